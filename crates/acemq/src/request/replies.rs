//! The requester's side of the reply queue: the table of requests waiting for their reply,
//! the loop that consumes the reply queue and hands each reply to its waiter, and getting
//! the subscription back after the connection was lost.
//!
//! A waiter is a [`Slot`]: registering one puts a oneshot sender in the table under the
//! request's correlation id (a UUID the requester made, kept as its 128 bits: no string
//! to copy or hash per request; a reply whose correlation is not a UUID matches nothing);
//! dropping the slot (the request finished, timed out, or its
//! future was dropped) takes it out again, so the table never outlives its requests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::consume::resubscribe::{backoff, wait_connected};
use crate::engine::Engine;
use crate::envelope;
use crate::headers::HeaderValue;
use crate::health::{HealthContributor, HealthReport};
use crate::topology::QueueDecl;
use crate::transport::{ConsumeSpec, Delivery, Settlement, Subscription, TransportError};
use crate::util::lock;

/// Replies acked with one `multiple` ack at most: half the reply queue's prefetch.
const ACK_RUN: u16 = super::REPLY_PREFETCH / 2;

/// A reply as delivered: what the waiter decodes.
#[derive(Debug)]
pub(super) struct Reply {
    pub(super) content_type: Option<String>,
    pub(super) body: Bytes,
    /// A fault reply's `acemq-error`: the responder's handler failed.
    pub(super) error: Option<String>,
}

/// State shared by a requester's handles and its reply loop.
pub(super) struct Shared {
    pub(super) engine: Arc<Engine>,
    pub(super) decl: QueueDecl,
    waiters: Mutex<Option<HashMap<u128, oneshot::Sender<Reply>>>>,
    pub(super) answered: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) unmatched: AtomicU64,
    /// Why the reply queue is not consumed right now (`None` while it is).
    lost: Mutex<Option<String>>,
}

impl Shared {
    pub(super) fn new(engine: Arc<Engine>, decl: QueueDecl) -> Shared {
        Shared {
            engine,
            decl,
            waiters: Mutex::new(Some(HashMap::new())),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            unmatched: AtomicU64::new(0),
            lost: Mutex::new(None),
        }
    }

    /// The reply queue's name.
    pub(super) fn queue(&self) -> &str {
        &self.decl.name
    }

    /// Requests waiting for their reply.
    pub(super) fn pending(&self) -> usize {
        lock(&self.waiters).as_ref().map_or(0, HashMap::len)
    }

    /// Registers a waiter for `correlation_id`; `None` once the reply loop has ended.
    pub(super) fn register(self: &Arc<Self>, correlation_id: uuid::Uuid) -> Option<Slot> {
        let key = correlation_id.as_u128();
        let (tx, rx) = oneshot::channel();
        lock(&self.waiters).as_mut()?.insert(key, tx);
        Some(Slot {
            shared: self.clone(),
            key,
            rx,
        })
    }

    /// Hands a delivered reply to its waiter, or counts it as unmatched.
    fn hand_over(&self, d: &Delivery) {
        let correlation = d
            .properties
            .headers
            .get(envelope::CORRELATION)
            .and_then(HeaderValue::as_str);
        let waiter = correlation
            .and_then(|c| uuid::Uuid::try_parse(c).ok())
            .and_then(|c| lock(&self.waiters).as_mut()?.remove(&c.as_u128()));
        let reply = Reply {
            content_type: d.properties.content_type.clone(),
            body: d.body.clone(),
            error: d
                .properties
                .headers
                .get(envelope::REPLY_ERROR)
                .and_then(HeaderValue::as_str)
                .map(str::to_owned),
        };
        // A waiter whose request was given up between the lookup and now is unmatched too.
        if waiter.is_none_or(|w| w.send(reply).is_err()) {
            self.unmatched.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                queue = %self.decl.name,
                correlation = correlation.unwrap_or("<none>"),
                "a reply matched no waiting request (timed out or dropped); acked and dropped"
            );
        }
    }

    /// Ends every wait: the waiters see the requester closed.
    fn close_waiters(&self) {
        lock(&self.waiters).take();
    }
}

/// The `requester:{reply queue}` health component: Up while the reply queue is consumed,
/// Degraded (with the reason) while it is being subscribed again, so replies cannot arrive.
pub(super) struct RequesterHealth(pub(super) Arc<Shared>);

impl RequesterHealth {
    /// The component's name for a reply queue.
    pub(super) fn name_for(queue: &str) -> String {
        format!("requester:{queue}")
    }
}

impl HealthContributor for RequesterHealth {
    fn name(&self) -> String {
        Self::name_for(self.0.queue())
    }

    fn report(&self) -> Result<HealthReport, String> {
        let s = &self.0;
        let report = match lock(&s.lost).clone() {
            None => HealthReport::up(self.name()),
            Some(reason) => HealthReport::degraded(self.name()).with_detail("reason", reason),
        };
        Ok(report
            .with_detail("pending", s.pending() as u64)
            .with_detail("answered", s.answered.load(Ordering::Relaxed))
            .with_detail("timedOut", s.timed_out.load(Ordering::Relaxed))
            .with_detail("unmatched", s.unmatched.load(Ordering::Relaxed)))
    }
}

/// One request's place in the table; dropping it frees the place.
pub(super) struct Slot {
    shared: Arc<Shared>,
    key: u128,
    rx: oneshot::Receiver<Reply>,
}

impl Slot {
    /// Waits for the reply; `None` when the requester closed first.
    pub(super) async fn reply(&mut self) -> Option<Reply> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(w) = lock(&self.shared.waiters).as_mut() {
            w.remove(&self.key);
        }
    }
}

/// Consumes the reply queue until `stop`, subscribing again whenever the broker ends the
/// subscription (connection lost, queue deleted); then ends every wait.
pub(super) async fn run(
    shared: Arc<Shared>,
    mut subscription: Box<dyn Subscription>,
    spec: ConsumeSpec,
    stop: CancellationToken,
) {
    // What a burst of buffered replies ran into (the subscription's end, or an error),
    // handled on the next turn.
    let mut carried: Option<Option<Result<Delivery, TransportError>>> = None;
    loop {
        let next = match carried.take() {
            Some(next) => next,
            None => tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                d = subscription.next() => d,
            },
        };
        match next {
            Some(Ok(d)) => {
                // Every reply already at hand is handed over at once, and the burst acked
                // with one `multiple` ack (as a consumer coalesces its acks).
                shared.hand_over(&d);
                let (mut last, mut run) = (d, 1u16);
                while run < ACK_RUN {
                    match subscription.try_next() {
                        Some(Some(Ok(d))) => {
                            shared.hand_over(&d);
                            (last, run) = (d, run + 1);
                        }
                        Some(other) => {
                            carried = Some(other);
                            break;
                        }
                        None => break,
                    }
                }
                // A reply that is not acked comes back after a reconnect and is counted as
                // unmatched then: nothing to do about a failed ack.
                let _ = last
                    .acker
                    .settle(Settlement::Ack { multiple: run > 1 })
                    .await;
            }
            None if subscription.cancelled_by_us() => break,
            ended => {
                let _ = subscription.close().await;
                if shared.engine.lifecycle.is_closed() {
                    break;
                }
                let ended = ended.and_then(Result::err);
                tracing::warn!(queue = %shared.decl.name, ?ended, "the reply subscription ended; subscribing again");
                *lock(&shared.lost) = Some(match ended {
                    Some(e) => format!("the reply subscription ended ({e}); subscribing again"),
                    None => "the reply subscription ended; subscribing again".to_owned(),
                });
                match resubscribe(&shared, &spec, &stop).await {
                    Some(again) => {
                        subscription = again;
                        lock(&shared.lost).take();
                    }
                    None => break,
                }
            }
        }
    }
    let _ = subscription.cancel().await;
    let _ = subscription.close().await;
    shared.close_waiters();
}

/// Gets the reply subscription back: waits for the connection, declares the reply queue
/// (a no-op unless it expired meanwhile), subscribes; backs off between failures. `None`
/// once stopped or the connection is closed by its owner.
async fn resubscribe(
    shared: &Shared,
    spec: &ConsumeSpec,
    stop: &CancellationToken,
) -> Option<Box<dyn Subscription>> {
    let transport = &shared.engine.transport;
    // The consumers' backoff: 100 ms doubling to 30 s, jittered.
    let policy = backoff();
    let mut status = transport.watch_status();
    let mut attempt = 0u32;
    loop {
        if !wait_connected(transport, &mut status, stop, || {}).await {
            return None;
        }
        if shared.engine.lifecycle.is_closed() {
            return None;
        }
        attempt += 1;
        let again = async {
            transport.declare_queue(&shared.decl).await?;
            transport.consume(spec.clone()).await
        };
        match again.await {
            Ok(sub) => {
                tracing::info!(queue = %spec.queue, attempt, "reply queue consumed again");
                return Some(sub);
            }
            Err(e) => {
                tracing::warn!(queue = %spec.queue, attempt, error = %e, "consuming the reply queue again failed; will retry");
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(policy.delay(attempt)) => {}
        }
    }
}
