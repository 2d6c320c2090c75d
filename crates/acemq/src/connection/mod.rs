//! The AceMQ connection: the entry point, and the one place every public method of
//! [`Connection`] is written.
//!
//! A `Connection` is a thin, cheaply cloned handle over the connection's
//! engine (`engine.rs`, held as `Arc<Engine>`); each method here is a few lines that delegate
//! down to the engine, the [`publish`](crate::publish), [`consume`](crate::consume) or
//! [`replay`](crate::replay) module. Nothing below this file imports it.
//! (It is over 600 lines: the one place every public method is written, each a few
//! lines that delegate; splitting it would scatter the API, not simplify it.)
//!
//! `Connection::connect(url)` picks the transport by scheme: `amqp://` and `amqps://` reach
//! RabbitMQ, `memory://name` an in-process broker (each name its own).

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::codec::{Decoder, Encoder, Json};
use crate::consume::{Consumer, ConsumerOptions, Handler};
use crate::engine::Engine;
use crate::error::Error;
use crate::health::{Health, HealthContributor};
use crate::intercept::{ConsumeInterceptor, PublishInterceptor};
use crate::lifecycle::DEFAULT_DRAIN_TIMEOUT;
use crate::publish::{PublishResult, Publisher};
use crate::replay::Replay;
use crate::topology::Topology;
use crate::transport::{Outbound, Transport, TransportStatus};

pub use crate::health::progress::CONSUMERS;
pub use options::ConnectionOptions;

mod options;

/// The default window of publishes awaiting their confirm, per connection.
pub const DEFAULT_MAX_OUTSTANDING_CONFIRMS: usize = 1000;

/// What this library can do, as `/acemq-info` reports it (only what has an API behind it).
pub const CAPABILITIES: &[&str] = &[
    "publisher-confirms",
    "mandatory-publish",
    "retry-ladder",
    "dead-letter",
    "parking",
    "replay",
    "idempotency",
    "interceptors",
    "pause-drain",
    "health",
    "metrics",
    "trace-context",
    "ordered-queues",
    "request-reply",
    "streams",
    "scheduler",
    "pipelines",
    "routing-slips",
];

/// A connection to RabbitMQ or to an in-process `memory://` broker.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// let mq = acemq::Connection::connect("memory://doc-connection").await?;
/// assert_eq!(mq.transport_kind(), "memory");
/// mq.close().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Connection {
    engine: Arc<Engine>,
}

impl Connection {
    /// Connects with default options. Schemes: `amqp`, `amqps`, `memory`.
    pub async fn connect(url: &str) -> Result<Connection, Error> {
        Self::connect_with(url, ConnectionOptions::default()).await
    }

    /// Connects with options.
    ///
    /// On RabbitMQ an unreachable broker is retried for the connect timeout (30 s by
    /// default), then the error names the address without its password; refused
    /// credentials fail at once. Once connected, a lost connection is recovered (see
    /// [`Connection::recovery_events`]).
    pub async fn connect_with(url: &str, options: ConnectionOptions) -> Result<Connection, Error> {
        let transport =
            crate::transport::connect_with(url, options.transport_options().clone()).await?;
        Ok(Self::with_transport(transport, options))
    }

    /// Connects with the URL and options of the environment
    /// ([`ConnectionOptions::from_env`]).
    #[cfg(feature = "amqp")]
    pub async fn connect_from_env() -> Result<Connection, Error> {
        let (url, options) = ConnectionOptions::from_env()?;
        Self::connect_with(&url, options).await
    }

    /// Recovery events from now on: `lost`, `retrying` (attempt, delay), `recovered`,
    /// `gave_up`, `blocked`, `unblocked`. Each is also logged (`tracing`) and counted
    /// (`acemq.connection.recovery.total`). `None` for a transport that does not recover.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-events").await?;
    /// let events = mq.recovery_events().expect("memory:// recovers");
    /// # drop(events);
    /// # Ok(()) }
    /// ```
    pub fn recovery_events(
        &self,
    ) -> Option<tokio::sync::broadcast::Receiver<crate::transport::recovery::RecoveryEvent>> {
        self.engine.transport.recovery_events()
    }

    /// Wraps an already open transport.
    pub fn with_transport(transport: Arc<dyn Transport>, options: ConnectionOptions) -> Connection {
        Connection {
            engine: Engine::new(transport, options.client(), options.max_outstanding()),
        }
    }

    /// The transport underneath (for inspection and tests).
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.engine.transport
    }

    /// `"amqp"` or `"memory"`.
    pub fn transport_kind(&self) -> &'static str {
        self.engine.transport.kind()
    }

    /// `{client}@{hostname}`, stamped on every publish that has no origin.
    pub fn origin(&self) -> &str {
        &self.engine.origin
    }

    /// Connected / blocked, answered locally.
    pub fn status(&self) -> TransportStatus {
        self.engine.transport.status()
    }

    /// The health of this connection and of every registered contributor, from local
    /// state only (never a broker round trip, so it answers at once even while the broker
    /// blocks the connection). The `connection` report is Down only when the connection is
    /// closed; a blocked connection is Up with `blocked` and `blockedReason`. The report is
    /// named `acemq` (as in the Java member's health document).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use acemq::health::HealthStatus;
    /// let mq = acemq::Connection::connect("memory://doc-health").await?;
    /// let health = mq.health();
    /// assert_eq!(health.status, HealthStatus::Up);
    /// assert_eq!(health.report("acemq").unwrap().details["blocked"], false);
    /// # Ok(()) }
    /// ```
    pub fn health(&self) -> Health {
        self.engine.health()
    }

    /// Adds a component to [`Connection::health`]. A contributor that errors or panics
    /// reports Down under its own name; it never takes the rest of the report with it.
    pub fn register_health(&self, contributor: impl HealthContributor + 'static) {
        self.engine.register_health(Arc::new(contributor));
    }

    /// Declares every exchange, queue and binding of a topology, in that order.
    pub async fn declare(&self, topology: &Topology) -> Result<(), Error> {
        self.engine.declare(topology).await
    }

    // --- Publishing -------------------------------------------------------------------

    /// A JSON publisher to `exchange` with `routing_key` (`""` is the default exchange,
    /// where the routing key names the queue).
    pub fn publisher<T>(
        &self,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Publisher<T>
    where
        T: serde::Serialize + ?Sized + 'static,
    {
        self.publisher_with(exchange, routing_key, Json)
    }

    /// A publisher with another codec ([`crate::codec::Text`], [`crate::codec::RawBytes`]
    /// or your own [`Encoder`]).
    pub fn publisher_with<T, E>(
        &self,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        encoder: E,
    ) -> Publisher<T>
    where
        T: ?Sized + 'static,
        E: Encoder<T>,
    {
        Publisher::new(
            self.engine.clone(),
            exchange.into(),
            routing_key.into(),
            encoder,
        )
    }

    /// Publishes an already built message (body and properties verbatim), mandatory and
    /// confirmed, and waits for the confirm. Not refused by
    /// [`Connection::pause_publishing`]: this is the path for publishing on someone's
    /// behalf, e.g. an outbox relay.
    pub async fn publish_prepared(&self, outbound: Outbound) -> Result<PublishResult, Error> {
        crate::publish::publish_prepared(&self.engine, outbound).await
    }

    /// Further publishes fail with [`Error::PublishingPaused`]; nothing is sent.
    pub fn pause_publishing(&self) {
        self.engine.set_publishing_paused(true);
    }

    /// Publishing works again.
    pub fn resume_publishing(&self) {
        self.engine.set_publishing_paused(false);
    }

    /// Registers a publish interceptor for every publisher of this connection.
    pub fn intercept_publish(&self, interceptor: impl PublishInterceptor) {
        self.engine.interceptors.add_publish(Arc::new(interceptor));
    }

    // --- Consuming --------------------------------------------------------------------

    /// Consumes JSON messages of type `T` from `queue`.
    ///
    /// The handler returns `Ok(())` to ack; any error (`?`) is retried under the policy;
    /// [`HandlerError::fatal`](crate::consume::HandlerError::fatal) sends the message to `{q}.dlq` at once. A body that does not
    /// decode goes to `{q}.parked` without running the handler.
    pub async fn consume<T, H>(
        &self,
        queue: &str,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<Consumer, Error>
    where
        T: DeserializeOwned + Send + 'static,
        H: Handler<T>,
    {
        self.consume_with(queue, Json, options, handler).await
    }

    /// Consumes with another codec ([`crate::codec::Text`], [`crate::codec::RawBytes`],
    /// or your own [`Decoder`]).
    pub async fn consume_with<T, D, H>(
        &self,
        queue: &str,
        decoder: D,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<Consumer, Error>
    where
        T: Send + 'static,
        D: Decoder<T>,
        H: Handler<T>,
    {
        crate::consume::start(&self.engine, queue, decoder, options, handler).await
    }

    /// A group of `size` competing consumers of `queue` (JSON), each its own subscription
    /// with its own prefetch, that can be scaled while it runs
    /// ([`ConsumerGroup::scale_to`](crate::consume::ConsumerGroup::scale_to),
    /// [`set_prefetch`](crate::consume::ConsumerGroup::set_prefetch)). `options.concurrency`
    /// applies per member.
    pub async fn consume_group<T, H>(
        &self,
        queue: &str,
        size: usize,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<crate::consume::ConsumerGroup, Error>
    where
        T: DeserializeOwned + Send + 'static,
        H: Handler<T>,
    {
        let handler = Arc::new(handler);
        let engine = self.engine.clone();
        let q = queue.to_owned();
        let start: crate::consume::StartMember = Arc::new(move |options: ConsumerOptions| {
            let (engine, q, handler) = (engine.clone(), q.clone(), handler.clone());
            Box::pin(async move {
                let h = move |m: crate::consume::Message<T>| handler.call(m);
                crate::consume::start(&engine, &q, Json, options, h).await
            })
        });
        crate::consume::ConsumerGroup::start(
            queue,
            self.engine.transport.clone(),
            size,
            options,
            start,
        )
        .await
    }

    /// Registers a consume interceptor for every consumer of this connection: plain
    /// consumers, responders, ordered partitions and stream readers alike.
    pub fn intercept_consume(&self, interceptor: impl ConsumeInterceptor) {
        self.engine.interceptors.add_consume(Arc::new(interceptor));
    }

    /// Registers a layer around the handler of every consumer of this connection (every
    /// kind, as [`Connection::intercept_consume`]); see [`HandlerLayer`](crate::intercept::HandlerLayer).
    pub fn wrap_handlers(&self, layer: impl crate::intercept::HandlerLayer) {
        self.engine.interceptors.add_layer(Arc::new(layer));
    }

    /// A replay of `{queue}.dlq` back into `queue`.
    pub fn replay(&self, queue: &str) -> Replay {
        Replay::new(self.engine.clone(), queue)
    }

    // --- Pausing, draining, closing -----------------------------------------------------

    /// Stops handing deliveries to handlers. Nothing is lost: a delivery that arrives
    /// meanwhile waits at the gate unacked (see [`Connection::held`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-pause").await?;
    /// mq.pause_consuming();
    /// assert!(mq.is_consuming_paused());
    /// mq.resume_consuming();
    /// # Ok(()) }
    /// ```
    pub fn pause_consuming(&self) {
        self.engine.lifecycle.set_paused(true);
    }

    /// Hands deliveries to handlers again (held ones first).
    pub fn resume_consuming(&self) {
        self.engine.lifecycle.set_paused(false);
    }

    /// Whether consuming is paused.
    pub fn is_consuming_paused(&self) -> bool {
        self.engine.lifecycle.consuming_paused()
    }

    /// Handlers running right now, across every consumer of this connection.
    pub fn in_flight(&self) -> usize {
        self.engine.lifecycle.in_flight()
    }

    /// Deliveries fetched and waiting at the pause gate, never handled. They are unacked:
    /// the broker redelivers them if the process goes away.
    pub fn held(&self) -> usize {
        self.engine.lifecycle.held()
    }

    /// Pauses consuming and waits for running handlers. `true` when every handler
    /// finished, `false` when `timeout` passed first (never an error). Consuming stays
    /// paused. A `true` does not mean every delivery was handled: read [`Connection::held`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-drain").await?;
    /// assert!(mq.drain_consumers(std::time::Duration::from_secs(1)).await);
    /// # Ok(()) }
    /// ```
    pub async fn drain_consumers(&self, timeout: Duration) -> bool {
        self.engine.drain_consumers(timeout).await
    }

    /// Like [`Connection::drain_consumers`], abandoning the wait when `cancel` fires:
    /// that is [`Error::Cancelled`], distinct from the timeout's `Ok(false)`. Handlers are
    /// not interrupted and consuming stays paused.
    pub async fn drain_consumers_until(
        &self,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<bool, Error> {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Error::Cancelled),
            finished = self.drain_consumers(timeout) => Ok(finished),
        }
    }

    /// Drains for up to [`DEFAULT_DRAIN_TIMEOUT`], then closes ([`Connection::close_now`]).
    pub async fn close(&self) -> Result<(), Error> {
        self.drain_consumers(DEFAULT_DRAIN_TIMEOUT).await;
        self.close_now().await
    }

    /// Closes without draining: consumers are cancelled first, held deliveries handed back
    /// at once, handler tokens cancelled (a retry or in-progress wait ends and its message
    /// is requeued, attempt unchanged), running handlers get up to
    /// [`ABANDON_AFTER`](crate::lifecycle::ABANDON_AFTER), then
    /// the connection closes anyway. An abandoned handler's late ack is dropped.
    pub async fn close_now(&self) -> Result<(), Error> {
        self.engine.close_now().await
    }

    // --- Ordered queues -----------------------------------------------------------------

    /// An ordered (partitioned) queue of JSON messages of type `T` called `name`: the
    /// exchange `{name}` and the quorum queues `{name}.p0`.. (see [`crate::ordered`]).
    /// Configure it (`partitions`, `keyed_by`, `prefetch`, `on_failure`), then `declare`,
    /// `send` and `consume`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-ordered-method").await?;
    /// let q = mq.ordered::<String>("jobs").partitions(4).keyed_by(|s| s.clone());
    /// q.declare().await?;
    /// assert_eq!(q.queues().len(), 4);
    /// # Ok(()) }
    /// ```
    pub fn ordered<T>(&self, name: &str) -> crate::ordered::OrderedQueue<T> {
        self.ordered_with(name, Json)
    }

    /// An ordered queue called `name` whose messages are written and read with `codec`
    /// ([`crate::codec::Text`], [`crate::codec::RawBytes`] or your own): `send` encodes
    /// with it (its content type goes on the wire) and `consume` decodes with it, parking a
    /// body whose content type it does not [accept](Decoder::accepts). Sending needs
    /// `C: Encoder<T>`, consuming `C: Decoder<T>`; otherwise as [`Connection::ordered`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use acemq::codec::Text;
    /// use acemq::consume::Message;
    /// let mq = acemq::Connection::connect("memory://doc-ordered-with-codec").await?;
    /// let q = mq
    ///     .ordered_with::<String, _>("lines", Text)
    ///     .partitions(2)
    ///     .keyed_by(|s| s.clone());
    /// q.declare().await?;
    /// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    /// let consumer = q
    ///     .consume(move |m: Message<String>| {
    ///         let tx = tx.clone();
    ///         async move {
    ///             let _ = tx.send((m.content_type().map(str::to_owned), m.into_payload()));
    ///             Ok(())
    ///         }
    ///     })
    ///     .await?;
    /// q.send(&"hello".to_owned()).await?;
    /// let (content_type, line) = rx.recv().await.expect("delivered");
    /// assert_eq!(line, "hello");
    /// assert_eq!(content_type.as_deref(), Some(acemq::codec::TEXT));
    /// consumer.close().await;
    /// # Ok(()) }
    /// ```
    pub fn ordered_with<T, C>(&self, name: &str, codec: C) -> crate::ordered::OrderedQueue<T, C>
    where
        C: Send + Sync + 'static,
    {
        crate::ordered::OrderedQueue::new(self.engine.clone(), name, codec)
    }

    // --- Streams ------------------------------------------------------------------------

    /// Declares a RabbitMQ stream (`x-queue-type: stream`) with its retention; with none, a
    /// warning is logged (the stream grows until the disk fills). Refused on `memory://`,
    /// which has no streams.
    pub async fn declare_stream(
        &self,
        name: &str,
        retention: crate::stream::StreamRetention,
    ) -> Result<(), Error> {
        if retention.is_unbounded() {
            tracing::warn!(
                stream = name,
                "declaring a stream with no retention (no max age, no max length): it grows without bound"
            );
        }
        let decl = retention.declaration(name)?;
        self.engine.transport.declare_queue(&decl).await?;
        Ok(())
    }

    /// A reader of JSON entries of stream `name` (from `next` unless told otherwise).
    pub fn stream<T>(&self, name: &str) -> crate::stream::StreamReader<T, Json>
    where
        T: DeserializeOwned + Send + 'static,
    {
        self.stream_with(name, Json)
    }

    /// A reader of stream `name` with another codec.
    pub fn stream_with<T, D>(&self, name: &str, decoder: D) -> crate::stream::StreamReader<T, D>
    where
        T: Send + 'static,
        D: Decoder<T>,
    {
        crate::stream::StreamReader::new(self.engine.clone(), name, decoder)
    }
}

// --- Request/reply ----------------------------------------------------------------------

impl Connection {
    /// A [`Requester`](crate::request::Requester) with its own reply queue
    /// `acemq.reply.{uuid}` (classic, `x-expires` 10 minutes), already consumed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-conn-requester").await?;
    /// let requester = mq.requester().await?;
    /// assert!(requester.reply_queue().starts_with("acemq.reply."));
    /// # Ok(()) }
    /// ```
    pub async fn requester(&self) -> Result<crate::request::Requester, Error> {
        crate::request::Requester::start(&self.engine).await
    }

    /// Answers JSON requests of type `Req` from `queue` with the handler's `Resp`, sent to
    /// the request's reply address (`acemq-reply-to`, else `reply_to`) with its
    /// correlation. A consumer like any other: a handler error is retried under the
    /// options' policy; a request without a reply address is acked, unanswered. See
    /// [`crate::request`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use acemq::consume::{ConsumerOptions, Message};
    /// let mq = acemq::Connection::connect("memory://doc-conn-respond").await?;
    /// mq.declare(&acemq::topology::Topology::define().queue("echo").build()?).await?;
    /// let responder = mq
    ///     .respond("echo", ConsumerOptions::default(), |m: Message<String>| async move {
    ///         Ok(m.into_payload())
    ///     })
    ///     .await?;
    /// assert_eq!(responder.queue(), "echo");
    /// # Ok(()) }
    /// ```
    pub async fn respond<Req, Resp, H>(
        &self,
        queue: &str,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<crate::request::Responder, Error>
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: serde::Serialize + Send + 'static,
        H: Handler<Req, Resp>,
    {
        self.respond_with(queue, Json, options, handler).await
    }

    /// Answers requests from `queue` with `codec`: the request is decoded with it (a body
    /// whose content type it does not [accept](Decoder::accepts) is parked, the handler not
    /// run) and the reply encoded with it, carrying its content type. Otherwise as
    /// [`Connection::respond`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use acemq::codec::Text;
    /// use acemq::consume::{ConsumerOptions, Message};
    /// let mq = acemq::Connection::connect("memory://doc-conn-respond-with").await?;
    /// mq.declare(&acemq::topology::Topology::define().queue("shout").build()?).await?;
    /// let _responder = mq
    ///     .respond_with("shout", Text, ConsumerOptions::default(), |m: Message<String>| async move {
    ///         Ok(m.payload().to_uppercase())
    ///     })
    ///     .await?;
    /// let requester = mq.requester().await?;
    /// let answer: String = requester
    ///     .request_with("", "shout", Text, &"hi".to_owned(), Duration::from_secs(5))
    ///     .await?;
    /// assert_eq!(answer, "HI");
    /// # Ok(()) }
    /// ```
    pub async fn respond_with<Req, Resp, C, H>(
        &self,
        queue: &str,
        codec: C,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<crate::request::Responder, Error>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
        C: Decoder<Req> + Encoder<Resp>,
        H: Handler<Req, Resp>,
    {
        crate::request::responder_start(&self.engine, queue, codec, options, handler).await
    }
}

// --- Scheduling -------------------------------------------------------------------------

impl Connection {
    /// A [`Scheduler`](crate::schedule::Scheduler): declares the family's ladder
    /// (`acemq.schedule`, its five rungs, `acemq.schedule.due`) and consumes the control
    /// queue (prefetch 50, like Java), delivering what falls due.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use std::time::Duration;
    /// let mq = acemq::Connection::connect("memory://doc-conn-scheduler").await?;
    /// mq.declare(&acemq::topology::Topology::define().queue("reminders").build()?).await?;
    /// let s = mq.scheduler().await?;
    /// s.after(Duration::from_secs(30), "", "reminders", &"stand up").await?;
    /// # Ok(()) }
    /// ```
    pub async fn scheduler(&self) -> Result<crate::schedule::Scheduler, Error> {
        self.scheduler_with(crate::schedule::SchedulerOptions::default())
            .await
    }

    /// A scheduler with options: [`SchedulerOptions::declare_only`](crate::schedule::SchedulerOptions::declare_only)
    /// to schedule without delivering, a cancellation store, another prefetch.
    pub async fn scheduler_with(
        &self,
        options: crate::schedule::SchedulerOptions,
    ) -> Result<crate::schedule::Scheduler, Error> {
        crate::schedule::start(&self.engine, options).await
    }
}

// --- Pipelines --------------------------------------------------------------------------

impl Connection {
    /// A builder of the pipeline `name` taking `In` (JSON) at its first step: add steps,
    /// then `build()` declares it (exchange `{name}`, queues `{name}.{step}`) and starts a
    /// consumer per step. See [`crate::pipeline`].
    pub fn pipeline<In>(&self, name: &str) -> crate::pipeline::PipelineBuilder<In, In>
    where
        In: serde::Serialize + Send + Sync + 'static,
    {
        crate::pipeline::PipelineBuilder::new(self.engine.clone(), name)
    }

    /// Consumes `queue` (JSON in, JSON out) following the routing slip each message
    /// carries: the handler's `Some(next)` goes to the slip's next stop (JSON or declared;
    /// a declared route needs its `pipeline`), `None` ends the run. See
    /// [`crate::pipeline`].
    pub async fn follow_slip<T, O, H>(
        &self,
        queue: &str,
        pipeline: Option<&str>,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<Consumer, Error>
    where
        T: DeserializeOwned + Send + 'static,
        O: serde::Serialize + Send + Sync + 'static,
        H: Handler<T, Option<O>>,
    {
        crate::pipeline::follow(&self.engine, queue, pipeline, Json, options, handler).await
    }

    /// Sends `payload` (JSON) to the first stop of `slip`, carrying it; returns the
    /// message id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use acemq::pipeline::RoutingSlip;
    /// let mq = acemq::Connection::connect("memory://doc-start-slip").await?;
    /// mq.declare(&acemq::topology::Topology::define().queue("a").queue("b").build()?).await?;
    /// let slip = RoutingSlip::new().then("", "a", "a").then("", "b", "b");
    /// mq.start_slip(&slip, &serde_json::json!({"order": 1})).await?;
    /// # Ok(()) }
    /// ```
    pub async fn start_slip<T>(
        &self,
        slip: &crate::pipeline::RoutingSlip,
        payload: &T,
    ) -> Result<String, Error>
    where
        T: serde::Serialize + ?Sized + 'static,
    {
        crate::pipeline::start_slip(
            &self.engine,
            slip,
            payload,
            crate::publish::SendOptions::new(),
        )
        .await
    }
}
