//! The AceMQ connection: the entry point that owns a transport and hands out publishers,
//! consumers and replays.
//!
//! `Connection::connect(url)` picks the transport by scheme: `amqp://` and `amqps://` reach
//! RabbitMQ, `memory://name` an in-process broker (each name its own).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Semaphore;

use crate::envelope::{DEFAULT_CLIENT_NAME, origin_for};
use crate::error::Error;
use crate::health::{Health, HealthContributor, HealthRegistry, HealthReport, connection_report};

/// The health component listing this connection's consumers.
pub const CONSUMERS: &str = "consumers";
use crate::intercept::Interceptors;
use crate::lifecycle::Lifecycle;
use crate::topology::Topology;
use crate::transport::{Transport, TransportStatus};

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

/// How a connection is set up.
///
/// ```
/// use acemq::connection::ConnectionOptions;
/// let o = ConnectionOptions::default().client_name("orders-service");
/// assert_eq!(o.get_client_name(), "orders-service");
/// ```
#[derive(Clone, Debug)]
pub struct ConnectionOptions {
    client_name: String,
    max_outstanding_confirms: usize,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            client_name: DEFAULT_CLIENT_NAME.into(),
            max_outstanding_confirms: DEFAULT_MAX_OUTSTANDING_CONFIRMS,
        }
    }
}

impl ConnectionOptions {
    /// The client name stamped in `x-acemq-origin` as `{client}@{hostname}` (default `acemq`).
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// The window of publishes awaiting their confirm (default 1000, at least 1).
    pub fn max_outstanding_confirms(mut self, n: usize) -> Self {
        self.max_outstanding_confirms = n.max(1);
        self
    }

    /// The configured client name.
    pub fn get_client_name(&self) -> &str {
        &self.client_name
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
    pub(crate) shared: Arc<Shared>,
}

/// State shared by everything a connection hands out.
pub(crate) struct Shared {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) origin: String,
    pub(crate) window: Arc<Semaphore>,
    pub(crate) publishing_paused: AtomicBool,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) interceptors: Interceptors,
    pub(crate) health: HealthRegistry,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("transport", &self.transport.kind())
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects with default options. Schemes: `amqp`, `amqps`, `memory`.
    pub async fn connect(url: &str) -> Result<Connection, Error> {
        Self::connect_with(url, ConnectionOptions::default()).await
    }

    /// Connects with options.
    pub async fn connect_with(url: &str, options: ConnectionOptions) -> Result<Connection, Error> {
        let transport = crate::transport::connect(url).await?;
        Ok(Self::with_transport(transport, options))
    }

    /// Wraps an already open transport.
    pub fn with_transport(transport: Arc<dyn Transport>, options: ConnectionOptions) -> Connection {
        Connection {
            shared: Arc::new(Shared {
                transport,
                origin: origin_for(&options.client_name),
                window: Arc::new(Semaphore::new(options.max_outstanding_confirms)),
                publishing_paused: AtomicBool::new(false),
                lifecycle: Lifecycle::default(),
                interceptors: Interceptors::default(),
                health: HealthRegistry::new(),
            }),
        }
    }

    /// The transport underneath (for inspection and tests).
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.shared.transport
    }

    /// `"amqp"` or `"memory"`.
    pub fn transport_kind(&self) -> &'static str {
        self.shared.transport.kind()
    }

    /// `{client}@{hostname}`, stamped on every publish that has no origin.
    pub fn origin(&self) -> &str {
        &self.shared.origin
    }

    /// Connected / blocked, answered locally.
    pub fn status(&self) -> TransportStatus {
        self.shared.transport.status()
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
        let lifecycle = &self.shared.lifecycle;
        let mut extra = vec![
            ("transport", self.transport_kind().to_owned()),
            ("inFlight", lifecycle.in_flight().to_string()),
            ("held", lifecycle.held().to_string()),
        ];
        if lifecycle.consuming_paused() {
            extra.push(("consuming", "paused".into()));
        }
        if self.shared.publishing_paused.load(Ordering::SeqCst) {
            extra.push(("publishing", "paused".into()));
        }
        let stopped = lifecycle.stopped_consumers();
        let mut consumers = if stopped.is_empty() {
            HealthReport::up(CONSUMERS)
        } else {
            HealthReport::degraded(CONSUMERS)
        };
        consumers = consumers.with_detail("running", lifecycle.running_consumers().to_string());
        for (queue, reason) in stopped {
            consumers = consumers.with_detail(format!("stopped.{queue}"), reason);
        }
        self.shared
            .health
            .evaluate_with([connection_report(&self.status(), &extra), consumers])
    }

    /// Adds a component to [`Connection::health`]. A contributor that errors or panics
    /// reports Down under its own name; it never takes the rest of the report with it.
    pub fn register_health(&self, contributor: impl HealthContributor + 'static) {
        self.shared.health.register(Arc::new(contributor));
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
        let t = &self.shared.transport;
        for e in topology.exchanges() {
            t.declare_exchange(e).await?;
        }
        for q in topology.queues() {
            t.declare_queue(q).await?;
        }
        for b in topology.bindings() {
            t.bind_queue(b).await?;
        }
        Ok(())
    }

    /// Further publishes fail with [`Error::PublishingPaused`]; nothing is sent.
    pub fn pause_publishing(&self) {
        self.shared.publishing_paused.store(true, Ordering::SeqCst);
    }

    /// Publishing works again.
    pub fn resume_publishing(&self) {
        self.shared.publishing_paused.store(false, Ordering::SeqCst);
    }
}
