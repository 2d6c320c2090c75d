//! Settlement: the one place that turns a delivery plus what happened to it into exactly
//! one broker outcome (wire.md §5–§6).
//!
//! `decide` is pure: handler result + envelope + policy -> [`Decision`]. `Settler`
//! carries a decision out. Every move (retry hop, dead letter, park) is a mandatory,
//! confirmed publish through the default exchange that keeps the body, `message_id`,
//! content type, reply-to and every incoming header, then rewrites the envelope fields;
//! the original is acked only after the copy is confirmed *and routed*, otherwise it is
//! handed back with requeue and `set_aside_failed` is counted. Nothing is ever acked into
//! nothing, and a failed move never closes the consumer's channel.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::handler::{HandlerError, Kind};
use super::stats::{Counter, Stats};
use crate::engine::Engine;
use crate::envelope::{self, Envelope};
use crate::headers::HeaderValue;
use crate::observe::metrics::{ConsumeMetrics, ConsumeOutcome};
use crate::observe::trace;
use crate::retry::{RetryPolicy, Wait};
use crate::topology::{dead_letter_queue, parked_queue, render_delay, retry_queue};
use crate::transport::{Confirmation, Delivery, Outbound, Settlement, TransportError};

/// Reason texts are cut to this many bytes (with a marker) so a republish never outgrows
/// the broker's frame size.
pub const MAX_REASON_BYTES: usize = 4096;

/// How long a delivery whose move failed is held before it is requeued.
pub const SET_ASIDE_PAUSE: Duration = Duration::from_millis(250);

/// The default wait between attempts when a consumer has no retry policy (seed 000:
/// "retried after a fixed delay, forever").
pub const DEFAULT_RETRY_DELAY_WITHOUT_POLICY: Duration = Duration::from_secs(5);

/// What happened to a delivery before settlement.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The handler returned Ok.
    Handled,
    /// The handler failed (or panicked, or an interceptor refused it).
    Failed(HandlerError),
    /// The body could not be decoded.
    Undecodable(String),
    /// The idempotency store says this id was handled (confirmed): ack, don't run.
    Duplicate,
    /// The idempotency store says another consumer holds a live claim on this id.
    InProgress,
}

/// Why a message goes to `{q}.dlq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// The policy gave up (attempts or age): outcome `dead_lettered`.
    Exhausted,
    /// The handler said it is unprocessable: outcome `rejected`.
    Unprocessable,
    /// The handler asked for it: outcome `dead_lettered`.
    Requested,
}

/// The broker outcome chosen for one delivery.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Decision {
    /// basic.ack.
    Ack,
    /// Republish with the attempt advanced, after `wait`.
    Retry(Wait),
    /// Republish to `{q}.dlq` with the reason.
    DeadLetter {
        /// `x-acemq-error`.
        reason: String,
        /// Why.
        kind: DeadLetterKind,
    },
    /// Republish the bytes as delivered to `{q}.parked` with the reason.
    Park {
        /// `x-acemq-error`.
        reason: String,
    },
    /// Hand back with requeue; no attempt spent.
    Release,
    /// Acked without running the handler: the id was already handled.
    Duplicate,
    /// Someone else is working on it: wait, then republish to the same queue with the
    /// attempt unchanged (no attempt spent, never dead-lettered).
    InProgress(Duration),
}

/// Decides a delivery's fate (pure apart from the jitter the policy draws).
pub(crate) fn decide(
    outcome: &Outcome,
    envelope: &Envelope,
    policy: Option<&RetryPolicy>,
    no_policy_delay: Duration,
    in_progress_delay: Duration,
) -> Decision {
    match outcome {
        Outcome::Handled => Decision::Ack,
        Outcome::Duplicate => Decision::Duplicate,
        Outcome::InProgress => Decision::InProgress(in_progress_delay),
        Outcome::Undecodable(e) => Decision::Park {
            reason: bounded(format!("could not be decoded: {e}")),
        },
        Outcome::Failed(err) => match err.kind {
            Kind::Retry => decide_failure(&err.reason, envelope, policy, no_policy_delay),
            Kind::Fatal => Decision::DeadLetter {
                reason: bounded(format!(
                    "the handler reported an unprocessable message: {}",
                    err.reason
                )),
                kind: DeadLetterKind::Unprocessable,
            },
            Kind::DeadLetter => Decision::DeadLetter {
                reason: bounded(format!(
                    "the handler dead-lettered the message: {}",
                    err.reason
                )),
                kind: DeadLetterKind::Requested,
            },
            Kind::Park => Decision::Park {
                reason: bounded(format!("the handler parked the message: {}", err.reason)),
            },
            Kind::Release => Decision::Release,
        },
    }
}

/// The policy's answer to an ordinary failure: retry after a wait, or dead-letter with the
/// family's reason text. Without a policy: retry after `no_policy_delay`, forever.
///
/// ```
/// use acemq::consume::settle::{decide_failure, Decision, DeadLetterKind};
/// use acemq::envelope::Envelope;
/// use acemq::retry::RetryPolicy;
/// let policy = RetryPolicy::none();
/// let d = decide_failure("boom", &Envelope::new("t"), Some(&policy), std::time::Duration::from_secs(5));
/// assert_eq!(d, Decision::DeadLetter { reason: "exhausted 1 attempts: boom".into(), kind: DeadLetterKind::Exhausted });
/// ```
pub fn decide_failure(
    error: &str,
    envelope: &Envelope,
    policy: Option<&RetryPolicy>,
    no_policy_delay: Duration,
) -> Decision {
    let Some(policy) = policy else {
        return Decision::Retry(Wait {
            delay: no_policy_delay,
            in_broker: false,
        });
    };
    let attempt = u32::try_from(envelope.attempt()).unwrap_or(1);
    let age = envelope.age();
    if let Some(wait) = policy.next_wait(attempt, age) {
        return Decision::Retry(wait);
    }
    let reason = if attempt >= policy.max_attempts() {
        format!("exhausted {attempt} attempts: {error}")
    } else {
        format!(
            "exceeded the maximum message age of {}: {error}",
            render_delay(policy.max_message_age())
        )
    };
    Decision::DeadLetter {
        reason: bounded(reason),
        kind: DeadLetterKind::Exhausted,
    }
}

/// Cuts a reason to [`MAX_REASON_BYTES`] on a character boundary, with a marker.
///
/// ```
/// let long = "x".repeat(1_000_000);
/// let cut = acemq::consume::settle::bounded(long);
/// assert!(cut.len() <= acemq::consume::settle::MAX_REASON_BYTES);
/// assert!(cut.ends_with("[truncated]"));
/// ```
pub fn bounded(reason: String) -> String {
    const MARKER: &str = "... [truncated]";
    if reason.len() <= MAX_REASON_BYTES {
        return reason;
    }
    let mut end = MAX_REASON_BYTES - MARKER.len();
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARKER}", &reason[..end])
}

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

/// How one delivery is being observed: when its handling started, its processing span and
/// its metric series (looked up once per delivery).
#[derive(Debug)]
pub(crate) struct Observed {
    pub(crate) started: Instant,
    pub(crate) span: tracing::Span,
    pub(crate) series: Arc<ConsumeMetrics>,
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
            Decision::InProgress(delay) => {
                if !self.wait(delay).await {
                    self.send(&d, REQUEUE, Counter::RequeuedOnClose).await
                } else {
                    let copy = self.copy(&d, &self.queue, envelope.clone());
                    self.move_then_ack(&d, copy, Counter::InProgress).await
                }
            }
            Decision::Park { reason } => {
                let mut copy = self.copy_as_delivered(&d, &parked_queue(&self.queue));
                copy.properties
                    .headers
                    .insert(envelope::ERROR.into(), HeaderValue::Str(reason));
                copy.properties.expiration = None;
                self.move_then_ack(&d, copy, Counter::Parked).await
            }
            Decision::DeadLetter { reason, kind } => {
                let target = dead_letter_queue(&self.queue);
                let mut copy = self.copy(&d, &target, envelope.clone().with_error(Some(reason)));
                copy.properties.expiration = None;
                let counter = match kind {
                    DeadLetterKind::Unprocessable => Counter::Rejected,
                    DeadLetterKind::Exhausted | DeadLetterKind::Requested => Counter::DeadLettered,
                };
                self.move_then_ack(&d, copy, counter).await
            }
            Decision::Retry(wait) => self.retry(&d, envelope, wait).await,
        };
        self.stats.add(counter);
        if let Some(outcome) = counter.outcome() {
            seen.series.record(outcome, seen.started.elapsed());
            trace::record_consume_outcome(&seen.span, outcome);
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
        for (series, took) in run.held.drain(..) {
            if sent {
                self.stats.add(Counter::Acked);
                series.record(ConsumeOutcome::Acked, took);
            } else {
                self.stats.add(Counter::SettleFailed);
            }
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
            match self
                .engine
                .publish_on_behalf(self.copy(d, &rung, next.clone()))
                .await
            {
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
        self.move_then_ack(d, self.copy(d, &self.queue, next), Counter::Retried)
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

    /// A copy for `target` through the default exchange: everything as delivered, then
    /// the envelope fields rewritten from `envelope`.
    fn copy(&self, d: &Delivery, target: &str, envelope: Envelope) -> Outbound {
        let mut copy = self.copy_as_delivered(d, target);
        envelope.write(&mut copy.properties.headers, &self.engine.origin);
        copy.properties.message_id = Some(envelope.id().to_owned());
        copy
    }

    fn copy_as_delivered(&self, d: &Delivery, target: &str) -> Outbound {
        Outbound {
            exchange: String::new(),
            routing_key: target.to_owned(),
            mandatory: true,
            properties: d.properties.clone(),
            body: d.body.clone(),
        }
    }
}

const ACK: Settlement = Settlement::Ack { multiple: false };
const REQUEUE: Settlement = Settlement::Nack {
    multiple: false,
    requeue: true,
};

/// The family's consume metrics of one consumer, one series set per message type.
#[derive(Debug)]
pub(crate) struct ConsumerMetrics {
    queue: Arc<str>,
    by_type: std::sync::Mutex<HashMap<String, Arc<ConsumeMetrics>>>,
}

impl ConsumerMetrics {
    pub(crate) fn new(queue: Arc<str>) -> Self {
        ConsumerMetrics {
            queue,
            by_type: std::sync::Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn for_type(&self, message_type: &str) -> Arc<ConsumeMetrics> {
        let mut map = self.by_type.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = map.get(message_type) {
            return m.clone();
        }
        let m = Arc::new(ConsumeMetrics::new(&*self.queue, message_type));
        map.insert(message_type.to_owned(), m.clone());
        m
    }

    /// Series for events not tied to one message type (set-aside failures, missing rungs).
    fn any(&self) -> Arc<ConsumeMetrics> {
        self.for_type("")
    }
}
