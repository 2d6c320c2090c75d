//! Moves that do not land at once, and deliveries that wait in the consumer.
//!
//! A decision is made once. When a move's copy is not confirmed and routed, the delivery
//! keeps its decision (it stays unacked, and its handler does not run again) and the move
//! is tried again after [`SET_ASIDE_PAUSE`], doubling up to [`MOVE_RETRY_MAX`], for as
//! long as its channel lives; only a redelivery after that channel was lost runs the
//! handler again. A copy that can never be sent (too large for the connection's
//! `frame_max`, or routed nowhere because its target queue is missing) takes the fallback
//! that needs no publish: when the source queue carries the contract's dead-letter
//! arguments (`acemq.dlx` → `{q}.dlq`; declared so by this connection, or by anyone: the
//! broker is asked once per queue with a declaration of exactly those arguments, see
//! `Engine::dead_letters_natively`) and `{q}.dlq` exists, the original is rejected without
//! requeue so the broker moves it to `{q}.dlq` itself (its `x-death` says why); otherwise
//! it is held, unacked and not run again, and reported with its reason
//! ([`MoveStatus::held_reason`]).
//!
//! A copy whose publish was answered in doubt while its confirm can still arrive (a
//! confirm timeout, or RabbitMQ withholding the confirm of the publish that met a memory
//! alarm) is never published a second time: the move waits for that confirm
//! ([`TrackedConfirm::late`](crate::transport::TrackedConfirm)), acks the original when it
//! says routed, and only publishes again when it says the copy did not land. Two copies
//! would both be delivered, and run the handler more often than the policy's attempts.
//! (RabbitMQ adds `x-death` without checking the frame size: a message whose headers were
//! already near `frame_max` can then be too large for a client to fetch from `{q}.dlq`;
//! count it with a passive declare, move it with a client whose `frame_max` is larger.)
//!
//! A delivery that waits (a retry wait in the consumer, the no-policy wait, the in-progress
//! wait, a move being retried) does so in a task of its own: it keeps its place in the
//! prefetch window but frees its handler slot. Those tasks are tracked ([`Settler::waits`])
//! so closing cuts them short and hands their deliveries back; they stay counted as in
//! flight, so draining waits for them as it did for a waiting handler.
//!
//! What is going on is shared in [`MoveState`] (read by the consumer's health, and by the
//! run loop, which stops taking deliveries while moves fail and publishing is impossible).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::settle::{ACK, REQUEUE, Settler};
use super::stats::{Counter, Observed};
use crate::topology::dead_letter_queue;
use crate::transport::{
    Confirmation, Delivery, Outbound, PendingConfirm, Settlement, Transport, TransportError,
};
use crate::util::lock;

/// How long a delivery whose move failed waits before the move is tried again (the first
/// time; the pause doubles on each failure, up to 30 s).
pub const SET_ASIDE_PAUSE: Duration = Duration::from_millis(250);

/// The longest pause between two tries of a failing move.
pub(crate) const MOVE_RETRY_MAX: Duration = Duration::from_secs(30);

const REJECT: Settlement = Settlement::Reject { requeue: false };

/// What a consumer's deliveries outside their handlers are doing now, shared by its tasks
/// and read by its health (see [`MoveStatus`] for the public snapshot).
#[derive(Debug, Default)]
pub(crate) struct MoveState {
    /// Deliveries out of the handler path: waiting, or retrying a move.
    pub(crate) waiting: AtomicUsize,
    /// Deliveries whose move is failing now (tried again with backoff).
    pub(crate) moves_failing: AtomicUsize,
    /// Deliveries held because their copy can never be sent and the queue has no
    /// dead-letter arguments to fall back on.
    pub(crate) held_unsendable: AtomicUsize,
    /// Why the last delivery counted in `held_unsendable` is held (`None` once none is).
    pub(crate) held_reason: Mutex<Option<String>>,
    /// Deliveries rejected without requeue so the broker dead-lettered them.
    pub(crate) dead_lettered_by_broker: AtomicU64,
    /// `Some(reason)` while the run loop takes no new deliveries because moves are failing
    /// and publishing is impossible.
    pub(crate) waiting_for_publish: Mutex<Option<String>>,
}

impl MoveState {
    /// The public snapshot.
    pub(crate) fn snapshot(&self) -> MoveStatus {
        MoveStatus {
            waiting: self.waiting.load(Ordering::SeqCst),
            moves_failing: self.moves_failing.load(Ordering::SeqCst),
            held_unsendable: self.held_unsendable.load(Ordering::SeqCst),
            held_reason: lock(&self.held_reason).clone(),
            dead_lettered_by_broker: self.dead_lettered_by_broker.load(Ordering::SeqCst),
            waiting_for_publish: lock(&self.waiting_for_publish).clone(),
        }
    }

    pub(crate) fn set_held_reason(&self, reason: Option<String>) {
        *lock(&self.held_reason) = reason;
    }

    pub(crate) fn set_waiting_for_publish(&self, reason: Option<String>) {
        *lock(&self.waiting_for_publish) = reason;
    }
}

/// What a consumer's deliveries outside their handlers are doing now
/// ([`Consumer::moves`](super::Consumer::moves)).
///
/// ```
/// let m = acemq::consume::MoveStatus::default();
/// assert_eq!((m.waiting, m.moves_failing, m.held_unsendable), (0, 0, 0));
/// assert!(m.waiting_for_publish.is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MoveStatus {
    /// Deliveries waiting in the consumer (a retry or in-progress wait, or a move being
    /// tried again): unacked, holding no handler slot.
    pub waiting: usize,
    /// Deliveries whose move (retry hop, `.dlq`, `.parked`, in-progress copy) is failing
    /// now and is tried again with backoff.
    pub moves_failing: usize,
    /// Deliveries held, unacked and not run again, because their copy can never be sent
    /// (too large for the frame, or its target missing) and the source queue has no
    /// dead-letter arguments to fall back on.
    pub held_unsendable: usize,
    /// Why a delivery is held (the latest one's reason, while `held_unsendable` is not 0):
    /// what made its copy unsendable, and why the broker would not dead-letter it (e.g.
    /// the source queue was refused a declaration with the contract's dead-letter
    /// arguments).
    pub held_reason: Option<String>,
    /// Deliveries rejected without requeue so that the broker moved them to `{q}.dlq`
    /// (their copy could never be sent).
    pub dead_lettered_by_broker: u64,
    /// `Some(reason)` while the consumer takes no new deliveries because moves are failing
    /// and publishing is impossible (connection down, recovering or blocked).
    pub waiting_for_publish: Option<String>,
}

/// Why a move did not land.
pub(super) struct Failure {
    /// Text for the log.
    pub(super) what: String,
    /// It will not pass by itself (too large, routed nowhere): the fallback applies.
    pub(super) permanent: bool,
    /// The copy's publish was answered in doubt while its confirm can still arrive: the
    /// broker's own answer, waited for before the copy is ever published again.
    pub(super) late: Option<PendingConfirm>,
}

impl Failure {
    /// A failure with nothing left to wait for.
    pub(super) fn new(what: String, permanent: bool) -> Failure {
        Failure {
            what,
            permanent,
            late: None,
        }
    }
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failure")
            .field("what", &self.what)
            .field("permanent", &self.permanent)
            .field("late", &self.late.is_some())
            .finish()
    }
}

/// Work a delivery does outside its handler slot: an optional wait, then a move (or the
/// retry of a move that failed).
#[derive(Debug)]
pub(super) struct Later {
    pub(super) d: Delivery,
    /// Wait this long first (in-consumer retry, in-progress).
    pub(super) wait: Option<Duration>,
    /// The copy to publish before the original is acked.
    pub(super) copy: Outbound,
    /// The counter once the copy landed.
    pub(super) counter: Counter,
    /// The first try already failed this way.
    pub(super) failed: Option<Failure>,
}

/// Why publishing is impossible right now, if it is.
pub(super) fn publishing_impossible(t: &dyn Transport) -> Option<String> {
    let status = t.status();
    if let Some(reason) = status.blocked {
        return Some(format!("the broker blocks publishing ({reason})"));
    }
    if !status.connected {
        return Some(if t.recovering() {
            "the connection is recovering".to_owned()
        } else {
            "the connection is down".to_owned()
        });
    }
    None
}

/// One delivery counted in [`MoveState::moves_failing`] until dropped.
struct Failing(Arc<MoveState>);

impl Failing {
    fn up(state: &Arc<MoveState>) -> Failing {
        state.moves_failing.fetch_add(1, Ordering::SeqCst);
        Failing(state.clone())
    }
}

impl Drop for Failing {
    fn drop(&mut self) {
        self.0.moves_failing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One delivery counted in [`MoveState::held_unsendable`] until dropped; the last one out
/// clears the reason.
struct Held(Arc<MoveState>);

impl Held {
    fn up(state: &Arc<MoveState>) -> Held {
        state.held_unsendable.fetch_add(1, Ordering::SeqCst);
        Held(state.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut reason = lock(&self.0.held_reason);
        if self.0.held_unsendable.fetch_sub(1, Ordering::SeqCst) == 1 {
            *reason = None;
        }
    }
}

impl Settler {
    /// Publishes a copy (sized first); once it landed, records `counter` (before the ack,
    /// so the outcome is counted before the copy can be handled) and acks the original
    /// (an ack that does not reach the broker is counted as `settle_failed` too); the
    /// failure otherwise (nothing settled, nothing recorded).
    pub(super) async fn try_move(
        &self,
        d: &Delivery,
        mut copy: Outbound,
        counter: Counter,
        seen: &Observed,
    ) -> Result<(), Failure> {
        let target = copy.routing_key.clone();
        if let Err(too_large) = self.engine.fit(&mut copy) {
            return Err(Failure::new(
                format!("the copy for {target} cannot be sent: {too_large}"),
                true,
            ));
        }
        match self.engine.publish_move(copy).await {
            (Ok(Confirmation::Routed), _) => {
                self.landed(d, counter, seen).await;
                Ok(())
            }
            (other, late) => {
                let mut failure = classify(&target, other);
                failure.late = late;
                Err(failure)
            }
        }
    }

    /// The copy landed: records `counter` (before the ack, so the outcome is counted before
    /// the copy can be handled) and acks the original.
    pub(super) async fn landed(&self, d: &Delivery, counter: Counter, seen: &Observed) {
        self.record(
            counter,
            &seen.series,
            seen.started.elapsed(),
            Some(&seen.span),
        );
        let sent = self.send(d, ACK, counter).await;
        if sent != counter {
            self.stats.add(sent);
        }
    }

    /// Hands `job` to a tracked task of its own, so its handler slot is free at once; the
    /// delivery stays unacked (in the prefetch window) and counted as in flight (the count
    /// taken when it was admitted, handed over: never counted twice).
    pub(super) fn spawn_later(&self, job: Later, seen: &Observed) {
        // Counted out before this returns, so an ack run never covers it (see AckRun), and
        // a failing move is counted before the run loop decides whether to take the next
        // delivery.
        self.moves.waiting.fetch_add(1, Ordering::SeqCst);
        let failing = job.failed.is_some().then(|| Failing::up(&self.moves));
        // The delivery's in-flight counts (its handler's, the series gauge, the lifecycle's)
        // pass to this task, which gives them back when it ends; the handler path does not.
        let seen = Observed {
            started: seen.started,
            span: seen.span.clone(),
            series: seen.series.clone(),
        };
        let me = self.clone();
        self.waits.spawn(async move {
            if let Some(counter) = me.later(job, &seen, failing).await {
                me.record(
                    counter,
                    &seen.series,
                    seen.started.elapsed(),
                    Some(&seen.span),
                );
            }
            seen.series.in_flight(-1);
            me.in_flight.fetch_sub(1, Ordering::SeqCst);
            me.engine.lifecycle.handler_finished();
            me.moves.waiting.fetch_sub(1, Ordering::SeqCst);
        });
    }

    /// Carries `job` out; the counter to record, `None` when it was recorded already.
    async fn later(
        &self,
        job: Later,
        seen: &Observed,
        failing: Option<Failing>,
    ) -> Option<Counter> {
        let Later {
            d,
            wait,
            copy,
            counter,
            failed,
        } = job;
        let failure = match (wait, failed) {
            (_, Some(f)) => f,
            (Some(delay), None) => {
                if !self.wait(delay).await {
                    return Some(self.send(&d, REQUEUE, Counter::RequeuedOnClose).await);
                }
                if !d.acker.is_live() {
                    // Its channel was lost meanwhile: the broker has it back already, and a
                    // copy now would be a duplicate.
                    return Some(Counter::SettleFailed);
                }
                match self.try_move(&d, copy.clone(), counter, seen).await {
                    Ok(()) => return None,
                    Err(f) => f,
                }
            }
            (None, None) => match self.try_move(&d, copy.clone(), counter, seen).await {
                Ok(()) => return None,
                Err(f) => f,
            },
        };
        let failing = failing.unwrap_or_else(|| Failing::up(&self.moves));
        self.keep_moving(&d, copy, counter, failure, seen, failing)
            .await
    }

    /// Tries a failed move again with backoff while the delivery's channel lives; the
    /// handler never runs again for it. See the module docs for the fallback.
    async fn keep_moving(
        &self,
        d: &Delivery,
        copy: Outbound,
        counter: Counter,
        mut failure: Failure,
        seen: &Observed,
        _failing: Failing,
    ) -> Option<Counter> {
        let target = copy.routing_key.clone();
        let mut held = None;
        let mut pause = SET_ASIDE_PAUSE;
        loop {
            self.stats.add(Counter::SetAsideFailed);
            self.metrics.any().set_aside_failed(&target);
            if failure.permanent {
                let no_fallback = match self.fallback(d, counter, &failure.what).await {
                    Ok(c) => return Some(c),
                    Err(why) => why,
                };
                let reason = format!("{}; no broker fallback: {no_fallback}", failure.what);
                if held.is_none() {
                    tracing::error!(queue = %self.queue, target, failure = %failure.what, no_fallback, "the copy cannot be sent and the broker would not dead-letter the original; holding the message unacked (it is not run again) until its channel closes");
                    held = Some(Held::up(&self.moves));
                }
                self.moves.set_held_reason(Some(reason));
            } else if failure.late.is_some() {
                tracing::warn!(queue = %self.queue, target, failure = %failure.what, "move in doubt; waiting for its confirm before the copy is ever published again");
            } else {
                tracing::warn!(queue = %self.queue, target, failure = %failure.what, retry_in = ?pause, "move not confirmed and routed; keeping the decision and trying the move again");
            }
            if let Some(late) = failure.late.take() {
                match self.await_late(d, late).await {
                    Late::Answer(Ok(Confirmation::Routed)) => {
                        self.landed(d, counter, seen).await;
                        return None;
                    }
                    Late::Answer(other) => {
                        // Answered, and not routed: nothing can land any more, so the copy
                        // is published again (after the pause).
                        failure = classify(&target, other);
                        continue;
                    }
                    Late::Done(c) => return Some(c),
                }
            }
            // The pause, looking at the channel every SET_ASIDE_PAUSE: once it is lost the
            // broker has the message back, and the run loop must not wait on this move.
            let until = tokio::time::Instant::now() + pause;
            loop {
                if !d.acker.is_live() {
                    tracing::debug!(queue = %self.queue, "the channel of a delivery whose move was failing closed; the broker redelivers it");
                    return Some(Counter::SettleFailed);
                }
                let now = tokio::time::Instant::now();
                if now >= until {
                    break;
                }
                tokio::select! {
                    biased;
                    _ = self.closing.cancelled() => {
                        return Some(self.send(d, REQUEUE, Counter::RequeuedOnClose).await);
                    }
                    _ = tokio::time::sleep_until(until.min(now + SET_ASIDE_PAUSE)) => {}
                }
            }
            pause = (pause * 2).min(MOVE_RETRY_MAX);
            match self.try_move(d, copy.clone(), counter, seen).await {
                Ok(()) => return None,
                Err(f) => failure = f,
            }
        }
    }

    /// Waits for the broker's own answer to a copy answered in doubt, looking at the
    /// delivery's channel every [`SET_ASIDE_PAUSE`]; cut short by closing (the original is
    /// requeued) or a lost channel (the broker has it back).
    async fn await_late(&self, d: &Delivery, late: PendingConfirm) -> Late {
        tokio::pin!(late);
        loop {
            if !d.acker.is_live() {
                tracing::debug!(queue = %self.queue, "the channel of a delivery whose move was in doubt closed; the broker redelivers it");
                return Late::Done(Counter::SettleFailed);
            }
            tokio::select! {
                biased;
                answer = &mut late => return Late::Answer(answer),
                _ = self.closing.cancelled() => {
                    return Late::Done(self.send(d, REQUEUE, Counter::RequeuedOnClose).await);
                }
                _ = tokio::time::sleep(SET_ASIDE_PAUSE) => {}
            }
        }
    }

    /// The fallback that needs no publish: reject without requeue when the broker would
    /// move the message to an existing `{q}.dlq` (the source queue carries the contract's
    /// dead-letter arguments, whoever declared it: `Engine::dead_letters_natively`).
    /// `Err(why)`: no such fallback (hold it).
    async fn fallback(
        &self,
        d: &Delivery,
        counter: Counter,
        what: &str,
    ) -> Result<Counter, String> {
        self.engine.dead_letters_natively(&self.queue).await?;
        let dlq = dead_letter_queue(&self.queue);
        if let Err(e) = self.engine.transport.inspect_queue(&dlq).await {
            // The broker would drop it: never reject into nothing.
            return Err(format!("{dlq} could not be looked at: {e}"));
        }
        tracing::warn!(queue = %self.queue, failure = %what, "rejecting without requeue: the broker dead-letters it to {dlq} (see its x-death header)");
        let counter = match counter {
            Counter::Rejected | Counter::DeadLettered => counter,
            _ => Counter::DeadLettered,
        };
        let sent = self.send(d, REJECT, counter).await;
        if sent == counter {
            self.moves
                .dead_lettered_by_broker
                .fetch_add(1, Ordering::SeqCst);
        }
        Ok(sent)
    }
}

/// How waiting for a late confirm ended.
enum Late {
    /// The broker's answer came.
    Answer(Result<Confirmation, TransportError>),
    /// The delivery was settled otherwise (closing, or its channel lost): count this.
    Done(Counter),
}

/// What a publish that did not land says about the next try.
pub(super) fn classify(target: &str, result: Result<Confirmation, TransportError>) -> Failure {
    match result {
        Ok(Confirmation::Unroutable { reply_text, .. }) => Failure::new(
            format!("the copy for {target} routed nowhere ({reply_text}): the queue is missing"),
            true,
        ),
        Ok(other) => Failure::new(
            format!("the copy for {target} was not confirmed: {other:?}"),
            false,
        ),
        Err(TransportError::Protocol { code: 501, detail }) => Failure::new(
            format!("the copy for {target} was refused as too large: {detail}"),
            true,
        ),
        Err(e) => Failure::new(
            format!("the copy for {target} was not published: {e}"),
            false,
        ),
    }
}
