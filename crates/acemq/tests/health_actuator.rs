//! The actuator over a real socket: status codes, the health document, info and 404.
#![cfg(feature = "actuator")]

mod http_client;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use acemq::actuator::{Actuator, ActuatorHandle, InfoDoc};
use acemq::health::{
    Health, HealthContributor, HealthRegistry, HealthReport, HealthStatus, connection_report,
};
use acemq::transport::TransportStatus;

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

/// What a connection would hold: its transport status and a registry of contributors.
#[derive(Clone)]
struct FakeConnection {
    status: Arc<Mutex<TransportStatus>>,
    registry: Arc<HealthRegistry>,
}

impl FakeConnection {
    fn new() -> Self {
        FakeConnection {
            status: Arc::new(Mutex::new(TransportStatus {
                connected: true,
                blocked: None,
            })),
            registry: Arc::new(HealthRegistry::new()),
        }
    }

    fn set(&self, connected: bool, blocked: Option<&str>) {
        *self.status.lock().expect("lock") = TransportStatus {
            connected,
            blocked: blocked.map(str::to_owned),
        };
    }

    /// Exactly what `Connection::health()` is meant to do.
    fn health(&self) -> Health {
        let status = self.status.lock().expect("lock").clone();
        self.registry.evaluate_with([connection_report(
            &status,
            &[("transport", "memory".to_string())],
        )])
    }
}

async fn start(conn: &FakeConnection) -> ActuatorHandle {
    let c = conn.clone();
    Actuator::builder()
        .bind(any_port())
        .health(move || c.health())
        .in_flight(|| 3)
        .info(InfoDoc::new(
            "memory",
            vec!["confirms".into(), "broker-retry".into()],
        ))
        .start()
        .await
        .expect("actuator starts")
}

struct Fixed(HealthStatus);
impl HealthContributor for Fixed {
    fn name(&self) -> String {
        "orders.partitions".into()
    }
    fn report(&self) -> Result<HealthReport, String> {
        Ok(HealthReport::new("orders.partitions", self.0).with_detail("halted", "1"))
    }
}

struct Panics;
impl HealthContributor for Panics {
    fn name(&self) -> String {
        "exploding".into()
    }
    fn report(&self) -> Result<HealthReport, String> {
        panic!("contributor blew up")
    }
}

#[tokio::test]
async fn up_degraded_down_answer_200_200_503() {
    let conn = FakeConnection::new();
    let actuator = start(&conn).await;
    let addr = actuator.local_addr();
    assert_ne!(addr.port(), 0);

    let a = http_client::get(addr, "/acemq-health").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.header("content-type")
            .is_some_and(|c| c.starts_with("application/json"))
    );
    let doc = a.json();
    assert_eq!(doc["status"], "UP");
    assert_eq!(doc["inFlight"], 3);
    assert_eq!(doc["components"]["connection"]["status"], "UP");
    assert_eq!(
        doc["components"]["connection"]["details"]["blocked"],
        "false"
    );
    assert_eq!(
        doc["components"]["connection"]["details"]["transport"],
        "memory"
    );

    conn.registry
        .register(Arc::new(Fixed(HealthStatus::Degraded)));
    let a = http_client::get(addr, "/acemq-health").await;
    assert_eq!(a.status, 200, "Degraded still answers 200: {}", a.body);
    let doc = a.json();
    assert_eq!(doc["status"], "DEGRADED");
    assert_eq!(doc["components"]["orders.partitions"]["status"], "DEGRADED");
    assert_eq!(
        doc["components"]["orders.partitions"]["details"]["halted"],
        "1"
    );

    conn.set(false, None);
    let a = http_client::get(addr, "/acemq-health").await;
    assert_eq!(a.status, 503, "{}", a.body);
    let doc = a.json();
    assert_eq!(doc["status"], "DOWN");
    assert_eq!(doc["components"]["connection"]["status"], "DOWN");
    assert_eq!(doc["components"]["connection"]["details"]["open"], "false");

    actuator.shutdown().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the port is released after shutdown"
    );
}

#[tokio::test]
async fn a_blocked_connection_is_up_with_its_reason() {
    let conn = FakeConnection::new();
    conn.set(true, Some("low on memory"));
    let actuator = start(&conn).await;
    let a = http_client::get(actuator.local_addr(), "/acemq-health").await;
    assert_eq!(a.status, 200, "{}", a.body);
    let doc = a.json();
    assert_eq!(doc["status"], "UP");
    let details = &doc["components"]["connection"]["details"];
    assert_eq!(doc["components"]["connection"]["status"], "UP");
    assert_eq!(details["blocked"], "true");
    assert_eq!(details["blockedReason"], "low on memory");
    assert_eq!(
        details["detail"],
        "the broker has blocked this connection: low on memory"
    );
    actuator.shutdown().await;
}

#[tokio::test]
async fn a_panicking_contributor_is_down_and_the_endpoint_still_answers() {
    let conn = FakeConnection::new();
    conn.registry.register(Arc::new(Panics));
    conn.registry.register(Arc::new(Fixed(HealthStatus::Up)));
    let actuator = start(&conn).await;
    let addr = actuator.local_addr();
    for _ in 0..2 {
        let a = http_client::get(addr, "/acemq-health").await;
        assert_eq!(a.status, 503, "{}", a.body);
        let doc = a.json();
        assert_eq!(doc["status"], "DOWN");
        assert_eq!(doc["components"]["exploding"]["status"], "DOWN");
        assert!(
            doc["components"]["exploding"]["details"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("contributor blew up")),
            "{doc}"
        );
        assert_eq!(doc["components"]["connection"]["status"], "UP");
        assert_eq!(doc["components"]["orders.partitions"]["status"], "UP");
    }
    // The server survived: other endpoints still work.
    assert_eq!(http_client::get(addr, "/acemq-info").await.status, 200);
    actuator.shutdown().await;
}

#[tokio::test]
async fn info_metrics_without_recorder_and_404() {
    let conn = FakeConnection::new();
    let actuator = start(&conn).await;
    let addr = actuator.local_addr();

    let info = http_client::get(addr, "/acemq-info").await;
    assert_eq!(info.status, 200);
    let doc = info.json();
    assert_eq!(doc["library"], "acemq-rust");
    assert_eq!(doc["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(doc["transport"], "memory");
    assert_eq!(doc["capabilities"][1], "broker-retry");

    // No recorder was installed: an empty, valid exposition (comments only).
    let m = http_client::get(addr, "/acemq-metrics").await;
    assert_eq!(m.status, 200);
    assert!(
        m.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4"))
    );
    assert!(
        m.body.lines().all(|l| l.is_empty() || l.starts_with('#')),
        "{}",
        m.body
    );

    let nf = http_client::get(addr, "/actuator/health").await;
    assert_eq!(nf.status, 404);
    assert!(nf.body.contains("/acemq-health"));
    actuator.shutdown().await;
}

#[tokio::test]
async fn metrics_render_serves_the_applications_recorder() {
    let actuator = Actuator::builder()
        .bind(any_port())
        .metrics_render(|| "acemq_consume_total{outcome=\"acked\"} 7\n".to_owned())
        .start()
        .await
        .expect("actuator starts");
    let m = http_client::get(actuator.local_addr(), "/acemq-metrics").await;
    assert_eq!(m.body, "acemq_consume_total{outcome=\"acked\"} 7\n");
    // No health source: UNKNOWN, 200.
    let h = http_client::get(actuator.local_addr(), "/acemq-health").await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "UNKNOWN");
    actuator.shutdown().await;
}

#[tokio::test]
async fn binding_a_taken_port_fails_with_the_address() {
    let first = Actuator::builder()
        .bind(any_port())
        .start()
        .await
        .expect("first");
    let err = Actuator::builder()
        .bind(first.local_addr())
        .start()
        .await
        .expect_err("the port is taken");
    assert!(
        err.to_string().contains(&first.local_addr().to_string()),
        "{err}"
    );
    first.shutdown().await;
}
