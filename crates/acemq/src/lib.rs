//! # AceMQ for Rust
//!
//! A reliability layer over RabbitMQ, and the Rust member of the AceMQ family: typed
//! publishing with publisher confirms, consumers whose failures are retried on a schedule
//! that survives restarts, dead letters (`{q}.dlq`) and unreadable messages (`{q}.parked`)
//! that can be replayed. Every member of the family speaks one wire contract, so a Rust
//! service reads, retries and replays what a Java, .NET, Go, Python or Ruby service wrote.
//!
//! The data path, module by module:
//! [`envelope`] (the wire headers) -> [`codec`] (the body) -> [`publish`] ->
//! [`transport`] (RabbitMQ or `memory://`) -> [`consume`] (with [`consume::settle`] owning
//! every settlement rule, driven by [`retry`]) -> [`replay`]. [`topology`] names and
//! declares the queues the rules need.
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![deny(unused_must_use)]

#[cfg(feature = "actuator")]
pub mod actuator;
pub mod codec;
pub mod connection;
pub mod consume;
mod engine;
pub mod envelope;
pub mod error;
pub mod headers;
pub mod health;
pub mod idempotency;
pub mod intercept;
pub mod lifecycle;
pub mod observe;
pub mod publish;
pub mod replay;
pub mod retry;
pub mod topology;
pub mod transport;
mod util;

pub use connection::Connection;

/// The README's tour, compiled as a doctest so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeTour;
pub use error::Error;
