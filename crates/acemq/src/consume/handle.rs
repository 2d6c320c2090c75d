//! One delivery, from the subscription to its settlement, as its steps:
//! the rule's look first (`Rule::begin`) → admit → crash-loop check → decode (asking the
//! codec whether it reads the content type) → guarded run (interceptors, claim, handler
//! layers, handler) → decide (by the consumer kind's rule) → in-place waits and holds →
//! settle → release. Every consumer kind runs these steps; see `consume::rule`.
//!
//! The idempotency claim is where our own outages meet the message: a store that cannot
//! be asked puts the delivery back without spending an attempt (`Outcome::StoreUnavailable`,
//! counted in health through the consumer's stats), and after a failed claim the claim is
//! given back best effort, because the store may have committed it and lost only its
//! reply (otherwise the message would wait "in progress" for a whole lease). The id is held
//! in this process ([`InHand`]) from before the claim to the end of the handling, so that
//! give-back never touches a claim a running delivery holds, and two deliveries of one id
//! never run here at once.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use futures::FutureExt;
use futures::future::{self, Either};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::decide::{DELIVERY_COUNT, Decision, Facts, Outcome};
use super::handler::{Handler, HandlerError};
use super::message::Message;
use super::rule::{Begin, Flow, Rule};
use super::settle::{AckRun, Settler};
use super::stats::Observed;
use crate::codec::Decoder;
use crate::envelope::cause::{self, Cause};
use crate::envelope::{Envelope, application_headers};
use crate::error::Error;
use crate::headers::Headers;
use crate::idempotency::{ClaimOutcome, IdempotencyStore, InHand, StoreError};
use crate::intercept::{ConsumeContext, HandleInfo, HandleResult, HandlerFuture};
use crate::lifecycle::{Gate, Lifecycle};
use crate::observe::trace::{self, TraceContext};
use crate::transport::{BoxFuture, Delivery};
use crate::util::panic_text;

/// Everything a consumer's tasks share: the one core under every consumer kind, which
/// differs only in its rule `R`.
pub(crate) struct Ctx<T, H, R> {
    pub(crate) settler: Settler,
    pub(crate) decoder: Arc<dyn Decoder<T>>,
    pub(crate) handler: Arc<H>,
    pub(crate) rule: R,
    pub(crate) idempotency: Option<Arc<dyn IdempotencyStore>>,
    pub(crate) in_flight: Arc<AtomicUsize>,
}

impl<T, H, R> Ctx<T, H, R> {
    fn lifecycle(&self) -> &Lifecycle {
        &self.settler.engine.lifecycle
    }
}

/// Handles one delivery. `acks` is the consumer's ack run when it runs one handler at a
/// time (an ack then joins the run instead of being sent at once). `slot` is the handler
/// slot the delivery holds until it is settled or handed to a wait of its own.
pub(crate) async fn handle<T, H, R>(
    ctx: Arc<Ctx<T, H, R>>,
    mut d: Delivery,
    slot: Option<OwnedSemaphorePermit>,
    mut acks: Option<&mut AckRun>,
) -> Flow
where
    T: Send + 'static,
    H: Handler<T>,
    R: Rule,
{
    let _slot = slot;
    // Shared from the start: a delivery's future holds a pointer, not the envelope (an
    // `async fn` keeps a local it borrowed until its scope ends, moved or not).
    let read = Arc::new(Envelope::read(&d.properties, &d.routing_key));
    match ctx.rule.begin(&d, &read) {
        Begin::Run => {}
        Begin::AckUnseen => {
            if let Err(e) = d.acker.ack().await {
                tracing::debug!(queue = %ctx.settler.queue, error = %e, "ack not sent (the channel is gone)");
            }
            return Flow::Next;
        }
        Begin::Stop(reason) => return Flow::Stop(Some(reason)),
        Begin::Hold(reason) => match ctx.rule.hold(&d, read.id(), &reason).await {
            Flow::Next => {}
            other => return other,
        },
    }
    if !admit(&ctx, &d, acks.as_deref_mut()).await {
        return Flow::Next;
    }
    let mut facts = Facts::of_delivery(&read, &d);
    // The broker's count belongs to this delivery, not to the copies settlement publishes
    // (they carry it in their attempt instead); a copy keeping it would count it twice.
    if d.properties.headers.contains_key(DELIVERY_COUNT) {
        Arc::make_mut(&mut d.properties)
            .headers
            .remove(DELIVERY_COUNT);
    }
    // The attempt copies carry counts the broker's unsettled returns (crashes) too.
    let mut envelope = if facts.returned > 0 {
        let spent = i32::try_from(facts.spent()).unwrap_or(i32::MAX);
        Arc::new((*read).clone().with_attempt(spent))
    } else {
        read
    };
    let (seen, trace_ctx) = observe(&ctx, &d, &envelope);
    let decision = loop {
        let decision = match ctx.rule.crash_loop(facts) {
            Some(dead) => {
                tracing::warn!(queue = %ctx.settler.queue, message_id = envelope.id(), returned = facts.returned, "a message keeps coming back without a settlement; its handler does not run");
                dead
            }
            None => {
                let outcome = guarded_run(&ctx, &d, &envelope, &seen, &trace_ctx).await;
                ctx.rule.decide(&outcome, facts)
            }
        };
        match decision {
            Decision::Again { wait, spend } => {
                // In place: the delivery keeps its slot, nothing behind it runs.
                if !ctx.settler.wait(wait).await {
                    return closed_while_held(&ctx, &d, &seen).await;
                }
                if spend {
                    facts.attempt = facts.attempt.saturating_add(1);
                    let next = i32::try_from(facts.spent()).unwrap_or(i32::MAX);
                    envelope = Arc::new((*envelope).clone().with_attempt(next));
                }
            }
            Decision::Hold { reason } => {
                ctx.rule.decided(
                    &Decision::Hold {
                        reason: reason.clone(),
                    },
                    &envelope,
                );
                // A held delivery is not a running handler: a drain does not wait for it.
                ctx.lifecycle().handler_finished();
                let flow = ctx.rule.hold(&d, envelope.id(), &reason).await;
                ctx.lifecycle().handler_started();
                if flow != Flow::Next {
                    release(&ctx, &seen, false);
                    return flow;
                }
                // Resumed: from attempt 1 again, its earlier returns forgiven.
                facts.attempt = 1;
                facts.returned = 0;
                envelope = Arc::new((*envelope).clone().with_attempt(1));
            }
            other => break other,
        }
    };
    let envelope = match &decision {
        // Dead-lettered before running: it keeps the last attempt that ran.
        Decision::DeadLetter { .. } if facts.returned > 0 => Arc::new(
            (*envelope)
                .clone()
                .with_attempt(envelope.attempt().saturating_sub(1).max(1)),
        ),
        _ => envelope,
    };
    ctx.rule.decided(&decision, &envelope);
    let flow = match &decision {
        Decision::Stop { reason } => Flow::Stop(Some(reason.clone())),
        _ => Flow::Next,
    };
    let handed_over = settle(&ctx, d, &envelope, decision, &seen, acks).await;
    release(&ctx, &seen, handed_over);
    flow
}

/// The consumer closed while a delivery waited in place: handed back (or left for the
/// channel's close, as the rule says), and the consumer stops.
async fn closed_while_held<T, H, R: Rule>(
    ctx: &Ctx<T, H, R>,
    d: &Delivery,
    seen: &Observed,
) -> Flow {
    if ctx.rule.requeue_on_close() {
        ctx.settler.hand_back(d).await;
    }
    release(ctx, seen, false);
    Flow::Stop(None)
}

/// Waits at the pause gate. `false` when the consumer is closing: the delivery was handed
/// back with requeue. `true`: it is admitted and counted as in flight until [`release`].
/// Only the open gate is on every delivery's path: a pause, a lost channel and a close are
/// boxed, so every delivery's future is smaller for them.
async fn admit<T, H, R: Rule>(
    ctx: &Ctx<T, H, R>,
    d: &Delivery,
    mut acks: Option<&mut AckRun>,
) -> bool {
    let gate = match ctx.lifecycle().gate_now(&ctx.settler.closing) {
        Some(gate) => gate,
        None => Box::pin(paused(ctx, acks.as_deref_mut())).await,
    };
    if gate == Gate::Pass && d.acker.is_live() {
        ctx.lifecycle().handler_started();
        ctx.in_flight.fetch_add(1, Ordering::SeqCst);
        ctx.settler.stats.delivery_started();
        return true;
    }
    Box::pin(not_admitted(ctx, d, gate, acks)).await;
    false
}

/// Waits at the gate while consuming is paused; held acks are sent first (they must not
/// wait for the resume).
async fn paused<T, H, R>(ctx: &Ctx<T, H, R>, acks: Option<&mut AckRun>) -> Gate {
    if let Some(acks) = acks {
        ctx.settler.flush(acks).await;
    }
    ctx.settler.stats.held_at_gate(true);
    let gate = ctx.lifecycle().gate(&ctx.settler.closing).await;
    ctx.settler.stats.held_at_gate(false);
    gate
}

/// A delivery that does not run: its channel is gone, or the consumer is closing.
async fn not_admitted<T, H, R: Rule>(
    ctx: &Ctx<T, H, R>,
    d: &Delivery,
    gate: Gate,
    acks: Option<&mut AckRun>,
) {
    if let Some(acks) = acks {
        ctx.settler.flush(acks).await;
    }
    if !d.acker.is_live() {
        // Its channel is gone (the connection was lost while it waited): the broker has
        // put it back already, and running the handler would only make a duplicate whose
        // outcome cannot be settled.
        tracing::debug!(queue = %ctx.settler.queue, "skipping a delivery whose channel closed before it ran");
        return;
    }
    if gate == Gate::Closing && ctx.rule.requeue_on_close() {
        ctx.settler.hand_back(d).await;
    }
}

/// Opens the delivery's processing span (a child of the `traceparent` it carries) and its
/// metric series, and counts it in the series' in-flight gauge.
fn observe<T, H, R>(
    ctx: &Ctx<T, H, R>,
    d: &Delivery,
    envelope: &Envelope,
) -> (Observed, TraceContext) {
    let (mut trace_ctx, parent) = TraceContext::for_process(&d.properties.headers);
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
    trace::link_process(&seen.span, &d.properties.headers, &mut trace_ctx);
    seen.series.in_flight(1);
    seen.series
        .attempt(u32::try_from(envelope.attempt()).unwrap_or(1));
    (seen, trace_ctx)
}

/// Decodes the body with the consumer's codec, asking it first whether it reads the
/// delivered content type; the error is the park reason.
fn decode<T: 'static, H, R>(ctx: &Ctx<T, H, R>, d: &Delivery) -> Result<T, String> {
    let content_type = d.properties.content_type.as_deref();
    if !ctx.decoder.accepts(content_type) {
        let refused = crate::codec::refused(content_type.unwrap_or(""), ctx.decoder.expects());
        return Err(match refused {
            Error::Decode { reason } => reason,
            other => other.to_string(),
        });
    }
    ctx.decoder
        .decode(content_type, &d.body)
        .map_err(|e| match e {
            Error::Decode { reason } => reason,
            other => other.to_string(),
        })
}

/// Decodes the body (a body the codec cannot read is [`Outcome::Undecodable`], and no
/// interceptor sees it), then runs the interceptors' `before_handle`, the idempotency claim
/// and the handler (a panic is a failure like any error), then every `after_handle` in
/// reverse order.
async fn guarded_run<T, H, R>(
    ctx: &Ctx<T, H, R>,
    d: &Delivery,
    envelope: &Arc<Envelope>,
    seen: &Observed,
    trace_ctx: &TraceContext,
) -> Outcome
where
    T: Send + 'static,
    H: Handler<T>,
{
    let payload = match decode(ctx, d) {
        Ok(payload) => payload,
        Err(reason) => return Outcome::Undecodable(reason),
    };
    let chain = ctx.settler.engine.interceptors.consume_chain();
    let layers = ctx.settler.engine.interceptors.layers();
    // The handler's headers are built here only when an interceptor or a layer reads them;
    // otherwise the message builds them on first use (most handlers never ask).
    let headers = (!chain.is_empty() || !layers.is_empty())
        .then(|| Arc::new(application_headers(&d.properties.headers)));
    let none = Headers::new();
    let cx = ConsumeContext {
        queue: &ctx.settler.queue,
        envelope,
        headers: headers.as_deref().unwrap_or(&none),
    };
    let refused = chain.iter().find_map(|i| i.before_handle(&cx).err());
    let claim = match refused {
        Some(e) => Claim::Settle(Outcome::Failed(e)),
        None if ctx.idempotency.is_none() => Claim::Run(None),
        // Boxed, as the claim's record below: only a consumer with a store claims, and the
        // store's round trip dwarfs an allocation; every other delivery's future is
        // smaller for it.
        None => Box::pin(claim(ctx, envelope.id())).await,
    };
    let outcome = match claim {
        Claim::Settle(outcome) => outcome,
        Claim::Run(held) => {
            let message = Message {
                payload,
                envelope: envelope.clone(),
                headers: headers.clone().map(OnceLock::from).unwrap_or_default(),
                properties: d.properties.clone(),
                queue: ctx.settler.queue.clone(),
                exchange: d.exchange.clone(),
                routing_key: d.routing_key.clone(),
                redelivered: d.redelivered,
                closing: ctx.settler.closing.clone(),
                cancellation: OnceLock::new(),
            };
            let layered = headers
                .as_ref()
                .filter(|_| !layers.is_empty())
                .map(|headers| HandleInfo {
                    queue: ctx.settler.queue.clone(),
                    envelope: envelope.clone(),
                    headers: headers.clone(),
                });
            let cause = Cause(envelope.clone());
            ctx.settler.stats.handler_running(true);
            // Boxed: the handler's run is sized by the application's handler, the
            // delivery's future by the core alone (small enough for the allocator's
            // per-thread cache when the handler is small, bounded when it is not).
            let running: BoxFuture<'_, Outcome> = Box::pin(
                cause::scope(
                    cause,
                    trace::scope(
                        trace_ctx.clone(),
                        run_handler(&ctx.handler, message, &layers, layered.as_ref()),
                    ),
                )
                .instrument(seen.span.clone()),
            );
            let outcome = running.await;
            ctx.settler.stats.handler_running(false);
            if let Some(store) = &ctx.idempotency {
                Box::pin(record_claim(ctx, &**store, envelope.id(), &outcome)).await;
            }
            drop(held);
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

/// What the claim step says: run the handler (holding the id in this process while it
/// runs, when there is a store), or settle without running it.
enum Claim {
    Run(Option<InHand>),
    Settle(Outcome),
}

/// Claims `id` in the consumer's idempotency store, if it has one.
///
/// - Held by another delivery in this process: in progress, without asking the store.
/// - The store cannot be asked: our outage, [`Outcome::StoreUnavailable`] (no attempt
///   spent). The claim may still have been committed with only its reply lost, so it is
///   given back (`release`, best effort: it removes only this owner's unconfirmed claim,
///   and no other delivery here holds the id). If that fails too, the claim stays until a
///   later delivery of the id finds it (a store that knows its owner takes its own claim
///   over: see `acemq-sql`) or its lease runs out.
/// - An id the store refuses as a key: the message can never be claimed, so it is
///   unprocessable.
async fn claim<T, H, R>(ctx: &Ctx<T, H, R>, id: &str) -> Claim {
    let Some(store) = &ctx.idempotency else {
        return Claim::Run(None);
    };
    let stats = &ctx.settler.stats;
    let Some(held) = InHand::enter(store, id) else {
        return Claim::Settle(Outcome::InProgress);
    };
    match store.try_claim(id).await {
        Ok(ClaimOutcome::Claimed) => {
            stats.store_answered();
            Claim::Run(Some(held))
        }
        Ok(ClaimOutcome::Duplicate) => {
            stats.store_answered();
            Claim::Settle(Outcome::Duplicate)
        }
        Ok(_) => {
            stats.store_answered();
            Claim::Settle(Outcome::InProgress)
        }
        Err(StoreError::Invalid(e)) => Claim::Settle(Outcome::Failed(HandlerError::fatal(
            format!("the message id cannot be used as an idempotency key: {e}"),
        ))),
        Err(e) => {
            let failures = stats.store_failed(&e.to_string());
            tracing::warn!(queue = %ctx.settler.queue, message_id = id, error = %e, failures, "the idempotency store could not be asked; the delivery waits and is put back without spending an attempt");
            if let Err(again) = store.release(id).await {
                tracing::debug!(message_id = id, error = %again, "could not give back a claim whose reply may have been lost");
            }
            drop(held);
            Claim::Settle(Outcome::StoreUnavailable { failures })
        }
    }
}

/// Carries the decision out: into the ack run when there is one, at once otherwise. A
/// plain function: the delivery's future holds the settlement's, not the delivery and the
/// decision once more beside it.
fn settle<'a, T, H, R>(
    ctx: &'a Ctx<T, H, R>,
    d: Delivery,
    envelope: &'a Envelope,
    decision: Decision,
    seen: &'a Observed,
    acks: Option<&'a mut AckRun>,
) -> impl Future<Output = bool> + Send + 'a
where
    T: Send + 'static,
    H: Handler<T>,
    R: Rule,
{
    match acks {
        Some(acks) => Either::Left(ctx.settler.settle_in_run(d, envelope, decision, seen, acks)),
        None => Either::Right(ctx.settler.settle(d, envelope, decision, seen)),
    }
}

/// The delivery is settled: no longer in flight.
/// `handed_over`: the delivery went on in a task of its own (a wait, a failing move), which
/// now owns its in-flight counts and gives them back when it ends.
fn release<T, H, R>(ctx: &Ctx<T, H, R>, seen: &Observed, handed_over: bool) {
    ctx.settler.stats.delivery_done();
    if handed_over {
        return;
    }
    seen.series.in_flight(-1);
    ctx.lifecycle().handler_finished();
    ctx.in_flight.fetch_sub(1, Ordering::SeqCst);
}

/// Confirms the claim after success; releases it after a failure (then the policy decides).
/// A confirm that fails leaves the claim behind: the work is done, so the message is
/// still acked, and a redelivery may run the handler again (once this owner's store takes
/// its own claim over, or after the lease). Either call's result tells health whether the
/// store answers.
async fn record_claim<T, H, R>(
    ctx: &Ctx<T, H, R>,
    store: &dyn IdempotencyStore,
    id: &str,
    outcome: &Outcome,
) {
    let result = match outcome {
        Outcome::Handled => store.confirm(id).await,
        _ => store.release(id).await,
    };
    match result {
        Ok(()) => ctx.settler.stats.store_answered(),
        Err(e) => {
            if matches!(e, StoreError::Unavailable(_)) {
                ctx.settler.stats.store_failed(&e.to_string());
            }
            tracing::warn!(message_id = id, error = %e, "idempotency store update failed; the claim stays until it is taken over or expires");
        }
    }
}

/// Runs the handler inside the connection's handler layers (the first registered is
/// outermost); a panic, in the handler or a layer, is a failure like any error, with the
/// panic message as reason. `info` is there exactly when there are layers.
///
/// The handler is called when the future is first polled (inside the delivery's cause and
/// trace scopes), and a plain function rather than an `async fn`: the message is held
/// until that call and the handler's future after it, in the same place, not both.
fn run_handler<'a, T: Send + 'static, H: Handler<T>>(
    handler: &'a Arc<H>,
    message: Message<T>,
    layers: &'a [Arc<dyn crate::intercept::HandlerLayer>],
    info: Option<&'a HandleInfo>,
) -> impl Future<Output = Outcome> + Send + 'a {
    future::lazy(move |_| {
        // A handler's `call` (or a layer's `wrap`) may run code of its own before it
        // returns its future: a panic there is the handler's failure too, not the end of
        // the consumer's loop.
        let called = std::panic::catch_unwind(AssertUnwindSafe(|| match info {
            Some(info) => {
                // A layer that answers by itself runs nothing of the handler, not even
                // the synchronous part of its call: the innermost future calls it when
                // polled.
                let handler = handler.clone();
                let inner: HandlerFuture = Box::pin(async move { handler.call(message).await });
                let wrapped = layers
                    .iter()
                    .rev()
                    .fold(inner, |next, layer| layer.wrap(info, next));
                Either::Left(wrapped)
            }
            None => Either::Right(handler.call(message)),
        }));
        match called {
            Ok(call) => Either::Left(AssertUnwindSafe(call).catch_unwind()),
            Err(panic) => Either::Right(future::ready(Err(panic))),
        }
    })
    .flatten()
    .map(|result| match result {
        Ok(Ok(())) => Outcome::Handled,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(panic) => Outcome::Failed(HandlerError::retry(format!(
            "the handler panicked: {}",
            panic_text(&*panic)
        ))),
    })
}
