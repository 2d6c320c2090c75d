//! Typed consuming: decode, hand to the handler, settle.
//!
//! This module owns the consumer's run loop: it declares the consumer's share of the
//! topology (`acemq.dlx`, `{q}.dlq`, `{q}.parked`, and the rungs of a policy with broker
//! waits; never the source queue), subscribes with a prefetch window, runs up to
//! `concurrency` handlers at once, decodes each body with the consumer's codec, runs the
//! handler (a panic is a failure like any error), and hands the result to [`settle`],
//! which owns every settlement rule.

mod handler;
mod message;
pub mod settle;
mod stats;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use handler::HandlerError;
pub use message::Message;
pub use stats::ConsumerStats;

use crate::codec::Decoder;
use crate::engine::Engine;
use crate::envelope::{Envelope, application_headers};
use crate::error::Error;
use crate::idempotency::{ClaimOutcome, IdempotencyStore};
use crate::intercept::{ConsumeContext, HandleResult};
use crate::lifecycle::{ConsumerControl, Gate, Lifecycle};
use crate::observe::trace::{self, TraceContext};
use crate::retry::RetryPolicy;
use crate::transport::{ConsumeSpec, Delivery, Subscription};
use settle::{AckRun, ConsumerMetrics, Observed, Outcome, Settler, decide};
use stats::Stats;
use tracing::Instrument;

/// How long a delivery whose id is claimed elsewhere waits before it is republished.
pub const DEFAULT_IN_PROGRESS_DELAY: Duration = Duration::from_secs(5);

/// The default prefetch window.
pub const DEFAULT_PREFETCH: u16 = 50;

/// How a consumer behaves.
///
/// ```
/// use acemq::consume::ConsumerOptions;
/// use acemq::retry::RetryPolicy;
/// use std::time::{Duration, Instant};
/// let o = ConsumerOptions::default()
///     .prefetch(20)
///     .concurrency(4)
///     .with_retry(RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(60)).unwrap());
/// assert_eq!(o.get_prefetch(), 20);
/// ```
#[derive(Clone)]
pub struct ConsumerOptions {
    prefetch: u16,
    concurrency: usize,
    retry: Option<RetryPolicy>,
    retry_delay_without_policy: Duration,
    idempotency: Option<Arc<dyn IdempotencyStore>>,
    in_progress_delay: Duration,
}

impl std::fmt::Debug for ConsumerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerOptions")
            .field("prefetch", &self.prefetch)
            .field("concurrency", &self.concurrency)
            .field("retry", &self.retry)
            .field(
                "retry_delay_without_policy",
                &self.retry_delay_without_policy,
            )
            .field("idempotent", &self.idempotency.is_some())
            .field("in_progress_delay", &self.in_progress_delay)
            .finish()
    }
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            prefetch: DEFAULT_PREFETCH,
            concurrency: 1,
            retry: None,
            retry_delay_without_policy: settle::DEFAULT_RETRY_DELAY_WITHOUT_POLICY,
            idempotency: None,
            in_progress_delay: DEFAULT_IN_PROGRESS_DELAY,
        }
    }
}

impl ConsumerOptions {
    /// The window of unacked deliveries (default 50, at least 1).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n;
        self
    }
    /// Handlers running at once (default 1; real parallel tasks when more).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }
    /// The retry policy. Without one, a failing message is retried every 5 s, forever.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }
    /// The delay between attempts when there is no policy (default 5 s).
    pub fn retry_delay_without_policy(mut self, delay: Duration) -> Self {
        self.retry_delay_without_policy = delay;
        self
    }
    /// Deduplicates by envelope id through `store`: the handler runs only after a claim;
    /// a confirmed id is acked without running it; an id another consumer is still
    /// working on waits [`ConsumerOptions::with_in_progress_delay`] and is republished to
    /// the queue with its attempt unchanged. See [`crate::idempotency`].
    pub fn idempotent(mut self, store: impl IdempotencyStore) -> Self {
        self.idempotency = Some(Arc::new(store));
        self
    }
    /// How long a delivery whose id is claimed elsewhere waits before it is republished
    /// (default 5 s; keep it well under the store's claim timeout).
    pub fn with_in_progress_delay(mut self, delay: Duration) -> Self {
        self.in_progress_delay = delay;
        self
    }
    /// The configured prefetch.
    pub fn get_prefetch(&self) -> u16 {
        self.prefetch
    }
    /// The configured policy.
    pub fn get_retry(&self) -> Option<&RetryPolicy> {
        self.retry.as_ref()
    }
}

/// A running consumer. Consumption goes on until [`Consumer::close`] or the connection
/// closes; dropping the handle does not stop it.
#[derive(Debug)]
pub struct Consumer {
    queue: Arc<str>,
    stats: Arc<Stats>,
    in_flight: Arc<AtomicUsize>,
    control: Arc<ConsumerControl>,
}

impl Consumer {
    /// The consumed queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }
    /// Outcome counts so far.
    pub fn stats(&self) -> ConsumerStats {
        self.stats.snapshot()
    }
    /// Handlers running right now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
    /// Stops taking deliveries, lets running handlers finish (a handler sitting out an
    /// in-consumer retry wait is cut short and its message requeued, attempt unchanged),
    /// then closes the consumer's channel: anything delivered but not handled goes back to
    /// the queue.
    pub async fn close(&self) {
        self.control.stop.cancel();
        self.control.closing.cancel();
        let mut done = self.control.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}

/// Everything a consumer's tasks share.
struct Ctx<T, F> {
    settler: Settler,
    decoder: Arc<dyn Decoder<T>>,
    handler: F,
    policy: Option<RetryPolicy>,
    no_policy_delay: Duration,
    idempotency: Option<Arc<dyn IdempotencyStore>>,
    in_progress_delay: Duration,
    in_flight: Arc<AtomicUsize>,
}

impl<T, F> Ctx<T, F> {
    fn lifecycle(&self) -> &Lifecycle {
        &self.settler.engine.lifecycle
    }
}

/// Starts a consumer of `queue` on `engine` (what [`crate::Connection::consume_with`]
/// does): refuses bad options and a closed connection, declares the consumer's topology,
/// subscribes, and spawns the run loop.
pub(crate) async fn start<T, D, F, Fut>(
    engine: &Arc<Engine>,
    queue: &str,
    decoder: D,
    options: ConsumerOptions,
    handler: F,
) -> Result<Consumer, Error>
where
    T: Send + 'static,
    D: Decoder<T>,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    if engine.lifecycle.is_closed() {
        return Err(Error::Closed);
    }
    if options.prefetch == 0 {
        return Err(Error::InvalidArgument("prefetch must be at least 1".into()));
    }
    if options.concurrency == 0 {
        return Err(Error::InvalidArgument(
            "concurrency must be at least 1".into(),
        ));
    }
    engine
        .declare_for_consumer(queue, options.retry.as_ref())
        .await?;
    let subscription = engine
        .transport
        .consume(ConsumeSpec {
            queue: queue.to_owned(),
            prefetch: options.prefetch,
            consumer_tag: String::new(),
            exclusive: false,
        })
        .await?;
    let queue: Arc<str> = Arc::from(queue);
    let stats = Arc::new(Stats::default());
    let in_flight = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let closing = CancellationToken::new();
    let ctx = Arc::new(Ctx {
        settler: Settler {
            engine: engine.clone(),
            queue: queue.clone(),
            stats: stats.clone(),
            closing: closing.clone(),
            metrics: ConsumerMetrics::new(queue.clone()),
        },
        decoder: Arc::new(decoder),
        handler,
        policy: options.retry,
        no_policy_delay: options.retry_delay_without_policy,
        idempotency: options.idempotency,
        in_progress_delay: options.in_progress_delay,
        in_flight: in_flight.clone(),
    });
    let (done_tx, done) = watch::channel(false);
    let control = Arc::new(ConsumerControl {
        queue: queue.clone(),
        stop: stop.clone(),
        closing,
        done,
        ended: std::sync::Mutex::new(None),
    });
    engine.lifecycle.register(control.clone());
    let watched = control.clone();
    tokio::spawn(async move {
        let ended = run(
            subscription,
            ctx,
            options.concurrency,
            options.prefetch,
            stop,
        )
        .await;
        watched.ended(ended);
        done_tx.send_replace(true);
    });
    Ok(Consumer {
        queue,
        stats,
        in_flight,
        control,
    })
}

async fn run<T, F, Fut>(
    mut subscription: Box<dyn Subscription>,
    ctx: Arc<Ctx<T, F>>,
    concurrency: usize,
    prefetch: u16,
    stop: CancellationToken,
) -> Option<String>
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let mut ended = None;
    let slots = Arc::new(Semaphore::new(concurrency));
    let handlers = TaskTracker::new();
    // One handler at a time: acks of consecutive deliveries are sent as one `multiple` ack
    // while more deliveries are already buffered, at most half the prefetch window at once.
    let mut acks = AckRun::default();
    let ack_run_limit = usize::from(prefetch / 2).max(1);
    loop {
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let buffered = if acks.len() == 0 {
            None
        } else {
            subscription.next().now_or_never()
        };
        let next = match buffered {
            Some(d) => d,
            None => {
                // Nothing more at hand: send the held acks before waiting.
                ctx.settler.flush(&mut acks).await;
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    d = subscription.next() => d,
                }
            }
        };
        if acks.len() >= ack_run_limit {
            ctx.settler.flush(&mut acks).await;
        }
        match next {
            Some(Ok(delivery)) if concurrency == 1 => {
                // One handler at a time: run it here instead of in a task of its own (a
                // spawn per delivery costs more than a fast handler); the loop would wait
                // for its slot before the next delivery anyway. A close still cancels the
                // subscription at once and lets this handler finish.
                let handled = handle(ctx.clone(), delivery, permit, Some(&mut acks));
                tokio::pin!(handled);
                tokio::select! {
                    biased;
                    () = &mut handled => {}
                    _ = stop.cancelled() => {
                        let _ = subscription.cancel().await;
                        handled.await;
                        break;
                    }
                }
            }
            Some(Ok(delivery)) => {
                handlers.spawn(handle(ctx.clone(), delivery, permit, None));
            }
            Some(Err(e)) => {
                tracing::error!(queue = %ctx.settler.queue, error = %e, "consumer subscription failed");
                ended = Some(format!("the subscription failed: {e}"));
                break;
            }
            None => {
                if !subscription.cancelled_by_us() {
                    tracing::warn!(queue = %ctx.settler.queue, "the broker ended the subscription (queue deleted or node down)");
                    ended = Some(
                        "the broker ended the subscription (queue deleted, or its node or connection went down)".into(),
                    );
                }
                break;
            }
        }
    }
    // No new deliveries; held acks are sent, running handlers finish and settle on the
    // still-open channel; then the channel closes and anything buffered goes back.
    ctx.settler.flush(&mut acks).await;
    let _ = subscription.cancel().await;
    handlers.close();
    handlers.wait().await;
    let _ = subscription.close().await;
    ended
}

async fn handle<T, F, Fut>(
    ctx: Arc<Ctx<T, F>>,
    d: Delivery,
    _slot: OwnedSemaphorePermit,
    mut acks: Option<&mut AckRun>,
) where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let envelope = Arc::new(Envelope::read(&d.properties, &d.routing_key));
    let content_type = d.properties.content_type.clone();
    let decoded = ctx.decoder.decode(content_type.as_deref(), &d.body);
    let gate = ctx.lifecycle().gate(&ctx.settler.closing);
    tokio::pin!(gate);
    let gate = match (&mut gate).now_or_never() {
        Some(g) => g,
        None => {
            // Paused: held acks must not wait for the resume.
            if let Some(acks) = acks.as_deref_mut() {
                ctx.settler.flush(acks).await;
            }
            gate.await
        }
    };
    if gate == Gate::Closing {
        if let Some(acks) = acks.as_deref_mut() {
            ctx.settler.flush(acks).await;
        }
        ctx.settler.hand_back(&d).await;
        return;
    }
    ctx.lifecycle().handler_started();
    ctx.in_flight.fetch_add(1, Ordering::SeqCst);
    let (trace_ctx, parent) = TraceContext::for_process(&d.properties.headers);
    let seen = Observed {
        started: Instant::now(),
        span: trace::process_span(
            &ctx.settler.queue,
            envelope.id(),
            envelope.message_type(),
            u32::try_from(envelope.attempt()).unwrap_or(1),
            &trace_ctx,
            parent.as_ref(),
        ),
        series: ctx.settler.metrics.for_type(envelope.message_type()),
    };
    seen.series.in_flight(1);
    let outcome = match decoded {
        Err(e) => Outcome::Undecodable(decode_reason(e)),
        Ok(payload) => {
            let headers = Arc::new(application_headers(&d.properties.headers));
            let chain = ctx.settler.engine.interceptors.consume_chain();
            let cx = ConsumeContext {
                queue: &ctx.settler.queue,
                envelope: &envelope,
                headers: &headers,
            };
            let refused = chain.iter().find_map(|i| i.before_handle(&cx).err());
            let claim = match (&refused, &ctx.idempotency) {
                (None, Some(store)) => Some(store.try_claim(envelope.id()).await),
                _ => None,
            };
            let outcome = match (refused, claim) {
                (Some(e), _) => Outcome::Failed(e),
                (None, Some(Ok(ClaimOutcome::Duplicate))) => Outcome::Duplicate,
                (None, Some(Ok(ClaimOutcome::InProgress))) => Outcome::InProgress,
                (None, Some(Err(e))) => Outcome::Failed(HandlerError::retry(format!(
                    "the idempotency store could not be asked: {e}"
                ))),
                (None, Some(Ok(_))) | (None, None) => {
                    let message = Message {
                        payload,
                        envelope: envelope.clone(),
                        headers: headers.clone(),

                        queue: ctx.settler.queue.clone(),
                        exchange: d.exchange.clone(),
                        routing_key: d.routing_key.clone(),
                        redelivered: d.redelivered,
                        content_type,
                        cancellation: ctx.settler.closing.child_token(),
                    };
                    let outcome = trace::scope(trace_ctx, run_handler(&ctx.handler, message))
                        .instrument(seen.span.clone())
                        .await;
                    if let Some(store) = &ctx.idempotency {
                        record_claim(&**store, envelope.id(), &outcome).await;
                    }
                    outcome
                }
            };
            let result = match &outcome {
                Outcome::Failed(e) => HandleResult::Failed(e),
                _ => HandleResult::Succeeded,
            };
            for i in chain.iter().rev() {
                i.after_handle(&cx, &result);
            }
            outcome
        }
    };
    let decision = decide(
        &outcome,
        &envelope,
        ctx.policy.as_ref(),
        ctx.no_policy_delay,
        ctx.in_progress_delay,
    );
    match acks {
        Some(acks) => {
            ctx.settler
                .settle_in_run(d, &envelope, decision, &seen, acks)
                .await
        }
        None => ctx.settler.settle(d, &envelope, decision, &seen).await,
    }
    seen.series.in_flight(-1);
    ctx.lifecycle().handler_finished();
    ctx.in_flight.fetch_sub(1, Ordering::SeqCst);
}

/// Confirms the claim after success; releases it after a failure (then the policy decides).
/// A confirm that fails leaves the claim to expire: the work is done, so the message is
/// still acked, and a redelivery after the lease would run the handler again.
async fn record_claim(store: &dyn IdempotencyStore, id: &str, outcome: &Outcome) {
    let result = match outcome {
        Outcome::Handled => store.confirm(id).await,
        _ => store.release(id).await,
    };
    if let Err(e) = result {
        tracing::warn!(message_id = id, error = %e, "idempotency store update failed; the claim will expire on its own");
    }
}

/// Runs the handler; a panic is a failure like any error, with the panic message as reason.
async fn run_handler<T, F, Fut>(handler: &F, message: Message<T>) -> Outcome
where
    F: Fn(Message<T>) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    match AssertUnwindSafe(handler(message)).catch_unwind().await {
        Ok(Ok(())) => Outcome::Handled,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(panic) => Outcome::Failed(HandlerError::retry(format!(
            "the handler panicked: {}",
            panic_message(&*panic)
        ))),
    }
}

fn decode_reason(e: Error) -> String {
    match e {
        Error::Decode { reason } => reason,
        other => other.to_string(),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".into())
}
