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
//! * `publisher`: one confirm-mode channel, publishes serialized, confirms collected in
//!   publish order and returns matched to publishes by `message_id`;
//! * `subscription`: one channel per subscription, prefetch before consume, settlements
//!   that never report an unsent ack as success;
//! * `convert`: properties and header tables, lossless and panic-free;
//! * `errors`: lapin errors by AMQP reply code.
//!
//! Topology operations run on channels of the consuming connection taken from a small pool,
//! one operation per channel at a time: a 404 or 406 closes the channel it happens on, so a
//! failed declare closes only its own channel, which is then dropped instead of returned.
//!
//! Each connection's event stream is subscribed to once, right after connecting (lapin sends
//! events only while a listener exists, and several listeners would split them), and drained
//! for the connection's life into a `watch` channel behind [`Transport::watch_status`].
//!
//! Connecting needs a tokio runtime (lapin's `tokio` feature); `amqp://` and `amqps://` URLs
//! are accepted (TLS through rustls with the ring provider).

mod convert;
mod errors;
mod publisher;
mod subscription;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicQosOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ConnectionStatus, Event};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use self::errors::from_lapin;
use self::publisher::Publisher;
use self::subscription::AmqpSubscription;
use super::{
    BoxFuture, ConsumeSpec, Delivery, Outbound, PendingConfirm, QueueInfo, Subscription, Transport,
    TransportError, TransportStatus,
};
use crate::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl};

/// How many idle topology channels are kept open.
const IDLE_TOPOLOGY_CHANNELS: usize = 4;

/// How often the connection state is re-read even without an event.
const STATUS_REFRESH: Duration = Duration::from_secs(1);

/// Options for [`AmqpTransport::connect_with`].
///
/// ```
/// use std::time::Duration;
/// use acemq::transport::amqp::AmqpOptions;
/// let o = AmqpOptions::default()
///     .connection_name("orders-service")
///     .confirm_timeout(Duration::from_secs(10));
/// assert_eq!(o.confirm_timeout, Duration::from_secs(10));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AmqpOptions {
    /// The `connection_name` client property, shown by `rabbitmqctl list_connections` and
    /// the management UI. The two connections are named `{name} (publish)` and
    /// `{name} (consume)`. Default `acemq`.
    pub connection_name: String,
    /// How long a publish waits for its confirm before it is reported in doubt
    /// ([`TransportError::ConfirmTimeout`]). Default 30 s.
    pub confirm_timeout: Duration,
}

impl Default for AmqpOptions {
    fn default() -> Self {
        AmqpOptions {
            connection_name: "acemq".to_owned(),
            confirm_timeout: Duration::from_secs(30),
        }
    }
}

impl AmqpOptions {
    /// Sets the connection name.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// Sets the confirm timeout.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }
}

/// RabbitMQ through lapin: a publishing and a consuming connection.
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
    publisher: Publisher,
    consume: Connection,
    /// Idle topology channels on the consuming connection.
    idle: std::sync::Mutex<Vec<Channel>>,
    /// The channel `basic.get` uses (deliveries are settled on it).
    get_channel: Mutex<Option<Channel>>,
    status: Arc<watch::Sender<TransportStatus>>,
    status_rx: watch::Receiver<TransportStatus>,
    watchers: Vec<JoinHandle<()>>,
    closed: AtomicBool,
}

impl std::fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

async fn open(url: &str, name: String) -> Result<Connection, TransportError> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    Connection::connect(url, properties)
        .await
        .map_err(from_lapin)
}

impl AmqpTransport {
    /// Connects to RabbitMQ (`amqp://` or `amqps://`) with default [`AmqpOptions`].
    pub async fn connect(url: &str) -> Result<AmqpTransport, TransportError> {
        Self::connect_with(url, AmqpOptions::default()).await
    }

    /// Connects to RabbitMQ with options.
    pub async fn connect_with(
        url: &str,
        options: AmqpOptions,
    ) -> Result<AmqpTransport, TransportError> {
        let publish = open(url, format!("{} (publish)", options.connection_name)).await?;
        let publish_events = publish.events_listener();
        let consume = match open(url, format!("{} (consume)", options.connection_name)).await {
            Ok(c) => c,
            Err(e) => {
                let _ = publish.close(200, "OK".into()).await;
                return Err(e);
            }
        };
        let consume_events = consume.events_listener();
        let (tx, status_rx) = watch::channel(TransportStatus {
            connected: true,
            blocked: None,
        });
        let status = Arc::new(tx);
        let both = [publish.status().clone(), consume.status().clone()];
        let watchers = vec![
            tokio::spawn(watch_events(
                publish_events,
                Side::Publish,
                both.clone(),
                status.clone(),
            )),
            tokio::spawn(watch_events(
                consume_events,
                Side::Consume,
                both,
                status.clone(),
            )),
        ];
        Ok(AmqpTransport {
            publisher: Publisher::new(publish, status_rx.clone(), options.confirm_timeout),
            consume,
            idle: std::sync::Mutex::new(Vec::new()),
            get_channel: Mutex::new(None),
            status,
            status_rx,
            watchers,
            closed: AtomicBool::new(false),
        })
    }

    /// A topology channel for one operation (from the pool, or a new one).
    async fn checkout(&self) -> Result<Channel, TransportError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(ch) if ch.status().connected() => Ok(ch),
            _ => self.consume.create_channel().await.map_err(from_lapin),
        }
    }

    /// Returns a topology channel to the pool unless the operation closed it.
    fn checkin(&self, ch: Channel) {
        if !ch.status().connected() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_TOPOLOGY_CHANNELS {
            idle.push(ch);
        }
    }

    /// The publishing connection's state as lapin sees it now.
    fn live_status(&self) -> TransportStatus {
        let mut s = self.status_rx.borrow().clone();
        s.connected = !self.closed.load(Ordering::Acquire)
            && self.publisher.connection().status().connected()
            && self.consume.status().connected();
        s.blocked = self.publisher.blocked(&self.status_rx);
        s
    }

    /// queue.bind (`bind`) or queue.unbind on a topology channel.
    async fn binding_op(&self, decl: &BindingDecl, bind: bool) -> Result<(), TransportError> {
        let (queue, exchange) = (convert::name(&decl.queue)?, convert::name(&decl.exchange)?);
        let routing_key = convert::name(&decl.routing_key)?;
        let arguments = convert::to_table(&decl.arguments)?;
        let ch = self.checkout().await?;
        let done = if bind {
            ch.queue_bind(
                queue,
                exchange,
                routing_key,
                QueueBindOptions::default(),
                arguments,
            )
            .await
        } else {
            ch.queue_unbind(queue, exchange, routing_key, arguments)
                .await
        };
        self.checkin(ch);
        done.map_err(from_lapin)
    }

    async fn queue_op(
        &self,
        name: &str,
        passive: bool,
        decl: Option<&QueueDecl>,
    ) -> Result<QueueInfo, TransportError> {
        let queue = convert::name(name)?;
        let (options, arguments) = match decl {
            Some(d) => (
                QueueDeclareOptions {
                    passive,
                    durable: d.durable,
                    exclusive: d.exclusive,
                    auto_delete: d.auto_delete,
                    nowait: false,
                },
                convert::to_table(&d.arguments)?,
            ),
            None => (
                QueueDeclareOptions {
                    passive,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        };
        let ch = self.checkout().await?;
        let declared = ch.queue_declare(queue, options, arguments).await;
        self.checkin(ch);
        let q = declared.map_err(from_lapin)?;
        Ok(QueueInfo {
            name: q.name().as_str().to_owned(),
            message_count: q.message_count(),
            consumer_count: q.consumer_count(),
        })
    }

    async fn exchange_op(
        &self,
        name: &str,
        kind: ExchangeKind,
        options: ExchangeDeclareOptions,
        arguments: FieldTable,
    ) -> Result<(), TransportError> {
        let exchange = convert::name(name)?;
        let kind = match kind {
            ExchangeKind::Direct => lapin::ExchangeKind::Direct,
            ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
            ExchangeKind::Topic => lapin::ExchangeKind::Topic,
            ExchangeKind::Headers => lapin::ExchangeKind::Headers,
        };
        let ch = self.checkout().await?;
        let declared = ch
            .exchange_declare(exchange, kind, options, arguments)
            .await;
        self.checkin(ch);
        declared.map_err(from_lapin)
    }
}

impl Drop for AmqpTransport {
    fn drop(&mut self) {
        for w in &self.watchers {
            w.abort();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Publish,
    Consume,
}

/// Drains one connection's event stream into the shared status, for the connection's life.
async fn watch_events(
    events: impl futures::Stream<Item = Event> + Send + 'static,
    side: Side,
    connections: [ConnectionStatus; 2],
    status: Arc<watch::Sender<TransportStatus>>,
) {
    let refresh = || {
        let connected = connections.iter().all(ConnectionStatus::connected);
        status.send_if_modified(|s| {
            let changed = s.connected != connected;
            s.connected = connected;
            changed
        });
    };
    let mut events = std::pin::pin!(events);
    let mut tick = tokio::time::interval(STATUS_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Event::ConnectionBlocked(reason)) => {
                    warn!(?side, %reason, "the broker blocked the connection");
                    if side == Side::Publish {
                        status.send_modify(|s| s.blocked = Some(reason));
                    }
                }
                Some(Event::ConnectionUnblocked) => {
                    info!(?side, "the broker unblocked the connection");
                    if side == Side::Publish {
                        status.send_modify(|s| s.blocked = None);
                    }
                }
                Some(Event::Error(e)) => {
                    debug!(?side, error = %e, "connection event: error");
                    refresh();
                }
                Some(other) => {
                    debug!(?side, event = ?other, "connection event");
                    refresh();
                }
                None => {
                    refresh();
                    return;
                }
            },
            _ = tick.tick() => refresh(),
        }
    }
}

impl Transport for AmqpTransport {
    fn kind(&self) -> &'static str {
        "amqp"
    }

    fn publish(&self, message: Outbound) -> BoxFuture<'_, Result<PendingConfirm, TransportError>> {
        Box::pin(self.publisher.publish(message))
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
            let channel = self.consume.create_channel().await.map_err(from_lapin)?;
            channel
                .basic_qos(spec.prefetch, BasicQosOptions { global: false })
                .await
                .map_err(from_lapin)?;
            let options = BasicConsumeOptions {
                exclusive: spec.exclusive,
                ..BasicConsumeOptions::default()
            };
            let consumer = channel
                .basic_consume(queue, tag, options, FieldTable::default())
                .await
                .map_err(from_lapin)?;
            Ok(Box::new(AmqpSubscription::new(channel, consumer)) as Box<dyn Subscription>)
        })
    }

    fn get(&self, queue: &str) -> BoxFuture<'_, Result<Option<Delivery>, TransportError>> {
        let queue = convert::name(queue);
        Box::pin(async move {
            let queue = queue?;
            let mut slot = self.get_channel.lock().await;
            let healthy = slot.as_ref().is_some_and(|c| c.status().connected());
            if !healthy {
                *slot = Some(self.consume.create_channel().await.map_err(from_lapin)?);
            }
            let Some(ch) = slot.as_ref() else {
                return Err(TransportError::Closed {
                    detail: "no basic.get channel".into(),
                });
            };
            let got = ch
                .basic_get(queue, BasicGetOptions { no_ack: false })
                .await
                .map_err(from_lapin)?;
            Ok(got.map(|m| subscription::delivery(m.delivery)))
        })
    }

    fn declare_exchange(&self, decl: &ExchangeDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        let arguments = convert::to_table(&decl.arguments);
        let (name, kind) = (decl.name.clone(), decl.kind);
        let options = ExchangeDeclareOptions {
            passive: false,
            durable: decl.durable,
            auto_delete: decl.auto_delete,
            internal: false,
            nowait: false,
        };
        Box::pin(async move { self.exchange_op(&name, kind, options, arguments?).await })
    }

    fn declare_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        let decl = decl.clone();
        Box::pin(async move { self.queue_op(&decl.name, false, Some(&decl)).await })
    }

    fn bind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        let decl = decl.clone();
        Box::pin(async move { self.binding_op(&decl, true).await })
    }

    fn unbind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        let decl = decl.clone();
        Box::pin(async move { self.binding_op(&decl, false).await })
    }

    fn inspect_queue(&self, name: &str) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        let name = name.to_owned();
        Box::pin(async move { self.queue_op(&name, true, None).await })
    }

    fn inspect_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        let name = name.to_owned();
        let options = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        Box::pin(async move {
            self.exchange_op(&name, ExchangeKind::Direct, options, FieldTable::default())
                .await
        })
    }

    fn delete_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        let name = convert::name(name);
        Box::pin(async move {
            let name = name?;
            let ch = self.checkout().await?;
            let deleted = ch.queue_delete(name, QueueDeleteOptions::default()).await;
            self.checkin(ch);
            deleted.map_err(from_lapin)
        })
    }

    fn delete_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        let name = convert::name(name);
        Box::pin(async move {
            let name = name?;
            let ch = self.checkout().await?;
            let deleted = ch
                .exchange_delete(name, ExchangeDeleteOptions::default())
                .await;
            self.checkin(ch);
            deleted.map_err(from_lapin)
        })
    }

    fn purge_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        let name = convert::name(name);
        Box::pin(async move {
            let name = name?;
            let ch = self.checkout().await?;
            let purged = ch.queue_purge(name, QueuePurgeOptions::default()).await;
            self.checkin(ch);
            purged.map_err(from_lapin)
        })
    }

    fn status(&self) -> TransportStatus {
        self.live_status()
    }

    fn watch_status(&self) -> watch::Receiver<TransportStatus> {
        self.status_rx.clone()
    }

    fn close(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            if self.closed.swap(true, Ordering::AcqRel) {
                return Ok(());
            }
            self.publisher.refuse().await;
            let mut first_error = None;
            for conn in [self.publisher.connection(), &self.consume] {
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
            // Only now drop the channels: dropping one sends channel.close, which would race
            // with the connection close.
            self.publisher.release().await;
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
            *self.get_channel.lock().await = None;
            for w in &self.watchers {
                w.abort();
            }
            self.status.send_modify(|s| {
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
