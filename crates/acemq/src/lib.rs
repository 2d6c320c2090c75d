//! # AceMQ for Rust
//!
//! A reliability layer over RabbitMQ, and the Rust member of the AceMQ family: typed
//! publishing with publisher confirms, consumers whose failures are retried on a schedule
//! that survives restarts, dead letters (`{q}.dlq`) and unreadable messages (`{q}.parked`)
//! that can be replayed.
//!
//! ```
//! use acemq::consume::{ConsumerOptions, Message};
//! use acemq::topology::Topology;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), acemq::Error> {
//! // "amqp://guest:guest@127.0.0.1:5672/%2f" for RabbitMQ; memory:// runs in the process.
//! let mq = acemq::Connection::connect("memory://quickstart").await?;
//! mq.declare(&Topology::define().queue("greetings").build()?).await?;
//!
//! // Returns once the broker has confirmed (and routed) it.
//! mq.publisher::<String>("", "greetings").send(&"hello".to_owned()).await?;
//!
//! // Ok acks; an error is retried under the consumer's policy, then dead-lettered.
//! let (tx, mut rx) = tokio::sync::mpsc::channel(1);
//! let _consumer = mq
//!     .consume("greetings", ConsumerOptions::default(), move |m: Message<String>| {
//!         let tx = tx.clone();
//!         async move {
//!             let _ = tx.send(m.into_payload()).await;
//!             Ok(())
//!         }
//!     })
//!     .await?;
//! assert_eq!(rx.recv().await.as_deref(), Some("hello"));
//!
//! mq.close().await?; // drains running handlers, then closes
//! # Ok(()) }
//! ```
//!
//! Every member of the family speaks one wire contract (`docs/wire.md` in the repository),
//! so a Rust service reads, retries and replays what a Java, .NET, Go, Python or Ruby
//! service wrote. The crate's README has a longer tour (retry policies, dead letters,
//! replay).
//!
//! The data path, module by module:
//!
//! - [`connection`] is the façade: [`Connection`] is a cheap handle and every one of its
//!   public methods is written there, a few lines each, delegating down.
//! - The engine (private, `engine.rs`) is what the handle points at: the [`transport`]
//!   (RabbitMQ or `memory://`), the confirm window, the one path for publishing on a
//!   caller's behalf (retry hops, dead letters, parking, replay), the declare loop for a
//!   [`topology`], the [`lifecycle`], the [`intercept`]ors and the [`health`] registry.
//!   Publishers, consumers and replays each hold the engine, never the connection.
//! - Out: [`publish`] builds the [`envelope`] (the wire headers) and encodes the body with a
//!   [`codec`], then sends it through the engine's confirm window.
//! - In: [`consume`] runs each delivery through its steps (admit → crash-loop check →
//!   decode → guarded run → decide → settle → release): the settlement rules are pure
//!   functions (the private `consume::decide`, driven by a [`retry`] policy) and their
//!   effects are moves made through the engine; [`replay`] brings dead letters and parked messages back.
//! - Both ways: [`request`] (a requester with a private reply queue, and a responder built
//!   on the consumer) for request/reply.
//! - Around it all: [`observe`] (metrics and trace context), [`idempotency`], and the
//!   `actuator` (feature `actuator`), and the operator `console` (feature `console`).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![deny(unused_must_use)]

#[cfg(feature = "actuator")]
pub mod actuator;
pub mod codec;
pub mod connection;
#[cfg(feature = "console")]
pub mod console;
pub mod consume;
mod engine;
pub mod envelope;
pub mod error;
mod handler_error;
pub mod headers;
pub mod health;
pub mod idempotency;
pub mod intercept;
pub mod lifecycle;
pub mod observe;
pub mod ordered;
pub mod pipeline;
pub mod publish;
pub mod replay;
pub mod request;
pub mod retry;
pub mod saga;
pub mod schedule;
pub mod stream;
pub mod topology;
pub mod transport;
mod util;

pub use connection::Connection;
pub use error::Error;

/// The README's tour, compiled as a doctest so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeTour;

/// Crates whose types appear in AceMQ's public API, re-exported so a user's code names the
/// same versions AceMQ was built with (`acemq::reexports::bytes::Bytes`, …).
///
/// ```
/// let body: acemq::reexports::bytes::Bytes = "hi".into();
/// let token = acemq::CancellationToken::new();
/// assert!(!token.is_cancelled() && body.len() == 2);
/// ```
pub mod reexports {
    pub use bytes;
    pub use time;
    pub use tokio_util;
}

/// The token a handler watches to notice shutdown ([`consume::Message::cancellation`]);
/// re-exported from `tokio_util`.
pub use tokio_util::sync::CancellationToken;
