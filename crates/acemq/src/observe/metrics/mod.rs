//! The family's metrics, through the [`metrics`] facade.
//!
#![doc = include_str!("../../../docs/metrics.md")]

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label, SharedString};

pub use names::*;

mod names;

/// How a publish ended: the `outcome` tag of `acemq.publish.*`.
///
/// ```
/// use acemq::observe::metrics::PublishOutcome;
/// assert_eq!(PublishOutcome::Unroutable.as_str(), "unroutable");
/// assert!(PublishOutcome::Failed.is_error());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
#[non_exhaustive]
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
    /// Ended without a settlement of its own (the family's value for a scope that closed
    /// without an outcome).
    Failed,
}

impl ConsumeOutcome {
    /// Every value, in declaration order.
    pub const ALL: [ConsumeOutcome; 7] = [
        ConsumeOutcome::Acked,
        ConsumeOutcome::Retried,
        ConsumeOutcome::DeadLettered,
        ConsumeOutcome::Parked,
        ConsumeOutcome::Rejected,
        ConsumeOutcome::InProgress,
        ConsumeOutcome::Failed,
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
            ConsumeOutcome::Failed => "failed",
        }
    }

    /// Whether a span with this outcome has ERROR status (`dead_lettered`, `rejected`,
    /// `failed`, as in the Java library).
    pub const fn is_error(self) -> bool {
        matches!(
            self,
            ConsumeOutcome::DeadLettered | ConsumeOutcome::Rejected | ConsumeOutcome::Failed
        )
    }

    /// Whether it also counts in `acemq.messages.dead.lettered.total` (dead-lettered,
    /// parked and rejected all leave the queue for a side queue).
    pub const fn is_set_aside(self) -> bool {
        self.set_aside_outcome().is_some()
    }

    /// The `outcome` value it counts under in `acemq.messages.dead.lettered.total`, whose
    /// closed set is `dead_lettered` | `parked`: a rejection goes to `{q}.dlq`, so it is
    /// `dead_lettered` there.
    ///
    /// ```
    /// use acemq::observe::metrics::ConsumeOutcome;
    /// assert_eq!(ConsumeOutcome::Rejected.set_aside_outcome(), Some("dead_lettered"));
    /// assert_eq!(ConsumeOutcome::Acked.set_aside_outcome(), None);
    /// ```
    pub const fn set_aside_outcome(self) -> Option<&'static str> {
        match self {
            ConsumeOutcome::DeadLettered | ConsumeOutcome::Rejected => Some("dead_lettered"),
            ConsumeOutcome::Parked => Some("parked"),
            _ => None,
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// How an outbox relay ended: the `outcome` tag of `acemq.outbox.total`.
///
/// ```
/// assert_eq!(acemq::observe::metrics::OutboxOutcome::Failed.as_str(), "failed");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutboxOutcome {
    /// The row was published (confirmed) and marked.
    Published,
    /// Publishing the row failed; it stays for the next pass.
    Failed,
}

impl OutboxOutcome {
    /// The tag value.
    pub const fn as_str(self) -> &'static str {
        match self {
            OutboxOutcome::Published => "published",
            OutboxOutcome::Failed => "failed",
        }
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

fn label(key: &'static str, value: &str) -> Label {
    Label::new(key, SharedString::from(value.to_owned()))
}

fn publish_labels(
    transport: &str,
    exchange: &str,
    routing_key: &str,
    message_type: &str,
    outcome: PublishOutcome,
) -> Vec<Label> {
    vec![
        label(TAG_EXCHANGE, exchange),
        label(TAG_ROUTING_KEY, routing_key),
        label(TAG_MESSAGE_TYPE, message_type),
        label(TAG_TRANSPORT, transport),
        Label::from_static_parts(TAG_OUTCOME, outcome.as_str()),
    ]
}

fn queue_type_labels(transport: &str, queue: &str, message_type: &str) -> Vec<Label> {
    vec![
        label(TAG_QUEUE, queue),
        label(TAG_MESSAGE_TYPE, message_type),
        label(TAG_TRANSPORT, transport),
    ]
}

fn with_outcome(mut labels: Vec<Label>, outcome: &'static str) -> Vec<Label> {
    labels.push(Label::from_static_parts(TAG_OUTCOME, outcome));
    labels
}

/// Counts one publish and records its duration (`transport`: `rabbitmq` or `memory`, see
/// [`crate::observe::transport_name`]).
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{record_publish, PublishOutcome};
/// record_publish("rabbitmq", "orders", "orders.placed", "OrderPlaced", PublishOutcome::Confirmed, Duration::from_millis(2));
/// ```
pub fn record_publish(
    transport: &str,
    exchange: &str,
    routing_key: &str,
    message_type: &str,
    outcome: PublishOutcome,
    duration: Duration,
) {
    let labels = publish_labels(transport, exchange, routing_key, message_type, outcome);
    histogram(PUBLISH_DURATION, labels.clone()).record(duration.as_secs_f64());
    counter(PUBLISH_TOTAL, labels).increment(1);
}

/// Counts one settled delivery and records its duration. A `Retried` outcome also counts
/// in `acemq.messages.retried.total`; `DeadLettered`, `Parked` and `Rejected` also count in
/// `acemq.messages.dead.lettered.total{outcome}` ([`ConsumeOutcome::set_aside_outcome`]).
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{record_consume, ConsumeOutcome};
/// record_consume("memory", "orders.placed", "OrderPlaced", ConsumeOutcome::Acked, Duration::from_millis(5));
/// ```
pub fn record_consume(
    transport: &str,
    queue: &str,
    message_type: &str,
    outcome: ConsumeOutcome,
    duration: Duration,
) {
    let base = queue_type_labels(transport, queue, message_type);
    let labels = with_outcome(base.clone(), outcome.as_str());
    histogram(CONSUME_DURATION, labels.clone()).record(duration.as_secs_f64());
    counter(CONSUME_TOTAL, labels).increment(1);
    if outcome == ConsumeOutcome::Retried {
        counter(MESSAGES_RETRIED_TOTAL, base).increment(1);
    } else if let Some(side) = outcome.set_aside_outcome() {
        counter(MESSAGES_DEAD_LETTERED_TOTAL, with_outcome(base, side)).increment(1);
    }
}

/// Records the attempt (1 for a first delivery) a message was on when handled, in the
/// `acemq.consume.attempts` distribution.
///
/// ```
/// acemq::observe::metrics::record_attempt("rabbitmq", "orders", "OrderPlaced", 2);
/// ```
pub fn record_attempt(transport: &str, queue: &str, message_type: &str, attempt: u32) {
    histogram(
        CONSUME_ATTEMPTS,
        queue_type_labels(transport, queue, message_type),
    )
    .record(f64::from(attempt));
}

/// Counts a move to a side queue (`target`: `{q}.dlq` or `{q}.parked`) that did not land.
///
/// ```
/// acemq::observe::metrics::record_set_aside_failed("rabbitmq", "orders", "orders.dlq");
/// ```
pub fn record_set_aside_failed(transport: &str, queue: &str, target: &str) {
    counter(
        MESSAGES_SET_ASIDE_FAILED,
        vec![
            label(TAG_QUEUE, queue),
            label(TAG_TARGET, target),
            label(TAG_TRANSPORT, transport),
        ],
    )
    .increment(1);
}

/// Counts a retry whose rung queue (`rung`: its name, e.g. `orders.retry.1m`) was missing.
///
/// ```
/// acemq::observe::metrics::record_rung_missing("rabbitmq", "orders", "orders.retry.1m");
/// ```
pub fn record_rung_missing(transport: &str, queue: &str, rung: &str) {
    counter(
        RETRY_RUNG_MISSING,
        vec![
            label(TAG_QUEUE, queue),
            label(TAG_RUNG, rung),
            label(TAG_TRANSPORT, transport),
        ],
    )
    .increment(1);
}

/// Counts one outbox relay and records the row's age when relayed (`acemq.outbox.lag`).
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{record_outbox, OutboxOutcome};
/// record_outbox("rabbitmq", "orders", "orders.placed", OutboxOutcome::Published, Duration::from_millis(40));
/// ```
pub fn record_outbox(
    transport: &str,
    exchange: &str,
    routing_key: &str,
    outcome: OutboxOutcome,
    lag: Duration,
) {
    let labels = vec![
        label(TAG_EXCHANGE, exchange),
        label(TAG_ROUTING_KEY, routing_key),
        label(TAG_TRANSPORT, transport),
    ];
    if outcome == OutboxOutcome::Published {
        histogram(OUTBOX_LAG, labels.clone()).record(lag.as_secs_f64());
    }
    counter(OUTBOX_TOTAL, with_outcome(labels, outcome.as_str())).increment(1);
}

/// Moves the `acemq.consume.in.flight{queue, message.type, transport}` gauge by `delta`
/// (+1 when a handler starts, -1 when it returns).
///
/// ```
/// acemq::observe::metrics::in_flight("memory", "orders", "OrderPlaced", 1);
/// acemq::observe::metrics::in_flight("memory", "orders", "OrderPlaced", -1);
/// ```
pub fn in_flight(transport: &str, queue: &str, message_type: &str, delta: i64) {
    move_gauge(
        &gauge(
            CONSUME_IN_FLIGHT,
            queue_type_labels(transport, queue, message_type),
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

/// Pre-keyed consume metrics for one (transport, queue, message type): after a series'
/// first use, recording never allocates.
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{ConsumeMetrics, ConsumeOutcome};
/// let m = ConsumeMetrics::new("memory", "orders.placed", "OrderPlaced");
/// m.in_flight(1);
/// m.attempt(1);
/// m.record(ConsumeOutcome::DeadLettered, Duration::from_millis(1));
/// m.in_flight(-1);
/// ```
#[derive(Debug)]
pub struct ConsumeMetrics {
    transport: String,
    queue: String,
    message_type: String,
    series: [OnceLock<(Counter, Histogram)>; ConsumeOutcome::ALL.len()],
    side: [OnceLock<Counter>; 2],
    retried: OnceLock<Counter>,
    attempts: OnceLock<Histogram>,
    in_flight: OnceLock<Gauge>,
}

impl ConsumeMetrics {
    /// Handles for a transport (`rabbitmq`, `memory`), a queue and the message type its
    /// handler takes.
    pub fn new(
        transport: impl Into<String>,
        queue: impl Into<String>,
        message_type: impl Into<String>,
    ) -> Self {
        ConsumeMetrics {
            transport: transport.into(),
            queue: queue.into(),
            message_type: message_type.into(),
            series: Default::default(),
            side: Default::default(),
            retried: OnceLock::new(),
            attempts: OnceLock::new(),
            in_flight: OnceLock::new(),
        }
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    fn base(&self) -> Vec<Label> {
        queue_type_labels(&self.transport, &self.queue, &self.message_type)
    }

    /// Same as [`record_consume`] for this transport, queue and type.
    pub fn record(&self, outcome: ConsumeOutcome, duration: Duration) {
        let (total, duration_h) = self.series[outcome.index()].get_or_init(|| {
            let labels = with_outcome(self.base(), outcome.as_str());
            (
                counter(CONSUME_TOTAL, labels.clone()),
                histogram(CONSUME_DURATION, labels),
            )
        });
        duration_h.record(duration.as_secs_f64());
        total.increment(1);
        if outcome == ConsumeOutcome::Retried {
            self.retried
                .get_or_init(|| counter(MESSAGES_RETRIED_TOTAL, self.base()))
                .increment(1);
        } else if let Some(side) = outcome.set_aside_outcome() {
            let slot = usize::from(side == "parked");
            self.side[slot]
                .get_or_init(|| {
                    counter(
                        MESSAGES_DEAD_LETTERED_TOTAL,
                        with_outcome(self.base(), side),
                    )
                })
                .increment(1);
        }
    }

    /// Same as [`record_attempt`] for this transport, queue and type.
    pub fn attempt(&self, attempt: u32) {
        self.attempts
            .get_or_init(|| histogram(CONSUME_ATTEMPTS, self.base()))
            .record(f64::from(attempt));
    }

    /// Same as [`in_flight`] for this transport, queue and type.
    pub fn in_flight(&self, delta: i64) {
        let g = self
            .in_flight
            .get_or_init(|| gauge(CONSUME_IN_FLIGHT, self.base()));
        move_gauge(g, delta);
    }

    /// Same as [`record_set_aside_failed`] for this transport and queue (rare: not cached).
    pub fn set_aside_failed(&self, target: &str) {
        record_set_aside_failed(&self.transport, &self.queue, target);
    }

    /// Same as [`record_rung_missing`] for this transport and queue (rare: not cached).
    pub fn rung_missing(&self, rung: &str) {
        record_rung_missing(&self.transport, &self.queue, rung);
    }
}

/// Pre-keyed publish metrics for one (transport, exchange, routing key, message type):
/// after a series' first use, recording never allocates.
///
/// ```
/// use std::time::Duration;
/// use acemq::observe::metrics::{PublishMetrics, PublishOutcome};
/// let m = PublishMetrics::new("memory", "", "orders.placed", "OrderPlaced");
/// m.record(PublishOutcome::Unroutable, Duration::from_micros(300));
/// ```
#[derive(Debug)]
pub struct PublishMetrics {
    transport: String,
    exchange: String,
    routing_key: String,
    message_type: String,
    series: [OnceLock<(Counter, Histogram)>; PublishOutcome::ALL.len()],
}

impl PublishMetrics {
    /// Handles for one transport, destination and message type.
    pub fn new(
        transport: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        message_type: impl Into<String>,
    ) -> Self {
        PublishMetrics {
            transport: transport.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            message_type: message_type.into(),
            series: Default::default(),
        }
    }

    /// Handles for a [`crate::publish::Publisher`] to `exchange` / `routing_key`: its
    /// series is typed by the routing key (`message` when that is empty).
    pub(crate) fn for_destination(transport: &str, exchange: &str, routing_key: &str) -> Self {
        let message_type = if routing_key.is_empty() {
            "message"
        } else {
            routing_key
        };
        PublishMetrics::new(transport, exchange, routing_key, message_type)
    }

    /// Same as [`record_publish`] for this transport, destination and type.
    pub fn record(&self, outcome: PublishOutcome, duration: Duration) {
        let (total, duration_h) = self.series[outcome.index()].get_or_init(|| {
            let labels = publish_labels(
                &self.transport,
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
