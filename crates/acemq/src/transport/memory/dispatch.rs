//! Delivery and settlement: the message half of the broker state.
//!
//! This module owns the channel record (one per subscription, one per connection for
//! basic.get) with its delivery tags and unacked deliveries, publishing into queues,
//! round-robin dispatch within each consumer's prefetch window (expiring the head on the
//! way), settlement (ack, requeue to the head marked redelivered, reject into the
//! dead-letter exchange or nowhere) and dead-letter routing. Opening and closing
//! channels lives in `channel`.
//!
//! Deliveries leave through an unbounded tokio mpsc per subscription (the prefetch window
//! bounds it); the `Delivery` value itself is built on the consumer's side, outside the
//! broker lock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::broker::State;
use super::deadletter::{self, Reason};
use super::queue::{self, Kind, Message, Ready};
use crate::topology::check_short;
use crate::transport::{Confirmation, Outbound, Settlement, TransportError};

/// A delivery on its way to a subscription (or out of basic.get).
#[derive(Debug)]
pub(crate) struct Pending {
    pub msg: Arc<Message>,
    pub tag: u64,
    pub redelivered: bool,
    /// Times it came back to its queue before.
    pub returns: u32,
    /// It came from a quorum queue (which reports `x-delivery-count`).
    pub quorum: bool,
}

/// The consumer on a subscription's channel.
#[derive(Debug)]
pub(crate) struct Consumer {
    pub queue: Arc<str>,
    pub queue_id: u64,
    pub tx: mpsc::UnboundedSender<Pending>,
    /// Window of unacked deliveries; 0 is unlimited (RabbitMQ's meaning).
    pub prefetch: usize,
}

/// A delivery not yet settled.
#[derive(Debug)]
pub(crate) struct Unacked {
    pub tag: u64,
    pub queue: Arc<str>,
    pub queue_id: u64,
    pub msg: Arc<Message>,
    pub returns: u32,
    pub expires_at: Option<Instant>,
}

/// An AMQP channel, as far as deliveries go.
#[derive(Debug)]
pub(crate) struct Channel {
    pub conn: u64,
    pub next_tag: u64,
    /// Unsettled deliveries in tag order.
    pub unacked: VecDeque<Unacked>,
    pub consumer: Option<Consumer>,
    /// Set when the channel closes, so buffered deliveries are not handed out.
    pub closed: Arc<AtomicBool>,
}

impl Channel {
    pub(crate) fn new(conn: u64, consumer: Option<Consumer>) -> Channel {
        Channel {
            conn,
            next_tag: 1,
            unacked: VecDeque::new(),
            consumer,
            closed: Arc::new(AtomicBool::new(false)),
        }
    }

    fn has_credit(&self) -> bool {
        self.consumer
            .as_ref()
            .is_some_and(|c| c.prefetch == 0 || self.unacked.len() < c.prefetch)
    }
}

/// What [`State::enqueue`] did with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Enqueued {
    /// There is no such queue.
    NoQueue,
    /// Appended at the tail.
    Appended,
    /// A TTL of 0 and nobody to take it: expired on arrival (routed all the same).
    Expired,
}

/// Queues whose heads changed and need a dispatch pass.
pub(crate) type Work = Vec<Arc<str>>;

fn push_work(work: &mut Work, name: &Arc<str>) {
    if !work.iter().any(|w| Arc::ptr_eq(w, name)) {
        work.push(name.clone());
    }
}

impl State {
    /// basic.publish with confirms: refused while blocked or when its content-header frame
    /// is over `frame_max` (131072; RabbitMQ would close the connection), NotFound for a missing
    /// exchange (at publish time), Unroutable for a mandatory publish that reached no
    /// queue, Routed otherwise (a non-mandatory publish that reached nothing is simply
    /// acked, as RabbitMQ acks it).
    pub(crate) fn publish(&mut self, m: Outbound) -> Result<Confirmation, TransportError> {
        if let Some(reason) = &self.blocked {
            return Err(TransportError::Blocked {
                reason: reason.clone(),
            });
        }
        check_short(&m.exchange)?;
        check_short(&m.routing_key)?;
        let header = crate::transport::header_frame_size(&m.properties);
        if header > crate::transport::DEFAULT_FRAME_MAX as usize {
            // RabbitMQ closes the connection for this; here it is refused, nothing sent.
            return Err(TransportError::Protocol {
                code: 501,
                detail: format!(
                    "FRAME_ERROR - frame_too_large: a content header of {header} bytes exceeds frame_max {}",
                    crate::transport::DEFAULT_FRAME_MAX
                ),
            });
        }
        if m.properties.priority.is_some() {
            return Err(TransportError::Unsupported(
                "the memory:// broker has no priority queues; publish without the priority property".into(),
            ));
        }
        queue::parse_expiration(&m.properties)?;
        let msg = Arc::new(Message {
            exchange: m.exchange,
            routing_key: m.routing_key,
            properties: Arc::new(m.properties),
            body: m.body,
        });
        let now = Instant::now();
        let mut work = Work::new();
        let routed = if msg.exchange.is_empty() {
            // The default exchange: straight to the queue named by the key.
            let key = msg.clone();
            let outcome = self.enqueue(&key.routing_key, msg, now, &mut work);
            if outcome == Enqueued::Appended {
                self.dispatch(&key.routing_key, now, &mut work);
            }
            outcome != Enqueued::NoQueue
        } else {
            let targets = self.route(&msg.exchange, &msg.routing_key, &msg.properties.headers)?;
            for t in &targets {
                if self.enqueue(t, msg.clone(), now, &mut work) == Enqueued::Appended {
                    self.dispatch(t, now, &mut work);
                }
            }
            !targets.is_empty()
        };
        // Whatever dead letters the publish caused (an immediate expiry).
        self.run(work, now);
        if routed || !m.mandatory {
            Ok(Confirmation::Routed)
        } else {
            Ok(Confirmation::Unroutable {
                reply_code: 312,
                reply_text: "NO_ROUTE".into(),
            })
        }
    }

    /// Appends a message to a queue (or, with a TTL of 0 and nobody to take it at once,
    /// expires it on arrival as RabbitMQ does). When it was appended, the caller owes
    /// the queue a dispatch pass.
    fn enqueue(
        &mut self,
        name: &str,
        msg: Arc<Message>,
        now: Instant,
        work: &mut Work,
    ) -> Enqueued {
        let State {
            queues, channels, ..
        } = self;
        let Some(q) = queues.get_mut(name) else {
            return Enqueued::NoQueue;
        };
        let mut expires_at = None;
        if q.ttl.is_some() || msg.properties.expiration.is_some() {
            let ttl = queue::effective_ttl(q.ttl, queue::message_ttl(&msg.properties));
            if ttl == Some(0) {
                let can_take = q.ready.is_empty()
                    && q.consumers
                        .iter()
                        .any(|c| channels.get(c).is_some_and(Channel::has_credit));
                if !can_take {
                    let (qname, dlx, dlrk) = (q.name.clone(), q.dlx.clone(), q.dlrk.clone());
                    self.dead_letter(&msg, &qname, Reason::Expired, dlx, dlrk, now, work);
                    return Enqueued::Expired;
                }
            } else {
                expires_at = q.expiry_for(&msg, now);
            }
        }
        q.ready.push_back(Ready {
            msg,
            redelivered: false,
            returns: 0,
            expires_at,
        });
        Enqueued::Appended
    }

    /// Dispatches every queue in `work` (and whatever their dead letters reach).
    pub(crate) fn run(&mut self, mut work: Work, now: Instant) {
        while let Some(name) = work.pop() {
            self.dispatch(&name, now, &mut work);
        }
    }

    /// Expires the head and hands ready messages to consumers with room in their window,
    /// round-robin, until one runs out.
    pub(crate) fn dispatch(&mut self, name: &str, now: Instant, work: &mut Work) {
        let State {
            queues, channels, ..
        } = self;
        let Some(q) = queues.get_mut(name) else {
            return;
        };
        let quorum = q.kind == Kind::Quorum;
        let mut expired: Vec<Ready> = Vec::new();
        loop {
            if q.head_expiry().is_some_and(|at| at <= now) {
                expired.extend(q.take_expired_head(now));
            }
            if q.ready.is_empty() || q.consumers.is_empty() {
                break;
            }
            let n = q.consumers.len();
            let mut delivered = false;
            for i in 0..n {
                let idx = (q.rr + i) % n;
                let cid = q.consumers[idx];
                let Some(ch) = channels.get_mut(&cid).filter(|c| c.has_credit()) else {
                    continue;
                };
                let Some(r) = q.ready.pop_front() else { break };
                let tag = ch.next_tag;
                let sent = ch.consumer.as_ref().is_some_and(|c| {
                    c.tx.send(Pending {
                        msg: r.msg.clone(),
                        tag,
                        redelivered: r.redelivered,
                        returns: r.returns,
                        quorum,
                    })
                    .is_ok()
                });
                if !sent {
                    // The subscription is gone without closing: detach it, keep the message.
                    q.ready.push_front(r);
                    ch.consumer = None;
                    q.remove_consumer(cid);
                    delivered = true; // try again with the remaining consumers
                    break;
                }
                q.rr = (idx + 1) % n;
                ch.next_tag += 1;
                ch.unacked.push_back(Unacked {
                    tag,
                    queue: q.name.clone(),
                    queue_id: q.id,
                    msg: r.msg,
                    returns: r.returns,
                    expires_at: r.expires_at,
                });
                delivered = true;
                break;
            }
            if !delivered {
                break;
            }
        }
        let (qname, dlx, dlrk) = (q.name.clone(), q.dlx.clone(), q.dlrk.clone());
        self.poke_timer(name);
        for r in expired {
            self.dead_letter(
                &r.msg,
                &qname,
                Reason::Expired,
                dlx.clone(),
                dlrk.clone(),
                now,
                work,
            );
        }
    }

    /// Republishes a message that left `queue` through the queue's dead-letter exchange;
    /// drops it when there is none, when the exchange does not exist, or for each target
    /// that would close a cycle.
    #[allow(clippy::too_many_arguments)]
    fn dead_letter(
        &mut self,
        msg: &Message,
        queue: &str,
        reason: Reason,
        dlx: Option<String>,
        dlrk: Option<String>,
        now: Instant,
        work: &mut Work,
    ) {
        let Some(dlx) = dlx else { return };
        let out = deadletter::dead_letter(msg, queue, reason, &dlx, dlrk.as_deref());
        let Ok(targets) = self.route(&out.exchange, &out.routing_key, &out.properties.headers)
        else {
            return;
        };
        let out = Arc::new(out);
        for t in targets {
            if !deadletter::is_cycle(&out, &t)
                && self.enqueue(&t, out.clone(), now, work) == Enqueued::Appended
                && let Some(q) = self.queues.get(&t)
            {
                push_work(work, &q.name);
            }
        }
    }

    /// Settles deliveries of a channel. An unknown or already settled tag is
    /// `AckNotSent` (RabbitMQ would close the channel with PRECONDITION_FAILED "unknown
    /// delivery tag"; the memory broker keeps the channel). `multiple` with tag 0 covers
    /// every unsettled delivery, as in AMQP.
    pub(crate) fn settle(
        &mut self,
        channel: u64,
        tag: u64,
        settlement: Settlement,
        now: Instant,
    ) -> Result<(), TransportError> {
        let ch = self
            .channels
            .get_mut(&channel)
            .ok_or(TransportError::AckNotSent)?;
        let (multiple, mut requeue, mut ack) = match settlement {
            Settlement::Ack { multiple } => (multiple, false, true),
            Settlement::Nack { multiple, requeue } => (multiple, requeue, false),
            Settlement::Reject { requeue } => (false, requeue, false),
        };
        if ack && self.faults.lose_acks > 0 {
            // An injected fault: the ack is "sent" but never arrives; the message comes
            // back, redelivered (a duplicate delivery).
            self.faults.lose_acks -= 1;
            (ack, requeue) = (false, true);
        }
        let mut work = Work::new();
        let credit = ch.consumer.as_ref().map(|c| c.queue.clone());
        if !multiple {
            // The common case (one delivery, usually the oldest): no allocation.
            let idx = if ch.unacked.front().is_some_and(|u| u.tag == tag) {
                0
            } else {
                ch.unacked
                    .binary_search_by_key(&tag, |u| u.tag)
                    .map_err(|_| TransportError::AckNotSent)?
            };
            let one = ch.unacked.remove(idx);
            self.settlements.record(settlement, 1);
            self.finish_settle(one, requeue, ack, now, &mut work);
        } else {
            let upto = if tag == 0 {
                ch.unacked.len()
            } else {
                ch.unacked
                    .binary_search_by_key(&tag, |u| u.tag)
                    .map_err(|_| TransportError::AckNotSent)?
                    + 1
            };
            let taken: Vec<Unacked> = ch.unacked.drain(..upto).collect();
            self.settlements.record(settlement, taken.len());
            self.finish_settle(taken, requeue, ack, now, &mut work);
        }
        if let Some(queue) = credit {
            // The window has room again.
            self.dispatch(&queue, now, &mut work);
        }
        self.run(work, now);
        Ok(())
    }

    fn finish_settle<I>(
        &mut self,
        taken: I,
        requeue: bool,
        ack: bool,
        now: Instant,
        work: &mut Work,
    ) where
        I: IntoIterator<Item = Unacked>,
        I::IntoIter: DoubleEndedIterator,
    {
        if requeue {
            self.requeue(taken, work);
        } else if !ack {
            for u in taken {
                let cfg = self
                    .queues
                    .get(&*u.queue)
                    .filter(|q| q.id == u.queue_id)
                    .map(|q| (q.dlx.clone(), q.dlrk.clone()));
                if let Some((dlx, dlrk)) = cfg {
                    self.dead_letter(&u.msg, &u.queue, Reason::Rejected, dlx, dlrk, now, work);
                }
            }
        }
    }

    /// Puts deliveries back at the head of their queues, in their original order,
    /// marked redelivered, with their original expiry.
    pub(crate) fn requeue<I>(&mut self, taken: I, work: &mut Work)
    where
        I: IntoIterator<Item = Unacked>,
        I::IntoIter: DoubleEndedIterator,
    {
        for u in taken.into_iter().rev() {
            if let Some(q) = self
                .queues
                .get_mut(&*u.queue)
                .filter(|q| q.id == u.queue_id)
            {
                q.ready.push_front(Ready {
                    msg: u.msg,
                    redelivered: true,
                    returns: u.returns.saturating_add(1),
                    expires_at: u.expires_at,
                });
                push_work(work, &q.name);
            }
        }
    }
}
