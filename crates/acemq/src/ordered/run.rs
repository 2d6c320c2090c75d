//! One partition's consumer: take the partition (its lock queue `{name}.p{i}.lock`,
//! exclusive to this connection, then an exclusive `basic.consume`), or wait on standby
//! while another consumer holds it; hand its deliveries, one at a time, to the one
//! delivery path (`consume::handle`) under the partition's rule ([`PartitionRule`]: retry
//! in place, then halt or skip); subscribe again after the connection or the subscription
//! is lost, holding a halted partition's message again when it is redelivered.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rand::RngExt;
use tokio_util::sync::CancellationToken;

use super::state::{Fate, Halt, Partition, PartitionRole, Shared};
use crate::consume::resubscribe::{backoff, wait_connected};
use crate::consume::rule::{Begin, Flow, Rule};
use crate::consume::{Ctx, Decision, Handler, InPlace, handle};
use crate::envelope::Envelope;
use crate::topology::QueueDecl;
use crate::transport::{ConsumeSpec, Delivery, Subscription, TransportError};

/// How long a consumer on standby waits before trying to take the partition again: a
/// random time in `STANDBY_RETRY..2 * STANDBY_RETRY`.
pub const STANDBY_RETRY: Duration = Duration::from_secs(1);

/// How often a halted partition checks that the channel of its held message is still open.
const HOLD_POLL: Duration = Duration::from_millis(100);

/// One partition's rule: the ordered queue's in-place rule, and the partition's halt.
pub(crate) struct PartitionRule {
    pub(crate) in_place: InPlace,
    pub(crate) shared: Arc<Shared>,
    pub(crate) index: usize,
    /// Stops taking deliveries (and ends a hold).
    pub(crate) stop: CancellationToken,
}

impl PartitionRule {
    fn part(&self) -> Option<&Partition> {
        self.shared.partitions.get(self.index)
    }
}

impl Rule for PartitionRule {
    fn begin(&self, _d: &Delivery, envelope: &Envelope) -> Begin {
        let Some(part) = self.part() else {
            return Begin::Run;
        };
        let held = part.halt.borrow().as_ref().map(|h| h.message_id.clone());
        match held {
            None => Begin::Run,
            Some(held) if held == envelope.id() => {
                // The held message, back after a reconnect: hold it again, do not run it.
                tracing::info!(queue = %part.queue, message_id = held, "the halted partition's message was redelivered; holding it again until resume");
                self.shared.held_again();
                Begin::Hold("held again after a redelivery".into())
            }
            Some(held) => {
                tracing::warn!(queue = %part.queue, held, first = envelope.id(), "the halted partition's message did not come back first (settled elsewhere, or removed); lifting the halt");
                self.shared.resume(part);
                Begin::Run
            }
        }
    }

    fn crash_loop(&self, facts: crate::consume::Facts) -> Option<Decision> {
        self.in_place.crash_loop(facts)
    }

    fn decide(&self, outcome: &crate::consume::Outcome, facts: crate::consume::Facts) -> Decision {
        self.in_place.decide(outcome, facts, &mut rand::rng())
    }

    /// Holds a halted partition's message (unacked, nothing behind it handed over) until
    /// `resume` (`Next`), the consumer stops, or its channel goes (`Lost`: the broker puts
    /// it back, and its redelivery is held again).
    async fn hold(&self, d: &Delivery, _message_id: &str, _reason: &str) -> Flow {
        let Some(part) = self.part() else {
            return Flow::Stop(None);
        };
        let mut halt = part.halt.subscribe();
        loop {
            if halt.borrow_and_update().is_none() {
                return Flow::Next;
            }
            if !d.acker.is_live() {
                return Flow::Lost("the held message's channel closed".into());
            }
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return Flow::Stop(None),
                _ = halt.changed() => {}
                _ = tokio::time::sleep(HOLD_POLL) => {}
            }
        }
    }

    fn decided(&self, decision: &Decision, envelope: &Envelope) {
        let Some(part) = self.part() else {
            return;
        };
        let fate = match decision {
            Decision::Ack => Fate::Handled,
            Decision::DeadLetter { .. } => Fate::Skipped,
            Decision::Park { .. } => Fate::Parked,
            Decision::Hold { reason } => {
                tracing::warn!(queue = %part.queue, message_id = envelope.id(), %reason, "handler failed; the partition is halted until resume");
                self.shared.halt(
                    part,
                    Halt {
                        message_id: envelope.id().to_owned(),
                        reason: reason.clone(),
                        since: SystemTime::now(),
                    },
                );
                Fate::Halted
            }
            _ => return,
        };
        self.shared.record(part, fate);
    }

    fn requeue_on_close(&self) -> bool {
        // The channel's close puts the whole window back, in order.
        false
    }
}

/// Runs one partition until the consumer stops.
pub(crate) async fn partition<T, H>(ctx: Arc<Ctx<T, H, PartitionRule>>, prefetch: u16)
where
    T: Send + 'static,
    H: Handler<T>,
{
    let Some(part) = ctx.rule.part() else {
        return;
    };
    let mut locked = false;
    take_and_consume(&ctx, part, prefetch, &mut locked).await;
    // Deliveries still waiting outside the handler (a move being retried) end first.
    ctx.settler.waits.close();
    ctx.settler.waits.wait().await;
    if locked {
        // Give the partition up at once (the broker would drop the lock queue with the
        // connection anyway): a standby consumer takes over on its next try.
        let _ = ctx
            .settler
            .engine
            .transport
            .delete_queue(&lock_queue(&part.queue))
            .await;
    }
}

/// The lock queue of a partition queue: `{name}.p{i}.lock`, exclusive to the connection of
/// the consumer that holds the partition (classic, transient, auto-delete; not Java's, and
/// Java never looks at it).
pub fn lock_queue(queue: &str) -> String {
    format!("{queue}.lock")
}

/// Takes the partition (its lock queue, then an exclusive consume), consumes it, and takes
/// it again after a loss, until the consumer stops. `locked`: whether this connection
/// declared the lock queue.
async fn take_and_consume<T, H>(
    ctx: &Arc<Ctx<T, H, PartitionRule>>,
    part: &Partition,
    prefetch: u16,
    locked: &mut bool,
) where
    T: Send + 'static,
    H: Handler<T>,
{
    let shared = &ctx.rule.shared;
    let stop = &ctx.rule.stop;
    let lock = QueueDecl::classic(lock_queue(&part.queue))
        .exclusive()
        .auto_delete()
        .transient();
    let transport = ctx.settler.engine.transport.clone();
    let spec = ConsumeSpec {
        queue: part.queue.clone(),
        prefetch,
        consumer_tag: consumer_tag(&part.queue),
        exclusive: true,
        arguments: Default::default(),
    };
    let policy = backoff();
    let mut failures = 0u32;
    let mut status = transport.watch_status();
    loop {
        let waiting = || {
            shared.set_role(
                part,
                PartitionRole::Connecting("waiting for the connection".into()),
            )
        };
        if !wait_connected(&transport, &mut status, stop, waiting).await {
            return;
        }
        let subscribed = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            s = async {
                // RabbitMQ ignores an exclusive consume on a quorum queue: the lock queue
                // (405 RESOURCE_LOCKED for any other connection) is what keeps the
                // partition to one consumer.
                transport.declare_queue(&lock).await?;
                *locked = true;
                transport.consume(spec.clone()).await
            } => s,
        };
        let mut sub = match subscribed {
            Ok(sub) => {
                failures = 0;
                tracing::info!(queue = %part.queue, "took the partition (exclusive consumer)");
                shared.set_role(part, PartitionRole::Active);
                sub
            }
            Err(e) if held_elsewhere(&e) => {
                if *crate::util::lock(&part.role) != PartitionRole::Standby {
                    tracing::info!(queue = %part.queue, error = %e, "another consumer holds the partition; on standby");
                }
                shared.set_role(part, PartitionRole::Standby);
                let wait = STANDBY_RETRY.mul_f64(rand::rng().random_range(1.0..2.0));
                if pause(stop, wait).await {
                    return;
                }
                continue;
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(queue = %part.queue, error = %e, attempt = failures, "subscribing to the partition failed; will retry");
                shared.set_role(
                    part,
                    PartitionRole::Connecting(format!("subscribing failed: {e}")),
                );
                if pause(stop, policy.delay(failures)).await {
                    return;
                }
                continue;
            }
        };
        let ended = deliveries(ctx, &mut *sub).await;
        // Anything delivered and not settled goes back to the queue, in order.
        let _ = sub.close().await;
        match ended {
            Flow::Lost(why) => {
                tracing::warn!(queue = %part.queue, reason = %why, "lost the partition's subscription; subscribing again");
                shared.set_role(part, PartitionRole::Connecting(format!("lost: {why}")));
            }
            Flow::Next | Flow::Stop(_) => return,
        }
    }
}

/// Sleeps `d`; `true` when the consumer was stopped meanwhile.
async fn pause(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        biased;
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// Another consumer holds the partition: its lock queue is another connection's (405
/// RESOURCE_LOCKED), or the exclusive consume was refused (403 ACCESS_REFUSED: a classic
/// partition queue).
fn held_elsewhere(e: &TransportError) -> bool {
    matches!(
        e,
        TransportError::AccessRefused { .. } | TransportError::ResourceLocked { .. }
    )
}

/// `acemq-ordered-{queue}-{8 hex}`, cut to AMQP's 255 bytes.
fn consumer_tag(queue: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let mut head = format!("acemq-ordered-{queue}");
    while head.len() > 240 {
        head.pop();
    }
    format!("{head}-{}", &suffix[..8])
}

/// Takes deliveries one at a time, each through the one delivery path, until the
/// subscription ends or the consumer stops.
async fn deliveries<T, H>(ctx: &Arc<Ctx<T, H, PartitionRule>>, sub: &mut dyn Subscription) -> Flow
where
    T: Send + 'static,
    H: Handler<T>,
{
    let stop = &ctx.rule.stop;
    loop {
        let next = tokio::select! {
            biased;
            _ = stop.cancelled() => return Flow::Stop(None),
            d = sub.next() => d,
        };
        let flow = match next {
            // A delivery whose channel closed before it ran is skipped: the subscription
            // then ends, and the partition subscribes again.
            Some(Ok(d)) => handle(ctx.clone(), d, None, None).await,
            None if sub.cancelled_by_us() => Flow::Stop(None),
            None => Flow::Lost("the broker ended the subscription".into()),
            Some(Err(e)) => Flow::Lost(format!("the subscription failed: {e}")),
        };
        if flow != Flow::Next {
            return flow;
        }
    }
}
