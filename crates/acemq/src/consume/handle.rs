//! One delivery, from the subscription to its settlement, as its steps:
//! admit → decode → guarded run (interceptors, claim, handler) → decide → settle → release.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::decide::{Decision, Facts, Outcome, Rules, decide};
use super::handler::HandlerError;
use super::message::Message;
use super::settle::{AckRun, Settler};
use super::stats::Observed;
use crate::codec::Decoder;
use crate::envelope::{Envelope, application_headers};
use crate::error::Error;
use crate::idempotency::{ClaimOutcome, IdempotencyStore};
use crate::intercept::{ConsumeContext, HandleResult};
use crate::lifecycle::{Gate, Lifecycle};
use crate::observe::trace::{self, TraceContext};
use crate::transport::Delivery;
use crate::util::panic_text;

/// Everything a consumer's tasks share.
pub(super) struct Ctx<T, F> {
    pub(super) settler: Settler,
    pub(super) decoder: Arc<dyn Decoder<T>>,
    pub(super) handler: F,
    pub(super) rules: Rules,
    pub(super) idempotency: Option<Arc<dyn IdempotencyStore>>,
    pub(super) in_flight: Arc<AtomicUsize>,
}

impl<T, F> Ctx<T, F> {
    fn lifecycle(&self) -> &Lifecycle {
        &self.settler.engine.lifecycle
    }
}

/// Handles one delivery. `acks` is the consumer's ack run when it runs one handler at a
/// time (an ack then joins the run instead of being sent at once).
pub(super) async fn handle<T, F, Fut>(
    ctx: Arc<Ctx<T, F>>,
    d: Delivery,
    _slot: OwnedSemaphorePermit,
    mut acks: Option<&mut AckRun>,
) where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    if !admit(&ctx, &d, acks.as_deref_mut()).await {
        return;
    }
    let envelope = Arc::new(Envelope::read(&d.properties, &d.routing_key));
    let (seen, trace_ctx) = observe(&ctx, &d, &envelope);
    let outcome = match decode(&ctx, &d) {
        Err(reason) => Outcome::Undecodable(reason),
        Ok(payload) => guarded_run(&ctx, &d, &envelope, payload, &seen, trace_ctx).await,
    };
    let decision = decide(&outcome, Facts::of(&envelope), &ctx.rules, &mut rand::rng());
    settle(&ctx, d, &envelope, decision, &seen, acks).await;
    release(&ctx, &seen);
}

/// Waits at the pause gate. `false` when the consumer is closing: the delivery was handed
/// back with requeue. `true`: it is admitted and counted as in flight until [`release`].
async fn admit<T, F>(ctx: &Ctx<T, F>, d: &Delivery, mut acks: Option<&mut AckRun>) -> bool {
    let gate = ctx.lifecycle().gate(&ctx.settler.closing);
    tokio::pin!(gate);
    let gate = match (&mut gate).now_or_never() {
        Some(g) => g,
        None => {
            // Paused: held acks must not wait for the resume.
            if let Some(acks) = acks.as_deref_mut() {
                ctx.settler.flush(acks).await;
            }
            gate.await
        }
    };
    if !d.acker.is_live() {
        // Its channel is gone (the connection was lost while it waited): the broker has
        // put it back already, and running the handler would only make a duplicate whose
        // outcome cannot be settled.
        if let Some(acks) = acks {
            ctx.settler.flush(acks).await;
        }
        tracing::debug!(queue = %ctx.settler.queue, "skipping a delivery whose channel closed before it ran");
        return false;
    }
    if gate == Gate::Closing {
        if let Some(acks) = acks {
            ctx.settler.flush(acks).await;
        }
        ctx.settler.hand_back(d).await;
        return false;
    }
    ctx.lifecycle().handler_started();
    ctx.in_flight.fetch_add(1, Ordering::SeqCst);
    true
}

/// Opens the delivery's processing span (a child of the `traceparent` it carries) and its
/// metric series, and counts it in the series' in-flight gauge.
fn observe<T, F>(ctx: &Ctx<T, F>, d: &Delivery, envelope: &Envelope) -> (Observed, TraceContext) {
    let (trace_ctx, parent) = TraceContext::for_process(&d.properties.headers);
    let seen = Observed {
        started: Instant::now(),
        span: trace::process_span(
            &ctx.settler.queue,
            envelope.id(),
            envelope.message_type(),
            u32::try_from(envelope.attempt()).unwrap_or(1),
            &trace_ctx,
            parent.as_ref(),
        ),
        series: ctx.settler.metrics.for_type(envelope.message_type()),
    };
    seen.series.in_flight(1);
    (seen, trace_ctx)
}

/// Decodes the body with the consumer's codec; the error is the park reason.
fn decode<T: 'static, F>(ctx: &Ctx<T, F>, d: &Delivery) -> Result<T, String> {
    let content_type = d.properties.content_type.as_deref();
    ctx.decoder
        .decode(content_type, &d.body)
        .map_err(|e| match e {
            Error::Decode { reason } => reason,
            other => other.to_string(),
        })
}

/// Runs the interceptors' `before_handle`, the idempotency claim and the handler (a panic
/// is a failure like any error), then every `after_handle` in reverse order.
async fn guarded_run<T, F, Fut>(
    ctx: &Ctx<T, F>,
    d: &Delivery,
    envelope: &Arc<Envelope>,
    payload: T,
    seen: &Observed,
    trace_ctx: TraceContext,
) -> Outcome
where
    F: Fn(Message<T>) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    let headers = Arc::new(application_headers(&d.properties.headers));
    let chain = ctx.settler.engine.interceptors.consume_chain();
    let cx = ConsumeContext {
        queue: &ctx.settler.queue,
        envelope,
        headers: &headers,
    };
    let refused = chain.iter().find_map(|i| i.before_handle(&cx).err());
    let claim = match (&refused, &ctx.idempotency) {
        (None, Some(store)) => Some(store.try_claim(envelope.id()).await),
        _ => None,
    };
    let outcome = match (refused, claim) {
        (Some(e), _) => Outcome::Failed(e),
        (None, Some(Ok(ClaimOutcome::Duplicate))) => Outcome::Duplicate,
        (None, Some(Ok(ClaimOutcome::InProgress))) => Outcome::InProgress,
        (None, Some(Err(e))) => Outcome::Failed(HandlerError::retry(format!(
            "the idempotency store could not be asked: {e}"
        ))),
        (None, Some(Ok(_))) | (None, None) => {
            let message = Message {
                payload,
                envelope: envelope.clone(),
                headers: headers.clone(),
                queue: ctx.settler.queue.clone(),
                exchange: d.exchange.clone(),
                routing_key: d.routing_key.clone(),
                redelivered: d.redelivered,
                content_type: d.properties.content_type.clone(),
                cancellation: ctx.settler.closing.child_token(),
            };
            let outcome = trace::scope(trace_ctx, run_handler(&ctx.handler, message))
                .instrument(seen.span.clone())
                .await;
            if let Some(store) = &ctx.idempotency {
                record_claim(&**store, envelope.id(), &outcome).await;
            }
            outcome
        }
    };
    let result = match &outcome {
        Outcome::Failed(e) => HandleResult::Failed(e),
        _ => HandleResult::Succeeded,
    };
    for i in chain.iter().rev() {
        i.after_handle(&cx, &result);
    }
    outcome
}

/// Carries the decision out: into the ack run when there is one, at once otherwise.
async fn settle<T, F>(
    ctx: &Ctx<T, F>,
    d: Delivery,
    envelope: &Envelope,
    decision: Decision,
    seen: &Observed,
    acks: Option<&mut AckRun>,
) {
    match acks {
        Some(acks) => {
            ctx.settler
                .settle_in_run(d, envelope, decision, seen, acks)
                .await
        }
        None => ctx.settler.settle(d, envelope, decision, seen).await,
    }
}

/// The delivery is settled: no longer in flight.
fn release<T, F>(ctx: &Ctx<T, F>, seen: &Observed) {
    seen.series.in_flight(-1);
    ctx.lifecycle().handler_finished();
    ctx.in_flight.fetch_sub(1, Ordering::SeqCst);
}

/// Confirms the claim after success; releases it after a failure (then the policy decides).
/// A confirm that fails leaves the claim to expire: the work is done, so the message is
/// still acked, and a redelivery after the lease would run the handler again.
async fn record_claim(store: &dyn IdempotencyStore, id: &str, outcome: &Outcome) {
    let result = match outcome {
        Outcome::Handled => store.confirm(id).await,
        _ => store.release(id).await,
    };
    if let Err(e) = result {
        tracing::warn!(message_id = id, error = %e, "idempotency store update failed; the claim will expire on its own");
    }
}

/// Runs the handler; a panic is a failure like any error, with the panic message as reason.
async fn run_handler<T, F, Fut>(handler: &F, message: Message<T>) -> Outcome
where
    F: Fn(Message<T>) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    match AssertUnwindSafe(handler(message)).catch_unwind().await {
        Ok(Ok(())) => Outcome::Handled,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(panic) => Outcome::Failed(HandlerError::retry(format!(
            "the handler panicked: {}",
            panic_text(&*panic)
        ))),
    }
}
