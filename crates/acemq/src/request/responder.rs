//! [`Responder`]: a consumer whose handler's answer is published back to the requester.
//!
//! The responder is a consume handler wrapper: [`start`] hands the consume machinery a
//! handler that reads the reply address, runs the application's handler, and publishes
//! its answer. A failure of the application's handler that the consumer's retry policy
//! would retry is returned as it is; a final one (see [`is_final`]) is answered with a
//! fault reply (`acemq-error`, empty body) before the consumer dead-letters or parks the
//! request. A reply that could not be published is an ordinary, retried failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;
use futures::future::{self, Either};
use tracing::Instrument;

use super::simple_type_name;
use crate::codec::RawBytes;
use crate::codec::{Decoder, Encoder};
use crate::consume::handler::Kind;
use crate::consume::{
    Consumer, ConsumerOptions, ConsumerStats, Handler, HandlerError, Message, bounded,
    retried_under,
};
use crate::engine::Engine;
use crate::envelope::REPLY_ERROR;
use crate::error::Error;
use crate::observe::metrics::PublishOutcome;
use crate::observe::trace::{self, TraceContext};
use crate::publish::{SendOptions, prepare};
use crate::retry::RetryPolicy;
use crate::transport::{BoxFuture, Confirmation, Outbound, TransportError};

/// Counts of a responder's requests so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResponderStats {
    /// Replies published (counted before the publish, given back if it fails).
    pub answered: u64,
    /// Requests with no reply address: acked, handler not run, no reply.
    pub unanswerable: u64,
    /// Replies the broker could not route (the reply queue is gone: its requester closed
    /// or expired). The request is acked: no requester is left to answer.
    pub undeliverable: u64,
    /// Final handler failures answered with a fault reply (`acemq-error`); each request
    /// went on to `.dlq` (or `.parked`).
    pub faulted: u64,
}

#[derive(Debug, Default)]
struct Counts {
    answered: AtomicU64,
    unanswerable: AtomicU64,
    undeliverable: AtomicU64,
    faulted: AtomicU64,
}

/// A running responder (see the [module docs](crate::request)). Like a consumer, it runs
/// until [`Responder::close`] or the connection closes; dropping it does not stop it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// use acemq::consume::{ConsumerOptions, Message};
/// let mq = acemq::Connection::connect("memory://doc-responder").await?;
/// mq.transport().declare_queue(&acemq::topology::QueueDecl::classic("sums")).await?;
/// let r = mq.respond("sums", ConsumerOptions::default(), |m: Message<Vec<i64>>| async move {
///     Ok(m.payload().iter().sum::<i64>())
/// }).await?;
/// assert_eq!(r.stats().answered, 0);
/// r.close().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Responder {
    consumer: Consumer,
    counts: Arc<Counts>,
}

impl Responder {
    /// Counts so far.
    pub fn stats(&self) -> ResponderStats {
        ResponderStats {
            answered: self.counts.answered.load(Ordering::Relaxed),
            unanswerable: self.counts.unanswerable.load(Ordering::Relaxed),
            undeliverable: self.counts.undeliverable.load(Ordering::Relaxed),
            faulted: self.counts.faulted.load(Ordering::Relaxed),
        }
    }

    /// The consumer underneath (its outcome counts, in-flight and move status).
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    /// The consumer's outcome counts (acked, retried, dead-lettered, ...).
    pub fn consumer_stats(&self) -> ConsumerStats {
        self.consumer.stats()
    }

    /// The queue it answers.
    pub fn queue(&self) -> &str {
        self.consumer.queue()
    }

    /// Stops taking requests and lets running handlers finish ([`Consumer::close`]).
    pub async fn close(&self) {
        self.consumer.close().await;
    }
}

/// Starts a responder on `queue` whose requests are decoded and replies encoded with
/// `codec` (what [`crate::Connection::respond_with`] does).
pub(crate) async fn start<Req, Resp, C, H>(
    engine: &Arc<Engine>,
    queue: &str,
    codec: C,
    options: ConsumerOptions,
    handler: H,
) -> Result<Responder, Error>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    C: Decoder<Req> + Encoder<Resp>,
    H: Handler<Req, Resp>,
{
    let counts = Arc::new(Counts::default());
    let codec = Arc::new(codec);
    let answering = Arc::new(Answering {
        engine: engine.clone(),
        counts: counts.clone(),
        codec: codec.clone(),
        handler,
        policy: options.retry_policy().cloned(),
    });
    let wrapper = move |m: Message<Req>| answer(answering.clone(), m);
    let consumer = crate::consume::start(engine, queue, codec, options, wrapper).await?;
    Ok(Responder { consumer, counts })
}

/// Whether a handler failure is this request's last: anything but an ordinary failure
/// (fatal, park, dead-letter), or an ordinary one the policy would not retry. Without a
/// policy the first failure is final: a plain consumer would retry forever, long after the
/// requester gave up. A release is never final (another instance may answer).
fn is_final(e: &HandlerError, policy: Option<&RetryPolicy>, retried: bool) -> bool {
    match e.kind {
        Kind::Release => false,
        Kind::Retry => policy.is_none() || !retried,
        Kind::Fatal | Kind::Park | Kind::DeadLetter => true,
    }
}

/// What every request of one responder shares.
struct Answering<C, H> {
    engine: Arc<Engine>,
    counts: Arc<Counts>,
    codec: Arc<C>,
    handler: H,
    policy: Option<RetryPolicy>,
}

/// One request: reply address, handler, reply (or fault reply).
///
/// A plain function: the application's handler is called now (inside the consumer's
/// guarded run, which catches a panic of the call itself), so the future returned holds
/// the handler's future and the request's envelope, not the message a second time.
fn answer<Req, Resp, C, H>(
    answering: Arc<Answering<C, H>>,
    m: Message<Req>,
) -> impl Future<Output = Result<(), HandlerError>> + Send + 'static
where
    Resp: Send + 'static,
    C: Encoder<Resp>,
    H: Handler<Req, Resp>,
{
    // The request's envelope, shared: its reply address, id and correlation are read from
    // it after the handler took the message, without a copy of each.
    let asked = m.envelope.clone();
    // Header first, property second: Envelope::read does it in that order.
    if asked.reply_to().is_none() {
        answering
            .counts
            .unanswerable
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(queue = %m.queue(), id = %asked.id(), "a request without a reply address (neither acemq-reply-to nor reply_to): acked, not handled, no reply");
        return Either::Left(future::ready(Ok(())));
    }
    let retried = retried_under(answering.policy.as_ref(), &asked);
    let call = answering.handler.call(m);
    Either::Right(async move {
        let a = &*answering;
        let reply_to = asked.reply_to().unwrap_or_default();
        let request = Request {
            reply_to,
            correlation_id: asked.correlation_id(),
            request_id: asked.id(),
        };
        let sending = match call.await {
            Ok(answer) => reply(a, &request, answer),
            Err(e) if is_final(&e, a.policy.as_ref(), retried) => {
                // Boxed: a failure's path need not make every request's future larger.
                let no_policy = a.policy.is_none();
                return Box::pin(fault(&a.engine, &a.counts, request, e, no_policy)).await;
            }
            Err(e) => return Err(e),
        };
        let sent = match sending {
            Ok(publishing) => publishing.await,
            Err(e) => Err(e),
        };
        match sent {
            Ok(Confirmation::Routed) => Ok(()),
            Ok(Confirmation::Unroutable { reply_text, .. }) => {
                a.counts.answered.fetch_sub(1, Ordering::Relaxed);
                a.counts.undeliverable.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%reply_to, request = %request.request_id, %reply_text, "the reply queue is gone (its requester closed or expired); request acked, reply dropped");
                Ok(())
            }
            Ok(Confirmation::Nacked) => {
                a.counts.answered.fetch_sub(1, Ordering::Relaxed);
                Err(HandlerError::retry(format!(
                    "the broker nacked the reply to {reply_to}"
                )))
            }
            Err(e) => {
                a.counts.answered.fetch_sub(1, Ordering::Relaxed);
                Err(HandlerError::retry(format!(
                    "the reply to {reply_to} could not be published: {e}"
                )))
            }
        }
    })
}

/// Builds the reply to `request` and starts its publish, counted as answered before the
/// publish (a requester may see the reply before it returns; given back when it fails).
/// The publish is boxed, so a request's future does not carry the reply's.
fn reply<'a, Resp, C: Encoder<Resp>, H>(
    a: &'a Answering<C, H>,
    request: &Request<'_>,
    answer: Resp,
) -> Result<BoxFuture<'a, Result<Confirmation, ReplyError>>, ReplyError> {
    a.counts.answered.fetch_add(1, Ordering::Relaxed);
    let built = build_reply(
        &a.engine,
        &*a.codec,
        request.reply_to,
        request.correlation_id.to_owned(),
        request.request_id,
        &answer,
    );
    match built {
        Ok(reply) => Ok(Box::pin(publish_reply(&a.engine, reply))),
        Err(e) => Err(e.into()),
    }
}

/// The request a reply answers.
struct Request<'a> {
    reply_to: &'a str,
    correlation_id: &'a str,
    request_id: &'a str,
}

/// Answers a final handler failure with a fault reply, then hands the failure back for the
/// consumer to dead-letter (or park) the request. Without a policy an ordinary failure
/// becomes a dead-letter request, so the consumer does not retry it forever. A fault reply
/// that could not be published is an ordinary failure: the request comes back.
async fn fault(
    engine: &Engine,
    counts: &Counts,
    request: Request<'_>,
    e: HandlerError,
    no_policy: bool,
) -> Result<(), HandlerError> {
    let reason = bounded(e.reason().to_owned());
    let reply_to = request.reply_to;
    let options = SendOptions::new()
        .correlation_id(request.correlation_id)
        .causation_id(request.request_id)
        .message_type("Fault")
        .persistent(false)
        .header(REPLY_ERROR, reason.as_str());
    let sent = match prepare(&RawBytes, "", reply_to, &[][..], options, &engine.origin) {
        Ok(out) => {
            let (ctx, parent) = TraceContext::for_publish();
            let mut out = out;
            ctx.inject(&mut out.properties.headers);
            let id = out.properties.message_id.as_deref().unwrap_or_default();
            let span = trace::publish_span("", reply_to, id, "Fault", &ctx, parent.as_ref());
            publish_reply(engine, Reply { out, span }).await
        }
        Err(e) => Err(e.into()),
    };
    match sent {
        Ok(Confirmation::Routed) => {
            counts.faulted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Confirmation::Unroutable { reply_text, .. }) => {
            counts.undeliverable.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%reply_to, request = %request.request_id, %reply_text, "the reply queue is gone; fault reply dropped");
        }
        Ok(Confirmation::Nacked) => {
            return Err(HandlerError::retry(format!(
                "the broker nacked the fault reply to {reply_to}"
            )));
        }
        Err(err) => {
            return Err(HandlerError::retry(format!(
                "the fault reply to {reply_to} could not be published: {err}"
            )));
        }
    }
    if no_policy && e.kind == Kind::Retry {
        return Err(HandlerError::dead_letter(format!(
            "the responder failed (a fault reply was sent): {reason}"
        )));
    }
    Err(e)
}

/// Why a reply was not sent.
#[derive(Debug, thiserror::Error)]
enum ReplyError {
    #[error(transparent)]
    Build(#[from] Error),
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// A reply ready to publish, with its publish span.
struct Reply {
    out: Outbound,
    span: tracing::Span,
}

/// The reply to `reply_to` through the default exchange with the request's correlation and
/// causation = the request's id, encoded with `codec` (its content type on the reply); its
/// `traceparent` a child of the handler's context.
fn build_reply<Resp, C: Encoder<Resp>>(
    engine: &Engine,
    codec: &C,
    reply_to: &str,
    correlation_id: String,
    request_id: &str,
    answer: &Resp,
) -> Result<Reply, Error> {
    let message_type = simple_type_name::<Resp>("Reply");
    let options = SendOptions::new()
        .correlation_id(correlation_id)
        .causation_id(request_id)
        .message_type(message_type)
        .persistent(false);
    let mut out = prepare(codec, "", reply_to, answer, options, &engine.origin)?;
    let (ctx, parent) = TraceContext::for_publish();
    ctx.inject(&mut out.properties.headers);
    let id = out.properties.message_id.as_deref().unwrap_or_default();
    let span = trace::publish_span("", reply_to, id, message_type, &ctx, parent.as_ref());
    Ok(Reply { out, span })
}

/// Publishes a reply mandatory and confirmed, as a publish made on the requester's behalf
/// (never refused by a publishing pause). A plain function: its future holds the reply
/// once, in the engine's move, not once more per layer.
fn publish_reply(
    engine: &Engine,
    reply: Reply,
) -> impl Future<Output = Result<Confirmation, ReplyError>> + Send + '_ {
    let Reply { out, span } = reply;
    let recorded = span.clone();
    engine
        .publish_on_behalf(out)
        .instrument(span)
        .map(move |sent| {
            let outcome = match &sent {
                Ok(Confirmation::Routed) => PublishOutcome::Confirmed,
                Ok(Confirmation::Unroutable { .. }) => PublishOutcome::Unroutable,
                _ => PublishOutcome::Failed,
            };
            trace::record_publish_outcome(&recorded, outcome);
            Ok(sent?)
        })
}
