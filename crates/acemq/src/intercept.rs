//! Interceptors: what belongs on every message rather than at every call site.
//!
//! A [`PublishInterceptor`] sees (and may change) the envelope and application headers of
//! every publish before the body is encoded; an error refuses the publish with nothing
//! sent. A [`ConsumeInterceptor`] runs `before_handle` in registration order before the
//! handler (an error fails the delivery like a handler error: retried, eventually
//! dead-lettered) and `after_handle` always, whether the handler succeeded or failed, in
//! reverse order, so nested scopes close inside out. A [`HandlerLayer`] wraps the
//! handler's future itself (a timeout, a span, a task-local tenant, a check that answers
//! without running the handler), which a before/after pair cannot; layers registered first
//! are outermost, and they run inside the interceptors and the idempotency claim.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use crate::envelope::Envelope;
use crate::error::Error;
use crate::handler_error::HandlerError;
use crate::headers::Headers;
use crate::util::{read, write};

/// What a publish interceptor sees.
#[derive(Debug)]
pub struct PublishContext<'a> {
    /// Destination exchange.
    pub exchange: &'a str,
    /// Routing key.
    pub routing_key: &'a str,
    /// The envelope, before it is written to the headers.
    pub envelope: &'a mut Envelope,
    /// Application headers (the reserved `x-acemq-` prefix is refused after this runs).
    pub headers: &'a mut Headers,
}

/// Sees every publish before encoding.
///
/// ```
/// use acemq::intercept::{PublishContext, PublishInterceptor};
/// struct Tenant;
/// impl PublishInterceptor for Tenant {
///     fn before_publish(&self, ctx: &mut PublishContext<'_>) -> Result<(), acemq::Error> {
///         ctx.headers.insert("x-tenant".into(), "acme".into());
///         Ok(())
///     }
/// }
/// ```
pub trait PublishInterceptor: Send + Sync + 'static {
    /// Runs before encoding; an error refuses the publish.
    fn before_publish(&self, ctx: &mut PublishContext<'_>) -> Result<(), Error>;
}

/// What a consume interceptor sees.
#[derive(Debug)]
pub struct ConsumeContext<'a> {
    /// The consumed queue.
    pub queue: &'a str,
    /// The delivered envelope.
    pub envelope: &'a Envelope,
    /// Application headers.
    pub headers: &'a Headers,
}

/// How the handler ended, for `after_handle`.
#[derive(Debug)]
#[non_exhaustive]
pub enum HandleResult<'a> {
    /// The handler returned Ok.
    Succeeded,
    /// The handler (or a `before_handle`) failed.
    Failed(&'a HandlerError),
}

/// Runs around every handler.
///
/// ```
/// use acemq::intercept::{ConsumeContext, ConsumeInterceptor, HandleResult};
/// struct Log;
/// impl ConsumeInterceptor for Log {
///     fn after_handle(&self, ctx: &ConsumeContext<'_>, r: &HandleResult<'_>) {
///         println!("{} {}: {r:?}", ctx.queue, ctx.envelope.id());
///     }
/// }
/// ```
pub trait ConsumeInterceptor: Send + Sync + 'static {
    /// Before the handler; an error fails the delivery like a handler error.
    fn before_handle(&self, _ctx: &ConsumeContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
    /// After the handler, always, in reverse registration order.
    fn after_handle(&self, _ctx: &ConsumeContext<'_>, _result: &HandleResult<'_>) {}
}

/// A handler's future as a [`HandlerLayer`] receives and returns it.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'static>>;

/// What a [`HandlerLayer`] knows about the delivery it wraps (owned: the wrapped future may
/// keep it).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HandleInfo {
    /// The consumed queue (an ordered partition's own queue, a stream's name).
    pub queue: Arc<str>,
    /// The delivered envelope, with the attempt being run.
    pub envelope: Arc<Envelope>,
    /// Application headers.
    pub headers: Arc<Headers>,
}

/// Wraps every handler's future: the layer decides whether, when and inside what the
/// handler runs. Any `Fn(&HandleInfo, HandlerFuture) -> HandlerFuture` is one.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// use std::time::Duration;
/// use acemq::consume::HandlerError;
/// use acemq::intercept::{HandleInfo, HandlerFuture};
/// let mq = acemq::Connection::connect("memory://doc-layer").await?;
/// // Every handler of this connection gets 30 s, then its delivery is retried.
/// mq.wrap_handlers(|_: &HandleInfo, next: HandlerFuture| -> HandlerFuture {
///     Box::pin(async move {
///         tokio::time::timeout(Duration::from_secs(30), next)
///             .await
///             .unwrap_or_else(|_| Err(HandlerError::retry("the handler took over 30 s")))
///     })
/// });
/// # Ok(()) }
/// ```
pub trait HandlerLayer: Send + Sync + 'static {
    /// Returns the future that runs in place of `next` (which runs the handler, and the
    /// layers inside this one).
    fn wrap(&self, info: &HandleInfo, next: HandlerFuture) -> HandlerFuture;
}

impl<F> HandlerLayer for F
where
    F: Fn(&HandleInfo, HandlerFuture) -> HandlerFuture + Send + Sync + 'static,
{
    fn wrap(&self, info: &HandleInfo, next: HandlerFuture) -> HandlerFuture {
        self(info, next)
    }
}

/// The registered interceptors and handler layers of a connection. Reading is a cheap
/// `Arc` clone.
#[derive(Default)]
pub(crate) struct Interceptors {
    publish: RwLock<Arc<[Arc<dyn PublishInterceptor>]>>,
    consume: RwLock<Arc<[Arc<dyn ConsumeInterceptor>]>>,
    layers: RwLock<Arc<[Arc<dyn HandlerLayer>]>>,
}

impl std::fmt::Debug for Interceptors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptors")
            .field("publish", &self.publish_chain().len())
            .field("consume", &self.consume_chain().len())
            .field("layers", &self.layers().len())
            .finish()
    }
}

impl Interceptors {
    pub(crate) fn add_publish(&self, i: Arc<dyn PublishInterceptor>) {
        let mut slot = write(&self.publish);
        let mut v: Vec<_> = slot.iter().cloned().collect();
        v.push(i);
        *slot = v.into();
    }

    pub(crate) fn add_consume(&self, i: Arc<dyn ConsumeInterceptor>) {
        let mut slot = write(&self.consume);
        let mut v: Vec<_> = slot.iter().cloned().collect();
        v.push(i);
        *slot = v.into();
    }

    pub(crate) fn add_layer(&self, l: Arc<dyn HandlerLayer>) {
        let mut slot = write(&self.layers);
        let mut v: Vec<_> = slot.iter().cloned().collect();
        v.push(l);
        *slot = v.into();
    }

    pub(crate) fn layers(&self) -> Arc<[Arc<dyn HandlerLayer>]> {
        read(&self.layers).clone()
    }

    pub(crate) fn publish_chain(&self) -> Arc<[Arc<dyn PublishInterceptor>]> {
        read(&self.publish).clone()
    }

    pub(crate) fn consume_chain(&self) -> Arc<[Arc<dyn ConsumeInterceptor>]> {
        read(&self.consume).clone()
    }
}
