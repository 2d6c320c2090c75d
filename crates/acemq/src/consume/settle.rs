//! Settlement effects: carrying a [`Decision`] out for one delivery (the rules that choose
//! it are in `consume::decide`).
//!
//! Every move (retry hop, dead letter, park, in-progress republish) is a mandatory,
//! confirmed publish through the default exchange of a copy that keeps the body,
//! `message_id`, content type, reply-to and every incoming header, with the envelope fields
//! rewritten; the original is acked only after the copy is confirmed *and routed*,
//! otherwise it is handed back with requeue after a short pause and `set_aside_failed` is
//! counted. Nothing is ever acked into nothing, and a failed move never closes the
//! consumer's channel. A broker wait whose rung queue is missing is counted as
//! `rung_missing` and waited in the consumer instead. A consumer running one handler at a
//! time sends consecutive acks as one `multiple` ack ([`AckRun`]).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::decide::{DeadLetterKind, Decision};
use super::stats::{ConsumerMetrics, Counter, Observed, Stats};
use crate::engine::{Engine, copy_as_delivered};
use crate::envelope::{self, Envelope};
use crate::headers::HeaderValue;
use crate::observe::metrics::{ConsumeMetrics, ConsumeOutcome};
use crate::observe::trace;
use crate::retry::Wait;
use crate::topology::{dead_letter_queue, parked_queue, retry_queue};
use crate::transport::{Confirmation, Delivery, Outbound, Settlement, TransportError};

/// How long a delivery whose move failed is held before it is requeued.
pub const SET_ASIDE_PAUSE: Duration = Duration::from_millis(250);

/// Acks held back so that a contiguous run of deliveries whose handlers have finished with
/// an ack is settled by one `multiple` ack. Used only by a consumer that runs one handler at
/// a time, so every delivery of its channel up to the run's last tag is either settled
/// already or in the run: a `multiple` ack of the last one acks exactly the run. Any other
/// settlement sends the run first, so a nack, requeue or move ends it.
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

/// Carries decisions out for one consumer.
#[derive(Debug)]
pub(crate) struct Settler {
    pub(crate) engine: Arc<Engine>,
    pub(crate) queue: Arc<str>,
    pub(crate) stats: Arc<Stats>,
    /// Cancelled when the consumer closes: an in-consumer wait ends and the message is
    /// requeued with its attempt unchanged.
    pub(crate) closing: CancellationToken,
    pub(crate) metrics: ConsumerMetrics,
}

impl Settler {
    /// The settler of the consumer of `queue`, counting into `stats`.
    pub(crate) fn new(
        engine: Arc<Engine>,
        queue: Arc<str>,
        stats: Arc<Stats>,
        closing: CancellationToken,
    ) -> Settler {
        Settler {
            engine,
            metrics: ConsumerMetrics::new(queue.clone()),
            queue,
            stats,
            closing,
        }
    }

    /// Settles one delivery according to `decision`, and records what happened — in the
    /// consumer's counters, the family's metrics and the processing span — in one place.
    pub(crate) async fn settle(
        &self,
        d: Delivery,
        envelope: &Envelope,
        decision: Decision,
        seen: &Observed,
    ) {
        let counter = match decision {
            Decision::Ack => self.send(&d, ACK, Counter::Acked).await,
            Decision::Release => self.send(&d, REQUEUE, Counter::Released).await,
            Decision::Duplicate => self.send(&d, ACK, Counter::Duplicate).await,
            Decision::InProgress(delay) | Decision::StoreUnavailable(delay) => {
                let counter = match decision {
                    Decision::StoreUnavailable(_) => Counter::StoreUnavailable,
                    _ => Counter::InProgress,
                };
                if !self.wait(delay).await {
                    self.send(&d, REQUEUE, Counter::RequeuedOnClose).await
                } else {
                    let copy = self.engine.copy_with(&d, &self.queue, envelope);
                    self.move_then_ack(&d, copy, counter).await
                }
            }
            Decision::Park { reason } => {
                let mut copy = copy_as_delivered(&d, &parked_queue(&self.queue));
                copy.properties
                    .headers
                    .insert(envelope::ERROR.into(), HeaderValue::Str(reason));
                copy.properties.expiration = None;
                self.move_then_ack(&d, copy, Counter::Parked).await
            }
            Decision::DeadLetter { reason, kind } => {
                let target = dead_letter_queue(&self.queue);
                let dead = envelope.clone().with_error(Some(reason));
                let mut copy = self.engine.copy_with(&d, &target, &dead);
                copy.properties.expiration = None;
                let counter = match kind {
                    DeadLetterKind::Unprocessable => Counter::Rejected,
                    DeadLetterKind::Exhausted | DeadLetterKind::Requested => Counter::DeadLettered,
                };
                self.move_then_ack(&d, copy, counter).await
            }
            Decision::Retry(wait) => self.retry(&d, envelope, wait).await,
        };
        self.record(
            counter,
            &seen.series,
            seen.started.elapsed(),
            Some(&seen.span),
        );
    }

    /// Counts one settled delivery and, when its counter is a consume outcome, records it
    /// in the delivery's metric series and processing span (the counter table says which).
    fn record(
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
    pub(crate) async fn settle_in_run(
        &self,
        d: Delivery,
        envelope: &Envelope,
        decision: Decision,
        seen: &Observed,
        run: &mut AckRun,
    ) {
        if decision != Decision::Ack {
            self.flush(run).await;
            return self.settle(d, envelope, decision, seen).await;
        }
        if run
            .last
            .as_ref()
            .is_some_and(|prev| prev.delivery_tag >= d.delivery_tag)
        {
            // Not after the run (cannot happen on one channel in order): keep it exact.
            self.flush(run).await;
        }
        trace::record_consume_outcome(&seen.span, ConsumeOutcome::Acked);
        run.held.push((seen.series.clone(), seen.started.elapsed()));
        run.last = Some(d);
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

    async fn retry(&self, d: &Delivery, envelope: &Envelope, wait: Wait) -> Counter {
        let next = envelope
            .clone()
            .with_attempt(envelope.attempt().saturating_add(1));
        if wait.in_broker {
            let rung = retry_queue(&self.queue, wait.delay);
            let copy = self.engine.copy_with(d, &rung, &next);
            match self.engine.publish_on_behalf(copy).await {
                Ok(Confirmation::Routed) => return self.send(d, ACK, Counter::Retried).await,
                Ok(Confirmation::Unroutable { .. }) => {
                    // The rung does not exist: count it and wait here instead.
                    self.stats.add(Counter::RungMissing);
                    self.metrics.any().rung_missing(&rung);
                    tracing::warn!(queue = %self.queue, rung = %rung, "retry rung missing; waiting in the consumer instead");
                }
                other => return self.set_aside_failed(d, &rung, other).await,
            }
        }
        if !self.wait(wait.delay).await {
            return self.send(d, REQUEUE, Counter::RequeuedOnClose).await;
        }
        self.move_then_ack(
            d,
            self.engine.copy_with(d, &self.queue, &next),
            Counter::Retried,
        )
        .await
    }

    /// Waits in the consumer, holding the delivery; `false` when the consumer is closing
    /// (the message then goes back with its attempt unchanged).
    async fn wait(&self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            _ = self.closing.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// Publishes the copy; acks the original only once the copy is confirmed and routed.
    async fn move_then_ack(&self, d: &Delivery, copy: Outbound, counter: Counter) -> Counter {
        let target = copy.routing_key.clone();
        match self.engine.publish_on_behalf(copy).await {
            Ok(Confirmation::Routed) => self.send(d, ACK, counter).await,
            other => self.set_aside_failed(d, &target, other).await,
        }
    }

    async fn set_aside_failed(
        &self,
        d: &Delivery,
        target: &str,
        result: Result<Confirmation, TransportError>,
    ) -> Counter {
        tracing::warn!(queue = %self.queue, target, ?result, "move not confirmed and routed; requeueing the original");
        self.metrics.any().set_aside_failed(target);
        // Hold it briefly so a missing target does not spin the message through the
        // consumer as fast as the broker can redeliver it.
        tokio::select! {
            biased;
            _ = self.closing.cancelled() => {}
            _ = tokio::time::sleep(SET_ASIDE_PAUSE) => {}
        }
        self.send(d, REQUEUE, Counter::SetAsideFailed).await;
        Counter::SetAsideFailed
    }

    /// Sends a settlement: `counter` when it reached the broker, `SettleFailed` when it did
    /// not (the broker will redeliver).
    async fn send(&self, d: &Delivery, s: Settlement, counter: Counter) -> Counter {
        match d.acker.settle(s).await {
            Ok(()) => counter,
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, "settlement not sent; the broker will redeliver");
                Counter::SettleFailed
            }
        }
    }
}

const ACK: Settlement = Settlement::Ack { multiple: false };
const REQUEUE: Settlement = Settlement::Nack {
    multiple: false,
    requeue: true,
};
