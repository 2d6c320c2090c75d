//! The three endpoints as an axum [`Router`]: what each answers, from the sources the
//! builder was given.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::info::InfoDoc;
use super::{
    HEALTH_PATH, INFO_PATH, LIVENESS_PATH, METRICS_PATH, PROMETHEUS_CONTENT_TYPE, READINESS_PATH,
    prometheus,
};
use crate::health::{COMPONENT, Health, HealthReport, panic_text};

pub(super) type HealthFn = Arc<dyn Fn() -> Health + Send + Sync>;
pub(super) type CountFn = Arc<dyn Fn() -> u64 + Send + Sync>;
pub(super) type RenderFn = Arc<dyn Fn() -> String + Send + Sync>;

/// Where each endpoint's answer comes from.
pub(super) struct Endpoints {
    pub(super) health: Option<HealthFn>,
    pub(super) in_flight: Option<CountFn>,
    pub(super) info: InfoDoc,
    /// `None`: the recorder `install_prometheus_recorder` installed, if any.
    pub(super) render: Option<RenderFn>,
}

/// The three routes, no fallback (so the router merges into an application's).
pub(super) fn routes(state: Arc<Endpoints>) -> Router {
    Router::new()
        .route(HEALTH_PATH, get(health_endpoint))
        .route(LIVENESS_PATH, get(health_endpoint))
        .route(READINESS_PATH, get(readiness_endpoint))
        .route(METRICS_PATH, get(metrics_endpoint))
        .route(INFO_PATH, get(info_endpoint))
        .with_state(state)
}

/// The standalone server's fallback: a 404 naming the three paths.
pub(super) async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!(
            "not found; the AceMQ actuator serves {HEALTH_PATH} ({LIVENESS_PATH}, {READINESS_PATH}), {METRICS_PATH} and {INFO_PATH}\n"
        ),
    )
        .into_response()
}

/// What `/acemq-health` answers: no source is `{"status":"UNKNOWN"}` (200).
pub(super) enum HealthAnswer {
    Unknown,
    Known(Health),
}

/// The health answer: status code and document. Down is 503, everything else 200.
pub(super) fn health_answer(e: &Endpoints) -> (StatusCode, HealthAnswer) {
    let Some(source) = &e.health else {
        return (StatusCode::OK, HealthAnswer::Unknown);
    };
    let mut health = catch_unwind(AssertUnwindSafe(|| source())).unwrap_or_else(|panic| {
        Health::from_reports(vec![HealthReport::down("health").with_detail(
            "error",
            format!("health source panicked: {}", panic_text(panic.as_ref())),
        )])
    });
    if let Some(count) = &e.in_flight
        && let Some(acemq) = health.reports.iter_mut().find(|r| r.name == COMPONENT)
        && !acemq.details.contains_key("inFlight")
        && let Ok(n) = catch_unwind(AssertUnwindSafe(|| count()))
    {
        acemq.details.insert("inFlight".into(), n.into());
    }
    let code = if health.is_down() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, HealthAnswer::Known(health))
}

async fn health_endpoint(State(e): State<Arc<Endpoints>>) -> Response {
    match health_answer(&e) {
        (code, HealthAnswer::Known(health)) => (code, axum::Json(health)).into_response(),
        (code, HealthAnswer::Unknown) => {
            (code, axum::Json(serde_json::json!({"status": "UNKNOWN"}))).into_response()
        }
    }
}

/// The health document, 503 unless ready ([`Health::is_ready`]); no source is not ready.
async fn readiness_endpoint(State(e): State<Arc<Endpoints>>) -> Response {
    match health_answer(&e) {
        (_, HealthAnswer::Known(health)) => {
            let code = if health.is_ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (code, axum::Json(health)).into_response()
        }
        (_, HealthAnswer::Unknown) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "UNKNOWN"})),
        )
            .into_response(),
    }
}

async fn metrics_endpoint(State(e): State<Arc<Endpoints>>) -> Response {
    let body = match (&e.render, prometheus::installed()) {
        (Some(render), _) => catch_unwind(AssertUnwindSafe(|| render())).unwrap_or_else(|panic| {
            format!(
                "# acemq: metrics rendering panicked: {}\n",
                panic_text(panic.as_ref())
            )
        }),
        (None, Some(handle)) => prometheus::render(handle),
        (None, None) => "# acemq: no metrics recorder is served here; see acemq::actuator::install_prometheus_recorder\n".to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::HealthStatus;

    fn endpoints(status: HealthStatus) -> Endpoints {
        Endpoints {
            health: Some(Arc::new(move || {
                Health::from_reports(vec![HealthReport::new(COMPONENT, status)])
            })),
            in_flight: Some(Arc::new(|| 2)),
            info: InfoDoc::default(),
            render: None,
        }
    }

    fn doc(answer: HealthAnswer) -> serde_json::Value {
        match answer {
            HealthAnswer::Known(h) => h.to_json(),
            HealthAnswer::Unknown => serde_json::json!({"status": "UNKNOWN"}),
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
        let (code, answer) = health_answer(&endpoints(HealthStatus::Down));
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        let doc = doc(answer);
        assert_eq!(doc["status"], "DOWN");
        assert_eq!(doc["components"]["acemq"]["details"]["inFlight"], 2);
        assert!(doc.get("inFlight").is_none(), "not at the top level: {doc}");
    }

    #[test]
    fn a_panicking_source_is_down_not_a_dropped_connection() {
        let e = Endpoints {
            health: Some(Arc::new(|| panic!("boom"))),
            in_flight: Some(Arc::new(|| panic!("also boom"))),
            info: InfoDoc::default(),
            render: None,
        };
        let (code, answer) = health_answer(&e);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        let doc = doc(answer);
        assert_eq!(doc["components"]["health"]["status"], "DOWN");
    }

    #[test]
    fn no_source_is_unknown() {
        let e = Endpoints {
            health: None,
            in_flight: None,
            info: InfoDoc::default(),
            render: None,
        };
        let (code, answer) = health_answer(&e);
        assert_eq!(code, StatusCode::OK);
        assert_eq!(doc(answer), serde_json::json!({"status": "UNKNOWN"}));
    }

    #[test]
    fn info_is_the_contracts_fields() {
        let v =
            serde_json::to_value(InfoDoc::new("amqp", vec!["x".into()]).application("svc", "1.2"))
                .unwrap_or_default();
        let mut keys: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "capabilities",
                "library",
                "libraryVersion",
                "name",
                "transport",
                "version"
            ]
        );
        assert_eq!(v["library"], "acemq-rust");
        assert_eq!(v["version"], "1.2");
        assert_eq!(v["name"], "svc");
        assert_eq!(v["transport"], "rabbitmq");
        assert_eq!(v["capabilities"][0], "x");
        let bare = serde_json::to_value(InfoDoc::default()).unwrap_or_default();
        assert_eq!(bare["version"], "unknown");
    }
}
