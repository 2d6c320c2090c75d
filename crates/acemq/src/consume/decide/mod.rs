//! The settlement rules (wire.md §5–§6), as pure functions: what happened to a delivery,
//! its attempt and age, and the consumer's policy → one [`Decision`].
//!
//! Nothing here is async or does I/O; the only thing drawn from outside is the jitter of a
//! consumer wait, from a random number generator the caller passes in. Carrying a decision
//! out (publishing copies, acking) is the job of `consume::settle`.
//!
//! Two rules are about faults that are not the message's:
//!
//! - **Our own outages spend no attempt.** An idempotency store that cannot be asked gives
//!   [`Decision::StoreUnavailable`]: the delivery waits ([`store_backoff`]: 250 ms doubling
//!   to 30 s, by the consumer's consecutive store failures) and is put back on its queue
//!   with its attempt unchanged, like an in-progress wait; it is never dead-lettered for it.
//! - **Crash loops end.** On a quorum queue the broker counts in `x-delivery-count` how
//!   often this message came back without a settlement (a consumer that crashed, was killed
//!   or lost its connection; on RabbitMQ before 4.3 also every requeue). Those deliveries
//!   count as attempts: the attempt the rules use is `x-acemq-attempt + x-delivery-count`,
//!   and a delivery whose count already uses up the policy's attempts is dead-lettered
//!   before its handler runs ([`crash_loop`]). Without a policy nothing ends a crash loop
//!   (a failing message is retried forever anyway); the broker-side backstop is a
//!   `delivery-limit` policy (docs/wire.md §6). On a classic queue only the redelivered
//!   flag is known, which says "at least once before" but not how often: it changes
//!   nothing.

use std::time::Duration;

use rand::Rng;

use super::handler::{HandlerError, Kind};
use crate::envelope::Envelope;
use crate::headers::HeaderValue;
use crate::retry::{RetryPolicy, Wait};
use crate::topology::render_delay;
use crate::transport::Delivery;

/// Reason texts are cut to this many bytes (with a marker) so a republish never outgrows
/// the broker's frame size.
pub const MAX_REASON_BYTES: usize = 4096;

/// The default wait between attempts when a consumer has no retry policy: a failing
/// message is retried after this fixed delay, forever (`docs/wire.md` §6).
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
    /// The idempotency store could not be asked: our outage, not the message's failure.
    /// `failures` counts the consumer's consecutive failed store calls, this one included.
    StoreUnavailable {
        /// Consecutive failed store calls (at least 1).
        failures: u32,
    },
}

/// Why a message goes to `{q}.dlq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeadLetterKind {
    /// The policy gave up (attempts or age): outcome `dead_lettered`.
    Exhausted,
    /// The handler said it is unprocessable: outcome `rejected`.
    Unprocessable,
    /// The handler asked for it: outcome `dead_lettered`.
    Requested,
}

/// The broker outcome chosen for one delivery.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Decision {
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
    /// The idempotency store could not be asked (our outage): wait, then republish to the
    /// same queue with the attempt unchanged, like [`Decision::InProgress`] (no attempt
    /// spent, never dead-lettered); the wait is [`store_backoff`].
    StoreUnavailable(Duration),
    /// Run the handler again in place after the wait, holding the delivery and its slot
    /// (nothing behind it is handed over): an ordered partition's or a stream's retry.
    /// `spend`: whether the next run is a new attempt (not after an in-progress claim or
    /// a store outage).
    Again {
        /// The wait before the next run.
        wait: Duration,
        /// Whether the next run counts as another attempt.
        spend: bool,
    },
    /// Halt: hold the delivery unacked until the consumer is told to resume (an ordered
    /// partition), then run it again from attempt 1.
    Hold {
        /// Why (the last failure).
        reason: String,
    },
    /// Ack it without handling it and go on (a stream reader that skips failures).
    Skip {
        /// Why it was not handled.
        reason: String,
    },
    /// Stop the consumer at this delivery, leaving it unsettled (a stream reader).
    Stop {
        /// Why.
        reason: String,
    },
}

/// The first wait of a delivery put back because the idempotency store could not be asked.
pub(crate) const STORE_RETRY_INITIAL: Duration = Duration::from_millis(250);

/// The longest wait of a delivery put back because the idempotency store could not be asked.
pub(crate) const STORE_RETRY_MAX: Duration = Duration::from_secs(30);

/// The wait after the consumer's `failures`-th consecutive failed idempotency store call:
/// [`STORE_RETRY_INITIAL`] doubling per failure, capped at [`STORE_RETRY_MAX`]
/// (`the_store_backoff_doubles_to_thirty_seconds` in the tests pins it).
pub(crate) fn store_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    STORE_RETRY_INITIAL
        .saturating_mul(1u32 << doublings)
        .min(STORE_RETRY_MAX)
}

/// A consumer's settlement rules: its policy and the two waits that are not the policy's.
#[derive(Clone, Debug)]
pub(crate) struct Rules {
    /// The retry policy (`None`: retry every `no_policy_delay`, forever).
    pub(crate) policy: Option<RetryPolicy>,
    /// The wait between attempts without a policy.
    pub(crate) no_policy_delay: Duration,
    /// The wait before republishing a delivery claimed elsewhere.
    pub(crate) in_progress_delay: Duration,
}

/// The quorum queue header counting how often a message came back without a settlement.
pub(crate) const DELIVERY_COUNT: &str = "x-delivery-count";

/// What the rules read from a delivery: its attempt (`x-acemq-attempt`, 1 for the first
/// delivery), its age since the first publish (`None` when unknown), how often the broker
/// says this message came back without a settlement (`x-delivery-count` on quorum queues,
/// 0 when absent) and its redelivered flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    pub(crate) attempt: u32,
    pub(crate) age: Option<Duration>,
    pub(crate) returned: u32,
    pub(crate) redelivered: bool,
}

impl Facts {
    /// Reads the attempt and age (now minus first-seen) of an envelope; nothing about the
    /// broker's redeliveries.
    pub(crate) fn of(envelope: &Envelope) -> Facts {
        Facts {
            attempt: u32::try_from(envelope.attempt()).unwrap_or(1),
            age: envelope.age(),
            returned: 0,
            redelivered: false,
        }
    }

    /// Reads an envelope and the broker's redelivery facts of its delivery.
    pub(crate) fn of_delivery(envelope: &Envelope, d: &Delivery) -> Facts {
        let returned = d
            .properties
            .headers
            .get(DELIVERY_COUNT)
            .and_then(HeaderValue::as_i64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0);
        Facts {
            returned,
            redelivered: d.redelivered,
            ..Facts::of(envelope)
        }
    }

    /// The attempt the rules use: the envelope's attempt plus the deliveries the broker
    /// counted that ended without a settlement (crashes count as attempts).
    pub(crate) fn spent(&self) -> u32 {
        self.attempt.saturating_add(self.returned)
    }
}

/// Crash-loop protection, checked before anything else runs: a delivery whose unsettled
/// returns (`x-delivery-count`) already use up the policy's attempts is dead-lettered
/// without running its handler. `None`: go ahead. Without a policy, or without a count
/// (classic queues: the redelivered flag alone says nothing about how often), never.
pub(crate) fn crash_loop(facts: Facts, rules: &Rules) -> Option<Decision> {
    let policy = rules.policy.as_ref()?;
    if facts.returned == 0 || facts.spent() <= policy.max_attempts() {
        return None;
    }
    Some(Decision::DeadLetter {
        reason: bounded(format!(
            "exhausted {} attempts: delivered {} times without a settlement (the consumer crashed or lost its connection)",
            policy.max_attempts(),
            facts.returned
        )),
        kind: DeadLetterKind::Exhausted,
    })
}

/// Decides a delivery's fate from what happened, its attempt and age, and the rules.
pub(crate) fn decide<R: Rng + ?Sized>(
    outcome: &Outcome,
    facts: Facts,
    rules: &Rules,
    rng: &mut R,
) -> Decision {
    match outcome {
        Outcome::Handled => Decision::Ack,
        Outcome::Duplicate => Decision::Duplicate,
        Outcome::InProgress => Decision::InProgress(rules.in_progress_delay),
        Outcome::StoreUnavailable { failures } => {
            Decision::StoreUnavailable(store_backoff(*failures))
        }
        Outcome::Undecodable(e) => Decision::Park {
            reason: bounded(format!("could not be decoded: {e}")),
        },
        Outcome::Failed(err) => match err.kind {
            Kind::Retry => failure(
                &err.reason,
                Facts {
                    attempt: facts.spent(),
                    ..facts
                },
                rules.policy.as_ref(),
                rules.no_policy_delay,
                rng,
            ),
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
/// family's reason text. Without a policy: retry after `no_policy_delay`, forever. The
/// attempt and age are the envelope's.
pub(crate) fn failure<R: Rng + ?Sized>(
    error: &str,
    Facts { attempt, age, .. }: Facts,
    policy: Option<&RetryPolicy>,
    no_policy_delay: Duration,
    rng: &mut R,
) -> Decision {
    let Some(policy) = policy else {
        return Decision::Retry(Wait {
            delay: no_policy_delay,
            in_broker: false,
        });
    };
    if let Some(wait) = policy.next_wait_with(rng, attempt, age) {
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

/// Whether an ordinary failure of a delivery with this envelope would be retried under
/// `policy` (`None`: no policy, which a plain consumer retries forever). A responder asks
/// before it answers a failure: the last one goes back to the requester as a fault reply.
pub(crate) fn retried_under(policy: Option<&RetryPolicy>, envelope: &Envelope) -> bool {
    let facts = Facts::of(envelope);
    policy.is_none_or(|p| {
        p.next_wait_with(&mut rand::rng(), facts.spent(), facts.age)
            .is_some()
    })
}

/// Cuts a reason to [`MAX_REASON_BYTES`] on a character boundary, with a marker.
pub(crate) fn bounded(reason: String) -> String {
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

mod in_place;
pub(crate) use in_place::{Final, InPlace};

#[cfg(test)]
mod tests;
