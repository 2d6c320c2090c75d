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
use crate::transport::{Confirmation, Delivery, Settlement};

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
    ///
    /// A pass stops at the first copy that does not land, leaving that message where it was:
    /// [`Error::Unroutable`] when the destination routed it nowhere (e.g. the queue was deleted
    /// mid-pass), [`Error::Nacked`] when the broker refused it, [`Error::InvalidArgument`]
    /// when its headers alone are too large for the connection's `frame_max` (the reason
    /// is cut to fit first), a transport error otherwise.
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
        let mut copy = self.engine.copy_with(d, &self.to, &envelope);
        // Sized before it is sent: the reason is cut to fit; a copy the headers alone make
        // too large would close the connection, so it is refused and stays where it was.
        if let Err(too_large) = self.engine.fit(&mut copy) {
            return Err(Error::InvalidArgument(format!(
                "message {} cannot be replayed to {}: {too_large}; it stays in {}",
                envelope.id(),
                self.to,
                self.from
            )));
        }
        match self.engine.publish_on_behalf(copy).await? {
            Confirmation::Routed => {
                d.acker.settle(Settlement::Ack { multiple: false }).await?;
                Ok(())
            }
            // The copy did not land: the dead letter is handed back (it stays where it was)
            // and the caller learns what the broker said.
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

const REQUEUE: Settlement = Settlement::Nack {
    multiple: false,
    requeue: true,
};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Replay;
    use crate::engine::Engine;
    use crate::error::Error;
    use crate::topology::QueueDecl;
    use crate::transport::memory::MemoryTransport;
    use crate::transport::{Confirmation, Outbound, Properties, Transport};

    /// A destination deleted under a running pass: the copy routes nowhere, which is
    /// reported as unroutable (not "not found"), and the dead letter stays where it was.
    /// (A replay needs only an engine, not a whole connection.)
    #[tokio::test]
    async fn a_copy_that_routes_nowhere_is_reported_as_unroutable() {
        let t: Arc<dyn Transport> = Arc::new(MemoryTransport::connect("replay-unroutable-unit"));
        let engine = Engine::new(t.clone(), "test", 8);
        t.declare_queue(&QueueDecl::classic("orders"))
            .await
            .unwrap();
        t.declare_queue(&QueueDecl::classic("orders.dlq"))
            .await
            .unwrap();
        let dead = Outbound {
            exchange: String::new(),
            routing_key: "orders.dlq".into(),
            mandatory: true,
            properties: Properties::default(),
            body: bytes::Bytes::from_static(b"lost?"),
        };
        assert_eq!(
            engine.publish_on_behalf(dead).await.unwrap(),
            Confirmation::Routed
        );
        let replay = Replay::new(engine, "orders");
        let deleter = t.clone();
        let err = replay
            .replay_matching(1, move |_| {
                // The destination goes away after the pass checked it.
                futures::executor::block_on(deleter.delete_queue("orders")).unwrap();
                true
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Unroutable { routing_key, .. } if routing_key == "orders"),
            "{err:?}"
        );
        assert_eq!(replay.pending().await.unwrap(), 1, "the dead letter stays");
        t.close().await.unwrap();
    }
}
