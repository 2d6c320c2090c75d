//! Getting a consumer's subscription back after the broker ended it: its connection was
//! lost (the transport is recovering), the broker cancelled it (queue deleted, node down),
//! or subscribing failed.
//!
//! The consumer waits until the transport is connected, subscribes again with the same
//! spec (queue, prefetch, the consumer's own stable tag), and on failure waits with
//! backoff (up to 100 ms doubling to 5 s, fully jittered) and tries again, for as long as the consumer
//! is not stopped. Meanwhile the consumer shows Degraded in health with the reason.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::transport::recovery::RecoveryPolicy;
use crate::transport::{ConsumeSpec, Subscription, Transport, TransportStatus};

/// The backoff between attempts to subscribe again.
pub(crate) fn backoff() -> RecoveryPolicy {
    RecoveryPolicy::default().delays(Duration::from_millis(100), Duration::from_secs(5))
}

/// Waits until `transport` is connected, calling `waiting` before each wait; `false` once
/// `stop` is cancelled. A transport whose status can no longer change is polled at the
/// backoff's longest delay rather than spun on.
pub(crate) async fn wait_connected(
    transport: &Arc<dyn Transport>,
    status: &mut watch::Receiver<TransportStatus>,
    stop: &CancellationToken,
    mut waiting: impl FnMut(),
) -> bool {
    while !transport.status().connected {
        waiting();
        tokio::select! {
            biased;
            _ = stop.cancelled() => return false,
            changed = status.changed() => if changed.is_err() {
                tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = tokio::time::sleep(backoff().max_delay()) => {}
                }
            },
        }
    }
    true
}

/// Subscribes again, waiting for the transport and backing off between failures; `None`
/// once `stop` is cancelled. `degraded` is told why the consumer is not consuming (each
/// time the reason changes).
pub(crate) async fn resubscribe(
    transport: &Arc<dyn Transport>,
    spec: &ConsumeSpec,
    stop: &CancellationToken,
    mut degraded: impl FnMut(String),
) -> Option<Box<dyn Subscription>> {
    let policy = backoff();
    let mut status = transport.watch_status();
    let mut attempt = 0u32;
    loop {
        // Wait for the connection first: subscribing on a recovering transport only fails.
        let waiting = || {
            degraded(format!(
                "the broker ended the subscription; waiting for the connection to {} to recover",
                transport.kind()
            ))
        };
        if !wait_connected(transport, &mut status, stop, waiting).await {
            return None;
        }
        attempt += 1;
        match transport.consume(spec.clone()).await {
            Ok(sub) => {
                tracing::info!(queue = %spec.queue, attempt, "consumer subscribed again");
                return Some(sub);
            }
            Err(e) => {
                tracing::warn!(queue = %spec.queue, attempt, error = %e, "subscribing again failed; will retry");
                degraded(format!(
                    "the broker ended the subscription; subscribing to {} again failed: {e}",
                    spec.queue
                ));
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(policy.delay(attempt)) => {}
        }
    }
}
