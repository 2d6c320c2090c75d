//! The settlement rules as a table: no broker, no runtime, no clock (attempt and age are inputs,
//! the jitter generator is seeded and the policies used here have none anyway).

use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

const S: fn(u64) -> Duration = Duration::from_secs;

fn retry_in_consumer(secs: u64) -> Decision {
    Decision::Retry(Wait {
        delay: S(secs),
        in_broker: false,
    })
}

fn retry_in_broker(secs: u64) -> Decision {
    Decision::Retry(Wait {
        delay: S(secs),
        in_broker: true,
    })
}

fn dead_letter(reason: &str, kind: DeadLetterKind) -> Decision {
    Decision::DeadLetter {
        reason: reason.into(),
        kind,
    }
}

fn failed(e: HandlerError) -> impl Fn() -> Outcome {
    let (kind, reason) = (e.kind, e.reason);
    move || {
        Outcome::Failed(HandlerError {
            kind,
            reason: reason.clone(),
        })
    }
}

#[test]
fn the_settlement_rules_as_a_table() {
    let fixed_1s = RetryPolicy::fixed(3, S(1)).unwrap();
    let fixed_60s = RetryPolicy::fixed(3, S(60)).unwrap();
    let aged = RetryPolicy::fixed(5, S(1)).unwrap().give_up_after(S(10));
    let none = RetryPolicy::none();
    type Make = Box<dyn Fn() -> Outcome>;
    // (what happened, attempt, age, policy, expected decision)
    type Row<'a> = (
        Make,
        u32,
        Option<Duration>,
        Option<&'a RetryPolicy>,
        Decision,
    );
    let table: Vec<Row<'_>> = vec![
        (
            Box::new(|| Outcome::Handled),
            1,
            None,
            Some(&fixed_1s),
            Decision::Ack,
        ),
        (
            Box::new(|| Outcome::Handled),
            9,
            Some(S(99)),
            Some(&aged),
            Decision::Ack,
        ),
        (
            Box::new(|| Outcome::Duplicate),
            1,
            None,
            None,
            Decision::Duplicate,
        ),
        (
            Box::new(|| Outcome::InProgress),
            3,
            None,
            Some(&fixed_1s),
            Decision::InProgress(S(7)),
        ),
        // Our store's outage: no attempt spent, whatever the attempt or policy.
        (
            Box::new(|| Outcome::StoreUnavailable { failures: 1 }),
            3,
            None,
            Some(&fixed_1s),
            Decision::StoreUnavailable(Duration::from_millis(250)),
        ),
        (
            Box::new(|| Outcome::StoreUnavailable { failures: 4 }),
            1,
            Some(S(99)),
            Some(&aged),
            Decision::StoreUnavailable(S(2)),
        ),
        (
            Box::new(|| Outcome::StoreUnavailable { failures: 99 }),
            1,
            None,
            None,
            Decision::StoreUnavailable(S(30)),
        ),
        (
            Box::new(|| Outcome::Undecodable("bad json".into())),
            1,
            None,
            Some(&fixed_1s),
            Decision::Park {
                reason: "could not be decoded: bad json".into(),
            },
        ),
        // Ordinary failures: the policy decides.
        (
            Box::new(failed(HandlerError::retry("boom"))),
            1,
            None,
            None,
            retry_in_consumer(5),
        ),
        (
            Box::new(failed(HandlerError::retry("boom"))),
            1000,
            Some(S(1 << 30)),
            None,
            retry_in_consumer(5),
        ),
        (
            Box::new(failed(HandlerError::retry("boom"))),
            1,
            None,
            Some(&fixed_1s),
            retry_in_consumer(1),
        ),
        (
            Box::new(failed(HandlerError::retry("boom"))),
            2,
            None,
            Some(&fixed_60s),
            retry_in_broker(60),
        ),
        (
            Box::new(failed(HandlerError::retry("boom"))),
            3,
            None,
            Some(&fixed_1s),
            dead_letter("exhausted 3 attempts: boom", DeadLetterKind::Exhausted),
        ),
        (
            Box::new(failed(HandlerError::retry("boom"))),
            2,
            Some(S(9)),
            Some(&aged),
            retry_in_consumer(1),
        ),
        (
            Box::new(failed(HandlerError::retry("boom"))),
            2,
            Some(S(11)),
            Some(&aged),
            dead_letter(
                "exceeded the maximum message age of 10s: boom",
                DeadLetterKind::Exhausted,
            ),
        ),
        (
            Box::new(failed(HandlerError::retry("boom"))),
            1,
            None,
            Some(&none),
            dead_letter("exhausted 1 attempts: boom", DeadLetterKind::Exhausted),
        ),
        // What the handler asked for, whatever the policy.
        (
            Box::new(failed(HandlerError::fatal("no such sku"))),
            1,
            None,
            Some(&fixed_1s),
            dead_letter(
                "the handler reported an unprocessable message: no such sku",
                DeadLetterKind::Unprocessable,
            ),
        ),
        (
            Box::new(failed(HandlerError::dead_letter("stop"))),
            1,
            None,
            None,
            dead_letter(
                "the handler dead-lettered the message: stop",
                DeadLetterKind::Requested,
            ),
        ),
        (
            Box::new(failed(HandlerError::park("later"))),
            2,
            None,
            Some(&fixed_1s),
            Decision::Park {
                reason: "the handler parked the message: later".into(),
            },
        ),
        (
            Box::new(failed(HandlerError::release())),
            3,
            None,
            Some(&fixed_1s),
            Decision::Release,
        ),
    ];
    let mut rng = StdRng::seed_from_u64(7);
    for (i, (outcome, attempt, age, policy, expected)) in table.into_iter().enumerate() {
        let rules = Rules {
            policy: policy.cloned(),
            no_policy_delay: S(5),
            in_progress_delay: S(7),
        };
        let facts = Facts {
            attempt,
            age,
            returned: 0,
            redelivered: false,
        };
        let got = decide(&outcome(), facts, &rules, &mut rng);
        assert_eq!(
            got, expected,
            "row {i}: attempt {attempt}, age {age:?}, policy {policy:?}"
        );
    }
}

#[test]
fn unsettled_returns_count_as_attempts() {
    let three = RetryPolicy::fixed(3, S(1)).unwrap();
    let crashed = |n: u32| {
        Some(dead_letter(
            &format!(
                "exhausted 3 attempts: delivered {n} times without a settlement (the consumer crashed or lost its connection)"
            ),
            DeadLetterKind::Exhausted,
        ))
    };
    // (attempt, x-delivery-count, redelivered, policy, before the handler runs, after
    // it failed with a retry)
    type Row<'a> = (
        u32,
        u32,
        bool,
        Option<&'a RetryPolicy>,
        Option<Decision>,
        Decision,
    );
    let table: Vec<Row<'_>> = vec![
        // A first delivery, and a classic queue's redelivery (flag, no count): as today.
        (1, 0, false, Some(&three), None, retry_in_consumer(1)),
        (1, 0, true, Some(&three), None, retry_in_consumer(1)),
        (3, 0, true, Some(&three), None, {
            dead_letter("exhausted 3 attempts: boom", DeadLetterKind::Exhausted)
        }),
        // Quorum queue: each unsettled return is an attempt.
        (1, 1, true, Some(&three), None, retry_in_consumer(1)),
        (
            1,
            2,
            true,
            Some(&three),
            None,
            dead_letter("exhausted 3 attempts: boom", DeadLetterKind::Exhausted),
        ),
        (1, 3, true, Some(&three), crashed(3), retry_in_consumer(1)),
        (2, 2, true, Some(&three), crashed(2), retry_in_consumer(1)),
        (1, 40, true, Some(&three), crashed(40), retry_in_consumer(1)),
        // Without a policy nothing ends a loop (the broker's delivery-limit may).
        (1, 40, true, None, None, retry_in_consumer(5)),
    ];
    let mut rng = StdRng::seed_from_u64(3);
    for (i, (attempt, returned, redelivered, policy, before, failed)) in
        table.into_iter().enumerate()
    {
        let rules = Rules {
            policy: policy.cloned(),
            no_policy_delay: S(5),
            in_progress_delay: S(5),
        };
        let facts = Facts {
            attempt,
            age: None,
            returned,
            redelivered,
        };
        assert_eq!(crash_loop(facts, &rules), before, "row {i}: before the run");
        if before.is_none() {
            let got = decide(
                &Outcome::Failed(HandlerError::retry("boom")),
                facts,
                &rules,
                &mut rng,
            );
            assert_eq!(got, failed, "row {i}: after a failure");
        }
    }
}

#[test]
fn the_store_backoff_doubles_to_thirty_seconds() {
    let waits: Vec<u64> = (0..10)
        .map(|n| store_backoff(n).as_millis() as u64)
        .collect();
    assert_eq!(
        waits,
        [250, 250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]
    );
    assert_eq!(store_backoff(u32::MAX), STORE_RETRY_MAX);
}

#[test]
fn every_reason_is_bounded() {
    let huge = "x".repeat(100_000);
    let rules = Rules {
        policy: Some(RetryPolicy::none()),
        no_policy_delay: S(5),
        in_progress_delay: S(5),
    };
    let mut rng = StdRng::seed_from_u64(1);
    let facts = Facts {
        attempt: 1,
        age: None,
        returned: 0,
        redelivered: false,
    };
    for e in [
        HandlerError::retry(&huge),
        HandlerError::fatal(&huge),
        HandlerError::dead_letter(&huge),
        HandlerError::park(&huge),
    ] {
        match decide(&Outcome::Failed(e), facts, &rules, &mut rng) {
            Decision::DeadLetter { reason, .. } | Decision::Park { reason } => {
                assert!(reason.len() <= MAX_REASON_BYTES, "{}", reason.len());
                assert!(reason.ends_with("... [truncated]"));
            }
            other => panic!("expected a move with a reason, got {other:?}"),
        }
    }
    let parked = decide(&Outcome::Undecodable(huge), facts, &rules, &mut rng);
    assert!(matches!(parked, Decision::Park { reason } if reason.len() <= MAX_REASON_BYTES));
}

#[test]
fn bounded_cuts_on_a_character_boundary() {
    let short = "é".repeat(10);
    assert_eq!(bounded(short.clone()), short);
    let cut = bounded("é".repeat(MAX_REASON_BYTES));
    assert!(cut.len() <= MAX_REASON_BYTES);
    assert!(cut.ends_with("... [truncated]"));
    assert_eq!(
        bounded("a".repeat(MAX_REASON_BYTES)).len(),
        MAX_REASON_BYTES
    );
}
