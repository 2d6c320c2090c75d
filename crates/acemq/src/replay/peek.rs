//! Peeking: the first `n` messages of a dead-letter (or parked) queue, read without moving
//! them.
//!
//! This module owns [`PeekedMessage`] (what an operator sees of one message, read through
//! the envelope) and [`Replay::peek`]: up to `n` basic.gets, never more than `n` unacked,
//! then all handed back in their order with one nack (see `scan::give_back`). If the process dies
//! while it holds them, the broker returns them when the connection closes.

use std::time::Duration;

use bytes::Bytes;
use time::OffsetDateTime;

use super::Replay;
use super::scan::give_back;
use crate::envelope::{self, Envelope, application_headers, format_instant};
use crate::error::Error;
use crate::headers::Headers;
use crate::transport::Delivery;

/// One message as [`Replay::peek`] shows it (the message itself stays in the queue).
///
/// The envelope fields are `None` when the message does not carry them (a message written
/// by something other than AceMQ, or dead-lettered by the broker itself).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// # let mq = acemq::Connection::connect("memory://doc-peeked").await?;
/// # for q in ["orders.dlq"] { mq.transport().declare_queue(&acemq::topology::QueueDecl::classic(q)).await?; }
/// for m in mq.replay("orders").peek(10).await? {
///     println!(
///         "{} {} attempt {:?}: {}",
///         m.id.as_deref().unwrap_or("-"),
///         m.message_type.as_deref().unwrap_or("-"),
///         m.attempt,
///         m.error.as_deref().unwrap_or("(no reason recorded)"),
///     );
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PeekedMessage {
    /// The envelope id (`x-acemq-id`, else the AMQP `message_id`).
    pub id: Option<String>,
    /// The logical type (`x-acemq-type`).
    pub message_type: Option<String>,
    /// The attempt it failed on (`x-acemq-attempt`).
    pub attempt: Option<u32>,
    /// Its first publish (`x-acemq-first-seen`).
    pub first_seen: Option<OffsetDateTime>,
    /// Time since its first publish.
    pub age: Option<Duration>,
    /// `{client}@{hostname}` of its publisher (`x-acemq-origin`).
    pub origin: Option<String>,
    /// Why it was dead-lettered or parked (`x-acemq-error`).
    pub error: Option<String>,
    /// How many times it was replayed before (`acemq-replay-count`).
    pub replay_count: Option<u32>,
    /// The queue its last replay took it from (`acemq-replayed-from`).
    pub replayed_from: Option<String>,
    /// When it was last replayed, RFC 3339 (`acemq-replayed-at`).
    pub replayed_at: Option<String>,
    /// Its application headers (without the reserved `x-acemq-*` ones).
    pub headers: Headers,
    /// Every header as delivered (including `x-acemq-*`, provenance and `x-death`).
    pub all_headers: Headers,
    /// Its content type.
    pub content_type: Option<String>,
    /// Its body, as stored.
    pub body: Bytes,
    /// The broker had delivered it before (to a consumer, or to an earlier peek).
    pub redelivered: bool,
}

impl PeekedMessage {
    /// Reads one delivery through the envelope.
    pub(crate) fn from_delivery(d: &Delivery) -> PeekedMessage {
        let h = &d.properties.headers;
        let env = Envelope::read(&d.properties, &d.routing_key);
        let has = |name: &str| h.contains_key(name);
        let id = (has(envelope::ID) || d.properties.message_id.is_some()).then(|| env.id());
        PeekedMessage {
            id: id.map(str::to_owned),
            message_type: has(envelope::TYPE).then(|| env.message_type().to_owned()),
            attempt: has(envelope::ATTEMPT)
                .then(|| u32::try_from(env.attempt()).ok())
                .flatten(),
            first_seen: env.first_seen_millis().and_then(|ms| {
                OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
            }),
            age: env.age(),
            origin: env.origin().map(str::to_owned),
            error: env.error().map(str::to_owned),
            replay_count: has(envelope::REPLAY_COUNT)
                .then(|| u32::try_from(env.replay_count()).ok())
                .flatten(),
            replayed_from: env.replayed_from().map(str::to_owned),
            replayed_at: env.replayed_at().map(format_instant),
            headers: application_headers(h),
            all_headers: h.clone(),
            content_type: d.properties.content_type.clone(),
            body: d.body.clone(),
            redelivered: d.redelivered,
        }
    }
}

impl Replay {
    /// Looks at up to `n` messages from the head of the queue without moving them: at most
    /// `n` are held unacked at once, and all are handed back in their order before this
    /// returns (a process that dies while peeking loses nothing either: the broker returns
    /// what it held when the connection closes). Peeked messages come back marked
    /// redelivered.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// # let mq = acemq::Connection::connect("memory://doc-peek-fn").await?;
    /// # for q in ["orders.dlq"] { mq.transport().declare_queue(&acemq::topology::QueueDecl::classic(q)).await?; }
    /// let replay = mq.replay("orders");
    /// let before = replay.pending().await?;
    /// let first = replay.peek(5).await?;
    /// assert!(first.len() <= 5);
    /// assert_eq!(replay.pending().await?, before);
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, n: usize) -> Result<Vec<PeekedMessage>, Error> {
        let _one_at_a_time = self.engine.gets.lock().await;
        let mut held: Vec<Delivery> = Vec::with_capacity(n.min(1024));
        let mut failure = None;
        while held.len() < n {
            match self.engine.transport.get(&self.from).await {
                Ok(Some(d)) => held.push(d),
                Ok(None) => break,
                Err(e) => {
                    failure = Some(Error::from(e));
                    break;
                }
            }
        }
        let seen = held.iter().map(PeekedMessage::from_delivery).collect();
        give_back(held).await;
        failure.map_or(Ok(seen), Err)
    }
}
