//! The family's metrics, through the [`metrics`] facade.
//!
#![doc = include_str!("../../../../../docs/metrics.md")]

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label, Unit};

/// Publishes, by outcome (counter). Tags: `exchange`, `routing.key`, `message.type`, `outcome`.
pub const PUBLISH_TOTAL: &str = "acemq.publish.total";
/// Time from publish to outcome, seconds (histogram). Tags as [`PUBLISH_TOTAL`].
pub const PUBLISH_DURATION: &str = "acemq.publish.duration";
/// Deliveries handled, by outcome (counter). Tags: `queue`, `message.type`, `outcome`.
pub const CONSUME_TOTAL: &str = "acemq.consume.total";
/// Time from hand-over to settlement, seconds (histogram). Tags as [`CONSUME_TOTAL`].
pub const CONSUME_DURATION: &str = "acemq.consume.duration";
/// Deliveries inside a handler right now (gauge). Tag: `queue`.
pub const CONSUME_IN_FLIGHT: &str = "acemq.consume.in.flight";
/// Retries scheduled (counter, no tags).
pub const MESSAGES_RETRIED_TOTAL: &str = "acemq.messages.retried.total";
/// Messages set aside (counter). Tag: `outcome` = `dead_lettered` | `parked` | `rejected`.
pub const MESSAGES_DEAD_LETTERED_TOTAL: &str = "acemq.messages.dead.lettered.total";
/// A move to `{q}.dlq` / `{q}.parked` that did not land (counter). Tags: `queue`, `target`.
pub const MESSAGES_SET_ASIDE_FAILED: &str = "acemq.messages.set.aside.failed";
/// A retry rung queue that was not there (counter). Tags: `queue`, `rung`.
pub const RETRY_RUNG_MISSING: &str = "acemq.retry.rung.missing";
/// Outbox relays, by outcome `published` | `failed` (counter).
pub const OUTBOX_TOTAL: &str = "acemq.outbox.total";
/// Age of an outbox row when relayed, seconds (histogram).
pub const OUTBOX_LAG: &str = "acemq.outbox.lag";
/// Request/reply calls, by outcome `answered` | `timed_out` (counter).
pub const REQUEST_TOTAL: &str = "acemq.request.total";
/// Request/reply round trip, seconds (histogram).
pub const REQUEST_DURATION: &str = "acemq.request.duration";

/// Every metric name above, for a set comparison with the other libraries.
pub const ALL_METRIC_NAMES: &[&str] = &[
    PUBLISH_TOTAL,
    PUBLISH_DURATION,
    CONSUME_TOTAL,
    CONSUME_DURATION,
    CONSUME_IN_FLIGHT,
    MESSAGES_RETRIED_TOTAL,
    MESSAGES_DEAD_LETTERED_TOTAL,
    MESSAGES_SET_ASIDE_FAILED,
    RETRY_RUNG_MISSING,
    OUTBOX_TOTAL,
    OUTBOX_LAG,
    REQUEST_TOTAL,
    REQUEST_DURATION,
];

/// Tag: the exchange published to (`""` for the default exchange).
pub const TAG_EXCHANGE: &str = "exchange";
/// Tag: the routing key.
pub const TAG_ROUTING_KEY: &str = "routing.key";
/// Tag: the envelope's message type.
pub const TAG_MESSAGE_TYPE: &str = "message.type";
/// Tag: the outcome (a closed set per metric).
pub const TAG_OUTCOME: &str = "outcome";
/// Tag: the consumed queue.
pub const TAG_QUEUE: &str = "queue";
/// Tag: where a set-aside was headed (`{q}.dlq`, `{q}.parked`).
pub const TAG_TARGET: &str = "target";
/// Tag: the missing retry rung (its queue name).
pub const TAG_RUNG: &str = "rung";

/// How a publish ended: the `outcome` tag of `acemq.publish.*`.
///
/// ```
/// use acemq::observe::metrics::PublishOutcome;
/// assert_eq!(PublishOutcome::Unroutable.as_str(), "unroutable");
/// assert!(PublishOutcome::Failed.is_error());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PublishOutcome {
    /// The broker confirmed it and it was routed.
    Confirmed,
    /// Sent without waiting for a confirm.
    Published,
    /// Confirmed but returned: it reached no queue.
    Unroutable,
    /// Nacked, timed out, or the connection failed.
    Failed,
    /// Refused before sending (publishing paused, connection blocked).
    Refused,
}

impl PublishOutcome {
    /// Every value, in declaration order.
    pub const ALL: [PublishOutcome; 5] = [
        PublishOutcome::Confirmed,
        PublishOutcome::Published,
        PublishOutcome::Unroutable,
        PublishOutcome::Failed,
        PublishOutcome::Refused,
    ];

    /// The tag value.
    pub const fn as_str(self) -> &'static str {
        match self {
            PublishOutcome::Confirmed => "confirmed",
            PublishOutcome::Published => "published",
            PublishOutcome::Unroutable => "unroutable",
            PublishOutcome::Failed => "failed",
            PublishOutcome::Refused => "refused",
        }
    }

    /// Whether a span with this outcome has ERROR status (`unroutable`, `failed`).
    pub const fn is_error(self) -> bool {
        matches!(self, PublishOutcome::Unroutable | PublishOutcome::Failed)
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// How a delivery ended: the `outcome` tag of `acemq.consume.*`.
///
/// ```
/// use acemq::observe::metrics::ConsumeOutcome;
/// assert_eq!(ConsumeOutcome::DeadLettered.as_str(), "dead_lettered");
/// assert_eq!(ConsumeOutcome::InProgress.as_str(), "in_progress");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConsumeOutcome {
    /// Handled and acknowledged.
    Acked,
    /// Failed and republished for another attempt.
    Retried,
    /// Gave up: moved to `{q}.dlq`.
    DeadLettered,
    /// Unreadable: moved to `{q}.parked`.
    Parked,
    /// The handler rejected it (no retry): moved to `{q}.dlq`.
    Rejected,
    /// Claimed elsewhere and still being handled: put back to wait.
    InProgress,
}

impl ConsumeOutcome {
    /// Every value, in declaration order.
    pub const ALL: [ConsumeOutcome; 6] = [
        ConsumeOutcome::Acked,
        ConsumeOutcome::Retried,
        ConsumeOutcome::DeadLettered,
        ConsumeOutcome::Parked,
        ConsumeOutcome::Rejected,
        ConsumeOutcome::InProgress,
    ];

    /// The tag value.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConsumeOutcome::Acked => "acked",
            ConsumeOutcome::Retried => "retried",
            ConsumeOutcome::DeadLettered => "dead_lettered",
            ConsumeOutcome::Parked => "parked",
            ConsumeOutcome::Rejected => "rejected",
            ConsumeOutcome::InProgress => "in_progress",
        }
    }

    /// Whether a span with this outcome has ERROR status (`dead_lettered`, `rejected`, as
    /// in the Java library).
    pub const fn is_error(self) -> bool {
        matches!(
            self,
            ConsumeOutcome::DeadLettered | ConsumeOutcome::Rejected
        )
    }

    /// Whether it also counts in `acemq.messages.dead.lettered.total` (dead-lettered,
    /// parked and rejected all leave the queue for a side queue).
    pub const fn is_set_aside(self) -> bool {
        matches!(
            self,
            ConsumeOutcome::DeadLettered | ConsumeOutcome::Parked | ConsumeOutcome::Rejected
        )
    }

    const fn index(self) -> usize {
        self as usize
    }
}

// Metadata for every series this module registers.
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

fn counter(name: &'static str, labels: Vec<Label>) -> Counter {
    let key = metrics::Key::from_parts(name, labels);
    metrics::with_recorder(|r| r.register_counter(&key, &METADATA))
}

fn histogram(name: &'static str, labels: Vec<Label>) -> Histogram {
    let key = metrics::Key::from_parts(name, labels);
    metrics::with_recorder(|r| r.register_histogram(&key, &METADATA))
}

fn gauge(name: &'static str, labels: Vec<Label>) -> Gauge {
    let key = metrics::Key::from_parts(name, labels);
    metrics::with_recorder(|r| r.register_gauge(&key, &METADATA))
}

fn publish_labels(
    exchange: &str,
    routing_key: &str,
    message_type: &str,
    outcome: PublishOutcome,
) -> Vec<Label> {
    vec![
        Label::new(TAG_EXCHANGE, exchange.to_owned()),
        Label::new(TAG_ROUTING_KEY, routing_key.to_owned()),
        Label::new(TAG_MESSAGE_TYPE, message_type.to_owned()),
        Label::from_static_parts(TAG_OUTCOME, outcome.as_str()),
    ]
}

fn consume_labels(queue: &str, message_type: &str, outcome: ConsumeOutcome) -> Vec<Label> {
    vec![
        Label::new(TAG_QUEUE, queue.to_owned()),
        Label::new(TAG_MESSAGE_TYPE, message_type.to_owned()),
        Label::from_static_parts(TAG_OUTCOME, outcome.as_str()),
    ]
}

fn dead_lettered_counter(outcome: ConsumeOutcome) -> Counter {
    counter(
        MESSAGES_DEAD_LETTERED_TOTAL,
        vec![Label::from_static_parts(TAG_OUTCOME, outcome.as_str())],
    )
}

/// Counts one publish and records its duration.
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{record_publish, PublishOutcome};
/// record_publish("orders", "orders.placed", "OrderPlaced", PublishOutcome::Confirmed, Duration::from_millis(2));
/// ```
pub fn record_publish(
    exchange: &str,
    routing_key: &str,
    message_type: &str,
    outcome: PublishOutcome,
    duration: Duration,
) {
    let labels = publish_labels(exchange, routing_key, message_type, outcome);
    histogram(PUBLISH_DURATION, labels.clone()).record(duration.as_secs_f64());
    counter(PUBLISH_TOTAL, labels).increment(1);
}

/// Counts one settled delivery and records its duration. A `Retried` outcome also counts
/// in `acemq.messages.retried.total`; `DeadLettered`, `Parked` and `Rejected` also count in
/// `acemq.messages.dead.lettered.total{outcome}`.
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{record_consume, ConsumeOutcome};
/// record_consume("orders.placed", "OrderPlaced", ConsumeOutcome::Acked, Duration::from_millis(5));
/// ```
pub fn record_consume(
    queue: &str,
    message_type: &str,
    outcome: ConsumeOutcome,
    duration: Duration,
) {
    let labels = consume_labels(queue, message_type, outcome);
    histogram(CONSUME_DURATION, labels.clone()).record(duration.as_secs_f64());
    counter(CONSUME_TOTAL, labels).increment(1);
    if outcome == ConsumeOutcome::Retried {
        counter(MESSAGES_RETRIED_TOTAL, Vec::new()).increment(1);
    } else if outcome.is_set_aside() {
        dead_lettered_counter(outcome).increment(1);
    }
}

/// Counts a move to a side queue (`target`: `{q}.dlq` or `{q}.parked`) that did not land.
///
/// ```
/// acemq::observe::metrics::record_set_aside_failed("orders", "orders.dlq");
/// ```
pub fn record_set_aside_failed(queue: &str, target: &str) {
    counter(
        MESSAGES_SET_ASIDE_FAILED,
        vec![
            Label::new(TAG_QUEUE, queue.to_owned()),
            Label::new(TAG_TARGET, target.to_owned()),
        ],
    )
    .increment(1);
}

/// Counts a retry whose rung queue (`rung`: its name, e.g. `orders.retry.1m`) was missing.
///
/// ```
/// acemq::observe::metrics::record_rung_missing("orders", "orders.retry.1m");
/// ```
pub fn record_rung_missing(queue: &str, rung: &str) {
    counter(
        RETRY_RUNG_MISSING,
        vec![
            Label::new(TAG_QUEUE, queue.to_owned()),
            Label::new(TAG_RUNG, rung.to_owned()),
        ],
    )
    .increment(1);
}

/// Moves the `acemq.consume.in.flight{queue}` gauge by `delta` (+1 when a handler starts,
/// -1 when it returns).
///
/// ```
/// acemq::observe::metrics::in_flight("orders", 1);
/// acemq::observe::metrics::in_flight("orders", -1);
/// ```
pub fn in_flight(queue: &str, delta: i64) {
    move_gauge(
        &gauge(
            CONSUME_IN_FLIGHT,
            vec![Label::new(TAG_QUEUE, queue.to_owned())],
        ),
        delta,
    );
}

fn move_gauge(g: &Gauge, delta: i64) {
    // i64 -> f64 is exact for any realistic in-flight count.
    #[allow(clippy::cast_precision_loss)]
    let d = delta.unsigned_abs() as f64;
    if delta >= 0 {
        g.increment(d);
    } else {
        g.decrement(d);
    }
}

/// Registers units and descriptions for every metric with the current recorder. Optional;
/// exporters use them for `# HELP` lines. The actuator calls it after installing its recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(PUBLISH_TOTAL, Unit::Count, "AceMQ publishes by outcome");
    describe_histogram!(
        PUBLISH_DURATION,
        Unit::Seconds,
        "AceMQ publish time to outcome"
    );
    describe_counter!(CONSUME_TOTAL, Unit::Count, "AceMQ deliveries by outcome");
    describe_histogram!(
        CONSUME_DURATION,
        Unit::Seconds,
        "AceMQ handling time to settlement"
    );
    describe_gauge!(
        CONSUME_IN_FLIGHT,
        Unit::Count,
        "AceMQ deliveries inside a handler"
    );
    describe_counter!(
        MESSAGES_RETRIED_TOTAL,
        Unit::Count,
        "AceMQ retries scheduled"
    );
    describe_counter!(
        MESSAGES_DEAD_LETTERED_TOTAL,
        Unit::Count,
        "AceMQ messages dead-lettered, parked or rejected"
    );
    describe_counter!(
        MESSAGES_SET_ASIDE_FAILED,
        Unit::Count,
        "AceMQ moves to a side queue that did not land"
    );
    describe_counter!(
        RETRY_RUNG_MISSING,
        Unit::Count,
        "AceMQ retries whose rung queue was missing"
    );
    describe_counter!(OUTBOX_TOTAL, Unit::Count, "AceMQ outbox relays by outcome");
    describe_histogram!(
        OUTBOX_LAG,
        Unit::Seconds,
        "AceMQ outbox row age when relayed"
    );
    describe_counter!(REQUEST_TOTAL, Unit::Count, "AceMQ requests by outcome");
    describe_histogram!(REQUEST_DURATION, Unit::Seconds, "AceMQ request round trip");
}

/// Pre-keyed consume metrics for one (queue, message type): after a series' first use,
/// recording never allocates.
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{ConsumeMetrics, ConsumeOutcome};
/// let m = ConsumeMetrics::new("orders.placed", "OrderPlaced");
/// m.in_flight(1);
/// m.record(ConsumeOutcome::DeadLettered, Duration::from_millis(1));
/// m.in_flight(-1);
/// ```
#[derive(Debug)]
pub struct ConsumeMetrics {
    queue: String,
    message_type: String,
    series: [OnceLock<(Counter, Histogram)>; 6],
    side: [OnceLock<Counter>; 6],
    retried: OnceLock<Counter>,
    in_flight: OnceLock<Gauge>,
}

impl ConsumeMetrics {
    /// Handles for a queue and the message type its handler takes.
    pub fn new(queue: impl Into<String>, message_type: impl Into<String>) -> Self {
        ConsumeMetrics {
            queue: queue.into(),
            message_type: message_type.into(),
            series: Default::default(),
            side: Default::default(),
            retried: OnceLock::new(),
            in_flight: OnceLock::new(),
        }
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Same as [`record_consume`] for this queue and type.
    pub fn record(&self, outcome: ConsumeOutcome, duration: Duration) {
        let (total, duration_h) = self.series[outcome.index()].get_or_init(|| {
            let labels = consume_labels(&self.queue, &self.message_type, outcome);
            (
                counter(CONSUME_TOTAL, labels.clone()),
                histogram(CONSUME_DURATION, labels),
            )
        });
        duration_h.record(duration.as_secs_f64());
        total.increment(1);
        if outcome == ConsumeOutcome::Retried {
            self.retried
                .get_or_init(|| counter(MESSAGES_RETRIED_TOTAL, Vec::new()))
                .increment(1);
        } else if outcome.is_set_aside() {
            self.side[outcome.index()]
                .get_or_init(|| dead_lettered_counter(outcome))
                .increment(1);
        }
    }

    /// Same as [`in_flight`] for this queue.
    pub fn in_flight(&self, delta: i64) {
        let g = self.in_flight.get_or_init(|| {
            gauge(
                CONSUME_IN_FLIGHT,
                vec![Label::new(TAG_QUEUE, self.queue.clone())],
            )
        });
        move_gauge(g, delta);
    }

    /// Same as [`record_set_aside_failed`] for this queue (rare: not cached).
    pub fn set_aside_failed(&self, target: &str) {
        record_set_aside_failed(&self.queue, target);
    }

    /// Same as [`record_rung_missing`] for this queue (rare: not cached).
    pub fn rung_missing(&self, rung: &str) {
        record_rung_missing(&self.queue, rung);
    }
}

/// Pre-keyed publish metrics for one (exchange, routing key, message type): after a
/// series' first use, recording never allocates.
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{PublishMetrics, PublishOutcome};
/// let m = PublishMetrics::new("", "orders.placed", "OrderPlaced");
/// m.record(PublishOutcome::Unroutable, Duration::from_micros(300));
/// ```
#[derive(Debug)]
pub struct PublishMetrics {
    exchange: String,
    routing_key: String,
    message_type: String,
    series: [OnceLock<(Counter, Histogram)>; 5],
}

impl PublishMetrics {
    /// Handles for one destination and message type.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        message_type: impl Into<String>,
    ) -> Self {
        PublishMetrics {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            message_type: message_type.into(),
            series: Default::default(),
        }
    }

    /// Same as [`record_publish`] for this destination and type.
    pub fn record(&self, outcome: PublishOutcome, duration: Duration) {
        let (total, duration_h) = self.series[outcome.index()].get_or_init(|| {
            let labels = publish_labels(
                &self.exchange,
                &self.routing_key,
                &self.message_type,
                outcome,
            );
            (
                counter(PUBLISH_TOTAL, labels.clone()),
                histogram(PUBLISH_DURATION, labels),
            )
        });
        duration_h.record(duration.as_secs_f64());
        total.increment(1);
    }
}

#[cfg(test)]
mod tests;
