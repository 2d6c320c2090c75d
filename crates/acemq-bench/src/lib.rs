//! The scenarios of the AceMQ benchmark, each written twice: through AceMQ and through raw
//! lapin "the straightforward, competent way". `main.rs` runs them in alternating rounds and
//! prints the table; `tests/smoke.rs` runs them with tiny counts so CI proves they still work.
//!
//! Every AMQP run gets its own durable queue (classic or quorum), deleted afterwards together
//! with the `{q}.dlq` / `{q}.parked` queues an AceMQ consumer declares.

use std::error::Error as StdError;
use std::time::Duration;

mod ace;
/// The codec scenarios (`--codecs`).
pub mod codecs;
/// The floor of scenario 5 (`--floor`): the contract's per-message work, bare.
pub mod floor;
mod raw;
mod request;
/// How cost grows with scale (`--scale`).
pub mod scale;
mod scenario;
mod stats;
mod wait;
/// Codec-wrapper scenarios: encryption and claim check.
pub mod wrappers;
pub use ace::{
    acemq_confirm_each, acemq_consume, acemq_pipelined, acemq_retry, memory_publish_consume,
};
pub use raw::{
    fill, raw_confirm_each, raw_consume, raw_pipelined, raw_retry, set_raw_contract,
    set_raw_envelope_headers, set_raw_two_connections,
};
pub use request::{
    REQUEST_TIMEOUT, REQUEST_WINDOW, RESPONDER_CONCURRENCY, acemq_request_reply,
    memory_request_reply, raw_request_reply, set_request_window,
};
pub use scenario::{Broker, Payload, QueueKind, Scenario, Side};
pub use stats::{Clock, Sample, Span, peak_rss_kib, percentile, process_cpu};
pub use wait::{FAIL_EVERY, FAILURE_WAIT, WAIT_PREFETCH, WORK, acemq_waits};

/// The error type of the benchmark.
pub type BoxError = Box<dyn StdError + Send + Sync>;
/// The result type of the benchmark.
pub type Result<T> = std::result::Result<T, BoxError>;

/// Publishes per batch in the pipelined scenario (raw lapin awaits each batch's confirms).
pub const BATCH: usize = 100;
/// The prefetch of every consumer.
pub const PREFETCH: u16 = 100;
/// How far the `memory://` publisher may run ahead of its consumer.
pub const MEMORY_BACKLOG: u64 = 10_000;
/// The in-consumer wait before the retry in scenario 4.
pub const RETRY_WAIT: Duration = Duration::from_millis(1);
