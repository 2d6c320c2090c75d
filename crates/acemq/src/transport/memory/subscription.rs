//! The consumer side: subscriptions and settlement handles.
//!
//! This module owns [`MemorySubscription`] (what `consume` returns: deliveries from the
//! broker's per-channel mpsc, turned into [`Delivery`] values outside the broker lock;
//! cancel / close / drop semantics) and [`MemoryAcker`] (settles one delivery tag of one
//! channel). A subscription keeps its connection open while it lives.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::broker::MemoryBroker;
use super::connection::MemoryConnection;
use super::dispatch::Pending;
use crate::headers::HeaderValue;
use crate::transport::{
    AckHandle, Acker, BoxFuture, Delivery, Settlement, Subscription, SubscriptionProbe,
    TransportError,
};

/// Settles one delivery of one memory channel.
pub(crate) struct MemoryAcker {
    broker: Arc<MemoryBroker>,
    channel: u64,
    tag: u64,
}

impl AckHandle for MemoryAcker {
    fn is_live(&self) -> bool {
        self.broker
            .lock()
            .channels
            .get(&self.channel)
            .is_some_and(|c| !c.closed.load(Ordering::Acquire))
    }

    fn settle(&self, settlement: Settlement) -> BoxFuture<'static, Result<(), TransportError>> {
        let r = self
            .broker
            .lock()
            .settle(self.channel, self.tag, settlement, Instant::now());
        Box::pin(std::future::ready(r))
    }
}

/// Turns a broker-side delivery into the `Delivery` a consumer sees. Quorum queues add
/// `x-delivery-count` to a message that came back before, as RabbitMQ 3.10 does.
pub(crate) fn delivery(p: Pending, broker: &Arc<MemoryBroker>, channel: u64) -> Delivery {
    let mut properties = p.msg.properties.clone();
    if p.quorum && p.returns > 0 {
        Arc::make_mut(&mut properties).headers.insert(
            "x-delivery-count".into(),
            HeaderValue::I64(i64::from(p.returns)),
        );
    }
    Delivery {
        delivery_tag: p.tag,
        exchange: p.msg.exchange.clone(),
        routing_key: p.msg.routing_key.clone(),
        redelivered: p.redelivered,
        properties,
        body: p.msg.body.clone(),
        acker: Acker::new(MemoryAcker {
            broker: broker.clone(),
            channel,
            tag: p.tag,
        }),
    }
}

/// A subscription to a memory queue (one channel with one consumer).
///
/// `next()` yields deliveries until the subscription ends: after `cancel()` it yields what
/// was already delivered and then `None`; after `close()`, a drop, or the queue's deletion
/// (a broker cancel: `cancelled_by_us()` is false) it ends. Closing or dropping it returns
/// its unsettled deliveries to the head of the queue, redelivered.
#[derive(Debug)]
pub(crate) struct MemorySubscription {
    conn: Arc<MemoryConnection>,
    channel: u64,
    rx: mpsc::UnboundedReceiver<Pending>,
    closed: Arc<AtomicBool>,
    by_us: bool,
}

impl MemorySubscription {
    pub(crate) fn new(
        conn: Arc<MemoryConnection>,
        channel: u64,
        rx: mpsc::UnboundedReceiver<Pending>,
        closed: Arc<AtomicBool>,
    ) -> Self {
        MemorySubscription {
            conn,
            channel,
            rx,
            closed,
            by_us: false,
        }
    }

    fn discard_buffered(&mut self) {
        self.rx.close();
        while self.rx.try_recv().is_ok() {}
    }
}

impl Subscription for MemorySubscription {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Delivery, TransportError>>> {
        Box::pin(async move {
            if self.closed.load(Ordering::Acquire) {
                self.discard_buffered();
                return None;
            }
            let p = self.rx.recv().await?;
            if self.closed.load(Ordering::Acquire) {
                // The channel closed while this was buffered: it is back on the queue.
                self.discard_buffered();
                return None;
            }
            Some(Ok(delivery(p, &self.conn.broker, self.channel)))
        })
    }

    fn try_next(&mut self) -> Option<Option<Result<Delivery, TransportError>>> {
        // As `next` polled once, without its future.
        if self.closed.load(Ordering::Acquire) {
            self.discard_buffered();
            return Some(None);
        }
        let p = match self.rx.try_recv() {
            Ok(p) => p,
            Err(mpsc::error::TryRecvError::Empty) => return None,
            Err(mpsc::error::TryRecvError::Disconnected) => return Some(None),
        };
        if self.closed.load(Ordering::Acquire) {
            self.discard_buffered();
            return Some(None);
        }
        Some(Some(Ok(delivery(p, &self.conn.broker, self.channel))))
    }

    fn cancel(&mut self) -> BoxFuture<'_, Result<(), TransportError>> {
        self.by_us = true;
        self.conn.broker.lock().cancel_consumer(self.channel);
        Box::pin(std::future::ready(Ok(())))
    }

    fn close(&mut self) -> BoxFuture<'_, Result<(), TransportError>> {
        self.by_us = true;
        self.conn
            .broker
            .lock()
            .close_channel(self.channel, Instant::now());
        self.discard_buffered();
        Box::pin(std::future::ready(Ok(())))
    }

    fn cancelled_by_us(&self) -> bool {
        self.by_us
    }

    /// Live while its channel and its connection are open (a recovered transport opens a
    /// new connection: one that was lost never comes back).
    fn probe(&self) -> SubscriptionProbe {
        let (conn, closed) = (self.conn.clone(), self.closed.clone());
        SubscriptionProbe::new(move || {
            !closed.load(Ordering::Acquire) && !conn.closed.load(Ordering::Acquire)
        })
    }
}

impl Drop for MemorySubscription {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            self.conn
                .broker
                .lock()
                .close_channel(self.channel, Instant::now());
        }
    }
}
