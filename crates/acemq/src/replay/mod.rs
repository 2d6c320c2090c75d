//! Replay: looking at, moving back, or dropping dead letters (`{q}.dlq`) and parked
//! messages (`{q}.parked`) (wire.md §7).
//!
//! This module owns the operator's view of a dead-letter queue:
//!
//! - [`Replay::peek`] looks at the first `n` messages without moving them (`peek.rs`);
//! - [`Replay::replay_matching`], [`Replay::dry_run_matching`] and
//!   [`Replay::purge_matching`] make one bounded pass over the queue (`scan.rs`).
//!
//! **Moving back.** A message is pulled (basic.get), republished through the default
//! exchange to the source queue (never through the original exchange, which would hand
//! duplicates to every other bound queue), and the dead letter is acked only after the copy
//! is confirmed and routed, so a replay is at-least-once and a crash half-way loses
//! nothing. The body is kept byte for byte, the attempt reset to 1 (unless
//! [`Replay::keeping_attempts`]), first-seen kept, and the provenance headers
//! `acemq-replayed-from`, `acemq-replayed-at` and `acemq-replay-count` written.
//!
//! **Bounded passes.** A pass examines at most the number of messages the queue held when
//! it started (and at most [`Replay::scan_limit`]), so it never reads a message twice nor
//! chases messages that fail again while it runs. Messages the filter declines (and, in a
//! dry run, the ones it accepts) are held unacked, never more than [`Replay::hold_limit`]
//! at once. While a pass holds fewer than that, the held messages are returned to their
//! places when it ends and the queue's order is unchanged. When the held set fills, the
//! held messages are **moved to the tail**: each is republished byte for byte (same
//! properties, headers and body) through the default exchange to the same queue, and the
//! original is acked once the copy is confirmed. Such a pass keeps the relative order of
//! the messages it passed over, but puts them behind the messages it did not reach (and
//! behind any that arrived during the pass). A crash between a copy's confirm and the
//! original's ack leaves the message twice in the queue, never zero times.
//!
//! **Peeking.** [`Replay::peek`] holds at most `n` messages unacked and hands them back
//! with one `basic.nack` (multiple, requeue); if the process dies while peeking, the broker
//! returns them when the connection closes. A classic queue (what `{q}.dlq` and
//! `{q}.parked` are) puts them back where they were, marked redelivered; a RabbitMQ 3.10
//! quorum queue would put them behind the others (in their order) and count a delivery.
//! RabbitMQ requeues asynchronously: [`Replay::pending`] can lag a peek by a moment.
//!
//! One pass or peek at a time per [`crate::Connection`] (a second one waits): they share
//! its basic.get channel. Use another connection to run them side by side.
//!
//! Java stops a filtered replay at the first message its filter declines; this library
//! goes on, bounded as above (wire.md §7, "our choice").

mod peek;
mod scan;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use time::OffsetDateTime;

use crate::engine::Engine;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::headers::{HeaderValue, Headers};
use crate::topology::{dead_letter_queue, parked_queue};
use crate::transport::{Confirmation, Delivery, Settlement};

pub use peek::PeekedMessage;
use scan::Mode;

/// How many declined messages a pass holds unacked at once unless told otherwise.
pub const DEFAULT_HOLD_LIMIT: usize = 100;

/// A replay of one queue's dead letters (or parked messages).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// let mq = acemq::Connection::connect("memory://doc-replay").await?;
/// let replay = mq.replay("orders.new");
/// assert_eq!(replay.from_queue(), "orders.new.dlq");
/// assert_eq!(replay.clone().parked().from_queue(), "orders.new.parked");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Replay {
    engine: Arc<Engine>,
    to: String,
    from: String,
    keep_attempts: bool,
    scan_limit: Option<usize>,
    hold_limit: usize,
    progress: Option<Arc<ProgressFn>>,
}

type ProgressFn = dyn Fn(&ReplayProgress) + Send + Sync;

impl fmt::Debug for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("keep_attempts", &self.keep_attempts)
            .field("scan_limit", &self.scan_limit)
            .field("hold_limit", &self.hold_limit)
            .field("on_progress", &self.progress.is_some())
            .finish_non_exhaustive()
    }
}

/// What a replay (or dry run, or purge) pass did.
///
/// ```
/// let r = acemq::replay::ReplayReport::default();
/// assert_eq!((r.scanned, r.replayed, r.declined, r.failed, r.purged), (0, 0, 0, 0, 0));
/// assert!(r.matched_ids.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Messages the pass examined.
    pub scanned: usize,
    /// Moved back to the source queue (confirmed and routed, then acked).
    pub replayed: usize,
    /// Declined by the filter; they stay in the dead-letter queue.
    pub declined: usize,
    /// Accepted but not moved (e.g. a copy too large for the connection's `frame_max`);
    /// they stay in the dead-letter queue.
    pub failed: usize,
    /// Dropped (acked) by [`Replay::purge_matching`].
    pub purged: usize,
    /// The envelope ids of the messages the filter accepted, in the order seen: what a dry
    /// run would move, or what a pass moved or purged.
    pub matched_ids: Vec<String>,
}

/// How far a pass has got, handed to [`Replay::on_progress`] after each message.
///
/// ```
/// let mq_replay = |r: acemq::replay::Replay| {
///     r.on_progress(|p: &acemq::replay::ReplayProgress| {
///         eprintln!("{} of {:?} scanned, {} replayed", p.scanned, p.total_hint, p.replayed)
///     })
/// };
/// # let _ = mq_replay;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayProgress {
    /// Messages examined so far.
    pub scanned: usize,
    /// Moved back (or, in a purge, dropped) so far.
    pub replayed: usize,
    /// Declined so far.
    pub declined: usize,
    /// Failed so far.
    pub failed: usize,
    /// How many the pass will examine at most (the queue's count when it started, capped
    /// by the scan limit).
    pub total_hint: Option<u64>,
}

/// A dead letter as a replay filter sees it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// # let mq = acemq::Connection::connect("memory://doc-deadletter").await?;
/// # for q in ["orders", "orders.dlq"] { mq.transport().declare_queue(&acemq::topology::QueueDecl::classic(q)).await?; }
/// let report = mq
///     .replay("orders")
///     .replay_matching(10, |dl| {
///         dl.message_type() == "order.placed"
///             && dl.error().is_some_and(|e| e.contains("timeout"))
///             && dl.header("x-tenant").as_deref() == Some("acme")
///     })
///     .await?;
/// assert_eq!(report.replayed, 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DeadLetter<'a> {
    /// Its envelope (`error()` says why it failed).
    pub envelope: &'a Envelope,
    /// Its application headers.
    pub headers: &'a Headers,
    /// Its body, as stored.
    pub body: &'a Bytes,
}

impl DeadLetter<'_> {
    /// Its logical type (`x-acemq-type`, else the routing key).
    pub fn message_type(&self) -> &str {
        self.envelope.message_type()
    }

    /// Why it was dead-lettered or parked (`x-acemq-error`), when recorded.
    pub fn error(&self) -> Option<&str> {
        self.envelope.error()
    }

    /// How long ago it was first published (`x-acemq-first-seen`), when known.
    pub fn age(&self) -> Option<Duration> {
        self.envelope.age()
    }

    /// An application header as text (strings as they are, numbers and booleans written
    /// out, byte arrays as lossy UTF-8); `None` when absent or a table or array.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).and_then(header_text)
    }
}

/// A scalar header value as text.
pub(crate) fn header_text(v: &HeaderValue) -> Option<String> {
    Some(match v {
        HeaderValue::Str(s) => s.clone(),
        HeaderValue::Bool(b) => b.to_string(),
        HeaderValue::F32(f) => f.to_string(),
        HeaderValue::F64(f) => f.to_string(),
        HeaderValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        other => other.as_i64()?.to_string(),
    })
}

impl Replay {
    /// A replay of `{queue}.dlq` back into `queue` (what [`crate::Connection::replay`]
    /// hands out).
    pub(crate) fn new(engine: Arc<Engine>, queue: &str) -> Replay {
        Replay {
            engine,
            to: queue.to_owned(),
            from: dead_letter_queue(queue),
            keep_attempts: false,
            scan_limit: None,
            hold_limit: DEFAULT_HOLD_LIMIT,
            progress: None,
        }
    }

    /// Replays `{queue}.parked` instead (after deploying the fix that reads them).
    pub fn parked(mut self) -> Self {
        self.from = parked_queue(&self.to);
        self
    }

    /// Keeps each message's attempt count instead of resetting it to 1.
    pub fn keeping_attempts(mut self) -> Self {
        self.keep_attempts = true;
        self
    }

    /// Stops a pass after examining `n` messages (whatever it found).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-scan-limit").await?;
    /// let replay = mq.replay("orders.new").scan_limit(1_000).hold_limit(50);
    /// # let _ = replay;
    /// # Ok(()) }
    /// ```
    pub fn scan_limit(mut self, n: usize) -> Self {
        self.scan_limit = Some(n);
        self
    }

    /// Holds at most `n` (at least 1) passed-over messages unacked at once (default
    /// [`DEFAULT_HOLD_LIMIT`]); beyond that they are moved to the tail of the queue (see
    /// the module docs).
    pub fn hold_limit(mut self, n: usize) -> Self {
        self.hold_limit = n.max(1);
        self
    }

    /// Calls `f` as a pass goes, after each message it examines.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-progress").await?;
    /// let replay = mq
    ///     .replay("orders.new")
    ///     .on_progress(|p| eprintln!("scanned {} of {:?}", p.scanned, p.total_hint));
    /// # let _ = replay;
    /// # Ok(()) }
    /// ```
    pub fn on_progress(mut self, f: impl Fn(&ReplayProgress) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(f));
        self
    }

    /// The queue messages are taken from.
    pub fn from_queue(&self) -> &str {
        &self.from
    }

    /// The queue messages are put back into.
    pub fn to_queue(&self) -> &str {
        &self.to
    }

    /// How many messages wait to be replayed (ready ones; moves nothing).
    pub async fn pending(&self) -> Result<u32, Error> {
        Ok(self
            .engine
            .transport
            .inspect_queue(&self.from)
            .await?
            .message_count)
    }

    /// Replays at most `max` messages.
    pub async fn replay(&self, max: usize) -> Result<ReplayReport, Error> {
        self.replay_matching(max, |_| true).await
    }

    /// Replays what is waiting now (messages that fail again and come back during the pass
    /// wait for the next one).
    pub async fn replay_all(&self) -> Result<ReplayReport, Error> {
        self.replay(usize::MAX).await
    }

    /// Replays at most `max` messages the filter accepts, in one bounded pass (see the
    /// module docs: declined messages stay in the dead-letter queue).
    ///
    /// An accepted message whose copy would be too large for the connection's `frame_max`
    /// is counted as `failed` and stays where it was. A pass stops at the first copy the
    /// broker does not take, leaving that message where it was: [`Error::Unroutable`] when
    /// the destination routed it nowhere (e.g. the queue was deleted mid-pass),
    /// [`Error::Nacked`] when the broker refused it, a transport error otherwise.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// # let mq = acemq::Connection::connect("memory://doc-replay-matching").await?;
    /// # for q in ["orders", "orders.dlq"] { mq.transport().declare_queue(&acemq::topology::QueueDecl::classic(q)).await?; }
    /// let report = mq
    ///     .replay("orders")
    ///     .hold_limit(100)
    ///     .replay_matching(10, |dl| dl.message_type() == "order.placed")
    ///     .await?;
    /// println!("replayed {} of {} scanned", report.replayed, report.scanned);
    /// # Ok(()) }
    /// ```
    pub async fn replay_matching<F>(&self, max: usize, filter: F) -> Result<ReplayReport, Error>
    where
        F: FnMut(&DeadLetter<'_>) -> bool,
    {
        // Fail before touching anything when the destination does not exist.
        self.engine.transport.inspect_queue(&self.to).await?;
        self.pass(Mode::Replay, max, filter).await
    }

    /// What [`Replay::replay_matching`] would move, without moving anything:
    /// `report.matched_ids` lists the accepted messages (at most `max`), `declined` the
    /// rest. Every message stays in the dead-letter queue (a long dry run moves what it
    /// cannot hold to the tail, as a pass does).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// # let mq = acemq::Connection::connect("memory://doc-dry-run").await?;
    /// # for q in ["orders", "orders.dlq"] { mq.transport().declare_queue(&acemq::topology::QueueDecl::classic(q)).await?; }
    /// let would = mq.replay("orders").dry_run_matching(usize::MAX, |_| true).await?;
    /// assert_eq!(would.replayed, 0);
    /// println!("would move {:?}", would.matched_ids);
    /// # Ok(()) }
    /// ```
    pub async fn dry_run_matching<F>(&self, max: usize, filter: F) -> Result<ReplayReport, Error>
    where
        F: FnMut(&DeadLetter<'_>) -> bool,
    {
        self.pass(Mode::DryRun, max, filter).await
    }

    /// Drops (acks) the messages the filter accepts, in one bounded pass; the others stay.
    /// `report.purged` counts them and `report.matched_ids` names them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// # let mq = acemq::Connection::connect("memory://doc-purge").await?;
    /// # for q in ["orders", "orders.dlq"] { mq.transport().declare_queue(&acemq::topology::QueueDecl::classic(q)).await?; }
    /// let week = std::time::Duration::from_secs(7 * 24 * 3600);
    /// let report = mq
    ///     .replay("orders")
    ///     .purge_matching(|dl| dl.age().is_some_and(|age| age > week))
    ///     .await?;
    /// println!("dropped {}", report.purged);
    /// # Ok(()) }
    /// ```
    pub async fn purge_matching<F>(&self, filter: F) -> Result<ReplayReport, Error>
    where
        F: FnMut(&DeadLetter<'_>) -> bool,
    {
        self.pass(Mode::Purge, usize::MAX, filter).await
    }

    /// Moves one accepted message back. `Ok(false)` when its copy cannot be sent at all
    /// (too large): it is then handed to the caller to keep.
    async fn move_back(&self, d: &Delivery, envelope: Envelope) -> Result<bool, Error> {
        let mut envelope = envelope.replayed(self.from.clone(), OffsetDateTime::now_utc());
        if !self.keep_attempts {
            envelope = envelope.with_attempt(1);
        }
        let mut copy = self.engine.copy_with(d, &self.to, &envelope);
        // Sized before it is sent: the reason is cut to fit; a copy the headers alone make
        // too large would close the connection, so it is not sent and stays where it was.
        if let Err(too_large) = self.engine.fit(&mut copy) {
            tracing::warn!(
                message_id = envelope.id(),
                from = %self.from,
                to = %self.to,
                "message cannot be replayed: {too_large}; it stays where it is"
            );
            return Ok(false);
        }
        match self.engine.publish_on_behalf(copy).await? {
            Confirmation::Routed => {
                d.acker.settle(Settlement::Ack { multiple: false }).await?;
                Ok(true)
            }
            // The copy did not land: the caller hands the dead letter back (it stays where
            // it was) and learns what the broker said.
            Confirmation::Unroutable { reply_text, .. } => Err(Error::Unroutable {
                exchange: String::new(),
                routing_key: self.to.clone(),
                message_id: envelope.id().to_owned(),
                reply_text,
            }),
            Confirmation::Nacked => Err(Error::Nacked {
                message_id: envelope.id().to_owned(),
            }),
        }
    }
}
