//! Routing: how an exchange picks queues for a message.
//!
//! This module owns the matching rules only (pure functions, no broker state): direct
//! (binding key equals routing key), fanout (everything), topic (dot-separated words,
//! `*` exactly one word, `#` zero or more) and headers (`x-match` = `all`, `any`,
//! `all-with-x` or `any-with-x`; binding arguments starting with `x-` are not matched
//! unless the `-with-x` form asks for them; a `Void` binding value only asks for the
//! header to be present). Values compare the way RabbitMQ (Erlang) compares them:
//! integers of any width are equal when their values are, long strings equal byte arrays
//! with the same bytes.

use crate::headers::{HeaderValue, Headers};
use crate::topology::ExchangeKind;
use crate::transport::TransportError;

/// How a headers binding matches, from its `x-match` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum XMatch {
    /// Every (non `x-`) binding argument must match.
    All,
    /// At least one (non `x-`) binding argument must match.
    Any,
    /// Every binding argument except `x-match` itself must match.
    AllWithX,
    /// At least one binding argument except `x-match` itself must match.
    AnyWithX,
}

/// Reads the `x-match` argument of a headers binding (default `all`). An unknown value is
/// refused the way RabbitMQ refuses it (PRECONDITION_FAILED).
pub(crate) fn x_match(arguments: &Headers) -> Result<XMatch, TransportError> {
    let Some(v) = arguments.get("x-match") else {
        return Ok(XMatch::All);
    };
    let text = match v {
        HeaderValue::Str(s) => s.as_str(),
        HeaderValue::Bytes(b) => std::str::from_utf8(b).unwrap_or(""),
        _ => "",
    };
    match text {
        "all" => Ok(XMatch::All),
        "any" => Ok(XMatch::Any),
        "all-with-x" => Ok(XMatch::AllWithX),
        "any-with-x" => Ok(XMatch::AnyWithX),
        _ => Err(TransportError::PreconditionFailed {
            detail: format!(
                "Invalid x-match field value {v:?}; expected all, any, all-with-x, or any-with-x"
            ),
        }),
    }
}

/// Whether a binding (key and arguments) of an exchange of `kind` takes a message.
pub(crate) fn binding_matches(
    kind: ExchangeKind,
    binding_key: &str,
    binding_args: &Headers,
    routing_key: &str,
    headers: &Headers,
) -> bool {
    match kind {
        ExchangeKind::Direct => binding_key == routing_key,
        ExchangeKind::Fanout => true,
        ExchangeKind::Topic => topic_matches(binding_key, routing_key),
        ExchangeKind::Headers => headers_match(binding_args, headers),
        // ExchangeKind is non_exhaustive; an unknown kind routes nowhere.
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// Splits a topic key into words as RabbitMQ does: the empty key has no words, otherwise
/// every `.` separates two (possibly empty) words.
fn words(key: &str) -> Vec<&str> {
    if key.is_empty() {
        Vec::new()
    } else {
        key.split('.').collect()
    }
}

/// Topic matching: `*` is exactly one word, `#` zero or more words.
///
/// Dynamic programming over (pattern word, key word) positions, so patterns with many
/// `#` stay linear in the product of their lengths.
pub(crate) fn topic_matches(pattern: &str, key: &str) -> bool {
    let p = words(pattern);
    let k = words(key);
    // reach[j]: the first i pattern words can consume exactly the first j key words.
    let mut reach = vec![false; k.len() + 1];
    reach[0] = true;
    for word in &p {
        let mut next = vec![false; k.len() + 1];
        match *word {
            "#" => {
                let mut any = false;
                for j in 0..=k.len() {
                    any |= reach[j];
                    next[j] = any;
                }
            }
            "*" => {
                next[1..].copy_from_slice(&reach[..k.len()]);
            }
            literal => {
                for j in 0..k.len() {
                    next[j + 1] = reach[j] && k[j] == literal;
                }
            }
        }
        reach = next;
    }
    reach[k.len()]
}

/// Headers matching for one binding's arguments against a message's headers.
pub(crate) fn headers_match(binding_args: &Headers, headers: &Headers) -> bool {
    let mode = x_match(binding_args).unwrap_or(XMatch::All);
    let with_x = matches!(mode, XMatch::AllWithX | XMatch::AnyWithX);
    let all = matches!(mode, XMatch::All | XMatch::AllWithX);
    let mut any_matched = false;
    for (k, want) in binding_args {
        if k == "x-match" || (!with_x && k.starts_with("x-")) {
            continue;
        }
        let matched = match (want, headers.get(k)) {
            (_, None) => false,
            (HeaderValue::Void, Some(_)) => true,
            (want, Some(have)) => values_equal(want, have),
        };
        if matched {
            any_matched = true;
            if !all {
                return true;
            }
        } else if all {
            return false;
        }
    }
    // `all` with nothing to compare matches everything; `any` needs one match.
    all || any_matched
}

fn as_integer(v: &HeaderValue) -> Option<i128> {
    match v {
        HeaderValue::I8(x) => Some(i128::from(*x)),
        HeaderValue::U8(x) => Some(i128::from(*x)),
        HeaderValue::I16(x) => Some(i128::from(*x)),
        HeaderValue::U16(x) => Some(i128::from(*x)),
        HeaderValue::I32(x) => Some(i128::from(*x)),
        HeaderValue::U32(x) => Some(i128::from(*x)),
        HeaderValue::I64(x) => Some(i128::from(*x)),
        HeaderValue::Timestamp(x) => Some(i128::from(*x)),
        _ => None,
    }
}

fn as_bytes(v: &HeaderValue) -> Option<&[u8]> {
    match v {
        HeaderValue::Str(s) => Some(s.as_bytes()),
        HeaderValue::Bytes(b) => Some(b),
        _ => None,
    }
}

/// Equality the way Erlang's `==` sees two AMQP field values.
pub(crate) fn values_equal(a: &HeaderValue, b: &HeaderValue) -> bool {
    if let (Some(x), Some(y)) = (as_integer(a), as_integer(b)) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (as_bytes(a), as_bytes(b)) {
        return x == y;
    }
    a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, HeaderValue)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned().into(), v.clone()))
            .collect()
    }

    #[test]
    fn topic_star_is_exactly_one_word() {
        assert!(topic_matches("sensor.*.temp", "sensor.rome.temp"));
        assert!(!topic_matches("sensor.*.temp", "sensor.temp"));
        assert!(!topic_matches("sensor.*.temp", "sensor.rome.north.temp"));
        assert!(topic_matches("*", "a"));
        assert!(!topic_matches("*", ""));
        assert!(!topic_matches("*", "a.b"));
        assert!(topic_matches("*.error", "app.error"));
    }

    #[test]
    fn topic_hash_is_zero_or_more_words() {
        assert!(topic_matches("sensor.rome.#", "sensor.rome"));
        assert!(topic_matches("sensor.rome.#", "sensor.rome.temp"));
        assert!(topic_matches("sensor.rome.#", "sensor.rome.temp.max"));
        assert!(!topic_matches("sensor.rome.#", "sensor.milan.temp"));
        assert!(topic_matches("#", ""));
        assert!(topic_matches("#", "a.b.c"));
        assert!(topic_matches("#.error", "error"));
        assert!(topic_matches("#.error", "a.b.error"));
        assert!(!topic_matches("#.error", "a.b.error.x"));
        assert!(topic_matches("a.#.z", "a.z"));
        assert!(topic_matches("a.#.z", "a.b.c.z"));
        assert!(topic_matches("#.*.#", "x"));
        assert!(!topic_matches("#.*.#", ""));
        assert!(topic_matches("a.#.#.b", "a.b"));
    }

    #[test]
    fn topic_literals_and_empty_words() {
        assert!(topic_matches("orders.new", "orders.new"));
        assert!(!topic_matches("orders.new", "orders.new.x"));
        assert!(topic_matches("", ""));
        assert!(!topic_matches("", "a"));
        assert!(topic_matches("a.*", "a."));
        assert!(topic_matches("a..b", "a..b"));
        assert!(!topic_matches("orders", "Orders"));
    }

    #[test]
    fn headers_all_and_any_match_as_rabbitmq_does() {
        let all = h(&[
            ("x-match", "all".into()),
            ("class", "10-A".into()),
            ("role", "parent".into()),
        ]);
        let any = h(&[
            ("x-match", "any".into()),
            ("class", "10-A".into()),
            ("role", "teacher".into()),
        ]);
        let parent = h(&[("class", "10-A".into()), ("role", "parent".into())]);
        let student = h(&[("class", "10-A".into()), ("role", "student".into())]);
        let teacher = h(&[("class", "11-B".into()), ("role", "teacher".into())]);
        assert!(headers_match(&all, &parent));
        assert!(!headers_match(&all, &student));
        assert!(!headers_match(&all, &teacher));
        assert!(headers_match(&any, &parent));
        assert!(headers_match(&any, &student));
        assert!(headers_match(&any, &teacher));
    }

    #[test]
    fn headers_default_is_all_and_x_arguments_are_ignored() {
        let b = h(&[("a", 1.into()), ("x-extra", "ignored".into())]);
        assert!(headers_match(&b, &h(&[("a", HeaderValue::I64(1))])));
        assert!(!headers_match(&b, &h(&[("a", 2.into())])));
        assert!(!headers_match(&b, &h(&[])));
        // Nothing to compare: all matches everything, any matches nothing.
        assert!(headers_match(&h(&[("x-match", "all".into())]), &h(&[])));
        assert!(!headers_match(
            &h(&[("x-match", "any".into())]),
            &h(&[("a", 1.into())])
        ));
        // The -with-x forms do compare x- arguments.
        let wx = h(&[("x-match", "all-with-x".into()), ("x-t", "1".into())]);
        assert!(headers_match(&wx, &h(&[("x-t", "1".into())])));
        assert!(!headers_match(&wx, &h(&[])));
    }

    #[test]
    fn headers_void_is_presence_and_values_compare_like_erlang() {
        let b = h(&[("flag", HeaderValue::Void)]);
        assert!(headers_match(&b, &h(&[("flag", "anything".into())])));
        assert!(!headers_match(&b, &h(&[])));
        assert!(values_equal(&HeaderValue::U8(7), &HeaderValue::I64(7)));
        assert!(values_equal(
            &HeaderValue::from("ab"),
            &HeaderValue::Bytes(b"ab".to_vec())
        ));
        assert!(!values_equal(&HeaderValue::from("1"), &HeaderValue::I32(1)));
    }

    #[test]
    fn x_match_refuses_unknown_values() {
        assert_eq!(x_match(&h(&[])).ok(), Some(XMatch::All));
        assert!(
            x_match(&h(&[("x-match", "some".into())]))
                .unwrap_err()
                .is_precondition_failed()
        );
    }
}
