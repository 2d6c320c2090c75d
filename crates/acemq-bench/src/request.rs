//! Scenario 7: request/reply round trips (issue 14).
//!
//! One responder (prefetch [`PREFETCH`](crate::PREFETCH), concurrency
//! [`RESPONDER_CONCURRENCY`]) echoes each request; one requester keeps [`REQUEST_WINDOW`]
//! requests in flight (each a confirmed publish, then the wait for the matching reply on its
//! reply queue). The figure is round trips per second, with the p50 / p99 of one round trip
//! (from the call to the decoded reply). AceMQ only, on RabbitMQ and on `memory://`.

use std::time::{Duration, Instant};

use acemq::consume::{ConsumerOptions, Message};
use acemq::topology::QueueDecl;
use futures::StreamExt;

use crate::{Broker, Clock, PREFETCH, Payload, QueueKind, Result, Sample, Scenario, Side};

/// Requests in flight from the one requester.
pub const REQUEST_WINDOW: usize = 16;

/// Handlers the responder runs at once.
pub const RESPONDER_CONCURRENCY: usize = 8;

/// The timeout of each request (a run that hits it fails).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `n` round trips through `queue` (which must exist) on `mq`: a responder echoing the
/// payload, a requester with [`REQUEST_WINDOW`] requests in flight.
pub async fn acemq_request_reply(
    mq: &acemq::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let responder = mq
        .respond(
            queue,
            ConsumerOptions::default()
                .prefetch(PREFETCH)
                .concurrency(RESPONDER_CONCURRENCY),
            |m: Message<Payload>| async move { Ok(m.into_payload()) },
        )
        .await?;
    let requester = mq.requester().await?;
    let started = Clock::start();
    let latencies: Vec<Result<Duration>> = futures::stream::iter(0..n)
        .map(|seq| {
            let requester = &requester;
            async move {
                let payload = Payload::new(seq, size);
                let t = Instant::now();
                let echo: Payload = requester
                    .request("", queue, &payload, REQUEST_TIMEOUT)
                    .await?;
                if echo.seq != seq {
                    return Err(format!("request {seq} was answered for {}", echo.seq).into());
                }
                Ok(t.elapsed())
            }
        })
        .buffer_unordered(REQUEST_WINDOW)
        .collect()
        .await;
    let elapsed = started.elapsed();
    requester.close().await;
    responder.close().await;
    let latencies = latencies.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(Sample::new(n, elapsed, latencies))
}

/// Scenario 7 on a fresh `memory://` broker.
pub async fn memory_request_reply(n: u64, size: usize) -> Result<Sample> {
    let name = format!("memory://acemq-bench-rr-{}", std::process::id());
    let mq = acemq::Connection::connect(&name).await?;
    mq.transport()
        .declare_queue(&QueueDecl::classic("bench.requests"))
        .await?;
    let sample = acemq_request_reply(&mq, "bench.requests", n, size).await;
    mq.transport().delete_queue("bench.requests").await?;
    mq.close().await?;
    sample
}

impl Broker {
    /// Scenario 7 on a fresh queue of `kind`, deleted afterwards.
    pub async fn run_request_reply(&self, kind: QueueKind, n: u64, size: usize) -> Result<Sample> {
        let queue = self.fresh_name(Scenario::RequestReply, kind, Side::AceMq);
        self.declare(&queue, kind).await?;
        let result = acemq_request_reply(&self.acemq, &queue, n, size).await;
        let deleted = self.delete(&queue).await;
        let sample = result?;
        deleted?;
        Ok(sample)
    }
}
