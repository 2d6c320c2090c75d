//! What a pipeline step does around its handler: the handler runs on the one delivery path
//! (an ordinary consumer of `{pipeline}.{step}`); then the run goes on — to the next step
//! of the route the message carries (the slip on the message wins over the queue it
//! arrived on), to the next stop of a JSON routing slip (which wins over a declared one),
//! or it ends (completed, or ended early). The next hop is a confirmed, routed publish
//! before the input is acked; a hop that does not land retries this step.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::future::BoxFuture;

use super::{Counters, PIPELINE_RUN_DURATION, PIPELINE_RUN_TOTAL, RoutingSlip, slip::ROUTING_SLIP};
use crate::codec::{Decoder, Encoder};
use crate::consume::{Consumer, ConsumerOptions, Handler, HandlerError, Message};
use crate::engine::Engine;
use crate::envelope::{Envelope, Route};
use crate::error::Error;
use crate::headers::{HeaderValue, Headers};
use crate::idempotency::{ClaimOutcome, IdempotencyStore, StoreError};
use crate::observe::trace::TraceContext;
use crate::transport::{Outbound, Properties};

/// What a step's handler wrapper knows about its place in the pipeline.
#[derive(Clone)]
pub(super) struct StepCtx {
    pub(super) engine: Arc<Engine>,
    /// The pipeline (its exchange): where a declared route's next hop goes. `None` for a
    /// slip follower told no pipeline.
    pub(super) pipeline: Option<Arc<str>>,
    /// The pipeline's steps (empty for a slip follower).
    pub(super) steps: Arc<[String]>,
    /// This step's position in them (`None` for a slip follower).
    pub(super) index: Option<usize>,
    /// What the run metrics call this step: its name, or a follower's queue.
    pub(super) label: Arc<str>,
    pub(super) counters: Arc<Counters>,
}

/// Starts the step's consumer, of `queue`.
pub(super) async fn start<Cur, O, C, H>(
    ctx: StepCtx,
    queue: String,
    options: ConsumerOptions,
    codec: C,
    handler: Arc<H>,
) -> Result<Consumer, Error>
where
    Cur: Send + 'static,
    O: Send + Sync + 'static,
    C: Decoder<Cur> + Encoder<O> + Clone,
    H: Handler<Cur, Option<O>>,
{
    let engine = ctx.engine.clone();
    let encoder = codec.clone();
    let wrapped = move |m: Message<Cur>| {
        let ctx = ctx.clone();
        let handler = handler.clone();
        let encoder = encoder.clone();
        async move {
            let envelope = m.envelope.clone();
            let headers = m.shared_headers().clone();
            let output = handler.call(m).await?;
            go_on(&ctx, &envelope, &headers, output, &encoder).await
        }
    };
    crate::consume::start(&engine, &queue, codec, options, wrapped).await
}

/// Where the run goes after a step succeeded.
enum Next {
    /// To the next step of a declared route.
    Step(Route),
    /// To the next stop of a JSON slip.
    Stop(RoutingSlip),
    /// Nowhere: the route or slip is finished.
    End,
}

async fn go_on<O, E: Encoder<O> + ?Sized>(
    ctx: &StepCtx,
    envelope: &Envelope,
    headers: &Headers,
    output: Option<O>,
    encoder: &E,
) -> Result<(), HandlerError> {
    let next = match RoutingSlip::from_headers(headers) {
        Some(Ok(slip)) => {
            let advanced = slip.advanced(time::OffsetDateTime::now_utc());
            if advanced.is_finished() {
                Next::End
            } else {
                Next::Stop(advanced)
            }
        }
        Some(Err(e)) => return Err(HandlerError::fatal(e)),
        // The slip on the message wins over the queue it arrived on.
        None => match envelope.route().cloned().or_else(|| {
            ctx.index.map(|i| {
                Route::start(ctx.steps.iter().cloned()).at(i32::try_from(i).unwrap_or(i32::MAX))
            })
        }) {
            Some(here) => {
                let advanced = here.advanced();
                if advanced.is_finished() {
                    Next::End
                } else {
                    Next::Step(advanced)
                }
            }
            None => Next::End,
        },
    };
    let step = &ctx.label;
    let (next, output) = match (next, output) {
        (Next::End, _) => {
            ctx.counters.completed.fetch_add(1, Ordering::Relaxed);
            record(ctx, step, "completed", envelope);
            return Ok(());
        }
        (_, None) => {
            ctx.counters.ended_early.fetch_add(1, Ordering::Relaxed);
            record(ctx, step, "ended_early", envelope);
            return Ok(());
        }
        (next, Some(output)) => (next, output),
    };
    let body = encoder
        .encode(&output)
        .map_err(|e| HandlerError::fatal(format!("the step's output could not be encoded: {e}")))?;
    let mut carried = headers.clone();
    let (context, _) = TraceContext::for_publish();
    context.inject(&mut carried);
    // The same id all the way (a run is traceable); each step starts at attempt 1 with
    // the run's first-seen kept.
    let mut hop = envelope.clone().with_attempt(1).with_error(None);
    let (exchange, key) = match &next {
        Next::Step(route) => {
            let Some(pipeline) = &ctx.pipeline else {
                // Publishing it anywhere else would be publishing it to the wrong place.
                return Err(HandlerError::fatal(
                    "the message carries a declared route but this consumer was not told its pipeline: follow it with Connection::follow_slip(queue, Some(pipeline), ..)",
                ));
            };
            hop = hop.with_route(Some(route.clone()));
            let key = route.current().unwrap_or_default().to_owned();
            (pipeline.to_string(), key)
        }
        Next::Stop(slip) => {
            carried.insert(ROUTING_SLIP.into(), HeaderValue::Str(slip.to_header()));
            let stop = slip.current();
            (
                stop.map(|s| s.exchange().to_owned()).unwrap_or_default(),
                stop.map(|s| s.routing_key().to_owned()).unwrap_or_default(),
            )
        }
        Next::End => return Ok(()),
    };
    hop.write(&mut carried, &ctx.engine.origin);
    let properties = Properties {
        message_id: Some(hop.id().to_owned()),
        content_type: Some(encoder.content_type().to_owned()),
        delivery_mode: Some(2),
        headers: carried,
        ..Properties::default()
    };
    ctx.engine
        .publish_landed(Outbound::new(
            exchange.clone(),
            key.clone(),
            properties,
            body,
        ))
        .await
        .map_err(|e| {
            HandlerError::retry(format!(
                "the hop to exchange {exchange:?} with routing key {key:?} did not land: {e}"
            ))
        })
}

/// `acemq.pipeline.run.total` and `.duration` (the run's age: the envelope's first-seen).
fn record(ctx: &StepCtx, step: &str, outcome: &'static str, envelope: &Envelope) {
    let labels = [
        (
            "pipeline",
            ctx.pipeline.as_deref().unwrap_or_default().to_owned(),
        ),
        ("step", step.to_owned()),
        ("outcome", outcome.to_owned()),
    ];
    metrics::counter!(PIPELINE_RUN_TOTAL, &labels).increment(1);
    if let Some(age) = envelope.age() {
        metrics::histogram!(PIPELINE_RUN_DURATION, &labels).record(age.as_secs_f64());
    }
}

/// An idempotency store whose keys are prefixed (a pipeline step's: `{pipeline}.{step}:`),
/// so that one store shared by several consumers of one id (the steps of a run) keeps a
/// claim per consumer.
///
/// ```
/// use acemq::idempotency::InMemoryIdempotencyStore;
/// use acemq::pipeline::Keyed;
/// let store = std::sync::Arc::new(InMemoryIdempotencyStore::for_one_day());
/// let _validate = Keyed::new(store.clone(), "orders.validate:");
/// let _reserve = Keyed::new(store, "orders.reserve:");
/// ```
pub struct Keyed {
    inner: Arc<dyn IdempotencyStore>,
    prefix: String,
}

impl std::fmt::Debug for Keyed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Keyed {
    /// `inner` with every key prefixed by `prefix`.
    pub fn new(inner: Arc<dyn IdempotencyStore>, prefix: impl Into<String>) -> Keyed {
        Keyed {
            inner,
            prefix: prefix.into(),
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

impl IdempotencyStore for Keyed {
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { self.inner.claim(&self.key(key)).await })
    }
    fn confirm<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.inner.confirm(&self.key(key)).await })
    }
    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.inner.release(&self.key(key)).await })
    }
    fn is_confirmed<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { self.inner.is_confirmed(&self.key(key)).await })
    }
    fn try_claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        Box::pin(async move { self.inner.try_claim(&self.key(key)).await })
    }
}
