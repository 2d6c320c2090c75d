//! Typed consuming: decode, hand to the handler, settle.
//!
//! This module owns the consumer: it declares the consumer's share of the topology
//! (`acemq.dlx`, `{q}.dlq`, `{q}.parked`, and the rungs of a policy with broker waits;
//! never the source queue), subscribes with a prefetch window and runs up to `concurrency`
//! handlers at once. Each delivery goes through `handle` (admit → decode → guarded run →
//! decide → settle → release): a body that does not decode is parked, a handler panic is a
//! failure like any error. The settlement rules are pure functions in `decide` (a
//! `Decision` per delivery, reasons cut to [`MAX_REASON_BYTES`]); carrying a decision out (copies,
//! acks, the rung-missing fallback) is `settle`'s job; waits and moves that did not land
//! go on outside the handler slot in `moves` ([`MoveStatus`]); what happened is counted
//! once, in `stats` ([`ConsumerStats`]).
//!
//! A decision is made once: while moves are failing and publishing is impossible
//! (connection down, recovering or blocked), the run loop takes no new delivery (it
//! says why in [`MoveStatus::waiting_for_publish`]) instead of running handlers whose
//! outcome cannot be carried out.

mod audit;
mod decide;
mod group;
mod handle;
pub(crate) mod handler;
mod message;
mod moves;
mod options;
pub(crate) mod resubscribe;
pub(crate) mod rule;
mod settle;
mod stats;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use decide::{DEFAULT_RETRY_DELAY_WITHOUT_POLICY, MAX_REASON_BYTES};
pub(crate) use decide::{Decision, retried_under};
pub(crate) use group::StartMember;
pub use group::{CONSUMER_GROUP_MEMBERS, ConsumerGroup, GroupDepth, MemberStats};
pub use handler::{Handler, HandlerError};
pub use message::Message;
pub use moves::{MoveStatus, SET_ASIDE_PAUSE};
pub use options::{
    ConsumerOptions, DEFAULT_BROKER_CHECK, DEFAULT_IN_PROGRESS_DELAY, DEFAULT_PREFETCH,
    DEFAULT_READY_STALL_AFTER,
};
pub use stats::{ConsumerStats, DEFAULT_STALL_AFTER};

use crate::codec::Decoder;
use crate::engine::Engine;
use crate::error::Error;
use crate::lifecycle::ConsumerControl;
use crate::topology::Topology;
use crate::transport::{ConsumeSpec, Subscription, Transport, TransportError};
pub(crate) use decide::{DeadLetterKind, Facts, Final, InPlace, Outcome, bounded};
pub(crate) use handle::{Ctx, handle};
use moves::{MoveState, publishing_impossible};
use resubscribe::resubscribe;
use settle::AckRun;
pub(crate) use settle::Settler;
pub(crate) use stats::Stats;

/// A running consumer. Consumption goes on until [`Consumer::close`] or the connection
/// closes; dropping the handle does not stop it.
#[derive(Debug)]
pub struct Consumer {
    queue: Arc<str>,
    stats: Arc<Stats>,
    in_flight: Arc<AtomicUsize>,
    moves: Arc<MoveState>,
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
    /// Deliveries being handled right now: running handlers, and deliveries waiting in
    /// the consumer (a retry or in-progress wait, a move tried again), which hold no
    /// handler slot.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
    /// What deliveries outside their handlers are doing: waiting, moves failing, held
    /// because their copy can never be sent, and whether the consumer stopped taking
    /// deliveries because publishing is impossible.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use acemq::consume::{ConsumerOptions, Message};
    /// let mq = acemq::Connection::connect("memory://doc-moves").await?;
    /// mq.declare(&acemq::topology::Topology::define().queue("q").build()?).await?;
    /// let c = mq.consume("q", ConsumerOptions::default(), |_: Message<String>| async { Ok(()) }).await?;
    /// assert_eq!(c.moves().moves_failing, 0);
    /// assert!(c.moves().waiting_for_publish.is_none());
    /// # Ok(()) }
    /// ```
    pub fn moves(&self) -> MoveStatus {
        self.moves.snapshot()
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

/// Starts a consumer of `queue` on `engine` (what [`crate::Connection::consume_with`]
/// does): refuses bad options and a closed connection, declares the consumer's topology,
/// subscribes, and spawns the run loop.
pub(crate) async fn start<T, D, H>(
    engine: &Arc<Engine>,
    queue: &str,
    decoder: D,
    options: ConsumerOptions,
    handler: H,
) -> Result<Consumer, Error>
where
    T: Send + 'static,
    D: Decoder<T>,
    H: Handler<T>,
{
    let rule = options.rules();
    let topology = Topology::for_consumer(queue, options.retry_policy());
    start_kind(engine, queue, decoder, options, rule, &topology, handler).await
}

/// [`start`] for a consumer kind with a rule of its own (`consume::rule`) and its own
/// share of the topology (what it declares before subscribing; never the source queue).
pub(crate) async fn start_kind<T, D, H, R>(
    engine: &Arc<Engine>,
    queue: &str,
    decoder: D,
    options: ConsumerOptions,
    rule: R,
    topology: &Topology,
    handler: H,
) -> Result<Consumer, Error>
where
    T: Send + 'static,
    D: Decoder<T>,
    H: Handler<T>,
    R: rule::Rule,
{
    if engine.lifecycle.is_closed() {
        return Err(Error::Closed);
    }
    if options.prefetch_window() == 0 {
        return Err(Error::InvalidArgument("prefetch must be at least 1".into()));
    }
    if options.concurrency == 0 {
        return Err(Error::InvalidArgument(
            "concurrency must be at least 1".into(),
        ));
    }
    engine.declare_consumer_topology(queue, topology).await?;
    // One tag for the consumer's life, kept across re-subscriptions (recoveries).
    let spec = ConsumeSpec {
        queue: queue.to_owned(),
        prefetch: options.prefetch_window(),
        consumer_tag: consumer_tag(queue),
        exclusive: false,
        arguments: Default::default(),
    };
    let subscription = engine.transport.consume(spec.clone()).await?;
    let queue: Arc<str> = Arc::from(queue);
    let stats = Arc::new(options.stats());
    let in_flight = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let closing = CancellationToken::new();
    let ctx = Arc::new(Ctx {
        settler: Settler::new(
            engine.clone(),
            queue.clone(),
            stats.clone(),
            closing.clone(),
            in_flight.clone(),
        ),
        decoder: Arc::new(decoder),
        handler: Arc::new(handler),
        rule,
        idempotency: options.idempotency.clone(),
        in_flight: in_flight.clone(),
    });
    let moves = ctx.settler.moves.clone();
    let (done_tx, done) = watch::channel(false);
    let control = Arc::new(ConsumerControl::new(
        queue.clone(),
        stop.clone(),
        closing,
        done,
        stats.clone(),
    ));
    control.subscribed(Some(subscription.probe()));
    engine.lifecycle.register(control.clone());
    let watched = control.clone();
    let (resubscribe_tx, resubscribe_rx) = watch::channel(0u64);
    if let Some(every) = options.broker_check {
        tokio::spawn(audit::run(
            engine.clone(),
            control.clone(),
            every,
            options.ready_stall_after,
            resubscribe_tx,
            stop.clone(),
        ));
    }
    let source = Source {
        transport: engine.transport.clone(),
        spec,
        control: control.clone(),
        detached: resubscribe_rx,
    };
    tokio::spawn(async move {
        run(subscription, source, ctx, options.concurrency, stop).await;
        // Stopped by its user: no longer a consumer that health should call stopped.
        watched.ended(None);
        done_tx.send_replace(true);
    });
    Ok(Consumer {
        queue,
        stats,
        in_flight,
        moves,
        control,
    })
}

/// The consumer tag: `acemq-{queue}-{8 hex}` (cut to AMQP's 255 bytes), stable for the
/// consumer's life so a recovered subscription is recognisably the same consumer.
fn consumer_tag(queue: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let mut head: String = format!("acemq-{queue}");
    while head.len() > 240 {
        head.pop();
    }
    format!("{head}-{}", &suffix[..8])
}

/// Where a consumer's subscription comes from, to subscribe again after the broker ended it.
struct Source {
    transport: Arc<dyn Transport>,
    spec: ConsumeSpec,
    control: Arc<ConsumerControl>,
    /// Bumped by the broker-side check when the broker lists no consumer although the
    /// subscription is open (see `audit`).
    detached: watch::Receiver<u64>,
}

impl Source {
    /// Resolves when the broker-side check asks for a new subscription.
    async fn detached(&mut self) {
        if self.detached.changed().await.is_err() {
            // No check running: never.
            std::future::pending::<()>().await;
        }
    }
}

async fn run<T, H, R>(
    mut subscription: Box<dyn Subscription>,
    mut source: Source,
    ctx: Arc<Ctx<T, H, R>>,
    concurrency: usize,
    stop: CancellationToken,
) where
    T: Send + 'static,
    H: Handler<T>,
    R: rule::Rule,
{
    let slots = Arc::new(Semaphore::new(concurrency));
    let handlers = TaskTracker::new();
    // One handler at a time: acks of consecutive deliveries are sent as one `multiple` ack
    // while more deliveries are already buffered, at most half the prefetch window at once.
    let mut acks = AckRun::default();
    let ack_run_limit = usize::from(source.spec.prefetch / 2).max(1);
    loop {
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        if !publishing_possible(&ctx.settler, &source, &stop, &mut acks).await {
            break;
        }
        let buffered = if acks.len() == 0 {
            None
        } else {
            subscription.try_next()
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
                    () = source.detached() => Some(Err(TransportError::Closed {
                        detail: "the broker lists no consumer of the queue although the subscription is open (a consumer cancel that never arrived)".into(),
                    })),
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
                let handled = handle(ctx.clone(), delivery, Some(permit), Some(&mut acks));
                tokio::pin!(handled);
                tokio::select! {
                    biased;
                    _ = &mut handled => {}
                    _ = stop.cancelled() => {
                        let _ = subscription.cancel().await;
                        handled.await;
                        break;
                    }
                }
            }
            Some(Ok(delivery)) => {
                // Boxed: the task then holds a pointer, and spawning and finishing it copy
                // a few bytes instead of the whole delivery state machine (several KB, each
                // copy a measurable share of a fast round trip).
                handlers.spawn(Box::pin(handle(ctx.clone(), delivery, Some(permit), None)));
            }
            None if subscription.cancelled_by_us() => break,
            ended_by => {
                // The broker ended the subscription (its connection was lost, the queue was
                // deleted, its node went down) or it failed: get it back.
                let reason = match ended_by {
                    Some(Err(e)) => format!("the subscription failed: {e}"),
                    _ => "the broker ended the subscription (queue deleted, or its node or connection went down)".to_owned(),
                };
                tracing::warn!(queue = %ctx.settler.queue, %reason, "subscribing again");
                // Acks held for coalescing can only go on the old channel: sent now, or
                // dropped (counted) if it is gone; those messages come back (at most a
                // prefetch window of duplicates).
                ctx.settler.flush(&mut acks).await;
                handlers.close();
                handlers.wait().await;
                handlers.reopen();
                let _ = subscription.close().await;
                source.control.subscribed(None);
                source.control.ended(Some(reason));
                match resubscribe(&source.transport, &source.spec, &stop, |why| {
                    source.control.ended(Some(why))
                })
                .await
                {
                    Some(again) => {
                        source.control.subscribed(Some(again.probe()));
                        subscription = again;
                        source.control.ended(None);
                        source.control.audited(None);
                        // A request made before this subscription is answered by it.
                        source.detached.mark_unchanged();
                    }
                    // Stopped (closed by the user) while waiting.
                    None => break,
                }
            }
        }
    }
    // No new deliveries; held acks are sent, running handlers finish and settle on the
    // still-open channel; then the channel closes and anything buffered goes back.
    ctx.settler.flush(&mut acks).await;
    let _ = subscription.cancel().await;
    handlers.close();
    handlers.wait().await;
    // Waiting deliveries: closing cut their waits short and handed them back; a stop
    // without closing (the connection's drain) lets them finish.
    ctx.settler.waits.close();
    ctx.settler.waits.wait().await;
    let _ = subscription.close().await;
}

/// How often the run loop looks again while it waits for publishing to be possible.
const PUBLISH_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Before taking the next delivery: while moves are failing and publishing is impossible,
/// wait (held acks sent first), saying why in the consumer's [`MoveStatus`]. `false` when
/// the consumer was stopped meanwhile.
async fn publishing_possible(
    settler: &Settler,
    source: &Source,
    stop: &CancellationToken,
    acks: &mut AckRun,
) -> bool {
    let failing = || settler.moves.moves_failing.load(Ordering::SeqCst) > 0;
    let mut announced = false;
    loop {
        let why = if failing() {
            publishing_impossible(&*source.transport)
        } else {
            None
        };
        let Some(why) = why else {
            if announced {
                tracing::info!(queue = %settler.queue, "publishing is possible again; taking deliveries");
                settler.moves.set_waiting_for_publish(None);
            }
            return true;
        };
        if !announced {
            announced = true;
            settler.flush(acks).await;
            tracing::warn!(queue = %settler.queue, reason = %why, "moves are failing and publishing is impossible; taking no new deliveries until it is");
        }
        settler.moves.set_waiting_for_publish(Some(why));
        tokio::select! {
            biased;
            _ = stop.cancelled() => {
                settler.moves.set_waiting_for_publish(None);
                return false;
            }
            _ = tokio::time::sleep(PUBLISH_POLL) => {}
        }
    }
}
