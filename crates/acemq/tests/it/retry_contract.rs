//! The retry policy and the topology names against the family's `contract-fixtures.json`
//! (`docs/wire.md` §4 and §5).
//!
//! The fixtures are read from the directory in `ACEMQ_FAMILY_FIXTURES` (CI sets it); a
//! missing file there is a failure. Without the variable, `../../../shared/fixtures`
//! relative to this crate is used when it exists; otherwise each test prints a note and
//! passes vacuously. Fixtures are never copied into the repository.

use crate::contract;

use std::time::Duration;

use acemq::retry::{DEFAULT_BROKER_WAIT_THRESHOLD, RetryPolicy};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::Value;

use contract::*;

#[test]
fn the_how_parser_reads_every_form() {
    assert_eq!(parse_policy("none()"), RetryPolicy::none());
    assert_eq!(
        parse_policy("fixed(4, 30s)"),
        RetryPolicy::fixed(4, Duration::from_secs(30)).unwrap()
    );
    assert_eq!(
        parse_policy("exponential(5, 1s, 24h).giveUpAfter(2m)"),
        RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(86_400))
            .unwrap()
            .give_up_after(Duration::from_secs(120))
    );
    assert_eq!(
        parse_policy("exponential(5, 100ms, 1.5, 1m).waitInBrokerFrom(0).withJitter(0.5)"),
        RetryPolicy::exponential_with_multiplier(5, ms(100), 1.5, Duration::from_secs(60))
            .unwrap()
            .wait_in_broker_from(Duration::ZERO)
            .with_jitter(0.5)
            .unwrap()
    );
}

// ---------------------------------------------------------------------------------------
// retrySchedules
// ---------------------------------------------------------------------------------------

#[test]
fn retry_schedules() {
    let Some(doc) = fixtures() else { return };
    assert_eq!(
        u64_of(&doc, "defaultBrokerWaitThresholdMillis"),
        DEFAULT_BROKER_WAIT_THRESHOLD.as_millis() as u64
    );
    let schedules = doc
        .get("retrySchedules")
        .and_then(Value::as_array)
        .expect("retrySchedules");
    assert!(!schedules.is_empty());
    let mut rng = StdRng::seed_from_u64(0xACE);
    for case in schedules {
        let name = str_of(case, "name");
        let how = str_of(case, "how");
        let policy = parse_policy(how);
        let ctx = format!("{name} ({how})");

        assert_eq!(
            u64::from(policy.max_attempts()),
            u64_of(case, "maxAttempts"),
            "{ctx}"
        );
        assert_eq!(
            policy.jitter_factor(),
            f64_of(case, "jitterFactor"),
            "{ctx}"
        );
        assert_eq!(
            policy.broker_wait_threshold().as_millis(),
            u128::from(u64_of(case, "brokerWaitThresholdMillis")),
            "{ctx}"
        );
        assert_eq!(
            policy.max_message_age().as_millis(),
            u128::from(u64_of(case, "maxMessageAgeMillis")),
            "{ctx}"
        );
        assert_eq!(
            !policy.max_message_age().is_zero(),
            bool_of(case, "hasMaxMessageAge"),
            "{ctx}"
        );

        let schedule = policy.schedule();
        assert_eq!(
            as_millis(&schedule),
            millis_list(case, "scheduleMillis"),
            "{ctx}"
        );
        assert_eq!(
            schedule.len() as u64,
            u64::from(policy.max_attempts() - 1),
            "{ctx}"
        );
        assert_eq!(
            as_millis(&policy.broker_rungs()),
            millis_list(case, "brokerRungDelaysMillis"),
            "{ctx}"
        );
        // The rungs are exactly the distinct schedule entries that wait in the broker.
        let mut expected_rungs: Vec<Duration> = Vec::new();
        for d in &schedule {
            if policy.waits_in_broker(*d) && !expected_rungs.contains(d) {
                expected_rungs.push(*d);
            }
        }
        assert_eq!(policy.broker_rungs(), expected_rungs, "{ctx}");

        // Doubling and capping, checked arithmetically for the exponential ones.
        if how.starts_with("exponential(") {
            let calls = parse_calls(how);
            let max = parse_duration(&calls[0].1[2]).as_millis();
            for pair in schedule.windows(2) {
                assert_eq!(
                    pair[1].as_millis(),
                    (pair[0].as_millis() * 2).min(max),
                    "{ctx}"
                );
            }
        }

        for decision in array_of(case, "decisions") {
            let attempt = u32::try_from(u64_of(decision, "attempt")).unwrap();
            let age = ms(u64_of(decision, "messageAgeMillis"));
            let retries = bool_of(decision, "retries");
            let dctx = format!("{ctx}: attempt {attempt} at age {age:?}");
            let wait = policy.next_wait_with(&mut rng, attempt, Some(age));
            assert_eq!(wait.is_some(), retries, "{dctx}");
            assert_eq!(
                policy.next_wait(attempt, Some(age)).is_some(),
                retries,
                "{dctx}"
            );
            assert_eq!(
                policy.next_delay(attempt, Some(age)).is_some(),
                retries,
                "{dctx}"
            );
            if let Some(wait) = wait {
                let index = (attempt as usize - 1).min(schedule.len() - 1);
                let scheduled = schedule[index];
                assert_eq!(wait.in_broker, policy.waits_in_broker(scheduled), "{dctx}");
                if wait.in_broker {
                    assert_eq!(wait.delay, scheduled, "{dctx}");
                } else {
                    let f = policy.jitter_factor();
                    let lo = scheduled.mul_f64(1.0 - f).max(ms(1));
                    let hi = scheduled.mul_f64(1.0 + f).max(ms(1));
                    assert!(
                        wait.delay >= lo && wait.delay <= hi,
                        "{dctx}: {:?} outside [{lo:?}, {hi:?}]",
                        wait.delay
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// maxMessageAge
// ---------------------------------------------------------------------------------------

#[test]
fn max_message_age() {
    let Some(doc) = fixtures() else { return };
    let s = section(&doc, "maxMessageAge");
    let default = u128::from(u64_of(s, "defaultMillis"));
    let secs = Duration::from_secs;
    for policy in [
        RetryPolicy::none(),
        RetryPolicy::fixed(3, secs(1)).unwrap(),
        RetryPolicy::exponential(3, secs(1), secs(10)).unwrap(),
        RetryPolicy::exponential_with_multiplier(3, secs(1), 3.0, secs(10)).unwrap(),
    ] {
        assert_eq!(policy.max_message_age().as_millis(), default, "{policy}");
    }
    assert!(bool_of(s, "zeroMeansNoLimit"));

    let base = RetryPolicy::exponential(5, secs(1), secs(86_400)).unwrap();
    let cases = array_of(s, "cases");
    assert!(!cases.is_empty());
    for case in cases {
        let policy = base.give_up_after(ms(u64_of(case, "maxMessageAgeMillis")));
        let age = ms(u64_of(case, "messageAgeMillis"));
        assert_eq!(
            policy.next_wait(1, Some(age)).is_some(),
            bool_of(case, "retries"),
            "{policy} at age {age:?}"
        );
        // An unknown age counts as young enough, whatever the limit.
        assert_eq!(
            policy.next_wait(1, None).is_some(),
            bool_of(s, "unknownAgeRetries"),
            "{policy} at an unknown age"
        );
    }
}

// ---------------------------------------------------------------------------------------
// brokerWaitThreshold
// ---------------------------------------------------------------------------------------

#[test]
fn broker_wait_threshold() {
    let Some(doc) = fixtures() else { return };
    let s = section(&doc, "brokerWaitThreshold");
    assert_eq!(
        u128::from(u64_of(s, "defaultMillis")),
        DEFAULT_BROKER_WAIT_THRESHOLD.as_millis()
    );
    let cases = array_of(s, "cases");
    assert!(!cases.is_empty());
    for case in cases {
        let threshold = ms(u64_of(case, "thresholdMillis"));
        let delay = ms(u64_of(case, "delayMillis"));
        let policy = RetryPolicy::none().wait_in_broker_from(threshold);
        assert_eq!(
            policy.waits_in_broker(delay),
            bool_of(case, "waitsInBroker"),
            "threshold {threshold:?}, delay {delay:?}"
        );
        // And through a schedule: a fixed policy of that delay waits where the rule says,
        // and has a rung exactly when it waits in the broker.
        let fixed = RetryPolicy::fixed(2, delay)
            .unwrap()
            .wait_in_broker_from(threshold);
        let wait = fixed.next_wait(1, None).unwrap();
        assert_eq!(wait.in_broker, bool_of(case, "waitsInBroker"));
        assert_eq!(fixed.broker_rungs().is_empty(), !wait.in_broker);
    }
}

// ---------------------------------------------------------------------------------------
// jitter
// ---------------------------------------------------------------------------------------

fn named_schedule<'a>(doc: &'a Value, name: &str) -> &'a Value {
    array_of(doc, "retrySchedules")
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no retrySchedules entry named {name:?}"))
}

#[test]
fn jitter() {
    let Some(doc) = fixtures() else { return };
    let s = section(&doc, "jitter");
    let policy = parse_policy(str_of(named_schedule(&doc, str_of(s, "policy")), "how"));
    let factor = f64_of(s, "factor");
    let (min_mult, max_mult) = (f64_of(s, "minMultiplier"), f64_of(s, "maxMultiplier"));
    let floor = ms(u64_of(s, "flooredAtMillis"));
    assert_eq!(policy.jitter_factor(), factor);
    assert!(bool_of(s, "appliesInBothDirections"));
    assert!((min_mult - (1.0 - factor)).abs() < 1e-9);
    assert!((max_mult - (1.0 + factor)).abs() < 1e-9);
    assert!(bool_of(s, "appliesToConsumerWaits"));
    assert!(!bool_of(s, "appliesToBrokerWaits"));

    // Consumer waits: every attempt of the policy, 5,000 samples each.
    const SAMPLES: usize = 5_000;
    let schedule = policy.schedule();
    let mut rng = StdRng::seed_from_u64(20_240_601);
    for (index, &scheduled) in schedule.iter().enumerate() {
        assert!(!policy.waits_in_broker(scheduled));
        let attempt = u32::try_from(index + 1).unwrap();
        let d = scheduled.as_secs_f64();
        let (lo, hi) = (d * min_mult, d * max_mult);
        let band = (hi - lo) * 0.05;
        let (mut low_band, mut high_band, mut sum) = (0usize, 0usize, 0.0f64);
        for i in 0..SAMPLES {
            // Half from a seeded generator, half from the thread-local one.
            let wait = if i % 2 == 0 {
                policy.next_wait_with(&mut rng, attempt, None)
            } else {
                policy.next_wait(attempt, None)
            }
            .unwrap();
            assert!(!wait.in_broker);
            let w = wait.delay.as_secs_f64();
            assert!(
                w >= lo - 1e-9 && w <= hi + 1e-9,
                "attempt {attempt}: {w}s outside [{lo}, {hi}]"
            );
            assert!(wait.delay >= floor);
            low_band += usize::from(w <= lo + band);
            high_band += usize::from(w >= hi - band);
            sum += w;
        }
        assert!(
            low_band > 0,
            "attempt {attempt}: lower 5% band never reached"
        );
        assert!(
            high_band > 0,
            "attempt {attempt}: upper 5% band never reached"
        );
        let mean = sum / SAMPLES as f64;
        assert!(
            (mean - d).abs() <= d * 0.02,
            "attempt {attempt}: mean {mean}s is not within 2% of {d}s"
        );
    }

    // The floor, for a tiny delay, at the fixture's factor and at the widest one.
    for jitter in [factor, 1.0] {
        for delay in [Duration::ZERO, ms(1)] {
            let tiny = RetryPolicy::fixed(3, delay)
                .unwrap()
                .with_jitter(jitter)
                .unwrap();
            for _ in 0..SAMPLES {
                let wait = tiny.next_wait_with(&mut rng, 1, None).unwrap();
                assert!(!wait.in_broker);
                assert!(wait.delay >= floor, "{tiny}: {:?}", wait.delay);
            }
        }
    }

    // Broker waits are exactly the schedule, however wide the jitter.
    let capped = parse_policy(str_of(named_schedule(&doc, "exponential-capped"), "how"));
    for jitter in [capped.jitter_factor(), 1.0] {
        let capped = capped.with_jitter(jitter).unwrap();
        let schedule = capped.schedule();
        let mut broker_waits = 0;
        for (index, &scheduled) in schedule.iter().enumerate() {
            if !capped.waits_in_broker(scheduled) {
                continue;
            }
            let attempt = u32::try_from(index + 1).unwrap();
            for _ in 0..1_000 {
                let wait = capped.next_wait_with(&mut rng, attempt, None).unwrap();
                assert!(wait.in_broker);
                assert_eq!(wait.delay, scheduled);
                broker_waits += 1;
            }
        }
        assert!(broker_waits > 0, "the capped policy has broker waits");
    }
}

// ---------------------------------------------------------------------------------------
