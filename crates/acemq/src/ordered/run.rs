//! One partition's consumer: take the partition (its lock queue `{name}.p{i}.lock`,
//! exclusive to this connection, then an exclusive `basic.consume`), or wait on standby
//! while another consumer holds it; hand its deliveries to the handler one at a
//! time; halt on a failure (the message held unacked, nothing behind it handed over) until
//! `resume`; subscribe again after the connection or the subscription is lost, holding a
//! halted partition's message again when it is redelivered.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use rand::RngExt;
use tokio_util::sync::CancellationToken;

use super::OnFailure;
use super::state::{Fate, Halt, Partition, PartitionRole, Shared};
use crate::codec::Decoder;
use crate::consume::resubscribe::{backoff, wait_connected};
use crate::consume::{HandlerError, Message};
use crate::engine::Engine;
use crate::envelope::{self, Envelope, application_headers};
use crate::error::Error;
use crate::headers::HeaderValue;
use crate::lifecycle::Gate;
use crate::topology::{QueueDecl, dead_letter_queue, parked_queue};
use crate::transport::{Confirmation, ConsumeSpec, Delivery, Subscription, TransportError};
use crate::util::panic_text;

/// How long a consumer on standby waits before trying to take the partition again: a
/// random time in `STANDBY_RETRY..2 * STANDBY_RETRY`.
pub const STANDBY_RETRY: Duration = Duration::from_secs(1);

/// How often a halted partition checks that the channel of its held message is still open.
const HOLD_POLL: Duration = Duration::from_millis(100);

/// What every partition task of one ordered consumer shares.
pub(crate) struct Ctx<T, F> {
    pub(crate) engine: Arc<Engine>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) decoder: Arc<dyn Decoder<T>>,
    pub(crate) handler: F,
    pub(crate) on_failure: OnFailure,
    pub(crate) prefetch: u16,
    /// Stops taking deliveries.
    pub(crate) stop: CancellationToken,
    /// Cuts in-place retry waits short; handler tokens are its children.
    pub(crate) closing: CancellationToken,
}

/// How a subscription, or one delivery, ended.
enum Ended {
    /// Carry on with the next delivery.
    Next,
    /// The consumer is stopping.
    Stopped,
    /// The subscription or its channel is gone: subscribe again.
    Lost(String),
}

/// Runs partition `p` until the consumer stops.
pub(crate) async fn partition<T, F, Fut>(ctx: Arc<Ctx<T, F>>, p: usize)
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let Some(part) = ctx.shared.partitions.get(p) else {
        return;
    };
    let mut locked = false;
    take_and_consume(&ctx, part, &mut locked).await;
    if locked {
        // Give the partition up at once (the broker would drop the lock queue with the
        // connection anyway): a standby consumer takes over on its next try.
        let _ = ctx
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
async fn take_and_consume<T, F, Fut>(ctx: &Ctx<T, F>, part: &Partition, locked: &mut bool)
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let lock = QueueDecl::classic(lock_queue(&part.queue))
        .exclusive()
        .auto_delete()
        .transient();
    let transport = ctx.engine.transport.clone();
    let spec = ConsumeSpec {
        queue: part.queue.clone(),
        prefetch: ctx.prefetch,
        consumer_tag: consumer_tag(&part.queue),
        exclusive: true,
        arguments: Default::default(),
    };
    let policy = backoff();
    let mut failures = 0u32;
    let mut status = transport.watch_status();
    loop {
        let waiting = || {
            ctx.shared.set_role(
                part,
                PartitionRole::Connecting("waiting for the connection".into()),
            )
        };
        if !wait_connected(&transport, &mut status, &ctx.stop, waiting).await {
            return;
        }
        let subscribed = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return,
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
                ctx.shared.set_role(part, PartitionRole::Active);
                sub
            }
            Err(e) if held_elsewhere(&e) => {
                if *crate::util::lock(&part.role) != PartitionRole::Standby {
                    tracing::info!(queue = %part.queue, error = %e, "another consumer holds the partition; on standby");
                }
                ctx.shared.set_role(part, PartitionRole::Standby);
                let wait = STANDBY_RETRY.mul_f64(rand::rng().random_range(1.0..2.0));
                if pause(&ctx.stop, wait).await {
                    return;
                }
                continue;
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(queue = %part.queue, error = %e, attempt = failures, "subscribing to the partition failed; will retry");
                ctx.shared.set_role(
                    part,
                    PartitionRole::Connecting(format!("subscribing failed: {e}")),
                );
                if pause(&ctx.stop, policy.delay(failures)).await {
                    return;
                }
                continue;
            }
        };
        let ended = deliveries(ctx, part, &mut *sub).await;
        // Anything delivered and not settled goes back to the queue, in order.
        let _ = sub.close().await;
        match ended {
            Ended::Lost(why) => {
                tracing::warn!(queue = %part.queue, reason = %why, "lost the partition's subscription; subscribing again");
                ctx.shared
                    .set_role(part, PartitionRole::Connecting(format!("lost: {why}")));
            }
            Ended::Next | Ended::Stopped => return,
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

/// Takes deliveries one at a time until the subscription ends or the consumer stops.
async fn deliveries<T, F, Fut>(
    ctx: &Ctx<T, F>,
    part: &Partition,
    sub: &mut dyn Subscription,
) -> Ended
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    loop {
        let next = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return Ended::Stopped,
            d = sub.next() => d,
        };
        let ended = match next {
            Some(Ok(d)) => delivery(ctx, part, d).await,
            None if sub.cancelled_by_us() => Ended::Stopped,
            None => Ended::Lost("the broker ended the subscription".into()),
            Some(Err(e)) => Ended::Lost(format!("the subscription failed: {e}")),
        };
        if !matches!(ended, Ended::Next) {
            return ended;
        }
    }
}

/// What running the handler (with its in-place retries) came to.
enum Outcome {
    Handled,
    Failed(String),
    Undecodable(String),
    /// The consumer is closing: the message is left unsettled (it goes back).
    Closing,
}

/// One delivery: hold it again if it is the halted partition's message, run it, settle it
/// (ack, skip to `.dlq`, park), or halt on it and wait for `resume`.
async fn delivery<T, F, Fut>(ctx: &Ctx<T, F>, part: &Partition, d: Delivery) -> Ended
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    ctx.shared.delivered();
    let envelope = Envelope::read(&d.properties, &d.routing_key);
    let held = part.halt.borrow().as_ref().map(|h| h.message_id.clone());
    if let Some(held) = held {
        if held == envelope.id() {
            // The held message, back after a reconnect: hold it again, do not run it.
            tracing::info!(queue = %part.queue, message_id = held, "the halted partition's message was redelivered; holding it again until resume");
            ctx.shared.held_again();
            match hold(ctx, part, &d).await {
                Ended::Next => {}
                other => return other,
            }
        } else {
            tracing::warn!(queue = %part.queue, held, first = envelope.id(), "the halted partition's message did not come back first (settled elsewhere, or removed); lifting the halt");
            ctx.shared.resume(part);
        }
    }
    loop {
        let outcome = run(ctx, part, &d, &envelope).await;
        let reason = match outcome {
            Outcome::Closing => return Ended::Stopped,
            Outcome::Handled => {
                if let Err(e) = d.acker.ack().await {
                    tracing::debug!(queue = %part.queue, error = %e, "ack not sent; the message will be redelivered");
                }
                ctx.shared.record(part, Fate::Handled);
                return Ended::Next;
            }
            Outcome::Undecodable(reason) => {
                let reason = format!("could not be decoded: {reason}");
                return set_aside(
                    ctx,
                    part,
                    &d,
                    &envelope,
                    &parked_queue(&part.queue),
                    &reason,
                    Fate::Parked,
                )
                .await;
            }
            Outcome::Failed(reason) => reason,
        };
        if ctx.on_failure == OnFailure::Skip {
            let reason = format!("skipped by ordered queue {}: {reason}", ctx.shared.name);
            return set_aside(
                ctx,
                part,
                &d,
                &envelope,
                &dead_letter_queue(&part.queue),
                &reason,
                Fate::Skipped,
            )
            .await;
        }
        tracing::warn!(queue = %part.queue, message_id = envelope.id(), %reason, "handler failed; the partition is halted until resume");
        ctx.shared.record(part, Fate::Halted);
        ctx.shared.halt(
            part,
            Halt {
                message_id: envelope.id().to_owned(),
                reason,
                since: SystemTime::now(),
            },
        );
        match hold(ctx, part, &d).await {
            // Resumed: from attempt 1 again.
            Ended::Next => continue,
            other => return other,
        }
    }
}

/// Holds a halted partition's message (unacked, nothing behind it handed over) until
/// `resume` (`Next`), the consumer stops, or its channel goes (`Lost`: the broker puts it
/// back, and its redelivery is held again).
async fn hold<T, F>(ctx: &Ctx<T, F>, part: &Partition, d: &Delivery) -> Ended {
    let mut halt = part.halt.subscribe();
    loop {
        if halt.borrow_and_update().is_none() {
            return Ended::Next;
        }
        if !d.acker.is_live() {
            return Ended::Lost("the held message's channel closed".into());
        }
        tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return Ended::Stopped,
            _ = halt.changed() => {}
            _ = tokio::time::sleep(HOLD_POLL) => {}
        }
    }
}

/// Runs the handler on `d`: once for `Stop` and `Skip`, up to `attempts` times for
/// `RetryInPlace` (waiting `delay` in between). Passes the pause gate first and counts the
/// handler in flight for the connection's drain.
async fn run<T, F, Fut>(
    ctx: &Ctx<T, F>,
    part: &Partition,
    d: &Delivery,
    envelope: &Envelope,
) -> Outcome
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let lifecycle = &ctx.engine.lifecycle;
    if lifecycle.gate(&ctx.closing).await == Gate::Closing || !d.acker.is_live() {
        return Outcome::Closing;
    }
    let payload = match ctx
        .decoder
        .decode(d.properties.content_type.as_deref(), &d.body)
    {
        Ok(p) => p,
        Err(Error::Decode { reason }) => return Outcome::Undecodable(reason),
        Err(e) => return Outcome::Undecodable(e.to_string()),
    };
    let (attempts, delay) = match ctx.on_failure {
        OnFailure::RetryInPlace { attempts, delay } => (attempts.max(1), delay),
        _ => (1, Duration::ZERO),
    };
    lifecycle.handler_started();
    ctx.shared.running(true);
    let headers = Arc::new(application_headers(&d.properties.headers));
    let queue: Arc<str> = Arc::from(part.queue.as_str());
    let mut payload = Some(payload);
    let mut outcome = Outcome::Closing;
    for attempt in 1..=attempts {
        let payload = match payload.take() {
            Some(p) => p,
            // A second attempt needs the body decoded again (the handler owns the first).
            None => match ctx
                .decoder
                .decode(d.properties.content_type.as_deref(), &d.body)
            {
                Ok(p) => p,
                Err(e) => {
                    outcome = Outcome::Undecodable(e.to_string());
                    break;
                }
            },
        };
        let message = Message {
            payload,
            envelope: Arc::new(
                envelope
                    .clone()
                    .with_attempt(i32::try_from(attempt).unwrap_or(i32::MAX)),
            ),
            headers: headers.clone(),
            queue: queue.clone(),
            exchange: d.exchange.clone(),
            routing_key: d.routing_key.clone(),
            redelivered: d.redelivered,
            content_type: d.properties.content_type.clone(),
            cancellation: ctx.closing.child_token(),
        };
        let result = AssertUnwindSafe((ctx.handler)(message))
            .catch_unwind()
            .await;
        let (error, final_) = match result {
            Ok(Ok(())) => {
                outcome = Outcome::Handled;
                break;
            }
            // Only an ordinary failure is retried in place; the others ask for no retry.
            Ok(Err(e)) => (e.reason().to_owned(), !e.is_retry()),
            Err(panic) => (
                format!("the handler panicked: {}", panic_text(&*panic)),
                false,
            ),
        };
        outcome = Outcome::Failed(error);
        if final_ || attempt == attempts {
            break;
        }
        tracing::debug!(queue = %part.queue, attempt, "handler failed; retrying in place");
        if pause(&ctx.closing, delay).await {
            outcome = Outcome::Closing;
            break;
        }
    }
    ctx.shared.running(false);
    lifecycle.handler_finished();
    outcome
}

/// How long a move that did not land waits before it is tried again, at most.
const MOVE_RETRY_MAX: Duration = Duration::from_secs(5);

/// Moves `d` to `target` (`{q}.dlq` or `{q}.parked`) with `reason` in `x-acemq-error`: a
/// mandatory, confirmed copy through the default exchange, the original acked only once the
/// copy is confirmed and routed. A move that does not land is tried again (nothing behind
/// it runs meanwhile) until it does, the channel goes, or the consumer stops.
async fn set_aside<T, F>(
    ctx: &Ctx<T, F>,
    part: &Partition,
    d: &Delivery,
    envelope: &Envelope,
    target: &str,
    reason: &str,
    fate: Fate,
) -> Ended {
    let mut tries = 0u32;
    loop {
        let mut copy = ctx.engine.copy_with(d, target, envelope);
        copy.properties
            .headers
            .insert(envelope::ERROR.into(), HeaderValue::Str(reason.to_owned()));
        let why = match ctx.engine.fit(&mut copy) {
            Err(too_large) => format!("the copy cannot be sent: {too_large}"),
            Ok(()) => match ctx.engine.publish_on_behalf(copy).await {
                Ok(Confirmation::Routed) => {
                    if let Err(e) = d.acker.ack().await {
                        tracing::debug!(queue = %part.queue, error = %e, "ack after the move not sent; the original will be redelivered");
                    }
                    ctx.shared.record(part, fate);
                    return Ended::Next;
                }
                Ok(other) => format!("the copy was not routed: {other:?}"),
                Err(e) => e.to_string(),
            },
        };
        tries += 1;
        tracing::warn!(queue = %part.queue, target, error = %why, tries, "moving a message aside failed; will retry");
        metrics::counter!(
            crate::observe::metrics::MESSAGES_SET_ASIDE_FAILED,
            "queue" => part.queue.clone(),
            "target" => target.to_owned(),
        )
        .increment(1);
        let wait = Duration::from_millis(100)
            .saturating_mul(2u32.saturating_pow(tries.min(8)))
            .min(MOVE_RETRY_MAX);
        if pause(&ctx.stop, wait).await {
            return Ended::Stopped;
        }
        if !d.acker.is_live() {
            return Ended::Lost("the channel closed while a move was retried".into());
        }
    }
}
