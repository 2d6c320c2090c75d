//! The HTTP actuator (feature `actuator`): `/acemq-health`, `/acemq-metrics`, `/acemq-info`.
//!
#![doc = include_str!("../../docs/actuator.md")]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Connection;
use crate::health::Health;
use endpoints::{CountFn, Endpoints, HealthFn, RenderFn};

pub use info::InfoDoc;
pub use prometheus::{install_prometheus_recorder, prometheus_builder};

mod endpoints;
mod info;
mod prometheus;

/// The default bind address, shared by the family.
pub const DEFAULT_BIND: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
    DEFAULT_PORT,
);
/// The default port.
pub const DEFAULT_PORT: u16 = 9464;
/// The health path.
pub const HEALTH_PATH: &str = "/acemq-health";
/// The liveness view of health: 503 only when `Down` (a restart would help).
pub const LIVENESS_PATH: &str = "/acemq-health/liveness";
/// The readiness view of health: 503 unless every component is `Up` and consuming is
/// neither paused nor draining ([`crate::health::Health::is_ready`]).
pub const READINESS_PATH: &str = "/acemq-health/readiness";
/// The Prometheus metrics path.
pub const METRICS_PATH: &str = "/acemq-metrics";
/// The info path.
pub const INFO_PATH: &str = "/acemq-info";
/// The metrics endpoint's content type (Prometheus text format 0.0.4).
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long [`ActuatorHandle::shutdown`] waits for open requests before aborting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The three endpoints for `connection`, as a router to merge into an application's own
/// axum app (no fallback, no state left to provide): its health, its `/acemq-info`
/// (application `name` = the connection's name, `version` `unknown`; use
/// [`Actuator::for_connection`] + [`ActuatorBuilder::application`] to set them) and the
/// Prometheus rendering of [`install_prometheus_recorder`]'s recorder when it was
/// installed (a comment line otherwise).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::{Router, routing::get};
/// let mq = acemq::Connection::connect("memory://doc-router").await?;
/// acemq::actuator::install_prometheus_recorder()?; // once, before traffic
/// let app = Router::new()
///     .route("/orders", get(|| async { "orders" }))
///     .merge(acemq::actuator::router(&mq));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await?;
/// # Ok(()) }
/// ```
pub fn router(connection: &Connection) -> Router {
    Actuator::for_connection(connection).router()
}

/// Why the actuator did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActuatorError {
    /// The address could not be bound (in use, not permitted).
    #[error("cannot bind the actuator to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The Prometheus recorder could not be installed (another global recorder is).
    #[error(
        "cannot install the Prometheus recorder: {0}; pass metrics_render(..) to serve an existing recorder"
    )]
    Recorder(String),
}

/// Entry point: [`Actuator::builder`] or [`Actuator::for_connection`].
#[derive(Debug)]
pub struct Actuator;

impl Actuator {
    /// A builder with the defaults: `127.0.0.1:9464`, no health source (`UNKNOWN`), no
    /// metrics recorder of its own, an info document with transport `unknown`.
    pub fn builder() -> ActuatorBuilder {
        ActuatorBuilder::default()
    }

    /// A builder serving `connection`: its health (with `inFlight`), and an info document
    /// with its transport (`rabbitmq` / `memory`), every capability
    /// ([`CAPABILITIES`](crate::connection::CAPABILITIES)), and the application named after
    /// the connection (`ConnectionOptions::name`, default `acemq`), version `unknown` until
    /// [`ActuatorBuilder::application`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let mq = acemq::Connection::connect("memory://doc-for-connection").await?;
    /// let actuator = acemq::actuator::Actuator::for_connection(&mq)
    ///     .application(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
    ///     .install_prometheus_recorder()
    ///     .start()
    ///     .await?;
    /// # actuator.shutdown().await; Ok(()) }
    /// ```
    pub fn for_connection(connection: &Connection) -> ActuatorBuilder {
        let health = connection.clone();
        let name = connection
            .origin()
            .split('@')
            .next()
            .unwrap_or(info::UNKNOWN)
            .to_owned();
        let info = InfoDoc::new(
            connection.transport_kind(),
            crate::connection::CAPABILITIES
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
        )
        .application(name, info::UNKNOWN);
        ActuatorBuilder::default()
            .health(move || health.health())
            .info(info)
    }
}

/// Configures and starts the actuator, or builds its [`Router`].
#[derive(Clone)]
pub struct ActuatorBuilder {
    bind: SocketAddr,
    health: Option<HealthFn>,
    in_flight: Option<CountFn>,
    info: InfoDoc,
    install: bool,
    render: Option<RenderFn>,
}

impl Default for ActuatorBuilder {
    fn default() -> Self {
        ActuatorBuilder {
            bind: DEFAULT_BIND,
            health: None,
            in_flight: None,
            info: InfoDoc::default(),
            install: false,
            render: None,
        }
    }
}

impl std::fmt::Debug for ActuatorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActuatorBuilder")
            .field("bind", &self.bind)
            .field("health", &self.health.is_some())
            .field("in_flight", &self.in_flight.is_some())
            .field("info", &self.info)
            .field("install", &self.install)
            .finish_non_exhaustive()
    }
}

impl ActuatorBuilder {
    /// Where to listen (default `127.0.0.1:9464`; port 0 picks a free port, see
    /// [`ActuatorHandle::local_addr`]).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// The health source, called on every `/acemq-health` request; typically
    /// `move || mq.health()`. It must answer from local state (see [`crate::health`]). A
    /// panic in it is answered as Down with the panic text under component `health`.
    pub fn health(mut self, f: impl Fn() -> Health + Send + Sync + 'static) -> Self {
        self.health = Some(Arc::new(f));
        self
    }

    /// An `inFlight` figure for the `acemq` component, used when the health source's report
    /// has none (a connection's own report always has it).
    pub fn in_flight(mut self, f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.in_flight = Some(Arc::new(f));
        self
    }

    /// The `/acemq-info` document.
    pub fn info(mut self, info: InfoDoc) -> Self {
        self.info = info;
        self
    }

    /// The application's name and version in `/acemq-info` (typically
    /// `env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")`, written in the application's
    /// crate). Default: `unknown` (the connection's name for the name, when built by
    /// [`Actuator::for_connection`]).
    pub fn application(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.info = self.info.application(name, version);
        self
    }

    /// Opt in to installing the family's Prometheus recorder
    /// ([`install_prometheus_recorder`]) as the process-wide global recorder when the
    /// actuator starts. Without it, `/acemq-metrics` serves that recorder if something
    /// installed it, the [`ActuatorBuilder::metrics_render`] source if given, or a comment
    /// line. The library never installs a recorder on its own.
    pub fn install_prometheus_recorder(mut self) -> Self {
        self.install = true;
        self
    }

    /// Serve `/acemq-metrics` from a recorder the application installed itself (for
    /// example `move || prometheus_handle.render()`; build it from [`prometheus_builder`]
    /// for the family's names and histograms).
    pub fn metrics_render(mut self, f: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.render = Some(Arc::new(f));
        self
    }

    /// The three endpoints as a router without a fallback, to merge into an application's
    /// axum app (see [`router`]). [`ActuatorBuilder::install_prometheus_recorder`] and
    /// [`ActuatorBuilder::bind`] are for [`ActuatorBuilder::start`] only; here, call
    /// [`install_prometheus_recorder`] yourself.
    pub fn router(self) -> Router {
        endpoints::routes(Arc::new(Endpoints {
            health: self.health,
            in_flight: self.in_flight,
            info: self.info,
            render: self.render,
        }))
    }

    /// Binds, installs the Prometheus recorder when asked, and serves the endpoints (and a
    /// 404 naming them for anything else) in a background task.
    pub async fn start(mut self) -> Result<ActuatorHandle, ActuatorError> {
        let listener = tokio::net::TcpListener::bind(self.bind)
            .await
            .map_err(|source| ActuatorError::Bind {
                addr: self.bind,
                source,
            })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| ActuatorError::Bind {
                addr: self.bind,
                source,
            })?;
        if self.install && self.render.is_none() {
            let handle = install_prometheus_recorder()?;
            self.render = Some(Arc::new(move || prometheus::render(&handle)));
        }
        let app = self.router().fallback(endpoints::not_found);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stop_rx.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "acemq actuator stopped with an error");
            }
        });
        tracing::info!(addr = %local_addr, "acemq actuator listening");
        Ok(ActuatorHandle {
            local_addr,
            stop: Some(stop_tx),
            server: Some(server),
        })
    }
}

/// A running actuator. Dropping it stops the server without waiting; prefer
/// [`ActuatorHandle::shutdown`].
#[derive(Debug)]
pub struct ActuatorHandle {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl ActuatorHandle {
    /// The address actually bound (the chosen port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, lets requests in progress finish (up to five seconds), and waits.
    /// The Prometheus recorder, if installed, stays installed: a global recorder cannot be
    /// removed.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut server) = self.server.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut server)
                .await
                .is_err()
        {
            server.abort();
        }
    }
}

impl Drop for ActuatorHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The actuator's own convenience on the connection, defined here (with the feature) so
/// that the connection does not depend on the actuator.
impl crate::Connection {
    /// Serves `/acemq-health`, `/acemq-metrics` and `/acemq-info` for this connection on
    /// `addr` (the family's default is `127.0.0.1:9464`), installing no recorder (the
    /// library never installs one by itself). The builder,
    /// [`Actuator::for_connection`](crate::actuator::Actuator::for_connection), does the
    /// rest: `.install_prometheus_recorder()` for metrics rendered by the actuator, the
    /// application's name and version in `/acemq-info`; and
    /// [`actuator::router`](crate::actuator::router) mounts the endpoints into an existing
    /// axum app.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mq = acemq::Connection::connect("memory://doc-actuator").await?;
    /// let actuator = mq.start_actuator("127.0.0.1:9464".parse()?).await?;
    /// println!("health at http://{}/acemq-health", actuator.local_addr());
    /// # Ok(()) }
    /// ```
    pub async fn start_actuator(
        &self,
        addr: std::net::SocketAddr,
    ) -> Result<ActuatorHandle, ActuatorError> {
        Actuator::for_connection(self).bind(addr).start().await
    }
}
