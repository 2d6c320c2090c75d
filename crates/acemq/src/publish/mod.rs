//! Typed publishing with publisher confirms.
//!
//! This module owns turning a payload plus [`SendOptions`] into one mandatory, confirmed
//! publish: the envelope is built and written, the body encoded, the reserved header prefix
//! refused, and the broker's answer turned into a [`PublishResult`] or an [`Error`]
//! (unroutable, nacked, refused). A bounded window of outstanding confirms per connection
//! (default 1000, held by the engine) keeps memory flat under load. The
//! moves the engine makes on a caller's behalf (retry hop, dead letter, park, replay) do
//! not come through here: they go through the engine's `publish_on_behalf`.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use futures::future::{self, BoxFuture, Either};
use futures::{FutureExt, TryFutureExt};
use tokio::sync::OwnedSemaphorePermit;

use crate::codec::Encoder;
use crate::engine::Engine;
use crate::envelope::{Envelope, check_application_headers};
use crate::error::Error;
use crate::headers::Headers;
use crate::intercept::PublishContext;
use crate::observe::metrics::{PublishMetrics, PublishOutcome};
use crate::observe::trace::{self, TraceContext};
use crate::transport::{Confirmation, Outbound, PendingConfirm, Properties, TransportError};
use tracing::Instrument;

mod options;

pub use options::{PublishResult, SendOptions};

/// A typed publisher bound to an exchange and routing key.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// use acemq::topology::Topology;
/// let mq = acemq::Connection::connect("memory://doc-publisher").await?;
/// mq.declare(&Topology::define().queue("orders").build()?).await?;
/// let orders = mq.publisher::<serde_json::Value>("", "orders");
/// let r = orders.send(&serde_json::json!({"id": "o-1"})).await?;
/// assert!(r.routed);
/// # Ok(()) }
/// ```
pub struct Publisher<T: ?Sized> {
    engine: Arc<Engine>,
    exchange: String,
    routing_key: String,
    encoder: Arc<dyn Encoder<T>>,
    mandatory: bool,
    persistent: bool,
    metrics: Arc<PublishMetrics>,
    _payload: PhantomData<fn(&T)>,
}

impl<T: ?Sized> Clone for Publisher<T> {
    fn clone(&self) -> Self {
        Publisher {
            engine: self.engine.clone(),
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            encoder: self.encoder.clone(),
            mandatory: self.mandatory,
            persistent: self.persistent,
            metrics: self.metrics.clone(),
            _payload: PhantomData,
        }
    }
}

impl<T: ?Sized + 'static> std::fmt::Debug for Publisher<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("content_type", &self.encoder.content_type())
            .finish_non_exhaustive()
    }
}

impl<T: ?Sized + 'static> Publisher<T> {
    /// A publisher over `engine` (what [`crate::Connection::publisher_with`] hands out).
    pub(crate) fn new<E: Encoder<T>>(
        engine: Arc<Engine>,
        exchange: String,
        routing_key: String,
        encoder: E,
    ) -> Publisher<T> {
        let transport = crate::observe::transport_name(engine.transport.kind());
        let metrics = PublishMetrics::for_destination(transport, &exchange, &routing_key);
        let encoder = Arc::new(encoder);
        Publisher::with_metrics(engine, exchange, routing_key, encoder, Arc::new(metrics))
    }

    /// A publisher recording into `metrics` kept by its caller, with an encoder its caller
    /// shares (a requester keeps both, and decodes replies with the same codec).
    pub(crate) fn with_metrics(
        engine: Arc<Engine>,
        exchange: String,
        routing_key: String,
        encoder: Arc<dyn Encoder<T>>,
        metrics: Arc<PublishMetrics>,
    ) -> Publisher<T> {
        Publisher {
            engine,
            metrics,
            exchange,
            routing_key,
            encoder,
            mandatory: true,
            persistent: true,
            _payload: PhantomData,
        }
    }

    /// Publishes without `mandatory`: a message that routes nowhere is dropped by the
    /// broker instead of being an error.
    pub fn allow_unroutable(mut self) -> Self {
        self.mandatory = false;
        self
    }

    /// Publishes with delivery mode 1 (not written to disk).
    pub fn transient(mut self) -> Self {
        self.persistent = false;
        self
    }

    /// Publishes one message and waits for the broker's confirm.
    ///
    /// **Wrapping it in a timeout** (`tokio::time::timeout(d, publisher.send(&p))`) is
    /// safe: dropping the future leaves the connection and every other publish intact and
    /// gives its place in the confirm window back. But when the timeout fires, the caller
    /// knows nothing about this message: it may not have been written yet, or it was written
    /// and the broker may or may not have it. Treat it as in doubt
    /// ([`ErrorKind::InDoubt`](crate::error::ErrorKind::InDoubt)), never as "not sent": if
    /// it must arrive, send it again with the same id ([`SendOptions::message_id`]) so
    /// consumers can drop the duplicate. Prefer the transport's own bound (on RabbitMQ,
    /// `AmqpOptions::confirm_timeout`, 30 s by default): it fails with
    /// [`ConfirmTimeout`](crate::transport::TransportError::ConfirmTimeout)
    /// (also in doubt), keeps tracking the late confirm, and the publish metric and span
    /// record the outcome, which a dropped `send` does not.
    pub async fn send(&self, payload: &T) -> Result<PublishResult, Error> {
        self.send_with(payload, SendOptions::default()).await
    }

    /// Publishes one message with envelope fields and options, and waits for the confirm.
    pub async fn send_with(
        &self,
        payload: &T,
        options: SendOptions,
    ) -> Result<PublishResult, Error> {
        let started = Instant::now();
        let (outbound, span) = self.build_message(payload, options)?;
        self.send_built(outbound, span, started).await
    }

    /// [`Publisher::send_with`] as a future that owns what it needs (the payload is encoded
    /// now): a requester lets it finish on its own when the reply comes before the confirm.
    pub(crate) fn into_sending(
        self,
        payload: &T,
        options: SendOptions,
    ) -> Result<BoxFuture<'static, Result<PublishResult, Error>>, Error> {
        let started = Instant::now();
        let (outbound, span) = self.build_message(payload, options)?;
        Ok(Box::pin(async move {
            self.send_built(outbound, span, started).await
        }))
    }

    /// Publishes a built message in its span, waits for the confirm, and records the
    /// outcome in the publish metric and the span. Combinators, not an `async fn`: the
    /// message is held once (in `start`), not once more per layer.
    fn send_built(
        &self,
        outbound: Outbound,
        span: tracing::Span,
        started: Instant,
    ) -> impl Future<Output = Result<PublishResult, Error>> + Send + '_ {
        self.start(outbound, None)
            .and_then(move |sent| sent.finish(started, &self.exchange, &self.routing_key))
            .instrument(span.clone())
            .map(move |result| {
                let outcome = self.record(&result, started);
                trace::record_publish_outcome(&span, outcome);
                result
            })
    }

    /// The publish span of a built message (its context is the `traceparent` it carries; its
    /// parent, the handler's context when publishing from inside one).
    fn span(&self, out: &Outbound, context: &TraceContext) -> tracing::Span {
        let h = &out.properties.headers;
        trace::publish_span(
            &self.exchange,
            &self.routing_key,
            out.properties.message_id.as_deref().unwrap_or_default(),
            h.get(crate::envelope::TYPE)
                .and_then(crate::headers::HeaderValue::as_str)
                .unwrap_or_default(),
            context,
            trace::current().as_ref(),
        )
    }

    /// Records the family's publish metric for one result; returns its outcome.
    fn record(&self, result: &Result<PublishResult, Error>, started: Instant) -> PublishOutcome {
        let outcome = match result {
            Ok(_) => PublishOutcome::Confirmed,
            Err(e) if e.is_refused() => PublishOutcome::Refused,
            Err(Error::Unroutable { .. }) => PublishOutcome::Unroutable,
            Err(_) => PublishOutcome::Failed,
        };
        self.metrics.record(outcome, started.elapsed());
        outcome
    }

    /// The message to send, with a trace context (a child of the handler's when publishing
    /// from inside one) injected as `traceparent`, and its publish span.
    fn build(&self, payload: &T, mut o: SendOptions) -> Result<(Outbound, TraceContext), Error> {
        o.persistent = o.persistent.or(Some(self.persistent));
        let chain = self.engine.interceptors.publish_chain();
        let mut out = prepare_with(
            &*self.encoder,
            &self.exchange,
            &self.routing_key,
            payload,
            o,
            &self.engine.origin,
            |envelope, headers| {
                for i in chain.iter() {
                    i.before_publish(&mut PublishContext {
                        exchange: &self.exchange,
                        routing_key: &self.routing_key,
                        envelope,
                        headers,
                    })?;
                }
                Ok(())
            },
        )?;
        out.mandatory = self.mandatory;
        let (context, _parent) = TraceContext::for_publish();
        context.inject(&mut out.properties.headers);
        Ok((out, context))
    }

    /// The message a send would publish (envelope, interceptors, trace context injected)
    /// and its publish span, without publishing it: for a scheduler, which carries it and
    /// publishes it later (the span covers handing it to the scheduler).
    pub(crate) fn build_message(
        &self,
        payload: &T,
        options: SendOptions,
    ) -> Result<(Outbound, tracing::Span), Error> {
        let (mut outbound, mut context) = self.build(payload, options)?;
        let span = self.span(&outbound, &context);
        trace::link_publish(&span, &mut outbound.properties.headers, &mut context);
        Ok((outbound, span))
    }

    /// Takes a slot in the confirm window (`permit`, or a free one now) and hands the
    /// message to the transport. A plain function: with a slot at hand the hand-over starts
    /// now and the future holds only the transport's; the wait for a slot when the window is
    /// full is boxed, so a publish that finds one does not carry it (nor a second copy of
    /// the message).
    fn start(
        &self,
        outbound: Outbound,
        permit: Option<OwnedSemaphorePermit>,
    ) -> impl Future<Output = Result<InFlight, Error>> + Send + '_ {
        if self.engine.publishing_paused() {
            return Either::Left(future::ready(Err(Error::PublishingPaused)));
        }
        // A free slot is only there when nobody waits for one (the semaphore gives a
        // returned slot to its oldest waiter first), so this keeps the window's order.
        match permit.or_else(|| self.engine.try_acquire()) {
            Some(permit) => {
                Either::Right(Either::Left(start_publish(&self.engine, outbound, permit)))
            }
            None => {
                let waiting: BoxFuture<'_, Result<InFlight, Error>> = Box::pin(async move {
                    let permit = self.engine.acquire().await?;
                    start_publish(&self.engine, outbound, permit).await
                });
                Either::Right(Either::Right(waiting))
            }
        }
    }
}

impl<T: Sized + 'static> Publisher<T> {
    /// Publishes every payload, then awaits every confirm: pipelined, not atomic. Results
    /// come back in order. When some fail, [`Error::Batch`] says how many; the others
    /// were confirmed.
    pub async fn send_all(&self, payloads: &[T]) -> Result<Vec<PublishResult>, Error> {
        let started = Instant::now();
        let total = payloads.len();
        let mut pending: VecDeque<Result<InFlight, Error>> = VecDeque::new();
        let mut results: Vec<Result<PublishResult, Error>> = Vec::with_capacity(total);
        for payload in payloads {
            let outbound = match self.build(payload, SendOptions::default()) {
                Ok((o, _)) => o,
                Err(e) => {
                    pending.push_back(Err(e));
                    continue;
                }
            };
            // Take a window slot; while none is free, settle our own oldest publish so a
            // batch larger than the window never waits on itself.
            let permit = loop {
                if let Some(p) = self.engine.try_acquire() {
                    break p;
                }
                match pending.pop_front() {
                    Some(Ok(f)) => {
                        results.push(f.finish(started, &self.exchange, &self.routing_key).await);
                    }
                    Some(Err(e)) => results.push(Err(e)),
                    None => break self.engine.acquire().await?,
                }
            };
            pending.push_back(self.start(outbound, Some(permit)).await);
        }
        for p in pending {
            results.push(match p {
                Ok(f) => f.finish(started, &self.exchange, &self.routing_key).await,
                Err(e) => Err(e),
            });
        }
        for r in &results {
            self.record(r, started);
        }
        let failed = results.iter().filter(|r| r.is_err()).count();
        let mut ok = Vec::with_capacity(total);
        let mut first = None;
        for r in results {
            match r {
                Ok(v) => ok.push(v),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        match first {
            None => Ok(ok),
            Some(first) => Err(Error::Batch {
                failed,
                total,
                first: Box::new(first),
            }),
        }
    }
}

/// Builds the message a publish sends: envelope written into the headers (`origin`
/// stamped when unset), body encoded, properties set (`message_id` = envelope id, the
/// codec's content type, delivery mode 2 unless `persistent(false)`). Refuses reserved
/// headers, a version below 1 and a zero expiration. Used by [`Publisher`] and by anything
/// that stores a message to publish later (the transactional outbox).
///
/// ```
/// use acemq::codec::Json;
/// use acemq::publish::{prepare, SendOptions};
/// let m = prepare(&Json, "orders", "order.placed", &serde_json::json!({"id": 1}),
///                 SendOptions::new().message_id("o-1"), "svc@host").unwrap();
/// assert_eq!(m.properties.message_id.as_deref(), Some("o-1"));
/// assert_eq!(m.properties.headers["x-acemq-type"].as_str(), Some("order.placed"));
/// ```
pub fn prepare<T: ?Sized, E: Encoder<T> + ?Sized>(
    encoder: &E,
    exchange: &str,
    routing_key: &str,
    payload: &T,
    o: SendOptions,
    origin: &str,
) -> Result<Outbound, Error> {
    prepare_with(
        encoder,
        exchange,
        routing_key,
        payload,
        o,
        origin,
        |_, _| Ok(()),
    )
}

/// [`prepare`] with a hook that sees the envelope and application headers before encoding.
fn prepare_with<T: ?Sized, E: Encoder<T> + ?Sized>(
    encoder: &E,
    exchange: &str,
    routing_key: &str,
    payload: &T,
    mut o: SendOptions,
    origin: &str,
    intercept: impl FnOnce(&mut Envelope, &mut Headers) -> Result<(), Error>,
) -> Result<Outbound, Error> {
    if let Some(v) = o.version.filter(|v| *v < 1) {
        return Err(Error::InvalidArgument(format!(
            "version must be at least 1, got {v}"
        )));
    }
    let expiration = match o.expiration {
        Some(ttl) if ttl.as_millis() == 0 => {
            return Err(Error::InvalidArgument(
                "expiration must be at least 1 ms".into(),
            ));
        }
        Some(ttl) => Some(ttl.as_millis().to_string()),
        None => None,
    };
    // Inside a handler, what is not set here is inherited from the message being handled.
    let cause = crate::envelope::cause::current();
    let correlation_id = o
        .correlation_id
        .or_else(|| cause.as_ref().map(|c| c.correlation_id().to_owned()));
    let mut envelope = Envelope::fresh(
        o.message_type.unwrap_or_else(|| routing_key.to_owned()),
        o.message_id,
        correlation_id,
    );
    if let Some(c) = o
        .causation_id
        .or_else(|| cause.as_ref().map(|c| c.message_id().to_owned()))
    {
        envelope = envelope.with_causation_id(c);
    }
    if let Some(v) = o.version {
        envelope = envelope.with_version(v);
    }
    if let Some(c) = o.claim {
        envelope = envelope.with_claim(c);
    }
    if let Some(r) = &o.reply_to {
        envelope = envelope.with_reply_to(r.clone());
    }
    intercept(&mut envelope, &mut o.headers)?;
    check_application_headers(&o.headers)?;
    let body = encoder.encode(payload)?;
    let mut headers = o.headers;
    let message_id = envelope.id().to_owned();
    envelope.into_headers(&mut headers, origin);
    let properties = Properties {
        message_id: Some(message_id),
        content_type: Some(encoder.content_type().to_owned()),
        delivery_mode: Some(if o.persistent.unwrap_or(true) { 2 } else { 1 }),
        expiration,
        reply_to: o.reply_to,
        headers,
        ..Properties::default()
    };
    Ok(Outbound {
        exchange: exchange.to_owned(),
        routing_key: routing_key.to_owned(),
        mandatory: true,
        properties,
        body,
    })
}

/// Publishes an already built message (body and properties verbatim), mandatory and
/// confirmed, and waits for the confirm; not refused by a publishing pause (what
/// [`crate::Connection::publish_prepared`] does).
pub(crate) async fn publish_prepared(
    engine: &Engine,
    mut outbound: Outbound,
) -> Result<PublishResult, Error> {
    // Always mandatory: whoever publishes on someone's behalf must learn of a message
    // that reached no queue (an outbox row marked published into nothing is lost).
    outbound.mandatory = true;
    let started = Instant::now();
    let permit = engine.acquire().await?;
    let (exchange, routing_key) = (outbound.exchange.clone(), outbound.routing_key.clone());
    start_publish(engine, outbound, permit)
        .await?
        .finish(started, &exchange, &routing_key)
        .await
}

/// A publish handed to the transport, awaiting its confirm. It keeps no copy of its
/// exchange and routing key: whoever finishes it has them (copied only into an unroutable
/// publish's error).
struct InFlight {
    message_id: String,
    mandatory: bool,
    confirm: PendingConfirm,
    _permit: OwnedSemaphorePermit,
}

/// Hands `outbound` to the transport now (a plain function: the future it returns holds
/// the transport's own future, not a second copy of the message) and awaits the hand-over.
fn start_publish(
    engine: &Engine,
    outbound: Outbound,
    permit: OwnedSemaphorePermit,
) -> impl Future<Output = Result<InFlight, Error>> + Send + '_ {
    let message_id = outbound.properties.message_id.clone().unwrap_or_default();
    let mandatory = outbound.mandatory;
    let handing_over = engine.transport.publish(outbound);
    async move {
        let confirm = handing_over.await.map_err(map_refusal)?;
        Ok(InFlight {
            message_id,
            mandatory,
            confirm,
            _permit: permit,
        })
    }
}

impl InFlight {
    /// Awaits the confirm; `exchange` and `routing_key` are where it was published.
    async fn finish(
        self,
        started: Instant,
        exchange: &str,
        routing_key: &str,
    ) -> Result<PublishResult, Error> {
        let confirmation = self.confirm.await.map_err(map_refusal)?;
        match confirmation {
            Confirmation::Routed => Ok(PublishResult {
                message_id: self.message_id,
                routed: self.mandatory,
                latency: started.elapsed(),
            }),
            Confirmation::Unroutable { reply_text, .. } => Err(Error::Unroutable {
                exchange: exchange.to_owned(),
                routing_key: routing_key.to_owned(),
                message_id: self.message_id,
                reply_text,
            }),
            Confirmation::Nacked => Err(Error::Nacked {
                message_id: self.message_id,
            }),
        }
    }
}

fn map_refusal(e: TransportError) -> Error {
    match e {
        TransportError::Blocked { reason } => Error::Blocked { reason },
        other => Error::Transport(other),
    }
}
