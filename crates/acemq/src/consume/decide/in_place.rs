//! The rule of consumers whose order a republish would break (an ordered partition, a
//! stream reader): a failure is retried in place, the delivery held and nothing behind it
//! handed over, and what happens after the last attempt is the consumer's [`Final`]
//! step. Nothing is ever put on a rung or back on the queue.
//!
//! The retries follow the consumer's policy (every wait in the consumer, whatever its
//! broker threshold); without a policy a failure is final at once. The crash-loop guard
//! is the plain consumer's: deliveries the broker counted without a settlement
//! (`x-delivery-count`) count as attempts, and one that has used them all goes to the
//! final step without running.

use std::time::Duration;

use rand::Rng;

use super::{
    DeadLetterKind, Decision, Facts, Outcome, bounded, crash_loop, failure, store_backoff,
};
use crate::consume::handler::Kind;
use crate::retry::RetryPolicy;

/// What the last failure of an in-place consumer comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Final {
    /// Halt and hold the message until resumed (an ordered partition's `Stop`).
    Halt,
    /// Dead-letter it to `{q}.dlq` with the reason, prefixed, and go on (an ordered
    /// partition's `Skip`).
    DeadLetter {
        /// Put before the reason, e.g. `skipped by ordered queue ledger`.
        prefix: String,
    },
    /// Ack it unhandled and go on (a stream reader that skips failures).
    Skip,
    /// Stop the consumer there (a stream reader).
    Stop,
}

/// The in-place rule: the policy whose attempts are run in place, the final step, and the
/// wait before running again a delivery whose id another consumer holds.
#[derive(Clone, Debug)]
pub(crate) struct InPlace {
    pub(crate) policy: Option<RetryPolicy>,
    pub(crate) last: Final,
    pub(crate) in_progress_delay: Duration,
    /// Whether an undecodable body is parked in `{q}.parked` (a queue) instead of taking
    /// the final step (a stream, which has no companions).
    pub(crate) parks: bool,
}

impl InPlace {
    /// Crash-loop protection: what [`crash_loop`] dead-letters takes the final step instead.
    pub(crate) fn crash_loop(&self, facts: Facts) -> Option<Decision> {
        let rules = super::Rules {
            policy: self.policy.clone(),
            no_policy_delay: Duration::ZERO,
            in_progress_delay: self.in_progress_delay,
        };
        match crash_loop(facts, &rules)? {
            Decision::DeadLetter { reason, .. } => Some(self.last(reason)),
            other => Some(other),
        }
    }

    /// The fate of a delivery.
    pub(crate) fn decide<R: Rng + ?Sized>(
        &self,
        outcome: &Outcome,
        facts: Facts,
        rng: &mut R,
    ) -> Decision {
        match outcome {
            Outcome::Handled => Decision::Ack,
            Outcome::Duplicate => Decision::Duplicate,
            Outcome::InProgress => Decision::Again {
                wait: self.in_progress_delay,
                spend: false,
            },
            Outcome::StoreUnavailable { failures } => Decision::Again {
                wait: store_backoff(*failures),
                spend: false,
            },
            Outcome::Undecodable(e) if self.parks => Decision::Park {
                reason: bounded(format!("could not be decoded: {e}")),
            },
            Outcome::Undecodable(e) => self.last(format!("could not be decoded: {e}")),
            Outcome::Failed(err) => match err.kind {
                Kind::Retry => self.retry(&err.reason, facts, rng),
                Kind::Fatal => self.last(format!(
                    "the handler reported an unprocessable message: {}",
                    err.reason
                )),
                Kind::DeadLetter if self.parks => Decision::DeadLetter {
                    reason: bounded(format!(
                        "the handler dead-lettered the message: {}",
                        err.reason
                    )),
                    kind: DeadLetterKind::Requested,
                },
                Kind::Park if self.parks => Decision::Park {
                    reason: bounded(format!("the handler parked the message: {}", err.reason)),
                },
                Kind::DeadLetter | Kind::Park => self.last(err.reason.clone()),
                // Handing back would let what is behind it overtake it: wait in place.
                Kind::Release => Decision::Again {
                    wait: self.in_progress_delay,
                    spend: false,
                },
            },
        }
    }

    /// An ordinary failure: the policy's next wait, in place; the final step once it gives
    /// up (or at once without a policy).
    fn retry<R: Rng + ?Sized>(&self, reason: &str, facts: Facts, rng: &mut R) -> Decision {
        let Some(policy) = &self.policy else {
            return self.last(reason.to_owned());
        };
        let facts = Facts {
            attempt: facts.spent(),
            ..facts
        };
        match failure(reason, facts, Some(policy), Duration::ZERO, rng) {
            Decision::Retry(wait) => Decision::Again {
                wait: wait.delay,
                spend: true,
            },
            Decision::DeadLetter { reason, .. } => self.last(reason),
            other => other,
        }
    }

    /// The final step, with `reason`.
    fn last(&self, reason: String) -> Decision {
        match &self.last {
            Final::Halt => Decision::Hold {
                reason: bounded(reason),
            },
            Final::DeadLetter { prefix } => Decision::DeadLetter {
                reason: bounded(format!("{prefix}: {reason}")),
                kind: DeadLetterKind::Exhausted,
            },
            Final::Skip => Decision::Skip {
                reason: bounded(reason),
            },
            Final::Stop => Decision::Stop {
                reason: bounded(reason),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consume::HandlerError;

    fn facts(attempt: u32, returned: u32) -> Facts {
        Facts {
            attempt,
            age: None,
            returned,
            redelivered: returned > 0,
        }
    }

    fn rule(policy: Option<RetryPolicy>, last: Final) -> InPlace {
        InPlace {
            policy,
            last,
            in_progress_delay: Duration::from_secs(5),
            parks: true,
        }
    }

    #[test]
    fn without_a_policy_a_failure_is_final_at_once() {
        let r = rule(None, Final::Halt);
        let failed = Outcome::Failed(HandlerError::retry("boom"));
        assert_eq!(
            r.decide(&failed, facts(1, 0), &mut rand::rng()),
            Decision::Hold {
                reason: "boom".into()
            }
        );
        let skip = rule(
            None,
            Final::DeadLetter {
                prefix: "skipped by ordered queue q".into(),
            },
        );
        assert_eq!(
            skip.decide(&failed, facts(1, 0), &mut rand::rng()),
            Decision::DeadLetter {
                reason: "skipped by ordered queue q: boom".into(),
                kind: DeadLetterKind::Exhausted
            }
        );
    }

    #[test]
    fn a_policy_retries_in_place_then_takes_the_final_step() {
        let policy = RetryPolicy::fixed(3, Duration::from_secs(60)).expect("policy");
        let r = rule(Some(policy), Final::Stop);
        let failed = Outcome::Failed(HandlerError::retry("boom"));
        // A broker-sized wait is still waited in place.
        assert_eq!(
            r.decide(&failed, facts(1, 0), &mut rand::rng()),
            Decision::Again {
                wait: Duration::from_secs(60),
                spend: true
            }
        );
        assert!(matches!(
            r.decide(&failed, facts(3, 0), &mut rand::rng()),
            Decision::Stop { reason } if reason == "exhausted 3 attempts: boom"
        ));
        // Crashes count as attempts.
        assert!(matches!(
            r.decide(&failed, facts(2, 1), &mut rand::rng()),
            Decision::Stop { .. }
        ));
    }

    #[test]
    fn claims_and_outages_wait_in_place_without_spending_an_attempt() {
        let r = rule(None, Final::Halt);
        assert_eq!(
            r.decide(&Outcome::InProgress, facts(1, 0), &mut rand::rng()),
            Decision::Again {
                wait: Duration::from_secs(5),
                spend: false
            }
        );
        assert_eq!(
            r.decide(
                &Outcome::StoreUnavailable { failures: 1 },
                facts(1, 0),
                &mut rand::rng()
            ),
            Decision::Again {
                wait: store_backoff(1),
                spend: false
            }
        );
        assert_eq!(
            r.decide(
                &Outcome::Failed(HandlerError::release()),
                facts(1, 0),
                &mut rand::rng()
            ),
            Decision::Again {
                wait: Duration::from_secs(5),
                spend: false
            }
        );
    }

    #[test]
    fn a_stream_has_no_companions_so_undecodable_takes_the_final_step() {
        let mut r = rule(None, Final::Skip);
        r.parks = false;
        assert!(matches!(
            r.decide(&Outcome::Undecodable("bad".into()), facts(1, 0), &mut rand::rng()),
            Decision::Skip { reason } if reason == "could not be decoded: bad"
        ));
        assert!(matches!(
            r.decide(
                &Outcome::Failed(HandlerError::park("no")),
                facts(1, 0),
                &mut rand::rng()
            ),
            Decision::Skip { .. }
        ));
    }

    #[test]
    fn a_crash_loop_takes_the_final_step_without_running() {
        let policy = RetryPolicy::fixed(2, Duration::from_secs(1)).expect("policy");
        let r = rule(Some(policy), Final::Halt);
        assert_eq!(r.crash_loop(facts(1, 1)), None);
        assert!(matches!(
            r.crash_loop(facts(1, 2)),
            Some(Decision::Hold { reason }) if reason.starts_with("exhausted 2 attempts")
        ));
        assert_eq!(rule(None, Final::Halt).crash_loop(facts(1, 9)), None);
    }
}
