//! Declared pipelines and routing slips: a chain of steps, each its own queue and its own
//! consumer, the route travelling with the message (`docs/patterns.md`, `docs/wire.md`
//! §14).
//!
//! This module owns the pipeline's wire (exchange `{pipeline}`, direct; queues
//! `{pipeline}.{step}`, quorum, bound on `{step}`; the declared slip as envelope fields,
//! [`Route`]), the typed builder ([`PipelineBuilder`]), what a
//! step does after its handler (`step`: the next hop, or the end of the run), and the JSON
//! routing slip (`slip`: [`RoutingSlip`], any member's form read, the canonical form
//! written).
//!
//! Every step is an ordinary consumer on the one delivery path: its own retry ladder,
//! `{pipeline}.{step}.dlq` and `.parked`, interceptors, idempotency. Wire-compatible with
//! the Java member (a Rust step can join a Java pipeline, and the other way round), and
//! better on the same wire: the same `x-acemq-id` on every hop (a run is traceable), but
//! idempotency keyed per step (`{pipeline}.{step}:{id}`, so one store shared by two steps
//! skips neither) and the attempt reset per step (each step has its whole retry budget),
//! `x-acemq-first-seen`, correlation and trace context kept.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
//! use acemq::consume::Message;
//! let mq = acemq::Connection::connect("memory://doc-pipeline").await?;
//! let orders = mq
//!     .pipeline::<u32>("doc-orders")
//!     .step("double", |m: Message<u32>| async move { Ok(Some(*m.payload() * 2)) })
//!     .step("print", |m: Message<u32>| async move {
//!         println!("{}", m.payload());
//!         Ok(None::<()>)
//!     })
//!     .build()
//!     .await?;
//! let run_id = orders.send(&21).await?;
//! assert_eq!(run_id.len(), 36);
//! # Ok(()) }
//! ```

mod slip;
mod step;

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use slip::{ROUTING_SLIP, RoutingSlip, SlipError, Stop};
pub use step::Keyed;

use crate::codec::{Decoder, Encoder, Json};
use crate::consume::{Consumer, ConsumerGroup, ConsumerOptions, Handler, StartMember};
use crate::engine::Engine;
use crate::envelope::Route;
use crate::error::Error;
use crate::idempotency::IdempotencyStore;
use crate::publish::{Publisher, SendOptions};
use crate::retry::RetryPolicy;
use crate::topology::{ExchangeDecl, ExchangeKind, QueueDecl, Topology};

pub use crate::observe::metrics::{PIPELINE_RUN_DURATION, PIPELINE_RUN_TOTAL};

/// A step's queue: `{pipeline}.{step}`.
///
/// ```
/// assert_eq!(acemq::pipeline::step_queue("orders", "reserve"), "orders.reserve");
/// ```
pub fn step_queue(pipeline: &str, step: &str) -> String {
    format!("{pipeline}.{step}")
}

/// Whether `name` is a step name every member accepts: `[A-Za-z0-9][A-Za-z0-9.-]*` (Java
/// also allows `_` and Unicode letters, Go does not; a Rust pipeline takes the
/// intersection).
///
/// ```
/// use acemq::pipeline::is_step_name;
/// assert!(is_step_name("reserve-stock.v2"));
/// assert!(!is_step_name("one,two") && !is_step_name("") && !is_step_name("_x") && !is_step_name("a_b"));
/// ```
pub fn is_step_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
}

/// The exchange, queues and bindings of a pipeline: `{pipeline}` (direct, durable),
/// `{pipeline}.{step}` (quorum, no other arguments) bound on `{step}`.
///
/// ```
/// let t = acemq::pipeline::topology("orders", &["validate", "reserve"])?;
/// assert_eq!(t.queues()[1].name, "orders.reserve");
/// assert_eq!(t.bindings()[1].routing_key, "reserve");
/// # Ok::<(), acemq::Error>(())
/// ```
pub fn topology(pipeline: &str, steps: &[&str]) -> Result<Topology, Error> {
    let mut b =
        Topology::define().exchange_decl(ExchangeDecl::durable(pipeline, ExchangeKind::Direct));
    for step in steps {
        let q = step_queue(pipeline, step);
        b = b
            .queue_decl(QueueDecl::quorum(q.clone()))
            .bind(q, pipeline, *step);
    }
    Ok(b.build()?)
}

/// Starts a step's consumer once the pipeline is declared.
type StartStep = Box<dyn FnOnce(step::StepCtx, String) -> StartMember + Send>;

/// One step, its type erased: how to start its consumer once the pipeline is declared.
struct StepSpec {
    name: String,
    options: ConsumerOptions,
    members: usize,
    start: StartStep,
}

/// Builds a pipeline: steps in order, each taking what the one before produced
/// (`Cur`). Made by [`crate::Connection::pipeline`]. The modifiers (`retry`, `idempotent`,
/// `concurrency`, `prefetch`, `options`) apply to the last step added.
#[must_use = "a pipeline does nothing until built"]
pub struct PipelineBuilder<In, Cur> {
    engine: Arc<Engine>,
    name: String,
    steps: Vec<StepSpec>,
    refused: Option<String>,
    _types: PhantomData<fn(In) -> Cur>,
}

impl<In, Cur> std::fmt::Debug for PipelineBuilder<In, Cur> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps: Vec<&str> = self.steps.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct("PipelineBuilder")
            .field("name", &self.name)
            .field("steps", &steps)
            .finish_non_exhaustive()
    }
}

impl<In> PipelineBuilder<In, In> {
    pub(crate) fn new(engine: Arc<Engine>, name: &str) -> Self {
        PipelineBuilder {
            engine,
            name: name.to_owned(),
            steps: Vec::new(),
            refused: None,
            _types: PhantomData,
        }
    }
}

impl<In, Cur> PipelineBuilder<In, Cur>
where
    In: Serialize + Send + Sync + 'static,
    Cur: Send + 'static,
{
    /// Adds a step whose handler gets the previous step's output (JSON) and returns
    /// `Some(next)` to hand `next` to the following step, or `None` to end the run early
    /// (the last step's value is not used).
    pub fn step<O, H>(self, name: &str, handler: H) -> PipelineBuilder<In, O>
    where
        Cur: DeserializeOwned,
        O: Serialize + Send + Sync + 'static,
        H: Handler<Cur, Option<O>>,
    {
        self.step_with(name, Json, handler)
    }

    /// [`step`](Self::step) with another codec: it decodes this step's input and encodes
    /// its output for the next step.
    pub fn step_with<O, C, H>(mut self, name: &str, codec: C, handler: H) -> PipelineBuilder<In, O>
    where
        O: Send + Sync + 'static,
        C: Decoder<Cur> + Encoder<O> + Clone,
        H: Handler<Cur, Option<O>>,
    {
        if !is_step_name(name) {
            self.refuse(format!(
                "step name {name:?} is not one every member accepts: use letters, digits, '.' and '-', starting with a letter or digit"
            ));
        } else if self.steps.iter().any(|s| s.name == name) {
            self.refuse(format!(
                "step {name:?} appears twice in pipeline {:?}",
                self.name
            ));
        }
        let step_name = name.to_owned();
        let handler = Arc::new(handler);
        let start: StartStep = Box::new(move |ctx: step::StepCtx, queue: String| {
            let member: StartMember = Arc::new(move |options: ConsumerOptions| {
                Box::pin(step::start(
                    ctx.clone(),
                    queue.clone(),
                    options,
                    codec.clone(),
                    handler.clone(),
                ))
            });
            member
        });
        self.steps.push(StepSpec {
            name: step_name,
            options: ConsumerOptions::default().concurrency(1),
            members: 1,
            start,
        });
        PipelineBuilder {
            engine: self.engine,
            name: self.name,
            steps: self.steps,
            refused: self.refused,
            _types: PhantomData,
        }
    }

    fn refuse(&mut self, why: String) {
        self.refused.get_or_insert(why);
    }

    fn last(mut self, f: impl FnOnce(ConsumerOptions) -> ConsumerOptions) -> Self {
        match self.steps.last_mut() {
            Some(last) => last.options = f(std::mem::take(&mut last.options)),
            None => self.refuse("a step modifier comes before any step: add a step first".into()),
        }
        self
    }

    /// The last step's retry policy (its own ladder: `{pipeline}.{step}.retry.*`).
    pub fn retry(self, policy: RetryPolicy) -> Self {
        self.last(|o| o.retry(policy))
    }

    /// Deduplicates the last step through `store`, keyed `{pipeline}.{step}:{id}`: one
    /// store shared by several steps skips none of them.
    pub fn idempotent(self, store: impl IdempotencyStore) -> Self {
        self.last(|o| o.idempotent(store))
    }

    /// Handlers of the last step run at once (default 1).
    pub fn concurrency(self, n: usize) -> Self {
        self.last(|o| o.concurrency(n))
    }

    /// Members (competing consumers, each its own subscription) of the last step at
    /// start (default 1); [`Pipeline::step`] scales them while the pipeline runs.
    pub fn members(mut self, n: usize) -> Self {
        match self.steps.last_mut() {
            Some(last) => last.members = n,
            None => self.refuse("a step modifier comes before any step: add a step first".into()),
        }
        self
    }

    /// The last step's prefetch.
    pub fn prefetch(self, n: u16) -> Self {
        self.last(|o| o.prefetch(n))
    }

    /// Every consumer option of the last step at once.
    pub fn options(self, options: ConsumerOptions) -> Self {
        self.last(|_| options)
    }

    /// Declares the exchange and the step queues and starts a consumer per step. Refuses
    /// an empty pipeline, a bad or duplicate step name, a pipeline name that is empty or
    /// makes too long a queue name.
    pub async fn build(self) -> Result<Pipeline<In>, Error> {
        if let Some(why) = self.refused {
            return Err(Error::InvalidArgument(why));
        }
        if self.steps.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "pipeline {:?} has no step: it would be an exchange nobody consumes",
                self.name
            )));
        }
        if self.name.is_empty() || self.name.starts_with("amq.") {
            return Err(Error::InvalidArgument(format!(
                "{:?} cannot name a pipeline (its exchange): use a non-empty name not starting with amq.",
                self.name
            )));
        }
        let names: Vec<String> = self.steps.iter().map(|s| s.name.clone()).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        self.engine.declare(&topology(&self.name, &refs)?).await?;
        let counters = Arc::new(Counters::default());
        let mut consumers = Vec::with_capacity(self.steps.len());
        for (index, spec) in self.steps.into_iter().enumerate() {
            let ctx = step::StepCtx {
                engine: self.engine.clone(),
                pipeline: Some(Arc::from(self.name.as_str())),
                steps: Arc::from(names.clone()),
                index: Some(index),
                label: Arc::from(spec.name.as_str()),
                counters: counters.clone(),
            };
            let queue = step_queue(&self.name, &spec.name);
            let mut options = spec.options;
            if let Some(store) = options.idempotency_store() {
                options = options.idempotent(Keyed::new(
                    store,
                    format!("{}:", step_queue(&self.name, &spec.name)),
                ));
            }
            let member = (spec.start)(ctx, queue.clone());
            let transport = self.engine.transport.clone();
            match ConsumerGroup::start(&queue, transport, spec.members, options, member).await {
                Ok(group) => consumers.push(group),
                Err(e) => {
                    for group in &consumers {
                        group.close().await;
                    }
                    return Err(e);
                }
            }
        }
        let entry = Publisher::new(
            self.engine.clone(),
            self.name.clone(),
            names[0].clone(),
            Json,
        );
        Ok(Pipeline {
            engine: self.engine,
            name: self.name,
            steps: names,
            consumers,
            counters,
            entry,
        })
    }
}

/// What a pipeline counted so far (in this process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PipelineStats {
    /// Runs started by [`Pipeline::send`].
    pub entered: u64,
    /// Runs whose last step succeeded here.
    pub completed: u64,
    /// Runs a step ended before the last step (its handler returned `None`).
    pub ended_early: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    entered: AtomicU64,
    completed: AtomicU64,
    ended_early: AtomicU64,
}

/// A running pipeline. [`Pipeline::close`] stops its step consumers.
pub struct Pipeline<In: ?Sized> {
    engine: Arc<Engine>,
    name: String,
    steps: Vec<String>,
    consumers: Vec<ConsumerGroup>,
    counters: Arc<Counters>,
    entry: Publisher<In>,
}

impl<In: ?Sized> std::fmt::Debug for Pipeline<In> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("name", &self.name)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl<In: Serialize + ?Sized + 'static> Pipeline<In> {
    /// Starts a run with `input` at the first step; returns the run id
    /// (`x-acemq-route-id`, the same on every hop).
    pub async fn send(&self, input: &In) -> Result<String, Error> {
        self.send_with(input, SendOptions::new()).await
    }

    /// [`send`](Self::send) with envelope options (id, correlation, headers).
    pub async fn send_with(&self, input: &In, options: SendOptions) -> Result<String, Error> {
        if self.engine.publishing_paused() {
            return Err(Error::PublishingPaused);
        }
        let options = options.message_type(self.name.clone());
        let (mut message, _span) = self.entry.build_message(input, options)?;
        let route = Route::start(self.steps.iter().cloned());
        route.write(&mut message.properties.headers);
        self.engine.publish_landed(message).await?;
        self.counters.entered.fetch_add(1, Ordering::Relaxed);
        Ok(route.id().to_owned())
    }
}

impl<In: ?Sized> Pipeline<In> {
    /// The pipeline's name (its exchange).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The step names, in order.
    pub fn steps(&self) -> &[String] {
        &self.steps
    }

    /// A step's queue, `{pipeline}.{step}`.
    pub fn queue_for(&self, step: &str) -> String {
        step_queue(&self.name, step)
    }

    /// A step's consumers, by name: their stats and in-flight counts, and
    /// [`scale_to`](ConsumerGroup::scale_to) / [`set_prefetch`](ConsumerGroup::set_prefetch)
    /// while the pipeline runs.
    pub fn step(&self, name: &str) -> Option<&ConsumerGroup> {
        self.steps
            .iter()
            .position(|s| s == name)
            .and_then(|i| self.consumers.get(i))
    }

    /// Counts so far.
    pub fn stats(&self) -> PipelineStats {
        let c = &self.counters;
        PipelineStats {
            entered: c.entered.load(Ordering::Relaxed),
            completed: c.completed.load(Ordering::Relaxed),
            ended_early: c.ended_early.load(Ordering::Relaxed),
        }
    }

    /// Stops every step's consumers at once, one shared drain (running handlers finish;
    /// what is queued stays).
    pub async fn close(&self) {
        futures::future::join_all(self.consumers.iter().map(ConsumerGroup::close)).await;
    }
}

/// Starts a consumer of `queue` that follows the routing slip its messages carry (what
/// [`crate::Connection::follow_slip`] does): after the handler returns `Some(next)`, `next`
/// goes to the slip's next stop (a JSON slip, written back as canonical JSON) or the
/// declared route's next step (on `pipeline`'s exchange; without `pipeline` such a message
/// is fatal, as Go refuses it, rather than published to the wrong place); `None`, or a
/// finished slip, ends the run.
pub(crate) async fn follow<T, O, C, H>(
    engine: &Arc<Engine>,
    queue: &str,
    pipeline: Option<&str>,
    codec: C,
    options: ConsumerOptions,
    handler: H,
) -> Result<Consumer, Error>
where
    T: Send + 'static,
    O: Send + Sync + 'static,
    C: Decoder<T> + Encoder<O> + Clone,
    H: Handler<T, Option<O>>,
{
    let ctx = step::StepCtx {
        engine: engine.clone(),
        pipeline: pipeline.map(Arc::from),
        steps: Arc::from(Vec::new()),
        index: None,
        label: Arc::from(queue),
        counters: Arc::new(Counters::default()),
    };
    step::start(ctx, queue.to_owned(), options, codec, Arc::new(handler)).await
}

/// Publishes `payload` (JSON) to the slip's first stop carrying the slip (what
/// [`crate::Connection::start_slip`] does); returns the message id.
pub(crate) async fn start_slip<T: Serialize + ?Sized + 'static>(
    engine: &Arc<Engine>,
    slip: &RoutingSlip,
    payload: &T,
    options: SendOptions,
) -> Result<String, Error> {
    let Some(first) = slip.current() else {
        return Err(Error::InvalidArgument(
            "the routing slip has no stop: add one with RoutingSlip::then".into(),
        ));
    };
    let publisher = Publisher::new(
        engine.clone(),
        first.exchange().to_owned(),
        first.routing_key().to_owned(),
        Json,
    );
    let (mut message, _span) = publisher.build_message(payload, options)?;
    message.properties.headers.insert(
        ROUTING_SLIP.into(),
        crate::headers::HeaderValue::Str(slip.to_header()),
    );
    let id = message.properties.message_id.clone().unwrap_or_default();
    engine.publish_landed(message).await?;
    Ok(id)
}
