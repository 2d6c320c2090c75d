//! # SQL-backed idempotency, the transactional outbox and stream offsets for AceMQ
//!
//! What a service behind RabbitMQ needs a database for:
//!
//! * [`SqlIdempotencyStore`]: an [`acemq::idempotency::IdempotencyStore`] shared by every
//!   instance behind a queue, so a redelivery that lands on another machine is still
//!   recognised. A claim is an `INSERT` (the primary key does the mutual exclusion), a
//!   claim is a lease another consumer may take over once it expires (one conditional
//!   `UPDATE`), and a confirmed row is never retaken.
//! * [`outbox::Outbox`] and [`outbox::OutboxRelay`]: the transactional outbox. A message
//!   is written in the caller's own transaction, with the business data, and becomes
//!   durable exactly when that transaction commits; a relay publishes it afterwards.
//! * [`offsets::SqlOffsetStore`]: an [`acemq::stream::OffsetStore`], so a stream reader
//!   resumes after its last committed offset on whichever instance restarts it. A commit
//!   is one upsert that keeps the highest offset.
//! * [`cancellations::SqlCancelStore`]: an [`acemq::schedule::CancelStore`], so a
//!   scheduled message cancelled on one instance is not delivered by any scheduler that
//!   shares the table, across restarts. A cancellation is one insert that ignores an
//!   existing row.
//! * [`saga::DurableSaga`]: a saga whose every step commits with its log entry in one
//!   transaction, so one interrupted anywhere (a crash, a SIGKILL) is resumed by recovery
//!   and ends completed or compensated, never half-applied. Rust only.
//!
//! Backends are sqlx 0.9 pools, one crate feature each: `postgres`, `mysql` (MySQL 8 and
//! MariaDB) and `sqlite` (bundled). None is on by default. TLS is not enabled here; to
//! reach a database over TLS, enable a sqlx TLS feature (for example
//! `sqlx/tls-rustls-ring-webpki`) in your own `Cargo.toml`.
//!
//! ## Representation
//!
//! The idempotency table is the Java member's (`TIMESTAMP WITH TIME ZONE` on PostgreSQL,
//! `DATETIME(3)` in UTC on MySQL and MariaDB, epoch milliseconds on SQLite), so Java and
//! Rust consumers share it; the outbox, the stream offsets and the scheduler's
//! cancellations store epoch milliseconds in `BIGINT` columns (the cancellations' from the
//! scheduler's clock, which passes them in). Timestamps are computed in Rust, so no database clock or time-zone
//! setting is involved (the instances sharing a table should have reasonably synchronised
//! clocks). SQL is written per dialect; a configurable table name is spliced into
//! statements only after it has been validated as an identifier (see [`TableName`]).
//!
//! The library never runs DDL uninvited: `create_table_sql()` hands you the statements for
//! a migration, and `create_table_if_absent()` exists for development and tests.
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![deny(unused_must_use)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused, unreachable_code)
)]

#[macro_use]
mod pool;
pub mod cancellations;
mod error;
pub mod headers_json;
mod idempotency;
mod ident;
pub mod offsets;
pub mod outbox;
pub mod saga;

pub use cancellations::SqlCancelStore;
pub use error::Error;
pub use idempotency::{IdempotencyDatabase, IdempotencyOptions, PurgeTask, SqlIdempotencyStore};
pub use ident::TableName;
pub use offsets::SqlOffsetStore;
pub use pool::{Dialect, SqlPool};

/// The `sqlx` this crate was built with: its pools and transactions appear in the API.
pub use sqlx;

pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(crate) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `{hostname}:{pid}:{uuid}`: identifies one store or relay instance in `claimed_by` and
/// `locked_by` columns. At most 64 characters (Java's `claimed_by VARCHAR(64)`): the uuid
/// is written without hyphens and the host name is shortened to fit.
pub(crate) fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    let tail = format!(":{}:{}", std::process::id(), uuid::Uuid::new_v4().simple());
    let room = 64usize.saturating_sub(tail.len());
    let host: String = host.chars().take(room).collect();
    format!("{host}{tail}")
}
