//! The acemq-sql integration tests, one module per area, in one test binary. They run every
//! backend (SQLite always; PostgreSQL and MariaDB at their `ACEMQ_TEST_*_URL`s), so they are
//! built only with all three backend features (`--all-features`). The recovery drill is a
//! binary of its own (`drills.rs`).

#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

#[path = "../support/mod.rs"]
mod support;

/// The acemq crate's test support (targets, unique names, polling, queue setup).
#[path = "../../../acemq/tests/support/mod.rs"]
mod amqp_support;

/// The acemq drills' broker control (stop and start the broker's application).
#[path = "../../../acemq/tests/drills/broker.rs"]
mod broker;

mod cancellations;
mod idempotency_conformance;
mod idempotency_tx;
mod idempotent_consumer;
mod outbox;
mod saga;
mod saga_kill;
mod store_outage;
