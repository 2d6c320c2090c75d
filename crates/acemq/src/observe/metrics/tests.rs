use super::*;
use metrics::with_local_recorder;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

type Row = (CompositeKey, DebugValue);

fn rows(snap: &Snapshotter) -> Vec<Row> {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect()
}

fn find<'a>(
    rows: &'a [Row],
    kind: MetricKind,
    name: &str,
    tags: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    rows.iter()
        .find(|(k, _)| {
            k.kind() == kind
                && k.key().name() == name
                && k.key().labels().count() == tags.len()
                && tags
                    .iter()
                    .all(|(tk, tv)| k.key().labels().any(|l| l.key() == *tk && l.value() == *tv))
        })
        .map(|(_, v)| v)
}

fn counter_value(rows: &[Row], name: &str, tags: &[(&str, &str)]) -> Option<u64> {
    match find(rows, MetricKind::Counter, name, tags) {
        Some(DebugValue::Counter(n)) => Some(*n),
        _ => None,
    }
}

fn histogram_len(rows: &[Row], name: &str, tags: &[(&str, &str)]) -> usize {
    match find(rows, MetricKind::Histogram, name, tags) {
        Some(DebugValue::Histogram(v)) => v.len(),
        _ => 0,
    }
}

fn gauge_value(rows: &[Row], name: &str, tags: &[(&str, &str)]) -> Option<f64> {
    match find(rows, MetricKind::Gauge, name, tags) {
        Some(DebugValue::Gauge(g)) => Some(g.into_inner()),
        _ => None,
    }
}

#[test]
fn outcome_values_are_the_contracts() {
    let p: Vec<_> = PublishOutcome::ALL.iter().map(|o| o.as_str()).collect();
    assert_eq!(
        p,
        ["confirmed", "published", "unroutable", "failed", "refused"]
    );
    let c: Vec<_> = ConsumeOutcome::ALL.iter().map(|o| o.as_str()).collect();
    assert_eq!(
        c,
        [
            "acked",
            "retried",
            "dead_lettered",
            "parked",
            "rejected",
            "in_progress",
            "failed"
        ]
    );
    for (i, o) in PublishOutcome::ALL.iter().enumerate() {
        assert_eq!(o.index(), i);
    }
    for (i, o) in ConsumeOutcome::ALL.iter().enumerate() {
        assert_eq!(o.index(), i);
    }
}

#[test]
fn names_are_the_contracts() {
    assert_eq!(ALL_METRIC_NAMES.len(), 14);
    let table: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
    assert_eq!(table, ALL_METRIC_NAMES, "the table and the name list agree");
    for m in METRICS {
        assert!(m.name.starts_with("acemq."), "{}", m.name);
        assert!(
            m.labels.contains(&TAG_TRANSPORT),
            "{} has transport",
            m.name
        );
    }
    assert_eq!(CONSUME_ATTEMPTS, "acemq.consume.attempts");
    assert_eq!(CONSUME_IN_FLIGHT, "acemq.consume.in.flight");
    assert_eq!(
        MESSAGES_DEAD_LETTERED_TOTAL,
        "acemq.messages.dead.lettered.total"
    );
    assert_eq!(TAG_ROUTING_KEY, "routing.key");
    assert_eq!(TAG_MESSAGE_TYPE, "message.type");
}

#[test]
fn publish_is_counted_with_its_tags() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    with_local_recorder(&recorder, || {
        record_publish(
            "rabbitmq",
            "orders",
            "orders.placed",
            "OrderPlaced",
            PublishOutcome::Confirmed,
            Duration::from_millis(3),
        );
        record_publish(
            "rabbitmq",
            "orders",
            "orders.placed",
            "OrderPlaced",
            PublishOutcome::Confirmed,
            Duration::from_millis(4),
        );
        let m = PublishMetrics::new("rabbitmq", "", "nowhere", "Ping");
        m.record(PublishOutcome::Unroutable, Duration::from_millis(1));
    });
    let rows = rows(&snap);
    let tags = [
        ("exchange", "orders"),
        ("routing.key", "orders.placed"),
        ("message.type", "OrderPlaced"),
        ("transport", "rabbitmq"),
        ("outcome", "confirmed"),
    ];
    assert_eq!(counter_value(&rows, PUBLISH_TOTAL, &tags), Some(2));
    assert_eq!(histogram_len(&rows, PUBLISH_DURATION, &tags), 2);
    let tags = [
        ("exchange", ""),
        ("routing.key", "nowhere"),
        ("message.type", "Ping"),
        ("transport", "rabbitmq"),
        ("outcome", "unroutable"),
    ];
    assert_eq!(counter_value(&rows, PUBLISH_TOTAL, &tags), Some(1));
    match find(&rows, MetricKind::Histogram, PUBLISH_DURATION, &tags) {
        Some(DebugValue::Histogram(v)) => {
            assert!((v[0].into_inner() - 0.001).abs() < 1e-9, "seconds")
        }
        other => panic!("no histogram: {other:?}"),
    }
}

#[test]
fn consume_outcomes_feed_the_side_counters() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    with_local_recorder(&recorder, || {
        let d = Duration::from_millis(2);
        let t = "memory";
        record_consume(t, "orders", "OrderPlaced", ConsumeOutcome::Acked, d);
        record_consume(t, "orders", "OrderPlaced", ConsumeOutcome::Retried, d);
        record_consume(t, "orders", "OrderPlaced", ConsumeOutcome::Retried, d);
        record_consume(t, "orders", "OrderPlaced", ConsumeOutcome::DeadLettered, d);
        // The handle path must land in the same series.
        let m = ConsumeMetrics::new(t, "orders", "OrderPlaced");
        m.record(ConsumeOutcome::Rejected, d);
        m.record(ConsumeOutcome::Parked, d);
        m.record(ConsumeOutcome::Retried, d);
        m.record(ConsumeOutcome::InProgress, d);
        m.attempt(1);
        m.attempt(3);
        record_attempt(t, "orders", "OrderPlaced", 2);
        m.in_flight(3);
        m.in_flight(-1);
        in_flight(t, "orders", "OrderPlaced", -1);
        m.set_aside_failed("orders.dlq");
        m.rung_missing("orders.retry.60000");
    });
    let rows = rows(&snap);
    let base = [
        ("queue", "orders"),
        ("message.type", "OrderPlaced"),
        ("transport", "memory"),
    ];
    let with = |o: &'static str| {
        let mut t = base.to_vec();
        t.push(("outcome", o));
        t
    };
    let c = |o: &'static str| counter_value(&rows, CONSUME_TOTAL, &with(o));
    assert_eq!(c("acked"), Some(1));
    assert_eq!(c("retried"), Some(3));
    assert_eq!(c("dead_lettered"), Some(1));
    assert_eq!(c("rejected"), Some(1));
    assert_eq!(c("parked"), Some(1));
    assert_eq!(c("in_progress"), Some(1));
    assert_eq!(histogram_len(&rows, CONSUME_DURATION, &with("retried")), 3);
    assert_eq!(histogram_len(&rows, CONSUME_ATTEMPTS, &base), 3);
    assert_eq!(counter_value(&rows, MESSAGES_RETRIED_TOTAL, &base), Some(3));
    // A rejection goes to the dlq: it counts as dead_lettered (the closed set is
    // dead_lettered | parked).
    assert_eq!(
        counter_value(&rows, MESSAGES_DEAD_LETTERED_TOTAL, &with("dead_lettered")),
        Some(2)
    );
    assert_eq!(
        counter_value(&rows, MESSAGES_DEAD_LETTERED_TOTAL, &with("parked")),
        Some(1)
    );
    for o in ["rejected", "in_progress"] {
        assert_eq!(
            counter_value(&rows, MESSAGES_DEAD_LETTERED_TOTAL, &with(o)),
            None,
            "{o}"
        );
    }
    assert_eq!(gauge_value(&rows, CONSUME_IN_FLIGHT, &base), Some(1.0));
    assert_eq!(
        counter_value(
            &rows,
            MESSAGES_SET_ASIDE_FAILED,
            &[
                ("queue", "orders"),
                ("target", "orders.dlq"),
                ("transport", "memory")
            ]
        ),
        Some(1)
    );
    assert_eq!(
        counter_value(
            &rows,
            RETRY_RUNG_MISSING,
            &[
                ("queue", "orders"),
                ("rung", "orders.retry.60000"),
                ("transport", "memory")
            ]
        ),
        Some(1)
    );
}

#[test]
fn every_recorded_series_has_the_tables_label_set() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    with_local_recorder(&recorder, || {
        let d = Duration::from_millis(1);
        record_publish("memory", "", "q", "T", PublishOutcome::Confirmed, d);
        for o in ConsumeOutcome::ALL {
            record_consume("memory", "q", "T", o, d);
        }
        record_attempt("memory", "q", "T", 1);
        in_flight("memory", "q", "T", 1);
        record_set_aside_failed("memory", "q", "q.dlq");
        record_rung_missing("memory", "q", "q.retry.1000");
        record_outbox("memory", "", "q", OutboxOutcome::Published, d);
        record_outbox("memory", "", "q", OutboxOutcome::Failed, d);
    });
    let rows = rows(&snap);
    let mut seen = std::collections::BTreeSet::new();
    for (k, _) in &rows {
        let name = k.key().name();
        let spec = spec_of(name).unwrap_or_else(|| panic!("{name} is in the table"));
        let mut got: Vec<&str> = k.key().labels().map(|l| l.key()).collect();
        let mut want = spec.labels.to_vec();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want, "{name}");
        seen.insert(name.to_owned());
    }
    // Everything but request/reply (recorded by its own module) was produced.
    assert_eq!(seen.len(), ALL_METRIC_NAMES.len() - 2, "{seen:?}");
}
