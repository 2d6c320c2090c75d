//! Replay: moving dead letters (`{q}.dlq`) or parked messages (`{q}.parked`) back to the
//! queue they failed in (wire.md §7).
//!
//! This module owns the replay pass: pull one message at a time (basic.get), republish it
//! through the default exchange to the source queue (never through the original exchange,
//! which would hand duplicates to every other bound queue), and ack the dead letter only
//! after the copy is confirmed and routed, so a replay is at-least-once and a crash
//! half-way loses nothing. The body is kept byte for byte, the attempt reset to 1 (unless
//! [`Replay::keeping_attempts`]), first-seen kept, and the provenance headers
//! `acemq-replayed-from`, `acemq-replayed-at` and `acemq-replay-count` written.

use std::sync::Arc;

use bytes::Bytes;
use time::OffsetDateTime;

use crate::engine::Engine;
use crate::envelope::{Envelope, application_headers};
use crate::error::Error;
use crate::headers::Headers;
use crate::topology::{dead_letter_queue, parked_queue};
use crate::transport::{Confirmation, Delivery, Settlement, TransportError};

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
#[derive(Clone, Debug)]
pub struct Replay {
    engine: Arc<Engine>,
    to: String,
    from: String,
    keep_attempts: bool,
}

/// What a replay pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Moved back to the source queue (confirmed and routed, then acked).
    pub replayed: usize,
    /// Declined by the filter and returned to where they were.
    pub skipped: usize,
}

/// A dead letter as a replay filter sees it.
#[derive(Debug)]
pub struct DeadLetter<'a> {
    /// Its envelope (`error()` says why it failed).
    pub envelope: &'a Envelope,
    /// Its application headers.
    pub headers: &'a Headers,
    /// Its body, as stored.
    pub body: &'a Bytes,
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

    /// The queue messages are taken from.
    pub fn from_queue(&self) -> &str {
        &self.from
    }

    /// The queue messages are put back into.
    pub fn to_queue(&self) -> &str {
        &self.to
    }

    /// How many messages wait to be replayed (moves nothing).
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
        let pending = self.pending().await? as usize;
        self.replay(pending).await
    }

    /// Replays at most `max` messages the filter accepts. Declined ones are held until the
    /// pass ends, then returned to the dead-letter queue together.
    pub async fn replay_matching<F>(&self, max: usize, mut filter: F) -> Result<ReplayReport, Error>
    where
        F: FnMut(&DeadLetter<'_>) -> bool,
    {
        // Fail before touching anything when the destination does not exist.
        self.engine.transport.inspect_queue(&self.to).await?;
        let budget = self.pending().await? as usize;
        let mut report = ReplayReport::default();
        let mut held: Vec<Delivery> = Vec::new();
        let mut result = Ok(());
        let mut seen = 0usize;
        while report.replayed < max && seen < budget {
            let delivery = match self.engine.transport.get(&self.from).await {
                Ok(Some(d)) => d,
                Ok(None) => break,
                Err(e) => {
                    result = Err(e.into());
                    break;
                }
            };
            seen += 1;
            let envelope = Envelope::read(&delivery.properties, &delivery.routing_key);
            let headers = application_headers(&delivery.properties.headers);
            let accepted = filter(&DeadLetter {
                envelope: &envelope,
                headers: &headers,
                body: &delivery.body,
            });
            if !accepted {
                held.push(delivery);
                continue;
            }
            if let Err(e) = self.move_back(&delivery, envelope).await {
                let _ = delivery.acker.settle(REQUEUE).await;
                result = Err(e);
                break;
            }
            report.replayed += 1;
        }
        report.skipped = held.len();
        for d in held {
            let _ = d.acker.settle(REQUEUE).await;
        }
        result.map(|()| report)
    }

    async fn move_back(&self, d: &Delivery, envelope: Envelope) -> Result<(), Error> {
        let mut envelope = envelope.replayed(self.from.clone(), OffsetDateTime::now_utc());
        if !self.keep_attempts {
            envelope = envelope.with_attempt(1);
        }
        let copy = self.engine.copy_with(d, &self.to, &envelope);
        match self.engine.publish_on_behalf(copy).await? {
            Confirmation::Routed => {
                d.acker.settle(Settlement::Ack { multiple: false }).await?;
                Ok(())
            }
            other => Err(Error::Transport(TransportError::NotFound {
                detail: format!(
                    "replay copy to {:?} was not routed ({other:?}); the message stays in {:?}",
                    self.to, self.from
                ),
            })),
        }
    }
}

const REQUEUE: Settlement = Settlement::Nack {
    multiple: false,
    requeue: true,
};
