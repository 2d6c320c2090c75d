//! [`Requester`]: sends requests and waits for their replies on a private reply queue.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::observe::{MetricsCache, RequestOutcome, request_span};
use super::replies::{RequesterHealth, Shared, run};
use super::{
    REPLY_PREFETCH, REPLY_QUEUE_EXPIRES_MS, REPLY_QUEUE_PREFIX, RequestError, simple_type_name,
};
use crate::codec::{Decoder, Encoder, Json};
use crate::engine::Engine;
use crate::error::Error;
use crate::headers::HeaderValue;
use crate::observe::trace::{self, TraceContext};
use crate::publish::{Publisher, SendOptions};
use crate::topology::QueueDecl;
use crate::transport::ConsumeSpec;
use crate::util::lock;

/// Counts of a requester's requests so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequesterStats {
    /// Requests whose reply came in time.
    pub answered: u64,
    /// Requests answered with a fault reply: the responder's handler failed
    /// ([`RequestError::Failed`]).
    pub failed: u64,
    /// Requests that timed out.
    pub timed_out: u64,
    /// Replies that matched no waiting request (late, or their request was dropped):
    /// acked and dropped.
    pub unmatched: u64,
    /// Requests waiting for their reply right now.
    pub pending: usize,
}

/// Sends requests and waits for their replies (see the [module docs](crate::request)).
///
/// Cheap to clone; every clone shares one reply queue. The reply queue is consumed until
/// [`Requester::close`] or until the last clone is dropped (then it is left to its
/// `x-expires`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// let mq = acemq::Connection::connect("memory://doc-requester").await?;
/// let requester = mq.requester().await?;
/// assert!(requester.reply_queue().starts_with("acemq.reply."));
/// assert_eq!(requester.stats().pending, 0);
/// requester.close().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Requester {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    metrics: MetricsCache,
    stop: CancellationToken,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for Requester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requester")
            .field("reply_queue", &self.reply_queue())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Requester {
    /// Declares a fresh reply queue on `engine` and starts consuming it (what
    /// [`crate::Connection::requester`] does).
    pub(crate) async fn start(engine: &Arc<Engine>) -> Result<Requester, Error> {
        if engine.lifecycle.is_closed() {
            return Err(Error::Closed);
        }
        let name = format!("{REPLY_QUEUE_PREFIX}{}", uuid::Uuid::new_v4());
        // Classic and durable, as every queue the Java member declares, with its x-expires:
        // a requester that goes away without closing leaves nothing behind for long.
        let decl = QueueDecl::classic(&name)
            .argument("x-expires", HeaderValue::I64(REPLY_QUEUE_EXPIRES_MS));
        engine.transport.declare_queue(&decl).await?;
        let spec = ConsumeSpec::new(name.clone(), REPLY_PREFETCH).tag(format!("acemq-{name}"));
        let subscription = match engine.transport.consume(spec.clone()).await {
            Ok(s) => s,
            Err(e) => {
                let _ = engine.transport.delete_queue(&name).await;
                return Err(e.into());
            }
        };
        let shared = Arc::new(Shared::new(engine.clone(), decl));
        engine.register_health(Arc::new(RequesterHealth(shared.clone())));
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(shared.clone(), subscription, spec, stop.clone()));
        Ok(Requester {
            inner: Arc::new(Inner {
                shared,
                metrics: MetricsCache::default(),
                stop,
                task: std::sync::Mutex::new(Some(task)),
            }),
        })
    }

    /// The reply queue, `acemq.reply.{uuid}`.
    pub fn reply_queue(&self) -> &str {
        self.inner.shared.queue()
    }

    /// Counts so far, and the requests waiting right now.
    pub fn stats(&self) -> RequesterStats {
        let s = &self.inner.shared;
        RequesterStats {
            answered: s.answered.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            timed_out: s.timed_out.load(Ordering::Relaxed),
            unmatched: s.unmatched.load(Ordering::Relaxed),
            pending: s.pending(),
        }
    }

    /// Sends `request` (JSON) to `exchange` with `routing_key` and waits up to `timeout`
    /// for the reply, decoded as `Resp`.
    ///
    /// The request is a normal confirmed, mandatory publish (refused while publishing is
    /// paused, unroutable is an error) whose envelope type is `Req`'s simple name, with a
    /// fresh `x-acemq-correlation` and the reply queue in `acemq-reply-to` and `reply_to`.
    /// `timeout` bounds the whole call, publish included, and is the request's
    /// `expiration` too (whole milliseconds): a request still queued when its caller gave
    /// up is dropped by the broker instead of being processed for nobody.
    ///
    /// Cancel-safe: dropping the future gives its place back at once; a reply that comes
    /// later is counted as unmatched and dropped.
    ///
    /// # Errors
    ///
    /// [`RequestError::TimedOut`] (the request may still be processed),
    /// [`RequestError::Failed`] (the responder's handler failed and said why),
    /// [`RequestError::Publish`], [`RequestError::Reply`] (the reply does not decode),
    /// [`RequestError::Closed`].
    pub fn request<Req, Resp>(
        &self,
        exchange: &str,
        routing_key: &str,
        request: &Req,
        timeout: Duration,
    ) -> impl Future<Output = Result<Resp, RequestError>>
    where
        Req: Serialize + ?Sized + 'static,
        Resp: DeserializeOwned,
    {
        // A plain function: the future is `request_with`'s, without a copy of the arguments.
        self.request_with(exchange, routing_key, Json, request, timeout)
    }

    /// [`Requester::request`] with another codec: `request` is encoded with `codec` (its
    /// content type on the wire) and the reply decoded with it; a reply in a content type
    /// the codec does not [accept](Decoder::accepts) is [`RequestError::Reply`]. The
    /// responder should answer with the same codec
    /// ([`Connection::respond_with`](crate::Connection::respond_with)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use acemq::codec::Text;
    /// use acemq::consume::{ConsumerOptions, Message};
    /// let mq = acemq::Connection::connect("memory://doc-request-with").await?;
    /// mq.transport().declare_queue(&acemq::topology::QueueDecl::classic("greet")).await?;
    /// let _responder = mq
    ///     .respond_with("greet", Text, ConsumerOptions::default(), |m: Message<String>| async move {
    ///         Ok(format!("hello, {}", m.payload()))
    ///     })
    ///     .await?;
    /// let requester = mq.requester().await?;
    /// let answer: String = requester
    ///     .request_with("", "greet", Text, "ann", Duration::from_secs(5))
    ///     .await?;
    /// assert_eq!(answer, "hello, ann");
    /// # Ok(()) }
    /// ```
    pub async fn request_with<Req, Resp, C>(
        &self,
        exchange: &str,
        routing_key: &str,
        codec: C,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, RequestError>
    where
        Req: ?Sized + 'static,
        C: Encoder<Req> + Decoder<Resp>,
    {
        let started = Instant::now();
        let shared = &self.inner.shared;
        let id = uuid::Uuid::new_v4();
        let destination = if exchange.is_empty() {
            routing_key
        } else {
            exchange
        };
        let codec = Arc::new(codec);
        // Built in a block, so what only the building needs (the publisher, its options,
        // the correlation id's text) is gone before the wait: a request's future holds the
        // send's future, its span and trace context, and its slot.
        let (ctx, span, metrics, mut slot, sending) = {
            let engine = &shared.engine;
            let correlation_id = crate::envelope::id_text(id);
            let message_type = simple_type_name::<Req>("Request");
            let (ctx, parent) = TraceContext::for_publish();
            let span = request_span(
                destination,
                routing_key,
                &correlation_id,
                message_type,
                &ctx,
                parent.as_ref(),
            );
            let slot = shared.register(id).ok_or(RequestError::Closed)?;
            let transport = crate::observe::transport_name(engine.transport.kind());
            let metrics = self
                .inner
                .metrics
                .get(transport, exchange, routing_key, message_type);
            let publisher: Publisher<Req> = Publisher::with_metrics(
                engine.clone(),
                exchange.into(),
                routing_key.into(),
                codec.clone(),
                metrics.publish.clone(),
            );
            let mut options = SendOptions::new()
                .correlation_id(correlation_id)
                .reply_to(shared.queue())
                .message_type(message_type);
            if timeout >= Duration::from_millis(1) {
                options = options.expiration(timeout);
            }
            // In the request's span and trace context: the publish span is their child.
            let sending = span.in_scope(|| {
                trace::sync_scope(ctx.clone(), || publisher.into_sending(request, options))
            });
            (ctx, span, metrics, slot, sending)
        };
        let mut sending = match sending {
            Ok(sending) => sending,
            Err(e) => {
                trace::record_outcome(&span, "failed", true);
                return Err(RequestError::Publish(e));
            }
        };
        let exchange_and_wait = async {
            // A reply proves the request arrived, so it is not kept waiting for the request's
            // confirm: RabbitMQ confirms a persistent message once it is on disk or acked, and
            // the responder acks only after its reply was confirmed, which waits for this
            // requester's ack of the reply. A publish that fails (unroutable, nacked, in
            // doubt) before a reply comes fails the request. When the reply comes first, the
            // confirm is awaited in a task of its own, for the publish metric and span.
            let early = tokio::select! {
                biased;
                sent = &mut sending => {
                    sent.map_err(RequestError::Publish)?;
                    None
                }
                reply = slot.reply() => Some(reply),
            };
            match early {
                Some(reply) => {
                    tokio::spawn(sending);
                    reply.ok_or(RequestError::Closed)
                }
                None => slot.reply().await.ok_or(RequestError::Closed),
            }
        };
        let waited = tokio::time::timeout(timeout, trace::scope(ctx, exchange_and_wait))
            .instrument(span.clone())
            .await;
        drop(slot);
        let reply = match waited {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                trace::record_outcome(&span, "failed", true);
                return Err(e);
            }
            Err(_elapsed) => {
                shared.timed_out.fetch_add(1, Ordering::Relaxed);
                metrics.record(RequestOutcome::TimedOut, started.elapsed());
                trace::record_outcome(&span, RequestOutcome::TimedOut.as_str(), true);
                return Err(RequestError::TimedOut {
                    destination: destination.to_owned(),
                    correlation_id: id.to_string(),
                    timeout,
                });
            }
        };
        if let Some(reason) = reply.error {
            shared.failed.fetch_add(1, Ordering::Relaxed);
            metrics.record(RequestOutcome::Failed, started.elapsed());
            trace::record_outcome(&span, RequestOutcome::Failed.as_str(), true);
            return Err(RequestError::Failed {
                destination: destination.to_owned(),
                correlation_id: id.to_string(),
                reason,
            });
        }
        shared.answered.fetch_add(1, Ordering::Relaxed);
        metrics.record(RequestOutcome::Answered, started.elapsed());
        trace::record_outcome(&span, RequestOutcome::Answered.as_str(), false);
        Decoder::<Resp>::decode(&*codec, reply.content_type.as_deref(), &reply.body).map_err(
            |source| RequestError::Reply {
                correlation_id: id.to_string(),
                source,
            },
        )
    }

    /// Stops consuming the reply queue and deletes it (as the Java member does on close).
    /// Requests still waiting fail with [`RequestError::Closed`]. Every clone is closed.
    pub async fn close(&self) {
        self.inner.stop.cancel();
        let task = lock(&self.inner.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let shared = &self.inner.shared;
        shared
            .engine
            .unregister_health(&RequesterHealth::name_for(shared.queue()));
        if shared.engine.lifecycle.is_closed() {
            return;
        }
        if let Err(e) = shared.engine.transport.delete_queue(shared.queue()).await {
            tracing::warn!(queue = %shared.queue(), error = %e, "could not delete the reply queue; its x-expires removes it within 10 minutes");
        }
    }
}
