//! Scenario 6: a message waiting for its retry in the consumer does not hold the handler
//! slot, so the other messages go on at nearly their no-failure rate.
//!
//! One handler at a time (concurrency 1), a handler that works 5 ms per message, and 10% of
//! the messages failing once with a 2 s wait in the consumer
//! (`RetryPolicy::fixed(2, 2 s)`). A waiting delivery keeps its place in the prefetch
//! window but not the handler slot, so the other 90% keep flowing. The figure is the rate
//! at which those others are handled (from subscribing to the last of them), compared with
//! the same run where nothing fails: AceMQ against itself, not against raw lapin (a raw
//! consumer that sleeps in its handler would stall for 2 s per failure).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::retry::RetryPolicy;
use tokio::sync::Notify;

use crate::{Broker, Clock, Payload, QueueKind, Result, Sample, Scenario, Side, fill};

/// How long a failed message waits in the consumer before its retry.
pub const FAILURE_WAIT: Duration = Duration::from_secs(2);

/// Every `FAIL_EVERY`-th message fails once (10%).
pub const FAIL_EVERY: u64 = 10;

/// The handler's work per message.
pub const WORK: Duration = Duration::from_millis(5);

/// The prefetch window: room for the deliveries waiting out their 2 s (about 40 at this
/// rate) and for the others to flow.
pub const WAIT_PREFETCH: u16 = 100;

/// Whether message `seq` is one that fails once (when failures are on).
pub fn fails(seq: u64) -> bool {
    seq.is_multiple_of(FAIL_EVERY)
}

/// One run of scenario 6 on AceMQ: `n` messages, the failing tenth failing once when
/// `with_failures`. The sample's rate is the others' (the messages that never fail).
pub async fn acemq_waits(
    mq: &acemq::Connection,
    queue: &str,
    n: u64,
    with_failures: bool,
) -> Result<Sample> {
    let others = (0..n).filter(|s| !fails(*s)).count() as u64;
    let handled_others = Arc::new(AtomicU64::new(0));
    let done_others = Arc::new(Notify::new());
    let (h, d) = (handled_others.clone(), done_others.clone());
    let policy = RetryPolicy::fixed(2, FAILURE_WAIT)?;
    let started = Clock::start();
    let consumer = mq
        .consume(
            queue,
            ConsumerOptions::default()
                .prefetch(WAIT_PREFETCH)
                .concurrency(1)
                .retry(policy),
            move |m: Message<Payload>| {
                let (h, d) = (h.clone(), d.clone());
                async move {
                    tokio::time::sleep(WORK).await;
                    let seq = m.payload().seq;
                    if fails(seq) {
                        if with_failures && m.attempt() < 2 {
                            return Err(HandlerError::retry("fails once"));
                        }
                    } else if h.fetch_add(1, Ordering::SeqCst) + 1 == others {
                        d.notify_one();
                    }
                    Ok(())
                }
            },
        )
        .await?;
    done_others.notified().await;
    let elapsed = started.elapsed();
    // Untimed: the failed ones come back after their wait and succeed.
    let deadline = tokio::time::Instant::now() + FAILURE_WAIT * 10 + Duration::from_secs(30);
    while consumer.stats().acked < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    consumer.close().await;
    let s = consumer.stats();
    let retried = if with_failures { n - others } else { 0 };
    if s.acked != n || s.retried != retried {
        return Err(format!(
            "acemq waits: acked {} of {n}, retried {} of {retried}",
            s.acked, s.retried
        )
        .into());
    }
    Ok(Sample::new(others, elapsed, Vec::new()))
}

impl Broker {
    /// Scenario 6 once on a fresh, pre-filled queue: with the failures, or (`baseline`)
    /// without them.
    pub async fn run_waits(
        &self,
        kind: QueueKind,
        n: u64,
        size: usize,
        with_failures: bool,
    ) -> Result<Sample> {
        let queue = self.fresh_name(Scenario::Waits, kind, Side::AceMq);
        self.declare(&queue, kind).await?;
        let result = async {
            fill(&self.admin, &queue, n, size).await?;
            acemq_waits(&self.acemq, &queue, n, with_failures).await
        }
        .await;
        let deleted = self.delete(&queue).await;
        let sample = result?;
        deleted?;
        Ok(sample)
    }
}
