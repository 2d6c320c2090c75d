//! Channels: their life cycle on the broker side.
//!
//! This module owns opening a consumer's channel (basic.consume, with exclusive-consumer
//! rules: enforced on classic queues, ignored on quorum queues as RabbitMQ does), basic.get on a connection's get channel, basic.cancel, closing a channel (its
//! unsettled deliveries go back to the head of their queues), closing a connection (its
//! channels, then its exclusive queues), auto-deleting a queue that loses its last
//! consumer, and queue.purge.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::broker::{State, count, not_found_queue};
use super::dispatch::{Channel, Consumer, Pending, Unacked, Work};
use super::queue::{self, Kind};
use crate::topology::check_short;
use crate::transport::{ConsumeSpec, TransportError};

impl State {
    /// basic.consume on a new channel of `conn`.
    pub(crate) fn consume(
        &mut self,
        conn: u64,
        spec: &ConsumeSpec,
        now: Instant,
    ) -> Result<(u64, mpsc::UnboundedReceiver<Pending>, Arc<AtomicBool>), TransportError> {
        check_short(&spec.consumer_tag)?;
        let q = self.accessible_queue(&spec.queue, conn)?;
        // RabbitMQ (3.10) enforces exclusive consumers on classic queues only: a quorum
        // queue accepts the flag and ignores it.
        let exclusive = spec.exclusive && q.kind != Kind::Quorum;
        if q.exclusive_consumer || (exclusive && !q.consumers.is_empty()) {
            return Err(TransportError::AccessRefused {
                detail: format!("{} in exclusive use", queue::queue_ref(&spec.queue)),
            });
        }
        let (queue_name, queue_id) = (q.name.clone(), q.id);
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.next_id();
        let ch = Channel::new(
            conn,
            Some(Consumer {
                queue: queue_name.clone(),
                queue_id,
                tx,
                prefetch: usize::from(spec.prefetch),
            }),
        );
        let closed = ch.closed.clone();
        self.channels.insert(id, ch);
        if let Some(q) = self.queues.get_mut(&spec.queue) {
            q.consumers.push(id);
            q.had_consumer = true;
            q.exclusive_consumer = exclusive;
        }
        self.run(vec![queue_name], now);
        Ok((id, rx, closed))
    }

    /// basic.get on the connection's get channel: the head message, unacked until
    /// settled, outside any prefetch window.
    pub(crate) fn get(
        &mut self,
        conn: u64,
        channel: u64,
        name: &str,
        now: Instant,
    ) -> Result<Option<Pending>, TransportError> {
        self.accessible_queue(name, conn)?;
        let mut work = Work::new();
        // A dispatch pass first: it expires the head (dead-lettering it) like a consumer would.
        self.dispatch(name, now, &mut work);
        self.run(work, now);
        let State {
            queues, channels, ..
        } = self;
        let q = queues.get_mut(name).ok_or_else(|| not_found_queue(name))?;
        let ch = channels
            .get_mut(&channel)
            .ok_or_else(|| TransportError::Closed {
                detail: "the connection is closed".into(),
            })?;
        q.last_used = now;
        let Some(r) = q.ready.pop_front() else {
            return Ok(None);
        };
        let tag = ch.next_tag;
        ch.next_tag += 1;
        ch.unacked.push_back(Unacked {
            tag,
            queue: q.name.clone(),
            queue_id: q.id,
            msg: r.msg.clone(),
            returns: r.returns,
            expires_at: r.expires_at,
        });
        let pending = Pending {
            msg: r.msg,
            tag,
            redelivered: r.redelivered,
            returns: r.returns,
            quorum: q.kind == Kind::Quorum,
        };
        self.poke_timer(name);
        Ok(Some(pending))
    }

    /// basic.cancel: no new deliveries; unsettled ones stay settleable.
    pub(crate) fn cancel_consumer(&mut self, channel: u64) {
        let consumer = self
            .channels
            .get_mut(&channel)
            .and_then(|ch| ch.consumer.take());
        if let Some(c) = consumer {
            self.detach(&c, channel);
        }
    }

    /// Detaches a consumer from its queue; an auto-delete queue that loses its last
    /// consumer is deleted.
    fn detach(&mut self, c: &Consumer, channel: u64) {
        let Some(q) = self
            .queues
            .get_mut(&*c.queue)
            .filter(|q| q.id == c.queue_id)
        else {
            return;
        };
        q.remove_consumer(channel);
        if q.auto_delete && q.had_consumer && q.consumers.is_empty() {
            let name = q.name.clone();
            self.remove_queue(&name);
        }
    }

    /// Closes a channel: its consumer goes, its unsettled deliveries return to the head
    /// of their queues (in order, redelivered), later settlements are `AckNotSent`.
    pub(crate) fn close_channel(&mut self, channel: u64, now: Instant) {
        let Some(mut ch) = self.channels.remove(&channel) else {
            return;
        };
        ch.closed.store(true, Ordering::Release);
        if let Some(c) = ch.consumer.take() {
            self.detach(&c, channel);
        }
        let taken: Vec<Unacked> = ch.unacked.drain(..).collect();
        let mut work = Work::new();
        self.requeue(taken, &mut work);
        self.run(work, now);
    }

    /// Closes a connection: every channel of it, then its exclusive queues.
    pub(crate) fn close_connection(&mut self, conn: u64, now: Instant) {
        let channels: Vec<u64> = self
            .channels
            .iter()
            .filter(|(_, c)| c.conn == conn)
            .map(|(id, _)| *id)
            .collect();
        for id in channels {
            self.close_channel(id, now);
        }
        let exclusive: Vec<Arc<str>> = self
            .queues
            .values()
            .filter(|q| q.exclusive_owner == Some(conn))
            .map(|q| q.name.clone())
            .collect();
        for q in exclusive {
            self.remove_queue(&q);
        }
        self.connections.remove(&conn);
    }

    /// queue.purge: drops the ready messages (not the unacked ones); returns how many.
    pub(crate) fn purge(&mut self, conn: u64, name: &str) -> Result<u32, TransportError> {
        self.accessible_queue(name, conn)?;
        let q = self
            .queues
            .get_mut(name)
            .ok_or_else(|| not_found_queue(name))?;
        let n = count(q.ready.len());
        q.ready.clear();
        Ok(n)
    }
}
