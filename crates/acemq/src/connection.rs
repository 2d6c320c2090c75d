//! The AceMQ connection: the entry point, and the one place every public method of
//! [`Connection`] is written.
//!
//! A `Connection` is a thin, cheaply cloned handle over the connection's
//! engine (`engine.rs`, held as `Arc<Engine>`); each method here is a few lines that delegate
//! down to the engine, the [`publish`](crate::publish), [`consume`](crate::consume) or
//! [`replay`](crate::replay) module. Nothing below this file imports it.
//!
//! `Connection::connect(url)` picks the transport by scheme: `amqp://` and `amqps://` reach
//! RabbitMQ, `memory://name` an in-process broker (each name its own).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::codec::{Decoder, Encoder, Json};
use crate::consume::{Consumer, ConsumerOptions, HandlerError, Message};
use crate::engine::Engine;
use crate::envelope::DEFAULT_CLIENT_NAME;
use crate::error::Error;
use crate::health::{Health, HealthContributor};
use crate::intercept::{ConsumeInterceptor, PublishInterceptor};
use crate::lifecycle::DEFAULT_DRAIN_TIMEOUT;
use crate::publish::{PublishResult, Publisher};
use crate::replay::Replay;
use crate::topology::Topology;
use crate::transport::recovery::RecoveryPolicy;
use crate::transport::{Outbound, Transport, TransportOptions, TransportStatus};

pub use crate::engine::CONSUMERS;

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
];

/// How a connection is set up: its name, the confirm window, recovery, and (feature `amqp`)
/// RabbitMQ's settings.
///
/// One name serves everywhere: it is stamped in `x-acemq-origin` as `{name}@{hostname}` and
/// shown by `rabbitmqctl list_connections` / the management UI as the connection name
/// (`{name} (publish)` and `{name} (consume)`).
///
/// Defaults: name `acemq`; 1,000 outstanding confirms; recovery on, redialling after 1 s
/// doubling to 30 s, forever; connecting retries an unreachable broker for 30 s; a publish
/// while the connection is recovering is refused at once with an error of kind
/// [`ErrorKind::Transient`](crate::error::ErrorKind) (nothing was sent, safe to send again)
/// unless [`ConnectionOptions::publish_wait`] gives it time; confirms wait 30 s, then the
/// publish is in doubt; certificates are always verified.
///
/// ```
/// use std::time::Duration;
/// use acemq::connection::ConnectionOptions;
/// use acemq::transport::recovery::RecoveryPolicy;
/// let o = ConnectionOptions::default()
///     .name("orders-service")
///     .heartbeat(10)
///     .address("amqp://guest:guest@rabbit-2:5672/%2f")
///     .recovery(RecoveryPolicy::default().delays(Duration::from_millis(500), Duration::from_secs(10)))
///     .publish_wait(Duration::from_secs(5));
/// assert_eq!(o.client(), "orders-service");
/// ```
#[derive(Clone, Debug)]
pub struct ConnectionOptions {
    client_name: String,
    max_outstanding_confirms: usize,
    transport: TransportOptions,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            client_name: DEFAULT_CLIENT_NAME.into(),
            max_outstanding_confirms: DEFAULT_MAX_OUTSTANDING_CONFIRMS,
            transport: TransportOptions::default(),
        }
    }
}

impl ConnectionOptions {
    /// The name: in `x-acemq-origin` and as the broker connection's name (default `acemq`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        #[cfg(feature = "amqp")]
        {
            self.transport.amqp.connection_name = self.client_name.clone();
        }
        self
    }

    /// The same as [`ConnectionOptions::name`] (the name it had first).
    pub fn client_name(self, name: impl Into<String>) -> Self {
        self.name(name)
    }

    /// The window of publishes awaiting their confirm (default 1000, at least 1).
    pub fn max_outstanding_confirms(mut self, n: usize) -> Self {
        self.max_outstanding_confirms = n.max(1);
        self
    }

    /// How a lost connection is redialled ([`RecoveryPolicy::disabled`] turns it off).
    pub fn recovery(mut self, policy: RecoveryPolicy) -> Self {
        self.transport = self.transport.recovery(policy);
        self
    }

    /// The configured client name.
    pub fn client(&self) -> &str {
        &self.client_name
    }

    /// The configured client name (the former name of [`ConnectionOptions::client`]).
    #[deprecated(since = "0.1.1", note = "use `ConnectionOptions::client`")]
    pub fn get_client_name(&self) -> &str {
        self.client()
    }

    /// The configured window of publishes awaiting their confirm.
    pub fn max_outstanding(&self) -> usize {
        self.max_outstanding_confirms
    }

    /// The transport's options (recovery, and RabbitMQ's settings).
    pub fn transport_options(&self) -> &TransportOptions {
        &self.transport
    }
}

#[cfg(feature = "amqp")]
impl ConnectionOptions {
    /// The heartbeat to ask RabbitMQ for, in seconds (a network cut with no close is noticed
    /// after about two).
    pub fn heartbeat(mut self, seconds: u16) -> Self {
        self.transport.amqp = self.transport.amqp.heartbeat(seconds);
        self
    }

    /// Another node of the same cluster, dialled in turn when the current one is lost.
    pub fn address(mut self, url: impl Into<String>) -> Self {
        self.transport.amqp = self.transport.amqp.address(url);
        self
    }

    /// How long connecting retries an unreachable broker (default 30 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.transport.amqp = self.transport.amqp.connect_timeout(timeout);
        self
    }

    /// How long a publish waits for a recovering connection before it is refused (default:
    /// not at all).
    pub fn publish_wait(mut self, wait: Duration) -> Self {
        self.transport.amqp = self.transport.amqp.publish_wait(wait);
        self
    }

    /// How long a publish waits for its confirm before it is in doubt (default 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.transport.amqp = self.transport.amqp.confirm_timeout(timeout);
        self
    }

    /// Where the user name and password come from (default: the URL).
    pub fn credentials(mut self, credentials: crate::transport::amqp::Credentials) -> Self {
        self.transport.amqp = self.transport.amqp.credentials(credentials);
        self
    }

    /// TLS for `amqps://` (a private CA bundle, a client certificate).
    pub fn tls(mut self, tls: crate::transport::amqp::TlsOptions) -> Self {
        self.transport.amqp = self.transport.amqp.tls(tls);
        self
    }

    /// The options from the environment, and the URL from `ACEMQ_URL`: `ACEMQ_NAME`,
    /// `ACEMQ_HEARTBEAT` (seconds), `ACEMQ_ADDRESSES` (more URLs, comma-separated),
    /// `ACEMQ_CONNECT_TIMEOUT` (seconds), `ACEMQ_USER` with `ACEMQ_PASSWORD` or
    /// `ACEMQ_PASSWORD_FILE`, `ACEMQ_TLS_CA_FILE`, `ACEMQ_TLS_CERT_FILE` with
    /// `ACEMQ_TLS_KEY_FILE`. A variable that is set but unusable is an error naming it
    /// (never its value).
    ///
    /// ```
    /// let e = acemq::connection::ConnectionOptions::from_env_vars(|_| None).unwrap_err();
    /// assert!(e.to_string().contains("ACEMQ_URL"));
    /// ```
    pub fn from_env() -> Result<(String, ConnectionOptions), Error> {
        Self::from_env_vars(|k| std::env::var(k).ok())
    }

    /// [`ConnectionOptions::from_env`] reading variables through `var` (for tests).
    pub fn from_env_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<(String, ConnectionOptions), Error> {
        use crate::transport::amqp::{Credentials, TlsOptions};
        let config = |m: String| Error::Config(m);
        let url = var("ACEMQ_URL").filter(|u| !u.is_empty()).ok_or_else(|| {
            config("ACEMQ_URL is not set (e.g. amqp://user:password@host:5672/%2f)".into())
        })?;
        let mut o = ConnectionOptions::default();
        if let Some(name) = var("ACEMQ_NAME") {
            o = o.name(name);
        }
        let seconds = |k: &str| -> Result<Option<u64>, Error> {
            var(k)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| config(format!("{k} must be a whole number of seconds")))
                })
                .transpose()
        };
        if let Some(h) = seconds("ACEMQ_HEARTBEAT")? {
            let h = u16::try_from(h).map_err(|_| config("ACEMQ_HEARTBEAT is too large".into()))?;
            o = o.heartbeat(h);
        }
        if let Some(t) = seconds("ACEMQ_CONNECT_TIMEOUT")? {
            o = o.connect_timeout(Duration::from_secs(t));
        }
        for a in var("ACEMQ_ADDRESSES").unwrap_or_default().split(',') {
            if !a.trim().is_empty() {
                o = o.address(a.trim());
            }
        }
        match (
            var("ACEMQ_USER"),
            var("ACEMQ_PASSWORD"),
            var("ACEMQ_PASSWORD_FILE"),
        ) {
            (Some(u), Some(p), _) => o = o.credentials(Credentials::user_password(u, p)),
            (user, None, Some(file)) => o = o.credentials(Credentials::file(file, user)),
            (None, None, None) => {}
            _ => {
                return Err(config(
                    "set ACEMQ_USER with ACEMQ_PASSWORD or ACEMQ_PASSWORD_FILE".into(),
                ));
            }
        }
        let read = |k: &str| -> Result<Option<Vec<u8>>, Error> {
            var(k)
                .map(|path| {
                    std::fs::read(&path)
                        .map_err(|e| config(format!("{k}: cannot read {path}: {e}")))
                })
                .transpose()
        };
        let mut tls = TlsOptions::default();
        let mut any_tls = false;
        if let Some(ca) = read("ACEMQ_TLS_CA_FILE")? {
            tls = tls.ca_bundle_pem(String::from_utf8_lossy(&ca).into_owned());
            any_tls = true;
        }
        match (read("ACEMQ_TLS_CERT_FILE")?, read("ACEMQ_TLS_KEY_FILE")?) {
            (Some(cert), Some(key)) => {
                tls = tls.client_certificate_pem(cert, key);
                any_tls = true;
            }
            (None, None) => {}
            _ => {
                return Err(config(
                    "set both ACEMQ_TLS_CERT_FILE and ACEMQ_TLS_KEY_FILE, or neither".into(),
                ));
            }
        }
        if any_tls {
            o = o.tls(tls);
        }
        Ok((url, o))
    }
}

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
        let transport = crate::transport::connect_with(url, options.transport.clone()).await?;
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
            engine: Engine::new(
                transport,
                &options.client_name,
                options.max_outstanding_confirms,
            ),
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
    /// closed; a blocked connection is Up with `blocked` and `blockedReason`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use acemq::health::HealthStatus;
    /// let mq = acemq::Connection::connect("memory://doc-health").await?;
    /// let health = mq.health();
    /// assert_eq!(health.status, HealthStatus::Up);
    /// assert_eq!(health.report("connection").unwrap().detail("blocked"), Some("false"));
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

    /// Serves `/acemq-health`, `/acemq-metrics` and `/acemq-info` for this connection on
    /// `addr` (the family's default is `127.0.0.1:9464`). Metrics are rendered from the
    /// Prometheus recorder the actuator installs when `install_recorder` is true (the
    /// library never installs one otherwise).
    #[cfg(feature = "actuator")]
    pub async fn start_actuator(
        &self,
        addr: std::net::SocketAddr,
        install_recorder: bool,
    ) -> Result<crate::actuator::ActuatorHandle, crate::actuator::ActuatorError> {
        let (health, in_flight) = (self.clone(), self.clone());
        let mut builder = crate::actuator::Actuator::builder()
            .bind(addr)
            .health(move || health.health())
            .in_flight(move || in_flight.in_flight() as u64)
            .info(crate::actuator::InfoDoc::new(
                self.transport_kind(),
                CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
            ));
        if install_recorder {
            builder = builder.install_prometheus_recorder();
        }
        builder.start().await
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
    /// [`HandlerError::fatal`] sends the message to `{q}.dlq` at once. A body that does not
    /// decode goes to `{q}.parked` without running the handler.
    pub async fn consume<T, F, Fut>(
        &self,
        queue: &str,
        options: ConsumerOptions,
        handler: F,
    ) -> Result<Consumer, Error>
    where
        T: DeserializeOwned + Send + 'static,
        F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.consume_with(queue, Json, options, handler).await
    }

    /// Consumes with another codec ([`crate::codec::Text`], [`crate::codec::RawBytes`],
    /// or your own [`Decoder`]).
    pub async fn consume_with<T, D, F, Fut>(
        &self,
        queue: &str,
        decoder: D,
        options: ConsumerOptions,
        handler: F,
    ) -> Result<Consumer, Error>
    where
        T: Send + 'static,
        D: Decoder<T>,
        F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        crate::consume::start(&self.engine, queue, decoder, options, handler).await
    }

    /// Registers a consume interceptor for every consumer of this connection.
    pub fn intercept_consume(&self, interceptor: impl ConsumeInterceptor) {
        self.engine.interceptors.add_consume(Arc::new(interceptor));
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
}
