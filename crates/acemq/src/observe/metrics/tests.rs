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
            "in_progress"
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
    assert_eq!(ALL_METRIC_NAMES.len(), 13);
    for n in ALL_METRIC_NAMES {
        assert!(n.starts_with("acemq."), "{n}");
    }
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
            "orders",
            "orders.placed",
            "OrderPlaced",
            PublishOutcome::Confirmed,
            Duration::from_millis(3),
        );
        record_publish(
            "orders",
            "orders.placed",
            "OrderPlaced",
            PublishOutcome::Confirmed,
            Duration::from_millis(4),
        );
        let m = PublishMetrics::new("", "nowhere", "Ping");
        m.record(PublishOutcome::Unroutable, Duration::from_millis(1));
    });
    let rows = rows(&snap);
    let tags = [
        ("exchange", "orders"),
        ("routing.key", "orders.placed"),
        ("message.type", "OrderPlaced"),
        ("outcome", "confirmed"),
    ];
    assert_eq!(counter_value(&rows, PUBLISH_TOTAL, &tags), Some(2));
    assert_eq!(histogram_len(&rows, PUBLISH_DURATION, &tags), 2);
    let tags = [
        ("exchange", ""),
        ("routing.key", "nowhere"),
        ("message.type", "Ping"),
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
        record_consume("orders", "OrderPlaced", ConsumeOutcome::Acked, d);
        record_consume("orders", "OrderPlaced", ConsumeOutcome::Retried, d);
        record_consume("orders", "OrderPlaced", ConsumeOutcome::Retried, d);
        record_consume("orders", "OrderPlaced", ConsumeOutcome::DeadLettered, d);
        // The handle path must land in the same series.
        let m = ConsumeMetrics::new("orders", "OrderPlaced");
        m.record(ConsumeOutcome::Rejected, d);
        m.record(ConsumeOutcome::Parked, d);
        m.record(ConsumeOutcome::Retried, d);
        m.record(ConsumeOutcome::InProgress, d);
        m.in_flight(3);
        m.in_flight(-1);
        in_flight("orders", -1);
        m.set_aside_failed("orders.dlq");
        m.rung_missing("orders.retry.60000");
    });
    let rows = rows(&snap);
    let c = |o: &str| {
        counter_value(
            &rows,
            CONSUME_TOTAL,
            &[
                ("queue", "orders"),
                ("message.type", "OrderPlaced"),
                ("outcome", o),
            ],
        )
    };
    assert_eq!(c("acked"), Some(1));
    assert_eq!(c("retried"), Some(3));
    assert_eq!(c("dead_lettered"), Some(1));
    assert_eq!(c("rejected"), Some(1));
    assert_eq!(c("parked"), Some(1));
    assert_eq!(c("in_progress"), Some(1));
    assert_eq!(
        histogram_len(
            &rows,
            CONSUME_DURATION,
            &[
                ("queue", "orders"),
                ("message.type", "OrderPlaced"),
                ("outcome", "retried")
            ]
        ),
        3
    );
    assert_eq!(counter_value(&rows, MESSAGES_RETRIED_TOTAL, &[]), Some(3));
    for o in ["dead_lettered", "rejected", "parked"] {
        assert_eq!(
            counter_value(&rows, MESSAGES_DEAD_LETTERED_TOTAL, &[("outcome", o)]),
            Some(1),
            "{o}"
        );
    }
    assert_eq!(
        counter_value(
            &rows,
            MESSAGES_DEAD_LETTERED_TOTAL,
            &[("outcome", "in_progress")]
        ),
        None
    );
    assert_eq!(
        gauge_value(&rows, CONSUME_IN_FLIGHT, &[("queue", "orders")]),
        Some(1.0)
    );
    assert_eq!(
        counter_value(
            &rows,
            MESSAGES_SET_ASIDE_FAILED,
            &[("queue", "orders"), ("target", "orders.dlq")]
        ),
        Some(1)
    );
    assert_eq!(
        counter_value(
            &rows,
            RETRY_RUNG_MISSING,
            &[("queue", "orders"), ("rung", "orders.retry.60000")]
        ),
        Some(1)
    );
}
