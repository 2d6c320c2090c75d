//! The one table of the family's metrics ([`METRICS`]): name, instrument, labels and help
//! text, from the wire contract §9. [`describe`], the Prometheus bucket configuration and
//! the contract test all read it, so a new metric is one row here (plus its recording).

use metrics::Unit;

/// Publishes, by outcome (counter).
pub const PUBLISH_TOTAL: &str = "acemq.publish.total";
/// Time from publish to outcome (timer, seconds).
pub const PUBLISH_DURATION: &str = "acemq.publish.duration";
/// Deliveries handled, by outcome (counter).
pub const CONSUME_TOTAL: &str = "acemq.consume.total";
/// Time from hand-over to settlement (timer, seconds).
pub const CONSUME_DURATION: &str = "acemq.consume.duration";
/// The attempt a message was on when handled (distribution).
pub const CONSUME_ATTEMPTS: &str = "acemq.consume.attempts";
/// Deliveries inside a handler right now (gauge).
pub const CONSUME_IN_FLIGHT: &str = "acemq.consume.in.flight";
/// Retries scheduled (counter).
pub const MESSAGES_RETRIED_TOTAL: &str = "acemq.messages.retried.total";
/// Messages set aside, `outcome` = `dead_lettered` | `parked` (counter; a handler's
/// rejection counts as `dead_lettered`: it goes to `{q}.dlq` too).
pub const MESSAGES_DEAD_LETTERED_TOTAL: &str = "acemq.messages.dead.lettered.total";
/// A move to `{q}.dlq` / `{q}.parked` that did not land (counter).
pub const MESSAGES_SET_ASIDE_FAILED: &str = "acemq.messages.set.aside.failed";
/// A retry rung queue that was not there (counter).
pub const RETRY_RUNG_MISSING: &str = "acemq.retry.rung.missing";
/// Outbox relays, by outcome `published` | `failed` (counter).
pub const OUTBOX_TOTAL: &str = "acemq.outbox.total";
/// Age of an outbox row when relayed (timer, seconds).
pub const OUTBOX_LAG: &str = "acemq.outbox.lag";
/// Request/reply calls, by outcome `answered` | `timed_out` (counter).
pub const REQUEST_TOTAL: &str = "acemq.request.total";
/// Request/reply round trip (timer, seconds).
pub const REQUEST_DURATION: &str = "acemq.request.duration";

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
/// Tag on every metric: `rabbitmq` or `memory` ([`crate::observe::transport_name`]).
pub const TAG_TRANSPORT: &str = "transport";

/// What kind of instrument a metric is, as Micrometer names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Instrument {
    /// A monotonic count (Prometheus `…_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Durations in seconds, exported as a histogram (`…_seconds_bucket/_sum/_count`),
    /// buckets [`DURATION_BUCKETS`].
    Timer,
    /// Plain numbers exported as a histogram (`…_bucket/_sum/_count`), buckets
    /// [`ATTEMPT_BUCKETS`].
    Distribution,
}

impl Instrument {
    /// The unit the metric is described with (`Seconds` for timers, `Count` otherwise).
    pub const fn unit(self) -> Unit {
        match self {
            Instrument::Timer => Unit::Seconds,
            _ => Unit::Count,
        }
    }

    /// The histogram buckets the Prometheus exporter must be given for it, if any.
    pub const fn buckets(self) -> Option<&'static [f64]> {
        match self {
            Instrument::Timer => Some(DURATION_BUCKETS),
            Instrument::Distribution => Some(ATTEMPT_BUCKETS),
            _ => None,
        }
    }
}

/// One metric of the family: its name, instrument, label keys and help text.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct MetricSpec {
    /// The name, dotted, exactly as the wire contract writes it.
    pub name: &'static str,
    /// Counter, gauge, timer or distribution.
    pub instrument: Instrument,
    /// Every label key the library puts on it, in the contract's order.
    pub labels: &'static [&'static str],
    /// The `# HELP` text.
    pub help: &'static str,
}

impl MetricSpec {
    /// The name Prometheus shows (Micrometer's naming, which the actuator's exporter is set
    /// up to produce): dots become underscores, timers gain `_seconds`, counters end in
    /// `_total`. Histograms add `_bucket`/`_sum`/`_count` to this.
    ///
    /// ```
    /// use acemq::observe::metrics::METRICS;
    /// let names: Vec<String> = METRICS.iter().map(|m| m.prometheus_name()).collect();
    /// assert!(names.contains(&"acemq_publish_duration_seconds".to_string()));
    /// assert!(names.contains(&"acemq_messages_set_aside_failed_total".to_string()));
    /// assert!(names.contains(&"acemq_consume_in_flight".to_string()));
    /// ```
    pub fn prometheus_name(&self) -> String {
        let mut n = self.name.replace('.', "_");
        match self.instrument {
            Instrument::Timer if !n.ends_with("_seconds") => n.push_str("_seconds"),
            Instrument::Counter if !n.ends_with("total") => n.push_str("_total"),
            _ => {}
        }
        n
    }
}

const PUBLISH_LABELS: &[&str] = &[
    TAG_EXCHANGE,
    TAG_ROUTING_KEY,
    TAG_MESSAGE_TYPE,
    TAG_TRANSPORT,
    TAG_OUTCOME,
];
const CONSUME_LABELS: &[&str] = &[TAG_QUEUE, TAG_MESSAGE_TYPE, TAG_TRANSPORT, TAG_OUTCOME];
const QUEUE_TYPE_LABELS: &[&str] = &[TAG_QUEUE, TAG_MESSAGE_TYPE, TAG_TRANSPORT];

/// Every metric of the wire contract §9, one row each. To add one: a `pub const` name
/// above, a row here, and its recording function; [`describe`], the actuator's Prometheus
/// buckets and the contract test pick it up from here.
pub const METRICS: &[MetricSpec] = &[
    spec(
        PUBLISH_DURATION,
        Instrument::Timer,
        PUBLISH_LABELS,
        "AceMQ publish time to outcome",
    ),
    spec(
        PUBLISH_TOTAL,
        Instrument::Counter,
        PUBLISH_LABELS,
        "AceMQ publishes by outcome",
    ),
    spec(
        CONSUME_DURATION,
        Instrument::Timer,
        CONSUME_LABELS,
        "AceMQ handling time to settlement",
    ),
    spec(
        CONSUME_TOTAL,
        Instrument::Counter,
        CONSUME_LABELS,
        "AceMQ deliveries by outcome",
    ),
    spec(
        CONSUME_ATTEMPTS,
        Instrument::Distribution,
        QUEUE_TYPE_LABELS,
        "AceMQ attempt a message was on when handled",
    ),
    spec(
        CONSUME_IN_FLIGHT,
        Instrument::Gauge,
        QUEUE_TYPE_LABELS,
        "AceMQ deliveries inside a handler",
    ),
    spec(
        MESSAGES_RETRIED_TOTAL,
        Instrument::Counter,
        QUEUE_TYPE_LABELS,
        "AceMQ retries scheduled",
    ),
    spec(
        MESSAGES_DEAD_LETTERED_TOTAL,
        Instrument::Counter,
        CONSUME_LABELS,
        "AceMQ messages dead-lettered or parked",
    ),
    spec(
        MESSAGES_SET_ASIDE_FAILED,
        Instrument::Counter,
        &[TAG_QUEUE, TAG_TARGET, TAG_TRANSPORT],
        "AceMQ moves to a side queue that did not land",
    ),
    spec(
        RETRY_RUNG_MISSING,
        Instrument::Counter,
        &[TAG_QUEUE, TAG_RUNG, TAG_TRANSPORT],
        "AceMQ retries whose rung queue was missing",
    ),
    spec(
        OUTBOX_LAG,
        Instrument::Timer,
        &[TAG_EXCHANGE, TAG_ROUTING_KEY, TAG_TRANSPORT],
        "AceMQ outbox row age when relayed",
    ),
    spec(
        OUTBOX_TOTAL,
        Instrument::Counter,
        &[TAG_EXCHANGE, TAG_ROUTING_KEY, TAG_TRANSPORT, TAG_OUTCOME],
        "AceMQ outbox relays by outcome",
    ),
    spec(
        REQUEST_DURATION,
        Instrument::Timer,
        &[
            TAG_ROUTING_KEY,
            TAG_MESSAGE_TYPE,
            TAG_TRANSPORT,
            TAG_OUTCOME,
        ],
        "AceMQ request round trip",
    ),
    spec(
        REQUEST_TOTAL,
        Instrument::Counter,
        &[
            TAG_ROUTING_KEY,
            TAG_MESSAGE_TYPE,
            TAG_TRANSPORT,
            TAG_OUTCOME,
        ],
        "AceMQ requests by outcome",
    ),
];

/// Deliveries handled by an ordered consumer (counter; Rust only). Tags: `queue` (the
/// partition's queue), `transport`, `outcome` = `handled` | `skipped` | `parked` | `halted`.
pub const ORDERED_TOTAL: &str = "acemq.ordered.total";
/// Partitions halted right now (gauge; Rust only). Tags: `queue` (the ordered queue's
/// name), `transport`.
pub const ORDERED_HALTED: &str = "acemq.ordered.halted";

/// Consumers subscribed again because the broker listed none while their subscription
/// was open (counter; Rust only). Tags: `queue`, `transport`.
pub const CONSUMER_RESUBSCRIBED_TOTAL: &str = "acemq.consumer.resubscribed.total";

/// Connection recovery events (counter; Rust only). Tags: `event` (`lost`, `retrying`,
/// `recovered`, `gave_up`, `blocked`, `unblocked`), `transport`. Recorded by the transports
/// (`transport::recovery`), which re-export it there.
pub const RECOVERY_TOTAL: &str = "acemq.connection.recovery.total";

/// Messages handed to a scheduler (counter; Rust only). Tags: `transport`.
pub const SCHEDULE_SCHEDULED_TOTAL: &str = "acemq.schedule.scheduled.total";
/// Scheduled messages published to their destination (counter; Rust only). Tags: `transport`.
pub const SCHEDULE_DELIVERED_TOTAL: &str = "acemq.schedule.delivered.total";
/// Scheduled messages put on a rung (counter; Rust only). Tags: `transport`.
pub const SCHEDULE_HOPS_TOTAL: &str = "acemq.schedule.hops.total";
/// Due messages not delivered because they were cancelled (counter; Rust only). Tags:
/// `transport`.
pub const SCHEDULE_CANCELLED_TOTAL: &str = "acemq.schedule.cancelled.total";
/// How late a scheduled message was delivered after its due time (timer, seconds; Rust
/// only). Tags: `transport`.
pub const SCHEDULE_LATENESS: &str = "acemq.schedule.lateness";
/// Ready messages in `acemq.schedule.due` at the last check (gauge; Rust only). Tags:
/// `transport`.
pub const SCHEDULE_BACKLOG: &str = "acemq.schedule.backlog";

/// Pipeline runs that ended at a step (counter; Java's name, not in the contract table).
/// Tags: `pipeline`, `step`, `outcome` = `completed` | `ended_early`.
pub const PIPELINE_RUN_TOTAL: &str = "acemq.pipeline.run.total";
/// A pipeline run's age when it ended (timer, seconds: now minus the envelope's
/// first-seen; Java's name). Tags: `pipeline`, `step`, `outcome`.
pub const PIPELINE_RUN_DURATION: &str = "acemq.pipeline.run.duration";

/// Members of a consumer group now (gauge; Rust only). Tags: `queue`.
pub const CONSUMER_GROUP_MEMBERS: &str = "acemq.consumer.group.members";

/// Sagas run to their end, by outcome (counter; Rust only). Tags: `saga`, `outcome` =
/// `completed` | `compensated` | `unresolved` ([`crate::saga`]).
pub const SAGA_TOTAL: &str = "acemq.saga.total";
/// Sagas that started compensating after a failed or abandoned step (counter; Rust only).
/// Tags: `saga`.
pub const SAGA_COMPENSATING_TOTAL: &str = "acemq.saga.compensating.total";
/// Saga steps left unresolved: their compensation failed every attempt or ran out of time,
/// and a person has to act (counter; Rust only). Tags: `saga`.
pub const SAGA_UNRESOLVED_TOTAL: &str = "acemq.saga.unresolved.total";
/// Tag: the saga's name ([`crate::saga::Saga::name`]).
pub const TAG_SAGA: &str = "saga";

/// Metrics of this library only (not in the wire contract), described like the others.
pub const RUST_ONLY_METRICS: &[MetricSpec] = &[
    spec(
        CONSUMER_RESUBSCRIBED_TOTAL,
        Instrument::Counter,
        &[TAG_QUEUE, TAG_TRANSPORT],
        "AceMQ consumers subscribed again after the broker listed none",
    ),
    spec(
        RECOVERY_TOTAL,
        Instrument::Counter,
        &["event", TAG_TRANSPORT],
        "AceMQ connection recovery events",
    ),
    spec(
        ORDERED_TOTAL,
        Instrument::Counter,
        &[TAG_QUEUE, TAG_TRANSPORT, TAG_OUTCOME],
        "AceMQ ordered-queue deliveries by outcome",
    ),
    spec(
        ORDERED_HALTED,
        Instrument::Gauge,
        &[TAG_QUEUE, TAG_TRANSPORT],
        "AceMQ ordered-queue partitions halted now",
    ),
    spec(
        CONSUMER_GROUP_MEMBERS,
        Instrument::Gauge,
        &[TAG_QUEUE],
        "AceMQ consumer group members",
    ),
    spec(
        PIPELINE_RUN_TOTAL,
        Instrument::Counter,
        &["pipeline", "step", TAG_OUTCOME],
        "AceMQ pipeline runs ended, by outcome",
    ),
    spec(
        PIPELINE_RUN_DURATION,
        Instrument::Timer,
        &["pipeline", "step", TAG_OUTCOME],
        "AceMQ pipeline run age when it ended",
    ),
    spec(
        SCHEDULE_SCHEDULED_TOTAL,
        Instrument::Counter,
        &[TAG_TRANSPORT],
        "AceMQ messages handed to a scheduler",
    ),
    spec(
        SCHEDULE_DELIVERED_TOTAL,
        Instrument::Counter,
        &[TAG_TRANSPORT],
        "AceMQ scheduled messages delivered",
    ),
    spec(
        SCHEDULE_HOPS_TOTAL,
        Instrument::Counter,
        &[TAG_TRANSPORT],
        "AceMQ scheduled messages put on a rung",
    ),
    spec(
        SCHEDULE_CANCELLED_TOTAL,
        Instrument::Counter,
        &[TAG_TRANSPORT],
        "AceMQ due messages not delivered because cancelled",
    ),
    spec(
        SCHEDULE_LATENESS,
        Instrument::Timer,
        &[TAG_TRANSPORT],
        "AceMQ scheduled delivery time after the due time",
    ),
    spec(
        SCHEDULE_BACKLOG,
        Instrument::Gauge,
        &[TAG_TRANSPORT],
        "AceMQ ready messages in the scheduler's control queue",
    ),
    spec(
        SAGA_TOTAL,
        Instrument::Counter,
        &[TAG_SAGA, TAG_OUTCOME],
        "AceMQ sagas by outcome",
    ),
    spec(
        SAGA_COMPENSATING_TOTAL,
        Instrument::Counter,
        &[TAG_SAGA],
        "AceMQ sagas that started compensating",
    ),
    spec(
        SAGA_UNRESOLVED_TOTAL,
        Instrument::Counter,
        &[TAG_SAGA],
        "AceMQ saga steps whose compensation did not succeed",
    ),
];

const fn spec(
    name: &'static str,
    instrument: Instrument,
    labels: &'static [&'static str],
    help: &'static str,
) -> MetricSpec {
    MetricSpec {
        name,
        instrument,
        labels,
        help,
    }
}

/// Every metric name of the wire contract, for a set comparison with the other libraries
/// (the names of [`METRICS`]).
pub const ALL_METRIC_NAMES: &[&str] = &[
    PUBLISH_DURATION,
    PUBLISH_TOTAL,
    CONSUME_DURATION,
    CONSUME_TOTAL,
    CONSUME_ATTEMPTS,
    CONSUME_IN_FLIGHT,
    MESSAGES_RETRIED_TOTAL,
    MESSAGES_DEAD_LETTERED_TOTAL,
    MESSAGES_SET_ASIDE_FAILED,
    RETRY_RUNG_MISSING,
    OUTBOX_LAG,
    OUTBOX_TOTAL,
    REQUEST_DURATION,
    REQUEST_TOTAL,
];

/// Bucket upper bounds (seconds) of every timer: 1 ms to 60 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Bucket upper bounds of `acemq.consume.attempts`: 1 to 10, then 15, 20, 50.
pub const ATTEMPT_BUCKETS: &[f64] = &[
    1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 50.0,
];

/// The spec of a metric by its dotted name.
///
/// ```
/// use acemq::observe::metrics::{spec_of, Instrument};
/// assert_eq!(spec_of("acemq.consume.attempts").map(|m| m.instrument), Some(Instrument::Distribution));
/// ```
pub fn spec_of(name: &str) -> Option<&'static MetricSpec> {
    METRICS
        .iter()
        .chain(RUST_ONLY_METRICS)
        .find(|m| m.name == name)
}

/// Registers units and descriptions for every metric with the current recorder. Optional;
/// exporters use them for `# HELP` lines and, with Prometheus' recommended naming, the
/// `_seconds` suffix of timers. The actuator calls it after installing its recorder; call
/// it yourself after installing your own.
///
/// ```
/// acemq::observe::metrics::describe(); // no recorder: a no-op
/// ```
pub fn describe() {
    for m in METRICS.iter().chain(RUST_ONLY_METRICS) {
        let unit = m.instrument.unit();
        match m.instrument {
            Instrument::Counter => metrics::describe_counter!(m.name, unit, m.help),
            Instrument::Gauge => metrics::describe_gauge!(m.name, unit, m.help),
            _ => metrics::describe_histogram!(m.name, unit, m.help),
        }
    }
}
