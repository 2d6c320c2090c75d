//! The HTTP actuator (feature `actuator`): `/acemq-health`, `/acemq-metrics`, `/acemq-info`.
//!
#![doc = include_str!("../../../docs/actuator.md")]

use std::net::{Ipv4Addr, SocketAddr};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::health::{Health, HealthReport, panic_text};

/// The default bind address, shared by the family.
pub const DEFAULT_BIND: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
    DEFAULT_PORT,
);
/// The default port.
pub const DEFAULT_PORT: u16 = 9464;
/// The health path.
pub const HEALTH_PATH: &str = "/acemq-health";
/// The Prometheus metrics path.
pub const METRICS_PATH: &str = "/acemq-metrics";
/// The info path.
pub const INFO_PATH: &str = "/acemq-info";
/// The metrics endpoint's content type (Prometheus text format 0.0.4).
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How often the installed Prometheus recorder's upkeep runs (drains histogram buffers).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);
/// How long [`ActuatorHandle::shutdown`] waits for open requests before aborting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

type HealthFn = Arc<dyn Fn() -> Health + Send + Sync>;
type CountFn = Arc<dyn Fn() -> u64 + Send + Sync>;
type RenderFn = Arc<dyn Fn() -> String + Send + Sync>;

/// What `/acemq-info` answers.
///
/// ```
/// let info = acemq::actuator::InfoDoc::new("memory", vec!["confirms".into()]);
/// assert_eq!(info.library, "acemq-rust");
/// assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InfoDoc {
    /// Always `acemq-rust`.
    pub library: String,
    /// This crate's version.
    pub version: String,
    /// `amqp` or `memory`.
    pub transport: String,
    /// What the transport and configuration offer (free-form names).
    pub capabilities: Vec<String>,
    /// The application's name, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub application: Option<String>,
    /// The application's version, when given.
    #[serde(rename = "applicationVersion", skip_serializing_if = "Option::is_none")]
    pub application_version: Option<String>,
}

impl InfoDoc {
    /// The library's name and version with a transport and its capabilities.
    pub fn new(transport: impl Into<String>, capabilities: Vec<String>) -> Self {
        InfoDoc {
            library: "acemq-rust".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            transport: transport.into(),
            capabilities,
            application: None,
            application_version: None,
        }
    }

    /// Adds the application's name and version.
    pub fn application(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.application = Some(name.into());
        self.application_version = Some(version.into());
        self
    }
}

impl Default for InfoDoc {
    fn default() -> Self {
        InfoDoc::new("unknown", Vec::new())
    }
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

/// Entry point: [`Actuator::builder`].
#[derive(Debug)]
pub struct Actuator;

impl Actuator {
    /// A builder with the defaults: `127.0.0.1:9464`, no health source (`UNKNOWN`), no
    /// metrics, an info document with transport `unknown`.
    pub fn builder() -> ActuatorBuilder {
        ActuatorBuilder::default()
    }
}

#[derive(Clone, Default)]
enum MetricsSource {
    #[default]
    None,
    InstallPrometheus,
    Render(RenderFn),
}

/// Configures and starts the actuator.
#[derive(Clone)]
pub struct ActuatorBuilder {
    bind: SocketAddr,
    health: Option<HealthFn>,
    in_flight: Option<CountFn>,
    info: InfoDoc,
    metrics: MetricsSource,
}

impl Default for ActuatorBuilder {
    fn default() -> Self {
        ActuatorBuilder {
            bind: DEFAULT_BIND,
            health: None,
            in_flight: None,
            info: InfoDoc::default(),
            metrics: MetricsSource::None,
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

    /// The `inFlight` figure of the health document; typically `move || mq.in_flight()`.
    pub fn in_flight(mut self, f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.in_flight = Some(Arc::new(f));
        self
    }

    /// The `/acemq-info` document.
    pub fn info(mut self, info: InfoDoc) -> Self {
        self.info = info;
        self
    }

    /// Opt in to installing `metrics-exporter-prometheus`'s recorder as the process-wide
    /// global recorder when the actuator starts, and serve its rendering. Without this (or
    /// [`ActuatorBuilder::metrics_render`]) no recorder is installed by AceMQ and
    /// `/acemq-metrics` answers an empty document.
    pub fn install_prometheus_recorder(mut self) -> Self {
        self.metrics = MetricsSource::InstallPrometheus;
        self
    }

    /// Serve `/acemq-metrics` from a recorder the application installed itself (for
    /// example `move || prometheus_handle.render()`).
    pub fn metrics_render(mut self, f: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = MetricsSource::Render(Arc::new(f));
        self
    }

    /// Binds, installs the Prometheus recorder when asked, and serves in a background task.
    pub async fn start(self) -> Result<ActuatorHandle, ActuatorError> {
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

        let mut upkeep: Option<JoinHandle<()>> = None;
        let render: Option<RenderFn> = match self.metrics {
            MetricsSource::None => None,
            MetricsSource::Render(f) => Some(f),
            MetricsSource::InstallPrometheus => {
                let handle = PrometheusBuilder::new()
                    .install_recorder()
                    .map_err(|e| ActuatorError::Recorder(e.to_string()))?;
                crate::observe::metrics::describe();
                let for_upkeep = handle.clone();
                upkeep = Some(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(UPKEEP_EVERY);
                    loop {
                        tick.tick().await;
                        for_upkeep.run_upkeep();
                    }
                }));
                Some(Arc::new(move || render_prometheus(&handle)))
            }
        };

        let state = Arc::new(Endpoints {
            health: self.health,
            in_flight: self.in_flight,
            info: self.info,
            render,
        });
        let app = router(state);
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
            upkeep,
        })
    }
}

fn render_prometheus(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    let mut buf = Vec::new();
    match handle.render_to_write(&mut buf) {
        Ok(()) => String::from_utf8_lossy(&buf).into_owned(),
        Err(e) => format!("# acemq: rendering failed: {e}\n"),
    }
}

/// A running actuator. Dropping it stops the server without waiting; prefer
/// [`ActuatorHandle::shutdown`].
#[derive(Debug)]
pub struct ActuatorHandle {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    upkeep: Option<JoinHandle<()>>,
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
        if let Some(upkeep) = self.upkeep.take() {
            upkeep.abort();
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
        if let Some(upkeep) = self.upkeep.take() {
            upkeep.abort();
        }
    }
}

struct Endpoints {
    health: Option<HealthFn>,
    in_flight: Option<CountFn>,
    info: InfoDoc,
    render: Option<RenderFn>,
}

fn router(state: Arc<Endpoints>) -> Router {
    Router::new()
        .route(HEALTH_PATH, get(health_endpoint))
        .route(METRICS_PATH, get(metrics_endpoint))
        .route(INFO_PATH, get(info_endpoint))
        .fallback(not_found)
        .with_state(state)
}

/// The health answer: status code and JSON document. Down is 503, everything else 200.
fn health_answer(e: &Endpoints) -> (StatusCode, serde_json::Value) {
    let Some(source) = &e.health else {
        return (
            StatusCode::OK,
            serde_json::json!({"status": "UNKNOWN", "components": {}}),
        );
    };
    let health = catch_unwind(AssertUnwindSafe(|| source())).unwrap_or_else(|panic| {
        Health::from_reports(vec![HealthReport::down("health").with_detail(
            "error",
            format!("health source panicked: {}", panic_text(panic.as_ref())),
        )])
    });
    let in_flight = e
        .in_flight
        .as_ref()
        .and_then(|f| catch_unwind(AssertUnwindSafe(|| f())).ok());
    let code = if health.is_down() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, health.to_json(in_flight))
}

async fn health_endpoint(State(e): State<Arc<Endpoints>>) -> Response {
    let (code, doc) = health_answer(&e);
    (code, axum::Json(doc)).into_response()
}

async fn metrics_endpoint(State(e): State<Arc<Endpoints>>) -> Response {
    let body = match &e.render {
        Some(render) => catch_unwind(AssertUnwindSafe(|| render())).unwrap_or_else(|panic| {
            format!(
                "# acemq: metrics rendering panicked: {}\n",
                panic_text(panic.as_ref())
            )
        }),
        None => "# acemq: no metrics recorder is served here; see ActuatorBuilder::install_prometheus_recorder\n".to_owned(),
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        body,
    )
        .into_response()
}

async fn info_endpoint(State(e): State<Arc<Endpoints>>) -> Response {
    (StatusCode::OK, axum::Json(e.info.clone())).into_response()
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!(
            "not found; the AceMQ actuator serves {HEALTH_PATH}, {METRICS_PATH} and {INFO_PATH}\n"
        ),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::HealthStatus;

    fn endpoints(status: HealthStatus) -> Endpoints {
        Endpoints {
            health: Some(Arc::new(move || {
                Health::from_reports(vec![HealthReport::new("connection", status)])
            })),
            in_flight: Some(Arc::new(|| 2)),
            info: InfoDoc::default(),
            render: None,
        }
    }

    #[test]
    fn only_down_is_503() {
        assert_eq!(
            health_answer(&endpoints(HealthStatus::Up)).0,
            StatusCode::OK
        );
        assert_eq!(
            health_answer(&endpoints(HealthStatus::Degraded)).0,
            StatusCode::OK
        );
        let (code, doc) = health_answer(&endpoints(HealthStatus::Down));
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(doc["status"], "DOWN");
        assert_eq!(doc["inFlight"], 2);
    }

    #[test]
    fn a_panicking_source_is_down_not_a_dropped_connection() {
        let e = Endpoints {
            health: Some(Arc::new(|| panic!("boom"))),
            in_flight: Some(Arc::new(|| panic!("also boom"))),
            info: InfoDoc::default(),
            render: None,
        };
        let (code, doc) = health_answer(&e);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(doc["components"]["health"]["status"], "DOWN");
        assert!(doc.get("inFlight").is_none());
    }

    #[test]
    fn no_source_is_unknown() {
        let e = Endpoints {
            health: None,
            in_flight: None,
            info: InfoDoc::default(),
            render: None,
        };
        let (code, doc) = health_answer(&e);
        assert_eq!(code, StatusCode::OK);
        assert_eq!(doc["status"], "UNKNOWN");
    }

    #[test]
    fn info_serializes_camel_case() {
        let v = serde_json::to_value(
            InfoDoc::new("memory", vec!["x".into()]).application("svc", "1.2"),
        )
        .unwrap_or_default();
        assert_eq!(v["library"], "acemq-rust");
        assert_eq!(v["applicationVersion"], "1.2");
        assert_eq!(v["capabilities"][0], "x");
        let bare = serde_json::to_value(InfoDoc::default()).unwrap_or_default();
        assert!(bare.get("application").is_none());
    }
}
