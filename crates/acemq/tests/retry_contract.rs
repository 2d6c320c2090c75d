//! The retry policy and the topology names against the family's `contract-fixtures.json`
//! (wire contract §4 and §5).
//!
//! The fixtures are read from the directory in `ACEMQ_FAMILY_FIXTURES` (CI sets it); a
//! missing file there is a failure. Without the variable, `../../../shared/fixtures`
//! relative to this crate is used when it exists; otherwise each test prints a note and
//! passes vacuously. Fixtures are never copied into the repository.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use acemq::headers::{HeaderValue, Headers};
use acemq::retry::{DEFAULT_BROKER_WAIT_THRESHOLD, RetryPolicy};
use acemq::topology::{
    DEAD_LETTER_EXCHANGE, ExchangeKind, QueueDecl, QueueType, RETRY_EXCHANGE, Topology,
    dead_letter_queue, dead_letter_queue_decl, parked_queue, parked_queue_decl, render_delay,
    retry_queue, rung_arguments, rung_decl,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value};

const FIXTURE_FILE: &str = "contract-fixtures.json";

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

/// The fixture document, or `None` (after a note) when no fixture directory is configured
/// or present.
fn fixtures() -> Option<Value> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = match std::env::var_os("ACEMQ_FAMILY_FIXTURES").filter(|v| !v.is_empty()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            // A relative directory may be meant from the test's working directory (the
            // crate) or from the workspace root, where CI runs cargo.
            let candidates: Vec<PathBuf> = if dir.is_absolute() {
                vec![dir.join(FIXTURE_FILE)]
            } else {
                vec![
                    dir.join(FIXTURE_FILE),
                    manifest.join("../..").join(&dir).join(FIXTURE_FILE),
                ]
            };
            match candidates.iter().find(|p| p.is_file()) {
                Some(found) => found.clone(),
                None => panic!(
                    "ACEMQ_FAMILY_FIXTURES is set but {FIXTURE_FILE} is not in it (tried {candidates:?})"
                ),
            }
        }
        None => {
            let dir = manifest.join("../../../shared/fixtures");
            if !dir.is_dir() {
                eprintln!(
                    "note: ACEMQ_FAMILY_FIXTURES is unset and {} does not exist; skipping the contract fixtures",
                    dir.display()
                );
                return None;
            }
            let file = dir.join(FIXTURE_FILE);
            assert!(file.is_file(), "{} is missing", file.display());
            file
        }
    };
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    Some(
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", file.display())),
    )
}

fn section<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc.get(name)
        .unwrap_or_else(|| panic!("fixture section {name:?} is missing"))
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{key:?} is not an unsigned integer in {v}"))
}

fn f64_of(v: &Value, key: &str) -> f64 {
    v.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{key:?} is not a number in {v}"))
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{key:?} is not a string in {v}"))
}

fn bool_of(v: &Value, key: &str) -> bool {
    v.get(key)
        .and_then(Value::as_bool)
        .unwrap_or_else(|| panic!("{key:?} is not a boolean in {v}"))
}

fn array_of<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{key:?} is not an array in {v}"))
}

fn millis_list(v: &Value, key: &str) -> Vec<u128> {
    array_of(v, key)
        .iter()
        .map(|x| u128::from(x.as_u64().unwrap_or_else(|| panic!("{x} in {key}"))))
        .collect()
}

fn as_millis(list: &[Duration]) -> Vec<u128> {
    list.iter().map(Duration::as_millis).collect()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------------------------------
// The `how` strings: none(), fixed(n, d), exponential(n, i, m), exponential(n, i, x, m),
// followed by any of .giveUpAfter(d), .withJitter(f), .waitInBrokerFrom(d).
// ---------------------------------------------------------------------------------------

fn parse_duration(text: &str) -> Duration {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .unwrap_or_else(|_| panic!("bad duration {text:?}"));
    match unit {
        "ms" => ms(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        "d" => Duration::from_secs(n * 86_400),
        "" if n == 0 => Duration::ZERO,
        _ => panic!("bad duration unit in {text:?}"),
    }
}

/// Splits `name(a, b).other(c)` into `[("name", ["a", "b"]), ("other", ["c"])]`.
fn parse_calls(how: &str) -> Vec<(String, Vec<String>)> {
    let mut calls = Vec::new();
    let mut rest = how.trim();
    while !rest.is_empty() {
        rest = rest.strip_prefix('.').unwrap_or(rest);
        let open = rest
            .find('(')
            .unwrap_or_else(|| panic!("no '(' in {how:?}"));
        let close = rest
            .find(')')
            .unwrap_or_else(|| panic!("no ')' in {how:?}"));
        let name = rest[..open].trim().to_owned();
        let args = rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        calls.push((name, args));
        rest = rest[close + 1..].trim();
    }
    calls
}

fn parse_policy(how: &str) -> RetryPolicy {
    let calls = parse_calls(how);
    let ((factory, args), modifiers) = calls
        .split_first()
        .unwrap_or_else(|| panic!("empty policy {how:?}"));
    let attempts = |s: &str| -> u32 { s.parse().unwrap_or_else(|_| panic!("bad count {s:?}")) };
    let mut policy = match (factory.as_str(), args.as_slice()) {
        ("none", []) => RetryPolicy::none(),
        ("fixed", [n, d]) => RetryPolicy::fixed(attempts(n), parse_duration(d)).unwrap(),
        ("exponential", [n, i, m]) => {
            RetryPolicy::exponential(attempts(n), parse_duration(i), parse_duration(m)).unwrap()
        }
        ("exponential", [n, i, x, m]) => RetryPolicy::exponential_with_multiplier(
            attempts(n),
            parse_duration(i),
            x.parse().unwrap_or_else(|_| panic!("bad multiplier {x:?}")),
            parse_duration(m),
        )
        .unwrap(),
        _ => panic!("unknown policy factory in {how:?}"),
    };
    for (name, args) in modifiers {
        policy = match (name.as_str(), args.as_slice()) {
            ("giveUpAfter", [d]) => policy.give_up_after(parse_duration(d)),
            ("waitInBrokerFrom", [d]) => policy.wait_in_broker_from(parse_duration(d)),
            ("withJitter", [f]) => policy
                .with_jitter(f.parse().unwrap_or_else(|_| panic!("bad jitter {f:?}")))
                .unwrap(),
            _ => panic!("unknown policy modifier {name:?} in {how:?}"),
        };
    }
    policy
}

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
// naming
// ---------------------------------------------------------------------------------------

/// A second, independent rendering of a rung delay (wire contract §4): largest unit that
/// divides the delay exactly, in whole milliseconds.
fn independent_render(millis: u128) -> String {
    for (unit, suffix) in [(3_600_000u128, "h"), (60_000, "m"), (1_000, "s")] {
        if millis > 0 && millis.is_multiple_of(unit) {
            return format!("{}{suffix}", millis / unit);
        }
    }
    format!("{millis}ms")
}

#[test]
fn naming() {
    let Some(doc) = fixtures() else { return };
    let s = section(&doc, "naming");
    let queue = str_of(s, "queue");
    assert_eq!(dead_letter_queue(queue), str_of(s, "deadLetterQueue"));
    assert_eq!(parked_queue(queue), str_of(s, "parkedQueue"));
    let retry_queues = array_of(s, "retryQueues");
    assert!(!retry_queues.is_empty());
    for case in retry_queues {
        let delay = ms(u64_of(case, "delayMillis"));
        assert_eq!(
            retry_queue(queue, delay),
            str_of(case, "queue"),
            "{delay:?}"
        );
        assert_eq!(
            render_delay(delay),
            independent_render(delay.as_millis()),
            "{delay:?}"
        );
    }
    // The recorded disagreement: we follow Java (`500ms`), not Go/Python/Ruby (`0s`).
    assert!(str_of(s, "subSecondDisagreement").contains(".retry.500ms"));
    assert_eq!(retry_queue(queue, ms(500)), format!("{queue}.retry.500ms"));
    // The two renderings agree everywhere else too.
    for millis in (0..10_000_000u128).step_by(7_919).chain([
        1, 999, 1_000, 60_000, 90_000, 3_600_000, 5_400_000, 7_200_000,
    ]) {
        assert_eq!(
            render_delay(ms(millis as u64)),
            independent_render(millis),
            "{millis} ms"
        );
    }
}

// ---------------------------------------------------------------------------------------
// rungArguments
// ---------------------------------------------------------------------------------------

/// Compares an argument table with a fixture's JSON object exactly: the same names,
/// integers as AMQP integers with the same value, strings as strings.
fn assert_arguments_eq(actual: &Headers, expected: &Map<String, Value>, ctx: &str) {
    let actual_keys: BTreeSet<&str> = actual.keys().map(String::as_str).collect();
    let expected_keys: BTreeSet<&str> = expected.keys().map(String::as_str).collect();
    assert_eq!(actual_keys, expected_keys, "{ctx}: argument names");
    for (key, want) in expected {
        let got = &actual[key];
        match want {
            Value::String(s) => assert_eq!(got, &HeaderValue::Str(s.clone()), "{ctx}: {key}"),
            Value::Number(n) => {
                let n = n
                    .as_i64()
                    .unwrap_or_else(|| panic!("{ctx}: {key} is not an integer in the fixture"));
                assert!(
                    matches!(
                        got,
                        HeaderValue::I8(_)
                            | HeaderValue::U8(_)
                            | HeaderValue::I16(_)
                            | HeaderValue::U16(_)
                            | HeaderValue::I32(_)
                            | HeaderValue::U32(_)
                            | HeaderValue::I64(_)
                    ),
                    "{ctx}: {key} must be an AMQP integer, got {got:?}"
                );
                assert_eq!(got.as_i64(), Some(n), "{ctx}: {key}");
            }
            other => panic!("{ctx}: unexpected fixture value {other} for {key}"),
        }
    }
}

#[test]
fn rung_arguments_match_exactly() {
    let Some(doc) = fixtures() else { return };
    let rungs = doc
        .get("rungArguments")
        .and_then(Value::as_array)
        .expect("rungArguments");
    assert!(!rungs.is_empty());
    for case in rungs {
        let delay = ms(u64_of(case, "delayMillis"));
        let expected = case
            .get("arguments")
            .and_then(Value::as_object)
            .expect("arguments");
        let source = expected
            .get("x-dead-letter-routing-key")
            .and_then(Value::as_str)
            .expect("x-dead-letter-routing-key");
        let ctx = str_of(case, "queue");
        assert_eq!(retry_queue(source, delay), ctx);
        assert_arguments_eq(&rung_arguments(source, delay), expected, ctx);
        let decl = rung_decl(source, delay);
        assert_eq!(decl.name, ctx);
        assert_eq!(decl.queue_type(), QueueType::Classic);
        assert!(decl.durable && !decl.exclusive && !decl.auto_delete);
        assert_arguments_eq(&decl.arguments, expected, ctx);
    }
}

// ---------------------------------------------------------------------------------------
// topology
// ---------------------------------------------------------------------------------------

fn declared_by(item: &Value, who: &[&str]) -> bool {
    who.contains(&str_of(item, "declaredBy"))
}

/// Checks `topology` holds exactly the fixture's items accepted by `who`.
fn assert_topology_matches(topology: &Topology, fixture: &Value, who: &[&str], ctx: &str) {
    // Exchanges.
    let expected: Vec<&Value> = array_of(fixture, "exchanges")
        .iter()
        .filter(|e| declared_by(e, who))
        .collect();
    let expected_names: BTreeSet<&str> = expected.iter().map(|e| str_of(e, "name")).collect();
    let actual_names: BTreeSet<&str> = topology
        .exchanges()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(actual_names, expected_names, "{ctx}: exchanges");
    assert_eq!(
        topology.exchanges().len(),
        expected.len(),
        "{ctx}: exchanges"
    );
    for want in expected {
        let name = str_of(want, "name");
        let got = topology.exchange(name).expect("exchange");
        assert_eq!(
            Some(got.kind),
            ExchangeKind::parse(str_of(want, "type")),
            "{ctx}: {name}"
        );
        assert_eq!(got.durable, bool_of(want, "durable"), "{ctx}: {name}");
        assert!(!got.auto_delete, "{ctx}: {name}");
        assert!(got.arguments.is_empty(), "{ctx}: {name}");
    }

    // Queues.
    let expected: Vec<&Value> = array_of(fixture, "queues")
        .iter()
        .filter(|q| declared_by(q, who))
        .collect();
    let expected_names: BTreeSet<&str> = expected.iter().map(|q| str_of(q, "name")).collect();
    let actual_names: BTreeSet<&str> = topology.queues().iter().map(|q| q.name.as_str()).collect();
    assert_eq!(actual_names, expected_names, "{ctx}: queues");
    assert_eq!(topology.queues().len(), expected.len(), "{ctx}: queues");
    for want in expected {
        let name = str_of(want, "name");
        let got = topology.queue(name).expect("queue");
        let qctx = format!("{ctx}: {name}");
        // The type is the presence of x-queue-type; the other arguments are exact.
        let mut arguments = got.arguments.clone();
        let queue_type = match arguments.remove("x-queue-type") {
            None => "classic",
            Some(HeaderValue::Str(t)) if t == "quorum" => "quorum",
            Some(other) => panic!("{qctx}: x-queue-type {other:?}"),
        };
        assert_eq!(queue_type, str_of(want, "type"), "{qctx}");
        assert_eq!(got.durable, bool_of(want, "durable"), "{qctx}");
        assert!(!got.exclusive && !got.auto_delete, "{qctx}");
        let expected_args = want
            .get("arguments")
            .and_then(Value::as_object)
            .expect("arguments");
        assert_arguments_eq(&arguments, expected_args, &qctx);
    }

    // Bindings.
    let expected: BTreeSet<(&str, &str, &str)> = array_of(fixture, "bindings")
        .iter()
        .filter(|b| declared_by(b, who))
        .map(|b| {
            (
                str_of(b, "queue"),
                str_of(b, "exchange"),
                str_of(b, "routingKey"),
            )
        })
        .collect();
    let actual: BTreeSet<(&str, &str, &str)> = topology
        .bindings()
        .iter()
        .map(|b| {
            (
                b.queue.as_str(),
                b.exchange.as_str(),
                b.routing_key.as_str(),
            )
        })
        .collect();
    assert_eq!(actual, expected, "{ctx}: bindings");
    assert_eq!(topology.bindings().len(), expected.len(), "{ctx}: bindings");
    assert!(
        topology.bindings().iter().all(|b| b.arguments.is_empty()),
        "{ctx}: binding arguments"
    );
}

#[test]
fn topology() {
    let Some(doc) = fixtures() else { return };
    let fixture = section(&doc, "topology");
    assert_eq!(str_of(&doc, "deadLetterExchange"), DEAD_LETTER_EXCHANGE);
    assert_eq!(str_of(&doc, "retryExchange"), RETRY_EXCHANGE);

    let source = str_of(fixture, "sourceQueue");
    let how = str_of(fixture, "policy");
    let how = how.split(" at ").next().unwrap_or(how);
    let policy = parse_policy(how);
    assert_eq!(
        policy,
        RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300)).unwrap()
    );
    assert_eq!(
        policy.broker_wait_threshold(),
        DEFAULT_BROKER_WAIT_THRESHOLD
    );
    assert_eq!(
        as_millis(&policy.schedule()),
        millis_list(fixture, "policyScheduleMillis")
    );
    assert_eq!(
        as_millis(&policy.broker_rungs()),
        millis_list(fixture, "policyRungDelaysMillis")
    );

    let built = Topology::define()
        .exchange("orders", ExchangeKind::Topic)
        .queue_with_dead_letter(source)
        .queue_with_retry(source, &policy)
        .bind(source, "orders", "order.*")
        .build()
        .expect("the fixture topology builds");
    assert_topology_matches(
        &built,
        fixture,
        &["topology", "consumer", "both"],
        "builder",
    );

    let consumer = Topology::for_consumer(source, Some(&policy));
    assert_topology_matches(&consumer, fixture, &["consumer", "both"], "for_consumer");
    assert!(
        consumer.queue(source).is_none(),
        "a consumer never declares its source queue"
    );
    // What the consumer declares is declared identically by the builder: no second
    // declarer can fail with PRECONDITION_FAILED.
    for q in consumer.queues() {
        assert_eq!(built.queue(&q.name), Some(q));
    }
    for e in consumer.exchanges() {
        assert_eq!(built.exchange(&e.name), Some(e));
    }
    for b in consumer.bindings() {
        assert!(built.bindings().contains(b), "{b:?}");
    }

    // Without a policy (or with one that never waits in the broker) the consumer still
    // declares the dead-letter half, and nothing of the retry half.
    let dead_letter_only = |item: &Value| {
        declared_by(item, &["consumer", "both"])
            && !str_of(item, "name").starts_with(&format!("{source}.retry."))
            && str_of(item, "name") != RETRY_EXCHANGE
    };
    for policy in [None, Some(&RetryPolicy::none())] {
        let t = Topology::for_consumer(source, policy);
        let expected_queues: BTreeSet<&str> = array_of(fixture, "queues")
            .iter()
            .filter(|q| dead_letter_only(q))
            .map(|q| str_of(q, "name"))
            .collect();
        let queues: BTreeSet<&str> = t.queues().iter().map(|q| q.name.as_str()).collect();
        assert_eq!(queues, expected_queues);
        let expected_exchanges: BTreeSet<&str> = array_of(fixture, "exchanges")
            .iter()
            .filter(|e| dead_letter_only(e))
            .map(|e| str_of(e, "name"))
            .collect();
        let exchanges: BTreeSet<&str> = t.exchanges().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(exchanges, expected_exchanges);
        assert!(
            t.bindings()
                .iter()
                .all(|b| b.exchange == DEAD_LETTER_EXCHANGE)
        );
        assert_eq!(t.bindings().len(), 2);
    }
}

// ---------------------------------------------------------------------------------------
// queueTypeDefaults
// ---------------------------------------------------------------------------------------

fn type_name(q: &QueueDecl) -> &'static str {
    match q.queue_type() {
        QueueType::Quorum => "quorum",
        QueueType::Classic => "classic",
        _ => "other",
    }
}

#[test]
fn queue_type_defaults() {
    let Some(doc) = fixtures() else { return };
    let s = section(&doc, "queueTypeDefaults");
    let first_queue =
        |t: Topology, name: &str| -> QueueDecl { t.queue(name).cloned().expect("declared queue") };
    let decls: Vec<(&str, QueueDecl)> = vec![
        (
            "sourceQueue",
            first_queue(Topology::define().queue("src").build().unwrap(), "src"),
        ),
        (
            "sourceQueueWithDeadLetter",
            first_queue(
                Topology::define()
                    .queue_with_dead_letter("src")
                    .build()
                    .unwrap(),
                "src",
            ),
        ),
        (
            "explicitClassicQueue",
            first_queue(
                Topology::define()
                    .classic_queue("src", Headers::new())
                    .build()
                    .unwrap(),
                "src",
            ),
        ),
        (
            "explicitClassicQueueWithDeadLetter",
            first_queue(
                Topology::define()
                    .classic_queue_with_dead_letter("src", Headers::new())
                    .build()
                    .unwrap(),
                "src",
            ),
        ),
        ("deadLetterQueue", dead_letter_queue_decl("src")),
        ("parkedQueue", parked_queue_decl("src")),
        ("retryRung", rung_decl("src", Duration::from_secs(30))),
    ];
    for (key, decl) in &decls {
        assert_eq!(type_name(decl), str_of(s, key), "{key}");
    }

    let durability = section(s, "durability");
    if bool_of(durability, "everyDeclaredQueueIsDurable") {
        for (key, decl) in &decls {
            assert!(decl.durable, "{key} must be durable");
        }
        let policy =
            RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300)).unwrap();
        for q in Topology::for_consumer("src", Some(&policy)).queues() {
            assert!(q.durable, "{} must be durable", q.name);
        }
    }
    // Java cannot be asked; the Rust API can, and keeps such queues classic.
    for decl in [
        QueueDecl::quorum("x").exclusive(),
        QueueDecl::quorum("x").auto_delete(),
        QueueDecl::quorum("x").transient(),
        QueueDecl::server_named(),
    ] {
        assert_eq!(decl.queue_type(), QueueType::Classic, "{decl:?}");
        let t = Topology::define().queue_decl(decl).build().unwrap();
        assert_eq!(t.queues()[0].queue_type(), QueueType::Classic);
    }
}
