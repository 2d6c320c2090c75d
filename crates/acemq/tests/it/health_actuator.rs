//! The actuator over a real socket: status codes, the health document, info and 404,
//! served for a real [`Connection`] on `memory://` (its health, in-flight count and info,
//! not a stand-in's).

use crate::http_client;
use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use acemq::Connection;
use acemq::actuator::{Actuator, ActuatorHandle, InfoDoc};
use acemq::connection::CAPABILITIES;
use acemq::consume::{Consumer, ConsumerOptions, Message};
use acemq::health::{HealthContributor, HealthReport, HealthStatus};
use acemq::transport::memory::MemoryBroker;
use support::{declare_classic, eventually, unique};

const WAIT: Duration = Duration::from_secs(10);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

/// A real connection on a fresh `memory://` broker, and that broker.
async fn connect() -> (Connection, Arc<MemoryBroker>) {
    let name = unique("health-actuator");
    let mq = Connection::connect(&format!("memory://{name}"))
        .await
        .expect("connect");
    (mq, MemoryBroker::named(&name))
}

/// The connection's own actuator (`Connection::start_actuator`), no recorder installed.
async fn start(mq: &Connection) -> ActuatorHandle {
    mq.start_actuator(any_port())
        .await
        .expect("actuator starts")
}

/// Three handlers running at once and held until `release` is notified: the
/// connection's in-flight count is 3.
async fn three_in_flight(mq: &Connection, release: Arc<tokio::sync::Notify>) -> Consumer {
    let q = unique("health-actuator.busy");
    declare_classic(mq, &q).await;
    let consumer = mq
        .consume(
            &q,
            ConsumerOptions::default().concurrency(3).prefetch(3),
            move |_m: Message<u32>| {
                let release = release.clone();
                async move {
                    release.notified().await;
                    Ok(())
                }
            },
        )
        .await
        .expect("consume");
    let p = mq.publisher::<u32>("", &q);
    for n in 0..3 {
        p.send(&n).await.expect("publish");
    }
    eventually(WAIT, "three handlers in flight", || async {
        (mq.in_flight() == 3).then_some(())
    })
    .await;
    consumer
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
    let (conn, _broker) = connect().await;
    let release = Arc::new(tokio::sync::Notify::new());
    let busy = three_in_flight(&conn, release.clone()).await;
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
    assert!(
        doc.get("inFlight").is_none(),
        "inFlight is a detail of acemq: {doc}"
    );
    assert_eq!(doc["components"]["acemq"]["details"]["inFlight"], 3);
    assert_eq!(doc["components"]["acemq"]["status"], "UP");
    assert_eq!(doc["components"]["acemq"]["details"]["blocked"], false);
    assert_eq!(doc["components"]["acemq"]["details"]["transport"], "memory");

    conn.register_health(Fixed(HealthStatus::Degraded));
    let a = http_client::get(addr, "/acemq-health").await;
    assert_eq!(a.status, 200, "Degraded still answers 200: {}", a.body);
    let doc = a.json();
    assert_eq!(doc["status"], "DEGRADED");
    assert_eq!(doc["components"]["orders.partitions"]["status"], "DEGRADED");
    assert_eq!(
        doc["components"]["orders.partitions"]["details"]["halted"],
        "1"
    );

    // The transport underneath goes away (as a dropped connection does).
    release.notify_waiters();
    conn.transport().close().await.expect("close the transport");
    eventually(WAIT, "the connection reported closed", || async {
        (!conn.status().connected).then_some(())
    })
    .await;
    let a = http_client::get(addr, "/acemq-health").await;
    assert_eq!(a.status, 503, "{}", a.body);
    let doc = a.json();
    assert_eq!(doc["status"], "DOWN");
    assert_eq!(doc["components"]["acemq"]["status"], "DOWN");
    assert_eq!(doc["components"]["acemq"]["details"]["open"], false);

    actuator.shutdown().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the port is released after shutdown"
    );
    busy.close().await;
    conn.close_now().await.ok();
}

#[tokio::test]
async fn a_blocked_connection_is_up_with_its_reason() {
    let (conn, broker) = connect().await;
    broker.block("low on memory");
    eventually(WAIT, "the blocked state", || async {
        conn.status().blocked.is_some().then_some(())
    })
    .await;
    let actuator = start(&conn).await;
    let a = http_client::get(actuator.local_addr(), "/acemq-health").await;
    assert_eq!(a.status, 200, "{}", a.body);
    let doc = a.json();
    assert_eq!(doc["status"], "UP");
    let details = &doc["components"]["acemq"]["details"];
    assert_eq!(doc["components"]["acemq"]["status"], "UP");
    assert_eq!(details["blocked"], true);
    assert_eq!(details["blockedReason"], "low on memory");
    assert_eq!(
        details["detail"],
        "the broker has blocked this connection: low on memory"
    );
    actuator.shutdown().await;
    broker.unblock();
    conn.close().await.expect("close");
}

#[tokio::test]
async fn a_panicking_contributor_is_down_and_the_endpoint_still_answers() {
    let (conn, _broker) = connect().await;
    conn.register_health(Panics);
    conn.register_health(Fixed(HealthStatus::Up));
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
        assert_eq!(doc["components"]["acemq"]["status"], "UP");
        assert_eq!(doc["components"]["orders.partitions"]["status"], "UP");
    }
    // The server survived: other endpoints still work.
    assert_eq!(http_client::get(addr, "/acemq-info").await.status, 200);
    actuator.shutdown().await;
    conn.close().await.expect("close");
}

#[tokio::test]
async fn info_metrics_without_recorder_and_404() {
    let (conn, _broker) = connect().await;
    // The application's own info document, with the connection's health behind it.
    let health = conn.clone();
    let actuator = Actuator::builder()
        .bind(any_port())
        .health(move || health.health())
        .info(InfoDoc::new(
            "memory",
            vec!["confirms".into(), "broker-retry".into()],
        ))
        .start()
        .await
        .expect("actuator starts");
    let addr = actuator.local_addr();

    let info = http_client::get(addr, "/acemq-info").await;
    assert_eq!(info.status, 200);
    let doc = info.json();
    assert_eq!(doc["library"], "acemq-rust");
    assert_eq!(doc["libraryVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(doc["version"], "unknown", "the application's, not set here");
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

    // The connection's own actuator reports its transport and every capability.
    let own = start(&conn).await;
    let doc = http_client::get(own.local_addr(), "/acemq-info")
        .await
        .json();
    assert_eq!(doc["library"], "acemq-rust");
    assert_eq!(doc["transport"], "memory");
    assert_eq!(doc["capabilities"], serde_json::json!(CAPABILITIES));
    let m = http_client::get(own.local_addr(), "/acemq-metrics").await;
    assert_eq!(m.status, 200);
    own.shutdown().await;
    conn.close().await.expect("close");
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
