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
