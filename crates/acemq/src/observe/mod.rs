//! Observability: the family's metrics and trace context.
//!
//! - [`metrics`]: metric names, tag keys and closed outcome enums from the wire contract
//!   (`docs/wire.md` §9), recorded through the [`metrics`](https://docs.rs/metrics) facade. The library
//!   never installs a recorder.
//! - [`trace`]: W3C `traceparent` / `tracestate` in message headers, a task-local current
//!   context, and the `{destination} publish` / `{queue} process` spans as [`tracing`]
//!   spans. No OpenTelemetry SDK is needed.
//!
//! Health lives in [`crate::health`]; the HTTP actuator that serves all of it is
//! `crate::actuator` (feature `actuator`).
//!
//! ```
//! use acemq::observe::{metrics::ConsumeOutcome, trace::TraceContext};
//! assert_eq!(ConsumeOutcome::Retried.as_str(), "retried");
//! assert_eq!(TraceContext::new_root().to_traceparent().len(), 55);
//! ```

pub mod metrics;
pub mod trace;

/// The family's name of the RabbitMQ transport (health, metrics' `transport` label,
/// `/acemq-info`): `rabbitmq`.
pub const TRANSPORT_RABBITMQ: &str = "rabbitmq";
/// The family's name of the in-process broker: `memory`.
pub const TRANSPORT_MEMORY: &str = "memory";

/// The family-facing name of a transport kind: `amqp` (what
/// [`Transport::kind`](crate::transport::Transport::kind) and `Connection::transport_kind`
/// answer for RabbitMQ) is `rabbitmq`; every other kind is its own name.
///
/// ```
/// use acemq::observe::transport_name;
/// assert_eq!(transport_name("amqp"), "rabbitmq");
/// assert_eq!(transport_name("memory"), "memory");
/// ```
pub fn transport_name(kind: &'static str) -> &'static str {
    match kind {
        "amqp" | "amqps" | TRANSPORT_RABBITMQ => TRANSPORT_RABBITMQ,
        other => other,
    }
}
