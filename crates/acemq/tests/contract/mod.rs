//! Shared by the contract tests: loading `contract-fixtures.json` from
//! `ACEMQ_FAMILY_FIXTURES` (a missing file there is a failure; without the variable,
//! `../../../shared/fixtures` beside the repository when it exists, else a note and a
//! vacuous pass), JSON accessors, and a parser for the fixture's `how` strings.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use acemq::retry::RetryPolicy;
use serde_json::Value;

pub const FIXTURE_FILE: &str = "contract-fixtures.json";

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

/// The fixture document, or `None` (after a note) when no fixture directory is configured
/// or present.
pub fn fixtures() -> Option<Value> {
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
                assert!(
                    std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                    "ACEMQ_TEST_REQUIRE_BROKER=1 (CI) but no family fixtures: set ACEMQ_FAMILY_FIXTURES"
                );
                eprintln!(
                    "note: ACEMQ_FAMILY_FIXTURES is unset and {} does not exist; the contract fixtures were not read",
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

pub fn section<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc.get(name)
        .unwrap_or_else(|| panic!("fixture section {name:?} is missing"))
}

pub fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{key:?} is not an unsigned integer in {v}"))
}

pub fn f64_of(v: &Value, key: &str) -> f64 {
    v.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{key:?} is not a number in {v}"))
}

pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{key:?} is not a string in {v}"))
}

pub fn bool_of(v: &Value, key: &str) -> bool {
    v.get(key)
        .and_then(Value::as_bool)
        .unwrap_or_else(|| panic!("{key:?} is not a boolean in {v}"))
}

pub fn array_of<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{key:?} is not an array in {v}"))
}

pub fn millis_list(v: &Value, key: &str) -> Vec<u128> {
    array_of(v, key)
        .iter()
        .map(|x| u128::from(x.as_u64().unwrap_or_else(|| panic!("{x} in {key}"))))
        .collect()
}

pub fn as_millis(list: &[Duration]) -> Vec<u128> {
    list.iter().map(Duration::as_millis).collect()
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------------------------------
// The `how` strings: none(), fixed(n, d), exponential(n, i, m), exponential(n, i, x, m),
// followed by any of .giveUpAfter(d), .withJitter(f), .waitInBrokerFrom(d).
// ---------------------------------------------------------------------------------------

pub fn parse_duration(text: &str) -> Duration {
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
pub fn parse_calls(how: &str) -> Vec<(String, Vec<String>)> {
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

pub fn parse_policy(how: &str) -> RetryPolicy {
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
