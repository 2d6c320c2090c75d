//! The transport seam: one trait between the engine and a broker.
//!
//! This module owns the broker-facing vocabulary: what a publish is ([`Outbound`]), what a
//! confirm says ([`Confirmation`]), what a delivery is ([`Delivery`]) and how it is settled
//! ([`Acker`], [`Settlement`]), what went wrong ([`TransportError`], sorted into an
//! [`ErrorKind`]), and the [`Transport`] trait the engine calls. [`connect`] (the router,
//! in `connect.rs`) picks the transport for a URL.
//!
//! It is the ground floor: from the rest of the crate it uses only `headers` (header
//! tables), `topology` (declarations and the name-length rule) and `observe` (metric and
//! transport names), none of which uses it. There are two implementations: `amqp` (RabbitMQ
//! through lapin, behind the default `amqp` feature) and [`memory`] (a broker inside the
//! process that is not kinder than RabbitMQ). Everything above this module is written
//! against the trait only, so a behaviour proven on one is the behaviour of the other. With
//! the `testing` feature, `conformance` holds the cases both pass, for a transport of your
//! own.
//!
//! ```
//! # async fn demo() -> Result<(), acemq::transport::TransportError> {
//! use acemq::transport::{Transport, memory::MemoryTransport};
//! let t = MemoryTransport::connect("doc-transport");
//! assert_eq!(t.kind(), "memory");
//! t.close().await?;
//! # Ok(()) }
//! ```

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(feature = "testing")]
pub mod conformance;
mod connect;
mod error;
mod frame;
pub mod memory;
pub mod recovery;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{broadcast, watch};

pub use self::connect::{TransportOptions, connect, connect_with};
pub use self::error::{ErrorKind, Source, TlsFailure, TransportError};
pub use self::frame::{DEFAULT_FRAME_MAX, HEADER_MARGIN, header_frame_size};
use crate::headers::Headers;
use crate::topology::{BindingDecl, ExchangeDecl, QueueDecl};

/// A boxed, sendable future: what every [`Transport`] method returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// AMQP basic properties, all of them, so a republish can keep what arrived.
///
/// ```
/// use acemq::transport::Properties;
/// let p = Properties { message_id: Some("m-1".into()), delivery_mode: Some(2), ..Default::default() };
/// assert_eq!(p.message_id.as_deref(), Some("m-1"));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Properties {
    /// `message-id`: AceMQ writes the envelope id here.
    pub message_id: Option<String>,
    /// `content-type`: the codec's.
    pub content_type: Option<String>,
    /// `content-encoding`.
    pub content_encoding: Option<String>,
    /// `delivery-mode`: 2 persistent, 1 transient.
    pub delivery_mode: Option<u8>,
    /// `priority`.
    pub priority: Option<u8>,
    /// `correlation-id` (AceMQ neither writes nor reads it; kept on republish).
    pub correlation_id: Option<String>,
    /// `reply-to`.
    pub reply_to: Option<String>,
    /// `expiration`: milliseconds as a decimal string.
    pub expiration: Option<String>,
    /// `timestamp` (seconds).
    pub timestamp: Option<u64>,
    /// `type`.
    pub kind: Option<String>,
    /// `user-id`.
    pub user_id: Option<String>,
    /// `app-id`.
    pub app_id: Option<String>,
    /// `cluster-id`.
    pub cluster_id: Option<String>,
    /// The header table.
    pub headers: Headers,
}

/// One message to publish.
///
/// ```
/// use acemq::transport::{Outbound, Properties};
/// let m = Outbound::new("", "orders.new", Properties::default(), "{}");
/// assert!(m.mandatory);
/// ```
#[derive(Clone, Debug)]
pub struct Outbound {
    /// Exchange (`""` is the default exchange).
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Return the message if it routes nowhere (AceMQ's default).
    pub mandatory: bool,
    /// Properties and headers.
    pub properties: Properties,
    /// Body bytes.
    pub body: Bytes,
}

impl Outbound {
    /// A mandatory publish.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        properties: Properties,
        body: impl Into<Bytes>,
    ) -> Self {
        Outbound {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            mandatory: true,
            properties,
            body: body.into(),
        }
    }
}

/// What the broker said about one publish.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Confirmation {
    /// Confirmed (acked) and, when mandatory, routed to at least one queue.
    Routed,
    /// Confirmed but returned: it reached no queue (only for mandatory publishes).
    Unroutable {
        /// The broker's reply code (312 NO_ROUTE).
        reply_code: u16,
        /// The broker's reply text.
        reply_text: String,
    },
    /// The broker refused responsibility (basic.nack).
    Nacked,
}

/// The second stage of a publish: resolves when the broker confirms.
pub type PendingConfirm = BoxFuture<'static, Result<Confirmation, TransportError>>;

/// A publish whose first answer may be "in doubt" while the broker's own answer can still
/// arrive ([`Transport::publish_tracked`]).
pub struct TrackedConfirm {
    /// Resolves as the [`PendingConfirm`] of [`Transport::publish`] does: the broker's
    /// answer, or in doubt ([`TransportError::ConfirmTimeout`]) when it is late or the
    /// connection was blocked first.
    pub answer: PendingConfirm,
    /// When `answer` was in doubt while the confirm could still arrive: resolves with the
    /// broker's own answer once it comes (never `ConfirmTimeout`; `ConfirmLost` or `Closed`
    /// when the channel goes first). `None` when the transport cannot follow it. Await it
    /// only after `answer` said in doubt.
    pub late: Option<PendingConfirm>,
}

impl std::fmt::Debug for TrackedConfirm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedConfirm")
            .field("late", &self.late.is_some())
            .finish_non_exhaustive()
    }
}

/// How to settle a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// basic.ack; `multiple` also acks every earlier unsettled delivery of the subscription.
    Ack {
        /// Ack all earlier deliveries too.
        multiple: bool,
    },
    /// basic.nack.
    Nack {
        /// Settle all earlier deliveries too.
        multiple: bool,
        /// Put the message back (at the head, marked redelivered) instead of dropping or
        /// dead-lettering it.
        requeue: bool,
    },
    /// basic.reject.
    Reject {
        /// Put the message back instead of dropping or dead-lettering it.
        requeue: bool,
    },
}

/// The transport side of one delivery's settlement. Implemented by each transport.
pub trait AckHandle: Send + Sync {
    /// Sends the settlement. Must fail with [`TransportError::AckNotSent`] when nothing
    /// reached the broker (the delivery was already settled, or its channel is gone).
    fn settle(&self, settlement: Settlement) -> BoxFuture<'static, Result<(), TransportError>>;

    /// Whether a settlement could still reach the broker: `false` once the delivery's
    /// channel is gone (the broker has put the message back already). Answered locally.
    fn is_live(&self) -> bool {
        true
    }
}

/// Settles one delivery. Obtained from a [`Delivery`].
pub struct Acker(pub(crate) Box<dyn AckHandle>);

impl Acker {
    /// Wraps a transport's handle.
    pub fn new(handle: impl AckHandle + 'static) -> Self {
        Acker(Box::new(handle))
    }

    /// Whether a settlement could still reach the broker (see [`AckHandle::is_live`]).
    pub fn is_live(&self) -> bool {
        self.0.is_live()
    }

    /// Sends a settlement.
    pub async fn settle(&self, settlement: Settlement) -> Result<(), TransportError> {
        self.0.settle(settlement).await
    }

    /// Acks this delivery alone.
    pub async fn ack(&self) -> Result<(), TransportError> {
        self.settle(Settlement::Ack { multiple: false }).await
    }

    /// Nacks this delivery alone.
    pub async fn nack(&self, requeue: bool) -> Result<(), TransportError> {
        self.settle(Settlement::Nack {
            multiple: false,
            requeue,
        })
        .await
    }
}

impl std::fmt::Debug for Acker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acker").finish_non_exhaustive()
    }
}

/// One message handed over by the broker (from a subscription or basic.get).
#[derive(Debug)]
pub struct Delivery {
    /// The channel's delivery tag.
    pub delivery_tag: u64,
    /// Exchange the message was published to.
    pub exchange: String,
    /// Routing key it was published with.
    pub routing_key: String,
    /// The broker delivered it before and it was not acked.
    pub redelivered: bool,
    /// Properties and headers as delivered, shared with the transport's own copy (the
    /// `memory://` broker keeps one for a redelivery), so a delivery costs no copy of the
    /// header table. `Arc::make_mut` gives a private copy to change.
    pub properties: Arc<Properties>,
    /// Body bytes as delivered.
    pub body: Bytes,
    /// Settles it.
    pub acker: Acker,
}

/// What to subscribe to.
///
/// ```
/// use acemq::transport::ConsumeSpec;
/// let spec = ConsumeSpec::new("jobs", 10).tag("worker-1").exclusive();
/// assert_eq!((spec.queue.as_str(), spec.prefetch, spec.exclusive), ("jobs", 10, true));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConsumeSpec {
    /// The queue.
    pub queue: String,
    /// Window of unacked deliveries (basic.qos, per consumer). Must be at least 1.
    pub prefetch: u16,
    /// Consumer tag; empty lets the transport choose.
    pub consumer_tag: String,
    /// Exclusive consumer.
    pub exclusive: bool,
    /// basic.consume arguments (e.g. `x-stream-offset` for a stream); empty for none.
    /// `memory://` refuses any (it has no streams).
    pub arguments: Headers,
}

impl ConsumeSpec {
    /// A subscription to `queue` with a window of `prefetch` unacked deliveries, a tag the
    /// transport chooses, not exclusive, no arguments.
    pub fn new(queue: impl Into<String>, prefetch: u16) -> Self {
        ConsumeSpec {
            queue: queue.into(),
            prefetch,
            consumer_tag: String::new(),
            exclusive: false,
            arguments: Headers::new(),
        }
    }

    /// Sets the consumer tag.
    pub fn tag(mut self, consumer_tag: impl Into<String>) -> Self {
        self.consumer_tag = consumer_tag.into();
        self
    }

    /// Asks for an exclusive consumer.
    pub fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self
    }

    /// Adds a basic.consume argument (e.g. `x-stream-offset`).
    pub fn argument(
        mut self,
        key: impl Into<String>,
        value: impl Into<crate::headers::HeaderValue>,
    ) -> Self {
        self.arguments.insert(key.into().into(), value.into());
        self
    }
}

/// A live subscription: deliveries come from [`Subscription::next`].
pub trait Subscription: Send {
    /// The next delivery; `None` once the subscription has ended (cancelled by us, by the
    /// broker, or its connection closed). Use [`Subscription::cancelled_by_us`] to tell.
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Delivery, TransportError>>>;
    /// What [`Subscription::next`] gives if it is at hand now; `None` when `next` would
    /// wait. A consumer takes its buffered deliveries with it between waits. The default
    /// polls `next` once; a transport that can tell without a future overrides it.
    fn try_next(&mut self) -> Option<Option<Result<Delivery, TransportError>>> {
        futures::FutureExt::now_or_never(self.next())
    }
    /// Stops new deliveries (basic.cancel). Unsettled deliveries stay settleable.
    fn cancel(&mut self) -> BoxFuture<'_, Result<(), TransportError>>;
    /// Closes the subscription's channel: unsettled deliveries go back to the queue.
    fn close(&mut self) -> BoxFuture<'_, Result<(), TransportError>>;
    /// Whether [`Subscription::cancel`] or [`Subscription::close`] ended it.
    fn cancelled_by_us(&self) -> bool;
    /// A handle that answers, from any task and at any time, whether this subscription is
    /// really consuming: its channel is open, on the transport's current connection (not
    /// one that was lost and replaced since), and the broker answered its `consume-ok`.
    /// Health reads it instead of trusting a flag set when the consumer subscribed. The
    /// default says live for as long as the handle exists (a transport that cannot tell).
    fn probe(&self) -> SubscriptionProbe {
        SubscriptionProbe::new(|| true)
    }
}

/// Whether one subscription is consuming now (see [`Subscription::probe`]). Cheap to
/// clone and to ask (local state only).
///
/// ```
/// use acemq::transport::SubscriptionProbe;
/// let p = SubscriptionProbe::new(|| false);
/// assert!(!p.is_live());
/// ```
#[derive(Clone)]
pub struct SubscriptionProbe(Arc<dyn Fn() -> bool + Send + Sync>);

impl SubscriptionProbe {
    /// A probe asking `live`.
    pub fn new(live: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        SubscriptionProbe(Arc::new(live))
    }

    /// Whether the subscription is consuming now.
    pub fn is_live(&self) -> bool {
        (self.0)()
    }
}

impl std::fmt::Debug for SubscriptionProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionProbe")
            .field("live", &self.is_live())
            .finish()
    }
}

/// What passive inspection says about a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueInfo {
    /// The queue's name (the generated one for a server-named queue).
    pub name: String,
    /// Ready messages (not counting unacked ones).
    pub message_count: u32,
    /// Consumers attached.
    pub consumer_count: u32,
}

/// The connection state a transport reports; health reads it without asking the broker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportStatus {
    /// The connection is open.
    pub connected: bool,
    /// `Some(reason)` while the broker blocks publishing on this connection.
    pub blocked: Option<String>,
}

/// A broker connection: everything the engine needs from RabbitMQ or `memory://`.
pub trait Transport: Send + Sync + 'static {
    /// `"amqp"` or `"memory"`.
    fn kind(&self) -> &'static str;

    /// Publishes one message. The returned future resolves once the message has been
    /// handed over, in call order; the [`PendingConfirm`] it yields resolves with the
    /// broker's confirmation. Refused at once with [`TransportError::Blocked`] while the
    /// publishing connection is blocked.
    fn publish(&self, message: Outbound) -> BoxFuture<'_, Result<PendingConfirm, TransportError>>;

    /// Publishes like [`Transport::publish`], keeping a way to the broker's own answer for a
    /// publish answered in doubt while its confirm can still arrive ([`TrackedConfirm`]), so
    /// a caller can wait for that confirm instead of publishing a second copy. The default
    /// keeps none (`late` is `None`).
    fn publish_tracked(
        &self,
        message: Outbound,
    ) -> BoxFuture<'_, Result<TrackedConfirm, TransportError>> {
        Box::pin(async move {
            Ok(TrackedConfirm {
                answer: self.publish(message).await?,
                late: None,
            })
        })
    }

    /// Subscribes to a queue with a prefetch window.
    fn consume(
        &self,
        spec: ConsumeSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Subscription>, TransportError>>;

    /// basic.get: takes the message at the head of a queue, if any (unacked until settled).
    fn get(&self, queue: &str) -> BoxFuture<'_, Result<Option<Delivery>, TransportError>>;

    /// Declares an exchange; a different existing one fails with
    /// [`TransportError::PreconditionFailed`].
    fn declare_exchange(&self, decl: &ExchangeDecl) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Declares a queue; a different existing one fails with
    /// [`TransportError::PreconditionFailed`]. Returns the queue's counts and name.
    fn declare_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>>;

    /// Declares a queue only to learn whether the broker's queue matches `decl`, without
    /// remembering it (it is not declared again after a recovery): a different existing
    /// one fails with [`TransportError::PreconditionFailed`] (on RabbitMQ a 406 that closes
    /// only the channel it was tried on). The default is [`Transport::declare_queue`].
    fn check_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        self.declare_queue(decl)
    }

    /// Binds a queue to an exchange.
    fn bind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Removes a binding.
    fn unbind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Passive check of a queue: [`TransportError::NotFound`] when it does not exist.
    fn inspect_queue(&self, name: &str) -> BoxFuture<'_, Result<QueueInfo, TransportError>>;

    /// Passive check of an exchange: [`TransportError::NotFound`] when it does not exist.
    fn inspect_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Deletes a queue (and its messages); returns how many messages it held.
    fn delete_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>>;

    /// Deletes an exchange.
    fn delete_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Removes every ready message from a queue; returns how many.
    fn purge_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>>;

    /// The current state, answered locally (never a broker round trip).
    fn status(&self) -> TransportStatus;

    /// Watches the state: connected / blocked changes.
    fn watch_status(&self) -> watch::Receiver<TransportStatus>;

    /// Recovery events from now on (`None` for a transport that does not recover).
    fn recovery_events(&self) -> Option<broadcast::Receiver<recovery::RecoveryEvent>> {
        None
    }

    /// Whether a lost connection is being redialled right now (so the state will change
    /// without anyone acting).
    fn recovering(&self) -> bool {
        false
    }

    /// The largest frame the publishing connection may send (negotiated with the broker;
    /// [`DEFAULT_FRAME_MAX`] when nothing was negotiated). A publish whose content-header
    /// frame ([`header_frame_size`]) is larger makes RabbitMQ close the connection, so the
    /// engine sizes every copy it makes against this first.
    fn frame_max(&self) -> u32 {
        DEFAULT_FRAME_MAX
    }

    /// Closes the connection(s). Unsettled deliveries go back to their queues.
    fn close(&self) -> BoxFuture<'_, Result<(), TransportError>>;
}
