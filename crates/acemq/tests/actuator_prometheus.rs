//! The opt-in Prometheus recorder. It is process-global, so this is the only test binary
//! that installs it, and it does so once.
#![cfg(feature = "actuator")]

mod http_client;

use std::time::Duration;

use acemq::actuator::Actuator;
use acemq::observe::metrics::{
    ConsumeMetrics, ConsumeOutcome, PublishOutcome, record_consume, record_publish,
};

#[tokio::test]
async fn metrics_endpoint_renders_family_names_with_underscores() {
    let actuator = Actuator::builder()
        .bind("127.0.0.1:0".parse().expect("address"))
        .install_prometheus_recorder()
        .start()
        .await
        .expect("actuator starts and installs the recorder");
    let addr = actuator.local_addr();

    record_consume(
        "orders.placed",
        "OrderPlaced",
        ConsumeOutcome::Retried,
        Duration::from_millis(12),
    );
    let handle = ConsumeMetrics::new("orders.placed", "OrderPlaced");
    handle.record(ConsumeOutcome::Retried, Duration::from_millis(3));
    handle.record(ConsumeOutcome::Parked, Duration::from_millis(1));
    handle.in_flight(2);
    record_publish(
        "",
        "orders.placed",
        "OrderPlaced",
        PublishOutcome::Confirmed,
        Duration::from_millis(1),
    );

    let m = http_client::get(addr, "/acemq-metrics").await;
    assert_eq!(m.status, 200);
    let body = &m.body;
    let line = body
        .lines()
        .find(|l| l.starts_with("acemq_consume_total{") && l.contains("outcome=\"retried\""))
        .unwrap_or_else(|| panic!("no retried series in:\n{body}"));
    assert!(line.contains("queue=\"orders.placed\""), "{line}");
    assert!(line.contains("message_type=\"OrderPlaced\""), "{line}");
    assert!(
        line.ends_with(" 2"),
        "free function and handle share the series: {line}"
    );
    assert!(body.contains("acemq_messages_retried_total 2"), "{body}");
    assert!(
        body.contains("acemq_messages_dead_lettered_total{outcome=\"parked\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("acemq_consume_in_flight{queue=\"orders.placed\"} 2"),
        "{body}"
    );
    assert!(
        body.lines().any(|l| l.starts_with("acemq_publish_total{")
            && l.contains("routing_key=\"orders.placed\"")
            && l.contains("outcome=\"confirmed\"")),
        "{body}"
    );
    assert!(body.contains("acemq_consume_duration"), "{body}");
    // Exact counts, not just presence: one confirmed publish, two retried and one parked
    // consume timings.
    let sample = |metric: &str, labels: &[&str]| -> Option<String> {
        body.lines()
            .find(|l| l.starts_with(&format!("{metric}{{")) && labels.iter().all(|x| l.contains(x)))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(
        sample(
            "acemq_publish_total",
            &["routing_key=\"orders.placed\"", "outcome=\"confirmed\""]
        )
        .as_deref(),
        Some("1"),
        "{body}"
    );
    assert_eq!(
        sample("acemq_consume_duration_count", &["outcome=\"retried\""]).as_deref(),
        Some("2"),
        "{body}"
    );
    assert_eq!(
        sample("acemq_consume_duration_count", &["outcome=\"parked\""]).as_deref(),
        Some("1"),
        "{body}"
    );
    assert_eq!(
        sample("acemq_publish_duration_count", &["outcome=\"confirmed\""]).as_deref(),
        Some("1"),
        "{body}"
    );

    // A second install fails: the global recorder is taken.
    let second = Actuator::builder()
        .bind("127.0.0.1:0".parse().expect("address"))
        .install_prometheus_recorder()
        .start()
        .await;
    assert!(second.is_err());
    actuator.shutdown().await;
}
