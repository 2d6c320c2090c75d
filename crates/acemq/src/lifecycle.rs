//! Lifecycle: pausing, draining and closing (`docs/wire.md` §12).
//!
//! This module owns the connection-wide consumer state: the pause gate (a delivery that
//! arrives while consuming is paused waits there unacked and is counted in `held`), the
//! count of handlers running (`in_flight`), draining (stop handing over, wait for running
//! handlers, answer `false` on timeout), and closing (cancel the consumers first, hand held
//! deliveries back at once, cut retry waits short, wait up to [`ABANDON_AFTER`] for running
//! handlers, then close anyway: an abandoned handler's late ack is dropped, never sent).
//!
//! It also keeps what health reads about each consumer (`ConsumerControl`): why it
//! stopped, if it stopped on its own, and its progress (`ConsumerProgress`: last delivery
//! and settlement, deliveries held, stalled or not, its idempotency store's outage).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::transport::SubscriptionProbe;
use crate::util::lock;

/// How long [`Connection::close`](crate::Connection::close) drains before closing (fits Kubernetes' default 30 s
/// grace period; the family's figure).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// How long closing waits for handlers still running before abandoning them.
pub const ABANDON_AFTER: Duration = Duration::from_secs(5);

/// One consumer as the lifecycle sees it.
#[derive(Debug)]
pub(crate) struct ConsumerControl {
    /// The consumed queue.
    pub(crate) queue: Arc<str>,
    /// Why the consumer stopped when nobody asked it to (health reports it).
    pub(crate) ended: Mutex<Option<String>>,
    /// Stops taking deliveries (the run loop cancels its subscription).
    pub(crate) stop: CancellationToken,
    /// Cuts waits short and cancels handler tokens; held deliveries go back.
    pub(crate) closing: CancellationToken,
    /// Set when the consumer's run loop has finished (its channel closed).
    pub(crate) done: watch::Receiver<bool>,
    /// What health reads about its progress (the consumer's stats).
    pub(crate) progress: Arc<dyn ReportsProgress>,
    /// The current subscription's own word on whether it is consuming (set by the run
    /// loop at each subscription): health asks it instead of trusting a flag.
    pub(crate) probe: Mutex<Option<SubscriptionProbe>>,
    /// What the broker-side check last found wrong (a stall, a detached consumer being
    /// subscribed again); `None` when it found nothing.
    pub(crate) audit: Mutex<Option<String>>,
}

/// Something that can say how a consumer is progressing, from local state only.
pub(crate) trait ReportsProgress: Send + Sync + fmt::Debug {
    /// A snapshot, now.
    fn progress(&self) -> ConsumerProgress;
}

/// How one consumer is progressing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConsumerProgress {
    /// When it last got a delivery past the pause gate.
    pub(crate) last_delivery: Option<SystemTime>,
    /// When it last settled one (ack, nack, confirmed move).
    pub(crate) last_settlement: Option<SystemTime>,
    /// Deliveries admitted and not finished with (running or waiting).
    pub(crate) in_hand: usize,
    /// Of those, handlers running.
    pub(crate) running: usize,
    /// Deliveries waiting at the pause gate.
    pub(crate) held: usize,
    /// Deliveries whose move is failing now.
    pub(crate) moves_failing: usize,
    /// Moves that failed since it started.
    pub(crate) set_aside_failed: u64,
    /// `Some(quiet)`: it holds deliveries and has settled nothing for `quiet`, at least
    /// `stall_after`.
    pub(crate) stalled: Option<Duration>,
    /// The quiet time after which it counts as stalled.
    pub(crate) stall_after: Duration,
    /// `None`: no idempotency store; `Some(None)`: the store answers; `Some(Some(o))`: it
    /// does not.
    pub(crate) store: Option<Option<StoreOutage>>,
}

/// An idempotency store that does not answer, as one consumer saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoreOutage {
    /// The latest error.
    pub(crate) error: String,
    /// When the first call of the outage failed.
    pub(crate) since: SystemTime,
    /// Consecutive failed calls.
    pub(crate) failures: u32,
}

impl ConsumerControl {
    /// A control for a consumer of `queue`, with nothing wrong yet.
    pub(crate) fn new(
        queue: Arc<str>,
        stop: CancellationToken,
        closing: CancellationToken,
        done: watch::Receiver<bool>,
        progress: Arc<dyn ReportsProgress>,
    ) -> Self {
        ConsumerControl {
            queue,
            ended: Mutex::new(None),
            stop,
            closing,
            done,
            progress,
            probe: Mutex::new(None),
            audit: Mutex::new(None),
        }
    }

    pub(crate) fn ended(&self, reason: Option<String>) {
        *lock(&self.ended) = reason;
    }

    /// The subscription the consumer holds from now on (`None`: none).
    pub(crate) fn subscribed(&self, probe: Option<SubscriptionProbe>) {
        *lock(&self.probe) = probe;
    }

    /// What the broker-side check found (`None`: nothing wrong).
    pub(crate) fn audited(&self, finding: Option<String>) {
        *lock(&self.audit) = finding;
    }

    /// Whether the consumer's subscription says it is consuming (no subscription: no).
    pub(crate) fn consuming(&self) -> bool {
        lock(&self.probe)
            .as_ref()
            .is_some_and(SubscriptionProbe::is_live)
    }

    /// Why the consumer is not consuming as it should, if it is not: stopped on its own
    /// (the run loop's reason), a subscription that is not live whatever the loop
    /// believes, or what the broker-side check found.
    fn stopped(&self) -> Option<String> {
        if let Some(reason) = lock(&self.ended).clone() {
            return Some(reason);
        }
        if *self.done.borrow() {
            return None;
        }
        let subscribed = lock(&self.probe).clone();
        if subscribed.as_ref().is_some_and(|p| !p.is_live()) {
            return Some(
                "the broker ended the subscription (its channel or connection is gone); subscribing again"
                    .to_owned(),
            );
        }
        lock(&self.audit).clone()
    }
}

/// Connection-wide consumer state.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    paused: watch::Sender<bool>,
    in_flight: AtomicUsize,
    held: AtomicUsize,
    idle: Notify,
    closed: AtomicBool,
    /// A drain or a close is under way (health says so; readiness is off).
    draining: AtomicBool,
    consumers: Mutex<Vec<Arc<ConsumerControl>>>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            paused: watch::Sender::new(false),
            draining: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            idle: Notify::new(),
            closed: AtomicBool::new(false),
            consumers: Mutex::new(Vec::new()),
        }
    }
}

/// What the pause gate decided for one delivery.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Hand it to the handler.
    Pass,
    /// The consumer is closing: hand it back with requeue.
    Closing,
}

impl Lifecycle {
    pub(crate) fn register(&self, control: Arc<ConsumerControl>) {
        let mut consumers = lock(&self.consumers);
        // Finished consumers are forgotten, unless they stopped on their own: health keeps
        // reporting those until the process deals with them.
        consumers.retain(|c| !*c.done.borrow() || c.stopped().is_some());
        consumers.push(control);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The pause gate's answer when it has one without waiting: closing, or not paused.
    pub(crate) fn gate_now(&self, closing: &CancellationToken) -> Option<Gate> {
        if closing.is_cancelled() {
            Some(Gate::Closing)
        } else if !*self.paused.borrow() {
            Some(Gate::Pass)
        } else {
            None
        }
    }

    /// Waits at the pause gate while consuming is paused.
    pub(crate) async fn gate(&self, closing: &CancellationToken) -> Gate {
        if let Some(gate) = self.gate_now(closing) {
            return gate;
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        let mut paused = self.paused.subscribe();
        let gate = tokio::select! {
            biased;
            _ = closing.cancelled() => Gate::Closing,
            r = paused.wait_for(|p| !*p) => match r { Ok(_) => Gate::Pass, Err(_) => Gate::Closing },
        };
        self.held.fetch_sub(1, Ordering::SeqCst);
        gate
    }

    pub(crate) fn handler_started(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn handler_finished(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    pub(crate) fn consuming_paused(&self) -> bool {
        *self.paused.borrow()
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
        if !paused {
            self.draining.store(false, Ordering::SeqCst);
        }
    }

    /// Marks a drain (or close) under way; a resume ends it.
    pub(crate) fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether a drain or a close is under way.
    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Waits until no handler runs; `false` when `timeout` passes first.
    pub(crate) async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }

    /// Consumers that stopped without being asked to: `(queue, reason)`.
    pub(crate) fn stopped_consumers(&self) -> Vec<(String, String)> {
        self.controls()
            .iter()
            .filter_map(|c| c.stopped().map(|r| (c.queue.to_string(), r)))
            .collect()
    }

    /// The progress of every running consumer: `(queue, progress)`.
    pub(crate) fn progress(&self) -> Vec<(String, ConsumerProgress)> {
        self.controls()
            .iter()
            .filter(|c| !*c.done.borrow())
            .map(|c| (c.queue.to_string(), c.progress.progress()))
            .collect()
    }

    /// Consumers registered and running.
    pub(crate) fn running_consumers(&self) -> usize {
        self.controls().iter().filter(|c| !*c.done.borrow()).count()
    }

    fn controls(&self) -> Vec<Arc<ConsumerControl>> {
        lock(&self.consumers).clone()
    }

    /// Cancels every consumer, hands held deliveries back, cuts waits short, and waits up
    /// to `grace` for the consumers to finish. Returns whether they all did.
    pub(crate) async fn shut_consumers(&self, grace: Duration) -> bool {
        self.closed.store(true, Ordering::SeqCst);
        self.draining.store(true, Ordering::SeqCst);
        let controls = self.controls();
        for c in &controls {
            c.stop.cancel();
            c.closing.cancel();
        }
        let all_done = async {
            for c in &controls {
                let mut done = c.done.clone();
                let _ = done.wait_for(|d| *d).await;
            }
        };
        tokio::time::timeout(grace, all_done).await.is_ok()
    }
}
