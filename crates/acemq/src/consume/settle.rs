//! Settlement effects: carrying a [`Decision`] out for one delivery (the rules that choose
//! it are in `consume::decide`).
//!
//! Every move (retry hop, dead letter, park, in-progress republish) is a mandatory,
//! confirmed publish through the default exchange of a copy that keeps the body,
//! `message_id`, content type, reply-to and every incoming header, with the envelope fields
//! rewritten, sized against the connection's `frame_max` first (the reason is cut to fit);
//! the original is acked only after the copy is confirmed *and routed*. A move that does
//! not land keeps its decision and is tried again with backoff (a copy answered in doubt
//! while its confirm can still arrive is not published again: its confirm is waited for), and every wait in the
//! consumer runs outside the handler slot (both in `consume::moves`); `set_aside_failed`
//! counts each try that failed. Nothing is ever acked into nothing, and a failed move
//! never closes the consumer's channel. A broker wait whose rung queue is missing is
//! counted as `rung_missing` and waited in the consumer instead. A consumer running one
//! handler at a time sends consecutive acks as one `multiple` ack ([`AckRun`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{self, Either};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::decide::{DeadLetterKind, Decision};
use super::moves::{Failure, Later, MoveState, classify};
use super::stats::{ConsumerMetrics, Counter, Observed, Stats};
use crate::engine::{Engine, copy_as_delivered};
use crate::envelope::{self, Envelope};
use crate::headers::HeaderValue;
use crate::observe::metrics::{ConsumeMetrics, ConsumeOutcome};
use crate::observe::trace;
use crate::retry::Wait;
use crate::topology::{dead_letter_queue, parked_queue, retry_queue};
use crate::transport::{BoxFuture, Confirmation, Delivery, Outbound, Settlement};

/// Acks held back so that a contiguous run of deliveries whose handlers have finished with
/// an ack is settled by one `multiple` ack. Used only by a consumer that runs one handler at
/// a time, so every delivery of its channel up to the run's last tag is either settled
/// already or in the run: a `multiple` ack of the last one acks exactly the run. Any other
/// settlement sends the run first, so a nack, requeue or move ends it; and while any
/// delivery is out of the handler path (waiting, or retrying a move; it stays unacked),
/// acks are sent one by one, so a `multiple` ack never covers it.
#[derive(Debug, Default)]
pub(crate) struct AckRun {
    /// The run's highest delivery (its acker sends the `multiple` ack).
    last: Option<Delivery>,
    /// Each delivery's metric series and handling time, recorded once the ack is sent.
    held: Vec<(Arc<ConsumeMetrics>, Duration)>,
}

impl AckRun {
    /// Deliveries waiting in the run.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

/// Carries decisions out for one consumer (cheap to clone: everything is shared).
#[derive(Debug, Clone)]
pub(crate) struct Settler {
    pub(crate) engine: Arc<Engine>,
    pub(crate) queue: Arc<str>,
    pub(crate) stats: Arc<Stats>,
    /// Cancelled when the consumer closes: an in-consumer wait ends and the message is
    /// requeued with its attempt unchanged. In an `Arc` so that each message can hold it
    /// for a token of its own without cloning the token (a lock on the token per clone).
    pub(crate) closing: Arc<CancellationToken>,
    pub(crate) metrics: Arc<ConsumerMetrics>,
    /// Deliveries outside their handlers (waits, failing moves), for health and the run
    /// loop.
    pub(crate) moves: Arc<MoveState>,
    /// The tasks those deliveries wait in (closed and awaited when the consumer stops).
    pub(crate) waits: TaskTracker,
    /// The consumer's count of deliveries in flight (a waiting one stays counted).
    pub(crate) in_flight: Arc<AtomicUsize>,
}

impl Settler {
    /// The settler of the consumer of `queue`, counting into `stats`.
    pub(crate) fn new(
        engine: Arc<Engine>,
        queue: Arc<str>,
        stats: Arc<Stats>,
        closing: CancellationToken,
        in_flight: Arc<AtomicUsize>,
    ) -> Settler {
        let transport = crate::observe::transport_name(engine.transport.kind());
        Settler {
            engine,
            metrics: Arc::new(ConsumerMetrics::new(transport, queue.clone())),
            queue,
            moves: stats.moves.clone(),
            stats,
            closing: Arc::new(closing),
            waits: TaskTracker::new(),
            in_flight,
        }
    }

    /// Settles one delivery according to `decision`, and records what happened — in the
    /// consumer's counters, the family's metrics and the processing span — in one place.
    /// A decision that waits, or a move that did not land at once, goes on in a task of
    /// its own (`consume::moves`) and is recorded there when it ends: then this answers
    /// `true`, and that task owns the delivery's in-flight count from here on.
    ///
    /// A plain function over [`Settler::step`]: an ack's future holds the delivery and the
    /// ack being sent, nothing of the other decisions' paths.
    pub(crate) fn settle<'a>(
        &'a self,
        d: Delivery,
        envelope: &'a Envelope,
        decision: Decision,
        seen: &'a Observed,
    ) -> impl Future<Output = bool> + Send + 'a {
        self.step(d, envelope, decision, seen)
            .map(move |step| match step {
                Step::Done(Some(counter)) => {
                    self.record(
                        counter,
                        &seen.series,
                        seen.started.elapsed(),
                        Some(&seen.span),
                    );
                    false
                }
                Step::Done(None) => false,
                Step::Later(job) => {
                    self.spawn_later(*job, seen);
                    true
                }
            })
    }

    /// What `decision` comes to now: a settlement sent, a move (boxed, as every move: the
    /// path of a failure, its copy and its move, need not make the future of every
    /// delivery, an ack's, kilobytes larger), or a wait handed on.
    fn step<'a>(
        &'a self,
        d: Delivery,
        envelope: &'a Envelope,
        decision: Decision,
        seen: &'a Observed,
    ) -> impl Future<Output = Step> + Send + 'a {
        let sending =
            |d, settlement, counter| Either::Left(Either::Left(self.sent(d, settlement, counter)));
        let now = |step| Either::Left(Either::Right(future::ready(step)));
        match decision {
            Decision::Ack => sending(d, ACK, Counter::Acked),
            Decision::Release => sending(d, REQUEUE, Counter::Released),
            Decision::Duplicate => sending(d, ACK, Counter::Duplicate),
            Decision::Skip { reason } => {
                tracing::warn!(queue = %self.queue, message_id = envelope.id(), %reason, "skipped without being handled");
                sending(d, ACK, Counter::Skipped)
            }
            Decision::InProgress(delay) | Decision::StoreUnavailable(delay) => {
                let counter = match decision {
                    Decision::StoreUnavailable(_) => Counter::StoreUnavailable,
                    _ => Counter::InProgress,
                };
                let copy = self.engine.copy_with(&d, &self.queue, envelope);
                now(Step::Later(Box::new(Later {
                    d,
                    wait: Some(delay),
                    copy,
                    counter,
                    failed: None,
                })))
            }
            Decision::Park { reason } => Either::Right(self.park(d, reason, seen)),
            Decision::DeadLetter { reason, kind } => {
                Either::Right(self.dead_letter(d, envelope, reason, kind, seen))
            }
            Decision::Retry(wait) => {
                let retrying: BoxFuture<'a, Step> = Box::pin(self.retry(d, envelope, wait));
                Either::Right(retrying)
            }
            // Left unsettled: the consumer stops, and the channel's close gives it back.
            Decision::Stop { .. } => now(Step::Done(None)),
            // Carried out in the delivery path itself, never handed here.
            Decision::Again { .. } | Decision::Hold { .. } => now(Step::Done(None)),
        }
    }

    /// Sends a settlement of `d`, as a step.
    async fn sent(&self, d: Delivery, settlement: Settlement, counter: Counter) -> Step {
        Step::Done(Some(self.send(&d, settlement, counter).await))
    }

    /// Moves `d` to the consumer's `.parked` queue with `reason`, as delivered.
    fn park<'a>(&'a self, d: Delivery, reason: String, seen: &'a Observed) -> BoxFuture<'a, Step> {
        let mut copy = copy_as_delivered(&d, &parked_queue(&self.queue));
        copy.properties
            .headers
            .insert(envelope::ERROR.into(), HeaderValue::Str(reason));
        copy.properties.expiration = None;
        Box::pin(self.move_now(d, copy, Counter::Parked, seen))
    }

    /// Moves `d` to the consumer's `.dlq` with `reason` in its envelope.
    fn dead_letter<'a>(
        &'a self,
        d: Delivery,
        envelope: &Envelope,
        reason: String,
        kind: DeadLetterKind,
        seen: &'a Observed,
    ) -> BoxFuture<'a, Step> {
        let target = dead_letter_queue(&self.queue);
        let dead = envelope.clone().with_error(Some(reason));
        let mut copy = self.engine.copy_with(&d, &target, &dead);
        copy.properties.expiration = None;
        let counter = match kind {
            DeadLetterKind::Unprocessable => Counter::Rejected,
            DeadLetterKind::Exhausted | DeadLetterKind::Requested => Counter::DeadLettered,
        };
        Box::pin(self.move_now(d, copy, counter, seen))
    }

    /// Counts one settled delivery and, when its counter is a consume outcome, records it
    /// in the delivery's metric series and processing span (the counter table says which).
    pub(super) fn record(
        &self,
        counter: Counter,
        series: &ConsumeMetrics,
        took: Duration,
        span: Option<&tracing::Span>,
    ) {
        self.stats.add(counter);
        if let Some(outcome) = counter.outcome() {
            series.record(outcome, took);
            if let Some(span) = span {
                trace::record_consume_outcome(span, outcome);
            }
        }
    }

    /// Like [`Settler::settle`], except that an ack joins `run` instead of being sent (it
    /// is counted once the run is sent); any other decision sends the run first.
    pub(crate) fn settle_in_run<'a>(
        &'a self,
        d: Delivery,
        envelope: &'a Envelope,
        decision: Decision,
        seen: &'a Observed,
        run: &'a mut AckRun,
    ) -> impl Future<Output = bool> + Send + 'a {
        if decision != Decision::Ack || self.moves.waiting.load(Ordering::SeqCst) > 0 {
            // Not an ack, or a delivery is out waiting (unacked, with a lower tag): send the
            // run, then this one on its own (boxed: an ack joining the run is the path
            // every delivery's future is sized for).
            let settling: BoxFuture<'a, bool> = Box::pin(async move {
                self.flush(run).await;
                self.settle(d, envelope, decision, seen).await
            });
            return Either::Left(settling);
        }
        Either::Right(async move {
            if run
                .last
                .as_ref()
                .is_some_and(|prev| prev.delivery_tag >= d.delivery_tag)
            {
                // Not after the run (cannot happen on one channel in order): keep it exact.
                Box::pin(self.flush(run)).await;
            }
            trace::record_consume_outcome(&seen.span, ConsumeOutcome::Acked);
            run.held.push((seen.series.clone(), seen.started.elapsed()));
            run.last = Some(d);
            false
        })
    }

    /// Sends the run as one ack (`multiple` when it holds more than one delivery) and
    /// counts each delivery as acked, or as `settle_failed` when the ack was not sent.
    pub(crate) async fn flush(&self, run: &mut AckRun) {
        let Some(last) = run.last.take() else {
            return;
        };
        let settlement = Settlement::Ack {
            multiple: run.held.len() > 1,
        };
        let sent = match last.acker.settle(settlement).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, deliveries = run.held.len(), "settlement not sent; the broker will redeliver");
                false
            }
        };
        let counter = if sent {
            Counter::Acked
        } else {
            Counter::SettleFailed
        };
        // The span already carries `acked` (set when the delivery joined the run).
        for (series, took) in run.held.drain(..) {
            self.record(counter, &series, took, None);
        }
    }

    /// Hands a delivery back with requeue because the consumer is closing (never acked,
    /// never dead-lettered).
    pub(crate) async fn hand_back(&self, d: &Delivery) {
        let counter = self.send(d, REQUEUE, Counter::RequeuedOnClose).await;
        self.stats.add(counter);
    }

    /// A retry: the hop to the rung now for a broker wait, else (or when the rung is
    /// missing) the wait in the consumer, out of the handler slot, then the copy to `{q}`.
    async fn retry(&self, d: Delivery, envelope: &Envelope, wait: Wait) -> Step {
        let next = envelope
            .clone()
            .with_attempt(envelope.attempt().saturating_add(1));
        if wait.in_broker {
            let rung = retry_queue(&self.queue, wait.delay);
            let mut copy = self.engine.copy_with(&d, &rung, &next);
            let failure = match self.engine.fit(&mut copy) {
                Err(too_large) => Failure::new(
                    format!("the copy for {rung} cannot be sent: {too_large}"),
                    true,
                ),
                Ok(()) => match self.engine.publish_move(copy.clone()).await {
                    (Ok(Confirmation::Routed), _) => {
                        return Step::Done(Some(self.send(&d, ACK, Counter::Retried).await));
                    }
                    (Ok(Confirmation::Unroutable { .. }), _) => {
                        // The rung does not exist: count it and wait here instead.
                        self.stats.add(Counter::RungMissing);
                        self.metrics.any().rung_missing(&rung);
                        tracing::warn!(queue = %self.queue, rung = %rung, "retry rung missing; waiting in the consumer instead");
                        return self.wait_then_retry(d, &next, wait);
                    }
                    (other, late) => {
                        // In doubt with its confirm still to come: waited for, never sent
                        // twice (`consume::moves`).
                        let mut failure = classify(&rung, other);
                        failure.late = late;
                        failure
                    }
                },
            };
            // Too large, or not published: the hop is tried again with backoff.
            return Step::Later(Box::new(Later {
                d,
                wait: None,
                copy,
                counter: Counter::Retried,
                failed: Some(failure),
            }));
        }
        self.wait_then_retry(d, &next, wait)
    }

    /// The wait in the consumer (out of the handler slot), then the copy to `{q}`.
    fn wait_then_retry(&self, d: Delivery, next: &Envelope, wait: Wait) -> Step {
        let copy = self.engine.copy_with(&d, &self.queue, next);
        Step::Later(Box::new(Later {
            d,
            wait: Some(wait.delay),
            copy,
            counter: Counter::Retried,
            failed: None,
        }))
    }

    /// Tries a move at once; if it does not land, it goes on out of the handler slot.
    async fn move_now(
        &self,
        d: Delivery,
        copy: Outbound,
        counter: Counter,
        seen: &Observed,
    ) -> Step {
        match self.try_move(&d, copy.clone(), counter, seen).await {
            Ok(()) => Step::Done(None),
            Err(failure) => Step::Later(Box::new(Later {
                d,
                wait: None,
                copy,
                counter,
                failed: Some(failure),
            })),
        }
    }

    /// Waits in the consumer, holding the delivery; `false` when the consumer is closing
    /// (the message then goes back with its attempt unchanged).
    pub(super) async fn wait(&self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            _ = self.closing.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// Sends a settlement: `counter` when it reached the broker, `SettleFailed` when it did
    /// not (the broker will redeliver).
    pub(super) async fn send(&self, d: &Delivery, s: Settlement, counter: Counter) -> Counter {
        match d.acker.settle(s).await {
            Ok(()) => counter,
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, "settlement not sent; the broker will redeliver");
                Counter::SettleFailed
            }
        }
    }
}

/// What settling a delivery came to now.
enum Step {
    /// Settled: count this (`None`: counted already).
    Done(Option<Counter>),
    /// It goes on outside the handler slot.
    Later(Box<Later>),
}

pub(super) const ACK: Settlement = Settlement::Ack { multiple: false };
pub(super) const REQUEUE: Settlement = Settlement::Nack {
    multiple: false,
    requeue: true,
};
