//! The `memory://` transport: a broker inside the process that is not kinder than
//! RabbitMQ 3.10.
//!
//! Each broker name is one broker for the life of the process ([`MemoryBroker::named`]),
//! so a consumer that reconnects to the same name finds its queues and messages. A
//! [`MemoryTransport`] is one connection to it. The broker keeps RabbitMQ's rules where
//! the engine could notice a difference: the four exchange types and the default
//! exchange, mandatory returns, PRECONDITION_FAILED on inequivalent redeclaration,
//! quorum-queue property rules, server-named queues, exclusive queues, prefetch windows,
//! per-channel delivery tags, requeue to the head marked redelivered, dead-lettering with
//! `x-death`, and TTL expiry at the head of the queue only. Time is `tokio::time`, so
//! paused-clock tests run hours of TTL in milliseconds.
//!
//! Modules: `broker` (registry, [`MemoryBroker`], block/unblock, exchanges, bindings,
//! queue declaration and deletion), `inspect` (read-only views for tests), `routing`
//! (matching rules), `queue` (the queue record and TTL bookkeeping), `args` (declaration
//! validation and equivalence), `dispatch` (publish, delivery, settlement), `channel`
//! (consume, get, cancel, close), `deadletter` (`x-death`), `expiry` (the per-queue
//! expiry task), `subscription` (the consumer side).
//!
//! Where it knowingly differs from RabbitMQ:
//! - publishing to a missing exchange fails at publish time with `NotFound` (RabbitMQ
//!   closes the channel asynchronously) and nothing else happens to the connection;
//! - settling an unknown or already settled delivery tag returns `AckNotSent` and keeps
//!   the subscription alive (RabbitMQ closes the channel with PRECONDITION_FAILED);
//! - a non-mandatory publish that reaches no queue confirms as `Routed` (RabbitMQ just
//!   acks it);
//! - requeued messages go to the head of the queue (classic queues in RabbitMQ try to
//!   restore the original position);
//! - unimplemented features are refused with `Unsupported` rather than ignored: priority
//!   (`x-max-priority`, the `priority` property), `x-max-length*`, `x-overflow`,
//!   `x-expires`, `x-single-active-consumer`, `x-delivery-limit`, streams and alternate
//!   exchanges. Sender-selected distribution (`CC`/`BCC` headers) is not implemented.
//!
//! ```
//! # async fn demo() -> Result<(), acemq::transport::TransportError> {
//! use acemq::topology::QueueDecl;
//! use acemq::transport::{ConsumeSpec, Outbound, Properties, Transport, memory::MemoryTransport};
//! let t = MemoryTransport::connect("doc-memory");
//! t.declare_queue(&QueueDecl::classic("jobs")).await?;
//! t.publish(Outbound::new("", "jobs", Properties::default(), "hello")).await?.await?;
//! let mut sub = t
//!     .consume(ConsumeSpec { queue: "jobs".into(), prefetch: 10, consumer_tag: String::new(), exclusive: false })
//!     .await?;
//! if let Some(Ok(d)) = sub.next().await {
//!     assert_eq!(d.body, "hello");
//!     d.acker.ack().await?;
//! }
//! # Ok(()) }
//! ```

mod args;
mod broker;
mod channel;
mod deadletter;
mod dispatch;
mod expiry;
mod inspect;
mod queue;
mod routing;
mod subscription;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;

pub use broker::MemoryBroker;
pub use inspect::{MessageSnapshot, SettlementCounts};

use super::{
    BoxFuture, ConsumeSpec, Delivery, Outbound, PendingConfirm, QueueInfo, Subscription, Transport,
    TransportError, TransportStatus,
};
use crate::topology::{BindingDecl, ExchangeDecl, QueueDecl};
use dispatch::Channel;
use subscription::MemorySubscription;

/// One connection to a memory broker. Closing it (or dropping it and every subscription
/// opened on it) returns its unsettled deliveries to their queues and deletes its
/// exclusive queues, as a closed AMQP connection does.
#[derive(Debug)]
pub(crate) struct Connection {
    id: u64,
    broker: Arc<MemoryBroker>,
    status: Arc<watch::Sender<TransportStatus>>,
    closed: AtomicBool,
    /// The channel basic.get deliveries belong to.
    get_channel: u64,
}

impl Connection {
    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.broker.lock().close_connection(self.id, Instant::now());
        self.status.send_modify(|s| s.connected = false);
    }

    fn check_open(&self) -> Result<(), TransportError> {
        if self.closed.load(Ordering::Acquire) {
            Err(TransportError::Closed {
                detail: format!("memory://{} connection closed", self.broker.name()),
            })
        } else {
            Ok(())
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

/// A connection to the in-process broker `memory://{name}`.
///
/// ```
/// use acemq::transport::{Transport, memory::MemoryTransport};
/// let t = MemoryTransport::connect("doc-connect");
/// assert_eq!(t.kind(), "memory");
/// assert!(t.status().connected);
/// ```
#[derive(Debug)]
pub struct MemoryTransport {
    conn: Arc<Connection>,
}

impl MemoryTransport {
    /// Connects to the broker named `name` (created on first use, kept for the life of
    /// the process).
    ///
    /// ```
    /// use acemq::transport::memory::MemoryTransport;
    /// let a = MemoryTransport::connect("doc-shared");
    /// let b = MemoryTransport::connect("doc-shared");
    /// assert!(std::sync::Arc::ptr_eq(&a.broker(), &b.broker()));
    /// ```
    pub fn connect(name: &str) -> MemoryTransport {
        let broker = MemoryBroker::named(name);
        let (id, get_channel, status) = {
            let mut st = broker.lock();
            let id = st.next_id();
            let get_channel = st.next_id();
            st.channels.insert(get_channel, Channel::new(id, None));
            let status = Arc::new(watch::Sender::new(TransportStatus {
                connected: true,
                blocked: st.blocked.clone(),
            }));
            st.connections.insert(id, status.clone());
            (id, get_channel, status)
        };
        MemoryTransport {
            conn: Arc::new(Connection {
                id,
                broker,
                status,
                closed: AtomicBool::new(false),
                get_channel,
            }),
        }
    }

    /// The broker this transport is connected to.
    ///
    /// ```
    /// use acemq::transport::memory::MemoryTransport;
    /// let t = MemoryTransport::connect("doc-broker-of");
    /// assert_eq!(t.broker().name(), "doc-broker-of");
    /// ```
    pub fn broker(&self) -> Arc<MemoryBroker> {
        self.conn.broker.clone()
    }

    /// Runs one synchronous broker operation on an open connection.
    fn with<T>(
        &self,
        op: impl FnOnce(&mut broker::State, u64) -> Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        self.conn.check_open()?;
        let mut st = self.conn.broker.lock();
        op(&mut st, self.conn.id)
    }
}

fn ready<'a, T: Send + 'a>(r: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(r))
}

impl Transport for MemoryTransport {
    fn kind(&self) -> &'static str {
        "memory"
    }

    /// Publishes synchronously: the confirm is already known when the first future
    /// resolves. A missing exchange fails here (not at confirm time) with `NotFound`.
    fn publish(&self, message: Outbound) -> BoxFuture<'_, Result<PendingConfirm, TransportError>> {
        let r = self.with(|st, _| st.publish(message));
        ready(r.map(|c| -> PendingConfirm { Box::pin(std::future::ready(Ok(c))) }))
    }

    fn consume(
        &self,
        spec: ConsumeSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Subscription>, TransportError>> {
        let r = self
            .with(|st, conn| st.consume(conn, &spec, Instant::now()))
            .map(|(channel, rx, closed)| -> Box<dyn Subscription> {
                Box::new(MemorySubscription::new(
                    self.conn.clone(),
                    channel,
                    rx,
                    closed,
                ))
            });
        ready(r)
    }

    fn get(&self, queue: &str) -> BoxFuture<'_, Result<Option<Delivery>, TransportError>> {
        let channel = self.conn.get_channel;
        let r = self
            .with(|st, conn| st.get(conn, channel, queue, Instant::now()))
            .map(|p| p.map(|p| subscription::delivery(p, &self.conn.broker, channel)));
        ready(r)
    }

    fn declare_exchange(&self, decl: &ExchangeDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        ready(self.with(|st, _| st.declare_exchange(decl)))
    }

    fn declare_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        ready(self.with(|st, conn| st.declare_queue(conn, decl)))
    }

    fn bind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        ready(self.with(|st, conn| st.bind(conn, decl)))
    }

    fn unbind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        ready(self.with(|st, conn| st.unbind(conn, decl)))
    }

    fn inspect_queue(&self, name: &str) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        ready(self.with(|st, conn| {
            let now = Instant::now();
            st.accessible_queue(name, conn)?;
            // Expired heads are gone by the time anyone counts, as in RabbitMQ.
            st.run(vec![Arc::from(name)], now);
            st.accessible_queue(name, conn).map(broker::State::info)
        }))
    }

    fn inspect_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        ready(self.with(|st, _| st.inspect_exchange(name)))
    }

    /// Deletes a queue; deleting a missing queue returns 0, as RabbitMQ 3.10 does.
    fn delete_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        ready(self.with(|st, conn| {
            super::check_short(name)?;
            if !st.queues.contains_key(name) {
                return Ok(0);
            }
            st.accessible_queue(name, conn)?;
            Ok(st.remove_queue(name))
        }))
    }

    /// Deletes an exchange and its bindings; deleting a missing one succeeds, as in
    /// RabbitMQ 3.10.
    fn delete_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        ready(self.with(|st, _| st.delete_exchange(name)))
    }

    fn purge_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        ready(self.with(|st, conn| st.purge(conn, name)))
    }

    fn status(&self) -> TransportStatus {
        self.conn.status.borrow().clone()
    }

    fn watch_status(&self) -> watch::Receiver<TransportStatus> {
        self.conn.status.subscribe()
    }

    fn close(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        self.conn.close();
        ready(Ok(()))
    }
}
