//! The RabbitMQ transport, on lapin.
//!
//! [`AmqpTransport`] holds **two connections**. A resource alarm blocks a connection, and a
//! blocked connection writes nothing at all (lapin stops its writer), acks included; so
//! publishing has a connection of its own, and consuming, settling, `basic.get` and every
//! topology operation use the other one, where they keep working while publishing is
//! refused. While the publishing connection is blocked, [`Transport::publish`] fails at once
//! with [`TransportError::Blocked`] (nothing is sent) instead of hanging.
//!
//! The parts:
//! * `link`: each connection in a replaceable link with a supervisor that drains its event
//!   stream once (lapin sends events only while a listener exists, and several listeners
//!   would split them), keeps the status, and on loss redials with backoff across the
//!   addresses, declares the recorded topology again and only then reports ready;
//! * `publisher`: one confirm-mode channel (`ConfirmChannel`), publishes serialized;
//!   `collector`: its confirms collected, each publish answered once its own is in;
//!   `returns`: returns matched to their publish by `message_id` and destination, never
//!   dropped while their publish may still arrive;
//! * `subscription`: one channel per subscription, prefetch before consume, settlements
//!   that never report an unsent ack as success, buffered deliveries of a dead channel
//!   dropped;
//! * `topology`: declares and deletes, one operation per pooled channel of the consuming
//!   connection (a 404 or 406 closes only its own channel, which is then dropped);
//! * `options`: names, timeouts, addresses, heartbeat, recovery, credentials, TLS;
//! * `convert`: properties and header tables, lossless and panic-free;
//! * `errors`: lapin errors by AMQP reply code;
//! * `tls`: the rustls connector, the TCP + TLS dial (the name verified may differ from the
//!   URL's host), TLS handshake failures sorted by cause.
//!
//! Connecting needs a tokio runtime (lapin's `tokio` feature); `amqp://` and `amqps://` URLs
//! are accepted (TLS through rustls with the ring provider).

mod collector;
mod convert;
mod errors;
mod link;
mod options;
mod publisher;
mod returns;
mod socket;
mod subscription;
mod tls;
mod topology;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use lapin::Channel;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicQosOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use tokio::sync::{Mutex, broadcast, watch};
use tokio::task::JoinHandle;
use tracing::debug;

use self::errors::from_lapin;
use self::link::{Dialer, Link, supervise};
pub use self::options::{AmqpOptions, Credentials, TlsOptions};
use self::publisher::ConfirmChannel;
use self::subscription::{AmqpSubscription, Generation, bounded};
use self::topology::timed;
use super::recovery::{Declared, DeclaredTopology, Events, RecoveryEvent, Side};
use super::{
    BoxFuture, ConsumeSpec, Delivery, Outbound, PendingConfirm, QueueInfo, Subscription,
    TrackedConfirm, Transport, TransportError, TransportStatus,
};
use crate::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl};

/// How many idle topology channels are kept open.
const IDLE_TOPOLOGY_CHANNELS: usize = 4;

/// RabbitMQ through lapin: a publishing and a consuming connection, each recovered on loss.
///
/// The two are separate because a blocked connection stalls every write on it, acks
/// included: a resource alarm then refuses publishes without stopping consumers from
/// draining.
///
/// ```no_run
/// # async fn demo() -> Result<(), acemq::transport::TransportError> {
/// use acemq::transport::{Transport, amqp::AmqpTransport};
/// let t = AmqpTransport::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// assert!(t.status().connected);
/// t.close().await?;
/// # Ok(()) }
/// ```
pub struct AmqpTransport {
    inner: Arc<Inner>,
    supervisors: Vec<JoinHandle<()>>,
}

/// The transport's state, shared with the link supervisors (which hold it weakly).
pub(crate) struct Inner {
    options: AmqpOptions,
    dialer: Dialer,
    publisher: ConfirmChannel,
    consume: Link,
    /// Idle topology channels on the consuming connection.
    idle: std::sync::Mutex<Vec<Channel>>,
    /// The channel `basic.get` uses (deliveries are settled on it).
    get_channel: Mutex<Option<Channel>>,
    status: Arc<watch::Sender<TransportStatus>>,
    status_rx: watch::Receiver<TransportStatus>,
    closed: AtomicBool,
    declared: DeclaredTopology,
    events: Events,
}

impl std::fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl AmqpTransport {
    /// Connects to RabbitMQ (`amqp://` or `amqps://`) with default [`AmqpOptions`].
    pub async fn connect(url: &str) -> Result<AmqpTransport, TransportError> {
        Self::connect_with(url, AmqpOptions::default()).await
    }

    /// Connects to RabbitMQ with options. An unreachable broker is retried for
    /// [`AmqpOptions::connect_timeout`] (then [`TransportError::Unreachable`], naming the
    /// address without its password); refused credentials fail at once.
    pub async fn connect_with(
        url: &str,
        options: AmqpOptions,
    ) -> Result<AmqpTransport, TransportError> {
        let dialer = Dialer::new(url, &options);
        let (budget, policy) = (options.connect_timeout, options.recovery.clone());
        let publish = dialer
            .dial_with_budget(Side::Publish, budget, &policy)
            .await?;
        let publish_events = publish.0.events_listener();
        let consume = match dialer
            .dial_with_budget(Side::Consume, budget, &policy)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                let _ = publish.0.close(200, "OK".into()).await;
                publish.1.shut();
                return Err(e);
            }
        };
        let consume_events = consume.0.events_listener();
        let (tx, status_rx) = watch::channel(TransportStatus {
            connected: true,
            blocked: None,
        });
        let inner = Arc::new(Inner {
            publisher: ConfirmChannel::new(
                Link::new(Side::Publish, publish),
                status_rx.clone(),
                options.confirm_timeout,
                options.publish_wait,
            ),
            consume: Link::new(Side::Consume, consume),
            options,
            dialer,
            idle: std::sync::Mutex::new(Vec::new()),
            get_channel: Mutex::new(None),
            status: Arc::new(tx),
            status_rx,
            closed: AtomicBool::new(false),
            declared: DeclaredTopology::default(),
            events: Events::new(crate::observe::TRANSPORT_RABBITMQ),
        });
        let weak = Arc::downgrade(&inner);
        let supervisors = vec![
            tokio::spawn(supervise(weak.clone(), Side::Publish, publish_events)),
            tokio::spawn(supervise(weak, Side::Consume, consume_events)),
        ];
        Ok(AmqpTransport { inner, supervisors })
    }

    /// Recovery events (lost, retrying, recovered, gave up, blocked, unblocked) from now on.
    pub fn recovery_events(&self) -> broadcast::Receiver<RecoveryEvent> {
        self.inner.events.subscribe()
    }
}

impl Inner {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Re-reads both links into the shared status.
    fn refresh_status(&self) {
        let connected = !self.is_closed() && self.publisher.link().ready() && self.consume.ready();
        self.status.send_if_modified(|s| {
            let changed = s.connected != connected;
            s.connected = connected;
            changed
        });
    }

    fn set_blocked(&self, reason: Option<String>) {
        match &reason {
            Some(r) => self
                .events
                .emit(RecoveryEvent::Blocked { reason: r.clone() }),
            None => self.events.emit(RecoveryEvent::Unblocked),
        }
        self.status.send_modify(|s| s.blocked = reason);
    }

    /// After a side reconnected: drop what belonged to the old connection; on the consuming
    /// side, declare the recorded topology again, in its order.
    async fn after_reconnect(&self, side: Side) -> Result<(), TransportError> {
        match side {
            Side::Publish => {
                self.publisher.reset().await;
                Ok(())
            }
            Side::Consume => {
                self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
                *self.get_channel.lock().await = None;
                self.redeclare().await
            }
        }
    }

    /// The state as lapin sees it now.
    fn live_status(&self) -> TransportStatus {
        let mut s = self.status_rx.borrow().clone();
        s.connected = !self.is_closed() && self.publisher.link().ready() && self.consume.ready();
        s.blocked = self.publisher.blocked(&self.status_rx);
        s
    }
}

impl Drop for AmqpTransport {
    fn drop(&mut self) {
        for w in &self.supervisors {
            w.abort();
        }
    }
}

impl Transport for AmqpTransport {
    fn kind(&self) -> &'static str {
        "amqp"
    }

    fn publish(&self, message: Outbound) -> BoxFuture<'_, Result<PendingConfirm, TransportError>> {
        self.inner.publisher.publish(message)
    }

    fn publish_tracked(
        &self,
        message: Outbound,
    ) -> BoxFuture<'_, Result<TrackedConfirm, TransportError>> {
        self.inner.publisher.publish_tracked(message)
    }

    fn consume(
        &self,
        spec: ConsumeSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Subscription>, TransportError>> {
        Box::pin(async move {
            if spec.prefetch == 0 {
                return Err(TransportError::Unsupported(
                    "prefetch 0 (an unlimited window); use at least 1".into(),
                ));
            }
            let queue = convert::name(&spec.queue)?;
            let tag = convert::name(&spec.consumer_tag)?;
            let arguments = convert::to_table(&spec.arguments)?;
            // The generation first: a connection lost from here on ends the attempt (and
            // the subscription, should the consume-ok still arrive).
            let generation = Generation::now(self.inner.consume.generation());
            let connection = self.inner.consume.current();
            let channel = bounded(&generation, connection.create_channel(), "channel.open").await?;
            let qos = channel.basic_qos(spec.prefetch, BasicQosOptions { global: false });
            bounded(&generation, qos, "basic.qos").await?;
            let options = BasicConsumeOptions {
                exclusive: spec.exclusive,
                ..BasicConsumeOptions::default()
            };
            let consume = channel.basic_consume(queue, tag, options, arguments);
            let consumer = bounded(&generation, consume, "basic.consume").await?;
            if !generation.is_current() {
                return Err(TransportError::NotConnected {
                    detail: "the connection was lost right after basic.consume-ok".into(),
                });
            }
            Ok(Box::new(AmqpSubscription::new(
                channel,
                consumer,
                connection.status().clone(),
                generation,
            )) as Box<dyn Subscription>)
        })
    }

    fn get(&self, queue: &str) -> BoxFuture<'_, Result<Option<Delivery>, TransportError>> {
        let queue = convert::name(queue);
        Box::pin(async move {
            let queue = queue?;
            let mut slot = self.inner.get_channel.lock().await;
            let generation = Generation::now(self.inner.consume.generation());
            let healthy = slot.as_ref().is_some_and(|c| c.status().connected());
            if !healthy {
                let conn = self.inner.consume.current();
                *slot = Some(bounded(&generation, conn.create_channel(), "channel.open").await?);
            }
            let Some(ch) = slot.as_ref() else {
                return Err(TransportError::Closed {
                    detail: "no basic.get channel".into(),
                });
            };
            let get = ch.basic_get(queue, BasicGetOptions { no_ack: false });
            let got = bounded(&generation, get, "basic.get").await?;
            Ok(got.map(|m| subscription::delivery(m.delivery, generation)))
        })
    }

    fn declare_exchange(&self, decl: &ExchangeDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        let decl = decl.clone();
        Box::pin(async move {
            self.inner.declare_exchange_op(&decl).await?;
            self.inner.declared.record(Declared::Exchange(decl));
            Ok(())
        })
    }

    fn declare_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        let decl = decl.clone();
        Box::pin(async move {
            let info = self.inner.queue_op(&decl.name, false, Some(&decl)).await?;
            self.inner.declared.record(Declared::Queue(decl));
            Ok(info)
        })
    }

    fn check_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        let decl = decl.clone();
        Box::pin(async move { self.inner.queue_op(&decl.name, false, Some(&decl)).await })
    }

    fn bind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        let decl = decl.clone();
        Box::pin(async move {
            self.inner.binding_op(&decl, true).await?;
            self.inner.declared.record(Declared::Binding(decl));
            Ok(())
        })
    }

    fn unbind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        let decl = decl.clone();
        Box::pin(async move {
            self.inner.binding_op(&decl, false).await?;
            self.inner.declared.forget_binding(&decl);
            Ok(())
        })
    }

    fn inspect_queue(&self, name: &str) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        let name = name.to_owned();
        Box::pin(async move { self.inner.queue_op(&name, true, None).await })
    }

    fn inspect_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        let name = name.to_owned();
        let options = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        Box::pin(async move {
            self.inner
                .exchange_op(&name, ExchangeKind::Direct, options, FieldTable::default())
                .await
        })
    }

    fn delete_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        let owned = name.to_owned();
        let name = convert::name(name);
        Box::pin(async move {
            let name = name?;
            let ch = self.inner.checkout().await?;
            let deleted = timed(
                ch.queue_delete(name, QueueDeleteOptions::default()),
                "queue.delete",
            )
            .await;
            self.inner.checkin(ch);
            let n = deleted?;
            self.inner.declared.forget_queue(&owned);
            Ok(n)
        })
    }

    fn delete_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        let owned = name.to_owned();
        let name = convert::name(name);
        Box::pin(async move {
            let name = name?;
            let ch = self.inner.checkout().await?;
            let deleted = timed(
                ch.exchange_delete(name, ExchangeDeleteOptions::default()),
                "exchange.delete",
            )
            .await;
            self.inner.checkin(ch);
            deleted?;
            self.inner.declared.forget_exchange(&owned);
            Ok(())
        })
    }

    fn purge_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        let name = convert::name(name);
        Box::pin(async move {
            let name = name?;
            let ch = self.inner.checkout().await?;
            let purged = timed(
                ch.queue_purge(name, QueuePurgeOptions::default()),
                "queue.purge",
            )
            .await;
            self.inner.checkin(ch);
            purged
        })
    }

    fn status(&self) -> TransportStatus {
        self.inner.live_status()
    }

    fn watch_status(&self) -> watch::Receiver<TransportStatus> {
        self.inner.status_rx.clone()
    }

    fn recovery_events(&self) -> Option<broadcast::Receiver<RecoveryEvent>> {
        Some(self.inner.events.subscribe())
    }

    fn recovering(&self) -> bool {
        !self.inner.is_closed()
            && (self.inner.publisher.link().recovering() || self.inner.consume.recovering())
    }

    /// The publishing connection's negotiated `frame_max` (0, "no limit", reads as
    /// [`super::DEFAULT_FRAME_MAX`]).
    fn frame_max(&self) -> u32 {
        match self
            .inner
            .publisher
            .link()
            .current()
            .configuration()
            .frame_max()
        {
            0 => super::DEFAULT_FRAME_MAX,
            n => n,
        }
    }

    fn close(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            let inner = &self.inner;
            if inner.closed.swap(true, Ordering::AcqRel) {
                return Ok(());
            }
            inner.publisher.refuse().await;
            inner.consume.end_generation();
            let mut first_error = None;
            for conn in [inner.publisher.link().current(), inner.consume.current()] {
                if !conn.status().connected() {
                    continue;
                }
                match conn.close(200, "OK".into()).await.map_err(from_lapin) {
                    Ok(()) => {}
                    // A channel closing at the same moment (a subscription dropped just
                    // before) can fail the close handshake; the connection is gone either way.
                    Err(TransportError::Closed { detail }) => {
                        debug!(%detail, "connection close raced with a channel close");
                    }
                    Err(e) => {
                        debug!(error = %e, "closing a connection failed");
                        first_error.get_or_insert(e);
                    }
                }
            }
            // A connection that was not open (lost, its socket possibly still held by
            // lapin) or whose close-ok came: its socket goes now.
            inner.publisher.link().shut_socket();
            inner.consume.shut_socket();
            // Only now drop the channels: dropping one sends channel.close, which would race
            // with the connection close.
            inner.publisher.release().await;
            inner.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
            *inner.get_channel.lock().await = None;
            for w in &self.supervisors {
                w.abort();
            }
            inner.status.send_modify(|s| {
                s.connected = false;
                s.blocked = None;
            });
            match first_error {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })
    }
}
