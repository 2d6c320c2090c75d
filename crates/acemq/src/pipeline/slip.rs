//! The JSON routing slip (`acemq-routing-slip`, `docs/wire.md` §14): an itinerary of stops
//! (exchange, routing key, optional name) the message carries and any member follows.
//!
//! Read in both forms the family writes: the canonical one (Java, Go, Ruby: compact,
//! `done` left out while empty, `completedAt` to the second with `Z`) and Python's
//! (spaces, `"done": []`, microseconds and `+00:00`). Written in the canonical form, byte
//! for byte. Fields this member does not know (on the slip or on a stop) are kept and
//! written back: other members drop them at their hops.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;

/// The header the JSON slip travels in (shared namespace: handlers see it).
pub const ROUTING_SLIP: &str = "acemq-routing-slip";

/// One stop of a routing slip.
///
/// ```
/// use acemq::pipeline::Stop;
/// let s = Stop::new("billing", "invoice.create").named("invoice");
/// assert_eq!(s.routing_key(), "invoice.create");
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stop {
    exchange: String,
    #[serde(rename = "routingKey")]
    routing_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(
        rename = "completedAt",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    completed_at: Option<String>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

impl Stop {
    /// A stop at `exchange` (`""` = the default) with `routing_key`.
    pub fn new(exchange: impl Into<String>, routing_key: impl Into<String>) -> Stop {
        Stop {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            name: None,
            completed_at: None,
            extra: Map::new(),
        }
    }

    /// With a name (empty: none).
    pub fn named(mut self, name: impl Into<String>) -> Stop {
        let name = name.into();
        self.name = (!name.is_empty()).then_some(name);
        self
    }

    /// The exchange.
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// The routing key.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// The name, if any.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref().filter(|n| !n.is_empty())
    }

    /// When it was completed (as written), for a stop in `done`.
    pub fn completed_at(&self) -> Option<&str> {
        self.completed_at.as_deref().filter(|c| !c.is_empty())
    }

    /// Empty optional fields read as absent, so they are left out when written.
    fn normalised(mut self) -> Stop {
        self.name = self.name.filter(|n| !n.is_empty());
        self.completed_at = self.completed_at.filter(|c| !c.is_empty());
        self
    }
}

/// A JSON routing slip: the stops still ahead (`steps[0]` is where the message is) and
/// those done.
///
/// ```
/// use acemq::pipeline::RoutingSlip;
/// let slip = RoutingSlip::new().then("", "validate", "validate").then("billing", "charge", "");
/// assert_eq!(
///     slip.to_header(),
///     r#"{"steps":[{"exchange":"","routingKey":"validate","name":"validate"},{"exchange":"billing","routingKey":"charge"}]}"#
/// );
/// let parsed = RoutingSlip::parse(&slip.to_header()).unwrap();
/// assert_eq!(parsed, slip);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoutingSlip {
    #[serde(default)]
    steps: Vec<Stop>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    done: Vec<Stop>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// A routing slip that cannot be read: fatal for the message carrying it (to `.dlq`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SlipError {
    /// The header is not valid slip JSON.
    #[error("the {ROUTING_SLIP} header is not a routing slip: {0}")]
    Unreadable(String),
    /// The header is not text.
    #[error("the {ROUTING_SLIP} header is not text")]
    NotText,
}

impl RoutingSlip {
    /// An empty slip.
    pub fn new() -> RoutingSlip {
        RoutingSlip::default()
    }

    /// With one more stop at the end (`name` empty: none).
    pub fn then(
        mut self,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        name: impl Into<String>,
    ) -> RoutingSlip {
        self.steps
            .push(Stop::new(exchange, routing_key).named(name));
        self
    }

    /// The stops ahead; the first is where the message is.
    pub fn steps(&self) -> &[Stop] {
        &self.steps
    }

    /// The stops done, oldest first.
    pub fn done(&self) -> &[Stop] {
        &self.done
    }

    /// Where the message is now (`steps[0]`), if anywhere.
    pub fn current(&self) -> Option<&Stop> {
        self.steps.first()
    }

    /// Whether no stop is ahead.
    pub fn is_finished(&self) -> bool {
        self.steps.is_empty()
    }

    /// The slip after the current stop is done: it moves to `done` with `completedAt` =
    /// `at` (UTC, to the second, `Z`); the next stop (if any) is where to publish.
    pub fn advanced(&self, at: OffsetDateTime) -> RoutingSlip {
        let mut next = self.clone();
        if !next.steps.is_empty() {
            let mut stop = next.steps.remove(0);
            stop.completed_at = Some(completed_at(at));
            next.done.push(stop);
        }
        next
    }

    /// Parses either form.
    pub fn parse(text: &str) -> Result<RoutingSlip, SlipError> {
        let slip: RoutingSlip =
            serde_json::from_str(text).map_err(|e| SlipError::Unreadable(e.to_string()))?;
        Ok(RoutingSlip {
            steps: slip.steps.into_iter().map(Stop::normalised).collect(),
            done: slip.done.into_iter().map(Stop::normalised).collect(),
            extra: slip.extra,
        })
    }

    /// Reads the slip from application headers: `None` when there is none.
    pub fn from_headers(h: &crate::headers::Headers) -> Option<Result<RoutingSlip, SlipError>> {
        use crate::headers::HeaderValue;
        Some(match h.get(ROUTING_SLIP)? {
            HeaderValue::Str(s) => RoutingSlip::parse(s),
            HeaderValue::Bytes(b) => std::str::from_utf8(b)
                .map_err(|_| SlipError::NotText)
                .and_then(RoutingSlip::parse),
            _ => Err(SlipError::NotText),
        })
    }

    /// The canonical header value: compact JSON, keys in the family's order, empty
    /// optional fields and an empty `done` left out.
    pub fn to_header(&self) -> String {
        // Serialising strings and maps of strings cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ`, as Java and Go write `completedAt`.
fn completed_at(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_s_form_reads_and_is_written_canonically() {
        let python = r#"{"steps": [{"exchange": "", "routingKey": "dispatch", "name": "dispatch"}], "done": [{"exchange": "", "routingKey": "validate", "name": "validate", "completedAt": "2026-03-04T05:06:07.123456+00:00"}]}"#;
        let slip = RoutingSlip::parse(python).unwrap();
        assert_eq!(slip.current().unwrap().routing_key(), "dispatch");
        assert_eq!(
            slip.to_header(),
            r#"{"steps":[{"exchange":"","routingKey":"dispatch","name":"dispatch"}],"done":[{"exchange":"","routingKey":"validate","name":"validate","completedAt":"2026-03-04T05:06:07.123456+00:00"}]}"#
        );
        let empty_done = RoutingSlip::parse(r#"{"steps": [], "done": []}"#).unwrap();
        assert_eq!(empty_done.to_header(), r#"{"steps":[]}"#);
    }

    #[test]
    fn advancing_stamps_completed_at_to_the_second() {
        let at = time::macros::datetime!(2026-03-04 05:06:07.891 UTC);
        let slip = RoutingSlip::new().then("", "a", "").then("x", "b", "b");
        let next = slip.advanced(at);
        assert_eq!(
            next.to_header(),
            r#"{"steps":[{"exchange":"x","routingKey":"b","name":"b"}],"done":[{"exchange":"","routingKey":"a","completedAt":"2026-03-04T05:06:07Z"}]}"#
        );
        assert!(next.advanced(at).is_finished());
    }

    #[test]
    fn unknown_fields_survive_and_bad_slips_are_errors() {
        let slip = RoutingSlip::parse(
            r#"{"steps":[{"exchange":"","routingKey":"a","hint":1}],"vars":{"k":"v"}}"#,
        )
        .unwrap();
        assert_eq!(
            slip.to_header(),
            r#"{"steps":[{"exchange":"","routingKey":"a","hint":1}],"vars":{"k":"v"}}"#
        );
        assert!(matches!(
            RoutingSlip::parse("not json"),
            Err(SlipError::Unreadable(_))
        ));
        assert!(matches!(
            RoutingSlip::parse(r#"{"steps":[{"exchange":""}]}"#),
            Err(SlipError::Unreadable(_))
        ));
    }
}
