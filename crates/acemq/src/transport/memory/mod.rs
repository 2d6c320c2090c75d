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
//! queue declaration and deletion), `connection` (one connection to a broker: what
//! closing it releases), `hash` (the broker maps' hasher), `inspect` (read-only views for
//! tests), `routing`
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
//!   `x-single-active-consumer`, `x-delivery-limit`, streams and alternate exchanges
//!   (`x-expires` is implemented: a queue unused for the period is deleted).
//!   Sender-selected distribution (`CC`/`BCC` headers) is not implemented.
//!
//! ```
//! # async fn demo() -> Result<(), acemq::transport::TransportError> {
//! use acemq::topology::QueueDecl;
//! use acemq::transport::{ConsumeSpec, Outbound, Properties, Transport, memory::MemoryTransport};
//! let t = MemoryTransport::connect("doc-memory");
//! t.declare_queue(&QueueDecl::classic("jobs")).await?;
//! t.publish(Outbound::new("", "jobs", Properties::default(), "hello")).await?.await?;
//! let mut sub = t
//!     .consume(ConsumeSpec::new("jobs", 10))
//!     .await?;
//! if let Some(Ok(d)) = sub.next().await {
//!     assert_eq!(d.body, "hello");
//!     d.acker.ack().await?;
//! }
//! # Ok(()) }
//! ```

mod args;
mod bindings;
mod broker;
mod channel;
mod connection;
mod deadletter;
mod dispatch;
mod expiry;
mod hash;
mod inspect;
mod queue;
mod recover;
mod routing;
mod subscription;
mod unused;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

pub use broker::MemoryBroker;
pub use inspect::{MessageSnapshot, SettlementCounts};

use super::recovery::{Declared, DeclaredTopology, Events, RecoveryEvent, RecoveryPolicy};
use super::{
    BoxFuture, ConsumeSpec, Delivery, Outbound, PendingConfirm, QueueInfo, Subscription,
    TrackedConfirm, Transport, TransportError, TransportStatus,
};
use crate::topology::{BindingDecl, ExchangeDecl, QueueDecl};
use connection::MemoryConnection;
use subscription::MemorySubscription;

/// A connection to the in-process broker `memory://{name}`.
///
/// Like the AMQP transport it recovers: a connection lost through
/// `MemoryTransport::drop_connection` (a fault injected by a test, feature `testing`) is
/// redialled under its [`RecoveryPolicy`] in `tokio` time, its topology declared again, and
/// consumers re-subscribe.
///
/// ```
/// use acemq::transport::{Transport, memory::MemoryTransport};
/// let t = MemoryTransport::connect("doc-connect");
/// assert_eq!(t.kind(), "memory");
/// assert!(t.status().connected);
/// ```
#[derive(Debug)]
pub struct MemoryTransport {
    inner: Arc<Inner>,
}

/// The transport's state, shared with its recovery task.
#[derive(Debug)]
pub(crate) struct Inner {
    broker: Arc<MemoryBroker>,
    /// The same sender across connections, so watchers see the loss and the recovery.
    status: Arc<watch::Sender<TransportStatus>>,
    conn: RwLock<Arc<MemoryConnection>>,
    /// Closed by its user: never recovered.
    closed: AtomicBool,
    recovering: AtomicBool,
    policy: std::sync::Mutex<RecoveryPolicy>,
    declared: DeclaredTopology,
    events: Events,
    /// The fault of `lose_connection_after_next_consume`, armed.
    after_consume: std::sync::Mutex<Option<std::time::Duration>>,
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
        let status = Arc::new(watch::Sender::new(TransportStatus::default()));
        let conn = MemoryConnection::open(&broker, &status);
        MemoryTransport {
            inner: Arc::new(Inner {
                broker,
                status,
                conn: RwLock::new(Arc::new(conn)),
                closed: AtomicBool::new(false),
                recovering: AtomicBool::new(false),
                policy: std::sync::Mutex::new(RecoveryPolicy::default()),
                declared: DeclaredTopology::default(),
                events: Events::new(crate::observe::TRANSPORT_MEMORY),
                after_consume: std::sync::Mutex::new(None),
            }),
        }
    }

    /// Sets how a lost connection is redialled (default: up to 50 ms doubling to 1.5 s, fully jittered, forever).
    ///
    /// ```
    /// use acemq::transport::memory::MemoryTransport;
    /// use acemq::transport::recovery::RecoveryPolicy;
    /// let t = MemoryTransport::connect("doc-policy").with_recovery(RecoveryPolicy::disabled());
    /// # drop(t);
    /// ```
    pub fn with_recovery(self, policy: RecoveryPolicy) -> Self {
        *self.inner.policy.lock().unwrap_or_else(|e| e.into_inner()) = policy;
        self
    }

    /// The broker this transport is connected to.
    ///
    /// ```
    /// use acemq::transport::memory::MemoryTransport;
    /// let t = MemoryTransport::connect("doc-broker-of");
    /// assert_eq!(t.broker().name(), "doc-broker-of");
    /// ```
    pub fn broker(&self) -> Arc<MemoryBroker> {
        self.inner.broker.clone()
    }

    /// Recovery events (lost, retrying, recovered, gave up) from now on.
    pub fn recovery_events(&self) -> broadcast::Receiver<RecoveryEvent> {
        self.inner.events.subscribe()
    }

    fn conn(&self) -> Arc<MemoryConnection> {
        self.inner.conn()
    }

    /// Runs one synchronous broker operation on an open connection.
    fn with<T>(
        &self,
        op: impl FnOnce(&mut broker::State, u64) -> Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        let conn = self.conn();
        if let Err(e) = conn.check_open() {
            if self.inner.recovering.load(Ordering::Acquire) {
                return Err(TransportError::NotConnected {
                    detail: format!("memory://{} is recovering", conn.broker.name()),
                });
            }
            return Err(e);
        }
        let mut st = conn.broker.lock();
        op(&mut st, conn.id)
    }

    /// A publish, done at once: its confirm, and for a delayed confirm
    /// ([`MemoryBroker::delay_confirms`]) the broker's own answer kept for later. Both
    /// [`Transport::publish`] and [`Transport::publish_tracked`] hand it over ready, with
    /// no future of their own around it.
    fn tracked(&self, message: Outbound) -> Result<TrackedConfirm, TransportError> {
        let r = self.with(|st, _| {
            let confirmed = st.publish(message)?;
            let lost = st.faults.lose_confirms > 0;
            if lost {
                st.faults.lose_confirms -= 1;
            }
            Ok((confirmed, lost, st.faults.confirm_delay))
        });
        r.map(|(c, lost, delay)| {
            let answer = if lost {
                Err(TransportError::ConfirmLost {
                    detail: "an injected fault lost the confirm".into(),
                    source: None,
                })
            } else {
                Ok(c)
            };
            let Some(d) = delay else {
                return TrackedConfirm {
                    answer: Box::pin(std::future::ready(answer)),
                    late: None,
                };
            };
            let at = Instant::now() + d;
            let started = Instant::now();
            let late = answer.clone();
            // Only a delayed confirm watches for a block (`wait_for` sees the current state).
            let mut status = self.inner.status.subscribe();
            TrackedConfirm {
                answer: Box::pin(async move {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => answer,
                        Ok(_) = status.wait_for(|s| s.blocked.is_some()) => {
                            let waited = started.elapsed().as_millis();
                            Err(TransportError::ConfirmTimeout {
                                millis: waited.try_into().unwrap_or(u64::MAX),
                            })
                        }
                    }
                }),
                late: Some(Box::pin(async move {
                    tokio::time::sleep_until(at).await;
                    late
                })),
            }
        })
    }

    /// [`Self::with`], then records the declaration for recovery when it succeeded.
    fn declaring<T>(
        &self,
        declared: Declared,
        op: impl FnOnce(&mut broker::State, u64) -> Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        let r = self.with(op)?;
        self.inner.declared.record(declared);
        Ok(r)
    }
}

impl Inner {
    fn conn(&self) -> Arc<MemoryConnection> {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn ready<'a, T: Send + 'a>(r: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(r))
}

impl Transport for MemoryTransport {
    fn kind(&self) -> &'static str {
        "memory"
    }

    /// Publishes synchronously, when called (not when the returned future is first polled):
    /// the confirm is already known when that future resolves. A missing exchange fails here (not at confirm time) with `NotFound`.
    /// With [`MemoryBroker::delay_confirms`], a confirm still outstanding when the broker
    /// blocks is answered in doubt at once ([`TransportError::ConfirmTimeout`]), as the AMQP
    /// transport answers RabbitMQ's withheld confirms; the message is in its queue all the
    /// same.
    fn publish(&self, message: Outbound) -> BoxFuture<'_, Result<PendingConfirm, TransportError>> {
        ready(self.tracked(message).map(|t| t.answer))
    }

    /// [`Transport::publish`], with the broker's own answer kept in
    /// [`TrackedConfirm::late`] for a confirm that was answered in doubt by a block.
    fn publish_tracked(
        &self,
        message: Outbound,
    ) -> BoxFuture<'_, Result<TrackedConfirm, TransportError>> {
        ready(self.tracked(message))
    }

    fn consume(
        &self,
        spec: ConsumeSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Subscription>, TransportError>> {
        if let Some(refusal) = refuse_consume_arguments(&spec) {
            return ready(Err(refusal));
        }
        let conn = self.conn();
        let r = self
            .with(|st, conn| st.consume(conn, &spec, Instant::now()))
            .map(|(channel, rx, closed)| -> Box<dyn Subscription> {
                Box::new(MemorySubscription::new(conn, channel, rx, closed))
            });
        if r.is_ok() {
            recover::after_consume(&self.inner);
        }
        ready(r)
    }

    fn get(&self, queue: &str) -> BoxFuture<'_, Result<Option<Delivery>, TransportError>> {
        let conn = self.conn();
        let channel = conn.get_channel;
        let r = self
            .with(|st, conn| st.get(conn, channel, queue, Instant::now()))
            .map(|p| p.map(|p| subscription::delivery(p, &conn.broker, channel)));
        ready(r)
    }

    fn declare_exchange(&self, decl: &ExchangeDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        ready(self.declaring(Declared::Exchange(decl.clone()), |st, _| {
            st.declare_exchange(decl)
        }))
    }

    fn declare_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        ready(self.declaring(Declared::Queue(decl.clone()), |st, conn| {
            st.declare_queue(conn, decl)
        }))
    }

    fn check_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        ready(self.with(|st, conn| st.declare_queue(conn, decl)))
    }

    fn bind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        ready(self.declaring(Declared::Binding(decl.clone()), |st, conn| {
            st.bind(conn, decl)
        }))
    }

    fn unbind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        let r = self.with(|st, conn| st.unbind(conn, decl));
        if r.is_ok() {
            self.inner.declared.forget_binding(decl);
        }
        ready(r)
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
            crate::topology::check_short(name)?;
            if !st.queues.contains_key(name) {
                return Ok(0);
            }
            st.accessible_queue(name, conn)?;
            self.inner.declared.forget_queue(name);
            Ok(st.remove_queue(name))
        }))
    }

    /// Deletes an exchange and its bindings; deleting a missing one succeeds, as in
    /// RabbitMQ 3.10.
    fn delete_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        let r = self.with(|st, _| st.delete_exchange(name));
        if r.is_ok() {
            self.inner.declared.forget_exchange(name);
        }
        ready(r)
    }

    fn purge_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        ready(self.with(|st, conn| st.purge(conn, name)))
    }

    fn status(&self) -> TransportStatus {
        self.inner.status.borrow().clone()
    }

    fn watch_status(&self) -> watch::Receiver<TransportStatus> {
        self.inner.status.subscribe()
    }

    fn recovery_events(&self) -> Option<broadcast::Receiver<RecoveryEvent>> {
        Some(self.inner.events.subscribe())
    }

    fn recovering(&self) -> bool {
        self.inner.recovering.load(Ordering::Acquire)
    }

    fn close(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.closed.store(true, Ordering::Release);
        self.conn().close();
        ready(Ok(()))
    }
}

/// `memory://` has no streams and no consumer arguments: a consume that asks for any is
/// refused, naming the limitation, instead of reading from the wrong place.
fn refuse_consume_arguments(spec: &ConsumeSpec) -> Option<TransportError> {
    if spec.arguments.contains_key("x-stream-offset") {
        return Some(TransportError::Unsupported(format!(
            "the memory:// broker has no streams, so it cannot read {:?} from an x-stream-offset; run stream readers against RabbitMQ (3.9 or later)",
            spec.queue
        )));
    }
    let names: Vec<&str> = spec.arguments.keys().map(|k| k.as_str()).collect();
    (!names.is_empty()).then(|| {
        TransportError::Unsupported(format!(
            "the memory:// broker takes no consumer arguments (asked for {names:?} on {:?})",
            spec.queue
        ))
    })
}
