//! The broker-side check of one consumer: what the broker says about the consumed queue,
//! against what the consumer believes.
//!
//! Every [`ConsumerOptions::broker_check`](super::ConsumerOptions::broker_check) interval
//! (30 s by default) one passive declare of the queue, on a topology channel beside the
//! consumer's own, reads its consumer count and ready count:
//!
//! * **detached**: the broker lists no consumer while this consumer's subscription says it
//!   is consuming (a cancel that never arrived, a subscription tied to a connection that
//!   was replaced): the run loop is asked to subscribe again, which is logged, counted in
//!   `acemq.consumer.resubscribed.total` and shown in health until it is back;
//! * **stalled**: ready messages and no delivery to this consumer for
//!   [`ConsumerOptions::ready_stall_after`](super::ConsumerOptions::ready_stall_after)
//!   (not while consuming is paused): `Degraded` with the reason, e.g. "12400 ready, no
//!   delivery for 64 s".
//!
//! The check changes nothing on the broker. A queue that is gone while the subscription
//! says it consumes counts as detached; any other failed check (connection down, a
//! timeout) leaves the verdict to the run loop, which sees those itself.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::lifecycle::ConsumerControl;
use crate::observe::metrics::{CONSUMER_RESUBSCRIBED_TOTAL, TAG_QUEUE, TAG_TRANSPORT};
use crate::transport::QueueInfo;

/// How long one check may wait for the broker's answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// What one check concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing wrong.
    Fine,
    /// The broker lists no consumer although the subscription is open: subscribe again.
    Detached(String),
    /// Ready messages, nothing delivered for too long.
    Stalled(String),
}

/// The pure rule: `consumers` and `ready` from the broker, whether the subscription says
/// it is consuming, how long since the last delivery (or since consuming started), whether
/// consuming is paused, and the stall window.
pub(crate) fn verdict(
    queue: &str,
    consumers: u32,
    ready: u32,
    consuming: bool,
    quiet: Duration,
    paused: bool,
    stall_after: Duration,
) -> Verdict {
    if consuming && consumers == 0 {
        return Verdict::Detached(format!(
            "the broker lists no consumer of {queue} although this consumer's subscription is open; subscribing again"
        ));
    }
    if !paused && ready > 0 && quiet >= stall_after {
        return Verdict::Stalled(format!(
            "{ready} ready, no delivery for {} s",
            quiet.as_secs()
        ));
    }
    Verdict::Fine
}

/// Runs the check until `stop`; asks the run loop to subscribe again through `resubscribe`
/// (a counter it watches).
pub(crate) async fn run(
    engine: Arc<Engine>,
    control: Arc<ConsumerControl>,
    every: Duration,
    stall_after: Duration,
    resubscribe: watch::Sender<u64>,
    stop: CancellationToken,
) {
    let started = Instant::now();
    let transport = crate::observe::transport_name(engine.transport.kind());
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if !engine.transport.status().connected {
            continue;
        }
        let queue = control.queue.clone();
        let info = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(CHECK_TIMEOUT, engine.transport.inspect_queue(&queue)) => r,
        };
        let info = match info {
            Ok(Ok(info)) => info,
            // The queue is gone although the subscription says it consumes (RabbitMQ 3.10
            // was seen to drop a deleted quorum queue's consumer without a cancel): a new
            // subscription waits for the queue to be declared again.
            Ok(Err(e)) if e.is_not_found() && control.consuming() => QueueInfo {
                name: queue.to_string(),
                message_count: 0,
                consumer_count: 0,
            },
            _ => continue,
        };
        let quiet = match control.progress.progress().last_delivery {
            Some(at) => SystemTime::now().duration_since(at).unwrap_or_default(),
            None => started.elapsed(),
        };
        let found = verdict(
            &queue,
            info.consumer_count,
            info.message_count,
            control.consuming(),
            quiet,
            engine.lifecycle.consuming_paused(),
            stall_after,
        );
        match found {
            Verdict::Fine => control.audited(None),
            Verdict::Stalled(reason) => {
                tracing::warn!(queue = %queue, %reason, "consumer stalled");
                control.audited(Some(reason));
            }
            Verdict::Detached(reason) => {
                tracing::warn!(queue = %queue, %reason, "consumer detached");
                metrics::counter!(CONSUMER_RESUBSCRIBED_TOTAL, TAG_QUEUE => queue.to_string(), TAG_TRANSPORT => transport)
                    .increment(1);
                control.audited(Some(reason));
                resubscribe.send_modify(|n| *n += 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn an_open_subscription_the_broker_does_not_list_is_detached() {
        let v = verdict("q", 0, 0, true, Duration::ZERO, false, MIN);
        assert!(matches!(v, Verdict::Detached(r) if r.contains("no consumer of q")));
        // Not subscribed now (recovering): the run loop is on it already.
        assert_eq!(
            verdict("q", 0, 5, false, Duration::ZERO, false, MIN),
            Verdict::Fine
        );
    }

    #[test]
    fn ready_messages_undelivered_for_the_window_are_a_stall() {
        let v = verdict("q", 1, 12_400, true, Duration::from_secs(64), false, MIN);
        assert_eq!(
            v,
            Verdict::Stalled("12400 ready, no delivery for 64 s".into())
        );
        assert_eq!(
            verdict("q", 1, 12_400, true, Duration::from_secs(59), false, MIN),
            Verdict::Fine
        );
        assert_eq!(
            verdict("q", 1, 0, true, Duration::from_secs(600), false, MIN),
            Verdict::Fine
        );
        // Paused on purpose: not a stall.
        assert_eq!(
            verdict("q", 1, 9, true, Duration::from_secs(600), true, MIN),
            Verdict::Fine
        );
    }
}
