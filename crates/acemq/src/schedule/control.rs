//! The control-queue consumer: every message a rung expires comes back to
//! `acemq.schedule.due`, and a scheduler either hops it to the next rung, waits the last
//! sub-second out, or delivers it. It is a consumer kind on the one delivery path
//! (`consume::start_kind`): interceptors, handler layers, spans, metrics, pause and drain
//! apply to it as to any consumer; what is its own is the handler below and its rule
//! ([`ControlRule`]).
//!
//! Every hop and delivery is a confirmed, mandatory publish made on the scheduler's behalf
//! (never refused by a publishing pause), and the control message is acked only once the
//! broker confirmed it routed. A crash between the two redelivers the control message:
//! the destination then sees the message twice *with the same id*, which an idempotent
//! consumer drops.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Inner;
use super::wire::{self, Route, Target};
use crate::consume::handler::HandlerError;
use crate::consume::handler::Kind;
use crate::consume::rule::Rule;
use crate::consume::{DeadLetterKind, Decision, Facts, Message, Outcome, bounded};

/// Tries of a delivery that routes nowhere (or a hop whose rung is gone) before the
/// control message goes to `acemq.schedule.due.dlq`.
pub const DEFAULT_UNDELIVERABLE_TRIES: u32 = 5;

/// The first wait after a failed hop or delivery; it doubles up to [`RETRY_MAX`].
const RETRY_INITIAL: Duration = Duration::from_millis(250);
/// The longest wait between tries.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The wait before the try after `attempt` failed ones.
fn backoff(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    RETRY_INITIAL
        .saturating_mul(1u32 << doublings)
        .min(RETRY_MAX)
}

/// One control message: read its `x-schedule-*` headers (unreadable: fatal), then hop,
/// wait or deliver.
pub(super) async fn on_due(inner: Arc<Inner>, m: Message<Bytes>) -> Result<(), HandlerError> {
    let target = Target::read(m.headers()).map_err(HandlerError::fatal)?;
    let remaining = target.due_at_ms.saturating_sub(inner.clock.now_ms());
    match wire::route(remaining) {
        Route::Rung(rung) => {
            let hop = wire::hop(m.headers(), m.payload().clone(), &rung, &inner.origin);
            inner
                .engine
                .publish_landed(hop)
                .await
                .map_err(|e| failure(&e, &format!("the hop to {rung}")))?;
            inner.counters.hopped();
            Ok(())
        }
        Route::Soon(wait) => {
            // On time, never early: the last sub-second is waited here. The consumer runs
            // as many handlers as its prefetch, so this wait holds back no other message.
            tokio::select! {
                biased;
                _ = m.cancellation().cancelled() => return Err(HandlerError::release()),
                _ = tokio::time::sleep(wait) => {}
            }
            deliver(&inner, &m, &target).await
        }
        Route::Deliver => deliver(&inner, &m, &target).await,
    }
}

/// Publishes a due message to its destination, unless it was cancelled.
async fn deliver(inner: &Inner, m: &Message<Bytes>, target: &Target) -> Result<(), HandlerError> {
    if let (Some(store), Some(id)) = (&inner.cancellations, wire::carried_id(m.headers())) {
        match store.is_cancelled(id, target.due_at_ms).await {
            Ok(true) => {
                tracing::info!(
                    message_id = id,
                    "a cancelled scheduled message fell due; not delivered"
                );
                inner.counters.cancelled();
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => {
                // Whether it was cancelled is unknown: deliver nothing yet.
                return Err(HandlerError::retry(format!(
                    "could not ask the cancellation store: {e}"
                )));
            }
        }
    }
    let (message, id) = wire::delivery(m.headers(), m.payload().clone(), target, &inner.origin);
    inner.engine.publish_landed(message).await.map_err(|e| {
        failure(
            &e,
            &format!(
                "the delivery of {id} to exchange {:?} with routing key {:?}",
                target.exchange, target.routing_key
            ),
        )
    })?;
    let late_ms = inner.clock.now_ms().saturating_sub(target.due_at_ms).max(0);
    inner
        .counters
        .delivered(Duration::from_millis(late_ms.unsigned_abs()));
    Ok(())
}

/// A failed publish as the control rule reads it: a message that routed nowhere asks for
/// the bounded tries then the dead-letter queue (`dead_letter`); anything else (nacked,
/// connection lost, blocked, in doubt) is transient (`retry`).
fn failure(e: &crate::Error, what: &str) -> HandlerError {
    match e {
        crate::Error::Unroutable { reply_text, .. } => {
            HandlerError::dead_letter(format!("{what} routed to no queue ({reply_text})"))
        }
        other => HandlerError::retry(format!("{what} failed: {other}")),
    }
}

/// The control consumer's one explicit failure rule:
///
/// - an unreadable control message (no `x-schedule-*` headers) goes to
///   `acemq.schedule.due.dlq` at once, with the reason;
/// - a message that routes nowhere is tried again (250 ms doubling) and after `tries`
///   tries goes to `acemq.schedule.due.dlq`, with the reason;
/// - any other failure is transient: tried again with backoff (250 ms doubling to 30 s),
///   as long as it takes; never dropped, never a hot loop;
/// - a message caught by the consumer's close is handed back.
///
/// Every wait is in place (the consumer holds the message); the classic control queue has
/// no delivery count, so there is no crash-loop check.
#[derive(Clone, Debug)]
pub(crate) struct ControlRule {
    pub(crate) tries: u32,
}

impl Rule for ControlRule {
    fn crash_loop(&self, _facts: Facts) -> Option<Decision> {
        None
    }

    fn decide(&self, outcome: &Outcome, facts: Facts) -> Decision {
        let again = |spend| Decision::Again {
            wait: backoff(facts.attempt),
            spend,
        };
        match outcome {
            Outcome::Handled | Outcome::Duplicate => Decision::Ack,
            Outcome::InProgress | Outcome::StoreUnavailable { .. } => again(false),
            Outcome::Undecodable(reason) => Decision::DeadLetter {
                reason: bounded(format!(
                    "the scheduler could not read the message: {reason}"
                )),
                kind: DeadLetterKind::Unprocessable,
            },
            Outcome::Failed(e) => match e.kind {
                Kind::Fatal | Kind::Park => Decision::DeadLetter {
                    reason: bounded(format!(
                        "the scheduler could not read the message: {}",
                        e.reason
                    )),
                    kind: DeadLetterKind::Unprocessable,
                },
                Kind::DeadLetter if facts.attempt >= self.tries => Decision::DeadLetter {
                    reason: bounded(format!(
                        "undeliverable after {} tries: {}",
                        facts.attempt, e.reason
                    )),
                    kind: DeadLetterKind::Exhausted,
                },
                Kind::DeadLetter | Kind::Retry => again(true),
                Kind::Release => Decision::Release,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(attempt: u32) -> Facts {
        Facts {
            attempt,
            age: None,
            returned: 0,
            redelivered: false,
        }
    }

    #[test]
    fn the_failure_rule() {
        let rule = ControlRule { tries: 3 };
        let unroutable = Outcome::Failed(HandlerError::dead_letter("nowhere"));
        assert_eq!(
            rule.decide(&unroutable, facts(1)),
            Decision::Again {
                wait: Duration::from_millis(250),
                spend: true
            }
        );
        assert_eq!(
            rule.decide(&unroutable, facts(2)),
            Decision::Again {
                wait: Duration::from_millis(500),
                spend: true
            }
        );
        assert!(matches!(
            rule.decide(&unroutable, facts(3)),
            Decision::DeadLetter { reason, .. } if reason == "undeliverable after 3 tries: nowhere"
        ));
        let unreadable = Outcome::Failed(HandlerError::fatal("x-schedule-due-at is missing"));
        assert!(matches!(
            rule.decide(&unreadable, facts(1)),
            Decision::DeadLetter { reason, kind: DeadLetterKind::Unprocessable }
                if reason.contains("x-schedule-due-at is missing")
        ));
        // Transient: never dead-lettered, the wait grows to 30 s and stays there.
        let transient = Outcome::Failed(HandlerError::retry("connection lost"));
        assert_eq!(
            rule.decide(&transient, facts(1_000)),
            Decision::Again {
                wait: RETRY_MAX,
                spend: true
            }
        );
        assert_eq!(
            rule.decide(&Outcome::Failed(HandlerError::release()), facts(1)),
            Decision::Release
        );
        assert_eq!(rule.decide(&Outcome::Handled, facts(1)), Decision::Ack);
        assert_eq!(rule.crash_loop(facts(99)), None);
    }
}
