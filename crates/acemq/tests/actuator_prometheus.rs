//! The opt-in Prometheus recorder. It is process-global, so this is the only test binary
//! that installs it, and it does so once.

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
        "memory",
        "orders.placed",
        "OrderPlaced",
        ConsumeOutcome::Retried,
        Duration::from_millis(12),
    );
    let handle = ConsumeMetrics::new("memory", "orders.placed", "OrderPlaced");
    handle.record(ConsumeOutcome::Retried, Duration::from_millis(3));
    handle.record(ConsumeOutcome::Parked, Duration::from_millis(1));
    handle.in_flight(2);
    record_publish(
        "memory",
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
    assert!(line.contains("transport=\"memory\""), "{line}");
    assert!(
        line.ends_with(" 2"),
        "free function and handle share the series: {line}"
    );
    let labels = "queue=\"orders.placed\",message_type=\"OrderPlaced\",transport=\"memory\"";
    assert!(
        body.contains(&format!("acemq_messages_retried_total{{{labels}}} 2")),
        "{body}"
    );
    assert!(
        body.contains(&format!(
            "acemq_messages_dead_lettered_total{{{labels},outcome=\"parked\"}} 1"
        )),
        "{body}"
    );
    assert!(
        body.contains(&format!("acemq_consume_in_flight{{{labels}}} 2")),
        "{body}"
    );
    assert!(
        body.lines().any(|l| l.starts_with("acemq_publish_total{")
            && l.contains("routing_key=\"orders.placed\"")
            && l.contains("outcome=\"confirmed\"")),
        "{body}"
    );
    // Timers are histograms in seconds, not summaries.
    assert!(
        body.contains("# TYPE acemq_consume_duration_seconds histogram"),
        "{body}"
    );
    assert!(!body.contains("quantile="), "no summaries: {body}");
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
        sample(
            "acemq_consume_duration_seconds_count",
            &["outcome=\"retried\""]
        )
        .as_deref(),
        Some("2"),
        "{body}"
    );
    // 3 ms and 12 ms: both under the 25 ms bucket, neither under 2.5 ms.
    assert_eq!(
        sample(
            "acemq_consume_duration_seconds_bucket",
            &["outcome=\"retried\"", "le=\"0.025\""]
        )
        .as_deref(),
        Some("2"),
        "{body}"
    );
    assert_eq!(
        sample(
            "acemq_consume_duration_seconds_bucket",
            &["outcome=\"retried\"", "le=\"0.0025\""]
        )
        .as_deref(),
        Some("0"),
        "{body}"
    );
    assert_eq!(
        sample(
            "acemq_consume_duration_seconds_count",
            &["outcome=\"parked\""]
        )
        .as_deref(),
        Some("1"),
        "{body}"
    );
    assert_eq!(
        sample(
            "acemq_publish_duration_seconds_count",
            &["outcome=\"confirmed\""]
        )
        .as_deref(),
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
