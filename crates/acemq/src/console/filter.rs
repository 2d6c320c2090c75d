//! The console's message filters: by id, type, reason, header, age and body substring,
//! read from a page's query string or a form, applied to a peeked message or to a pass's
//! dead letter alike; and the ages and durations the pages write ("3 min").

use std::time::Duration;

use serde::Deserialize;

use crate::replay::{DeadLetter, PeekedMessage, header_text};

/// What a page or an action selects. Every field is optional; an empty one selects all.
///
/// ```
/// let f = acemq::console::Filter {
///     reason: Some("timeout".into()),
///     header: Some("x-tenant=acme".into()),
///     older: Some("10m".into()),
///     ..Default::default()
/// };
/// assert!(f.is_active());
/// assert!(!acemq::console::Filter::default().is_active());
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Filter {
    /// One message, by its envelope id.
    #[serde(default)]
    pub id: Option<String>,
    /// The logical type (`x-acemq-type`), exactly.
    #[serde(default, rename = "type")]
    pub message_type: Option<String>,
    /// A substring of the reason (`x-acemq-error`).
    #[serde(default)]
    pub reason: Option<String>,
    /// `name=value` (the header equals it) or `name` (the header is present).
    #[serde(default)]
    pub header: Option<String>,
    /// Older than this (`90s`, `10m`, `2h`, `3d`), counted from first publish.
    #[serde(default)]
    pub older: Option<String>,
    /// A substring of the body (as UTF-8, lossy).
    #[serde(default)]
    pub body: Option<String>,
}

/// The fields a filter reads, from either a peeked message or a dead letter.
struct Seen<'a> {
    id: Option<&'a str>,
    message_type: Option<&'a str>,
    reason: Option<&'a str>,
    age: Option<Duration>,
    header: &'a dyn Fn(&str) -> Option<String>,
    body: &'a [u8],
}

fn set(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl Filter {
    /// Whether any field selects something.
    pub fn is_active(&self) -> bool {
        [
            &self.id,
            &self.message_type,
            &self.reason,
            &self.header,
            &self.older,
            &self.body,
        ]
        .into_iter()
        .any(|f| set(f).is_some())
    }

    /// The `older` field as a duration; an error says how to write it.
    pub fn older_than(&self) -> Result<Option<Duration>, String> {
        set(&self.older).map(parse_duration).transpose()
    }

    /// Whether a message a page peeked passes.
    pub fn accepts_peeked(&self, m: &PeekedMessage) -> bool {
        let header = |name: &str| m.all_headers.get(name).and_then(header_text);
        self.accepts(&Seen {
            id: m.id.as_deref(),
            message_type: m.message_type.as_deref(),
            reason: m.error.as_deref(),
            age: m.age,
            header: &header,
            body: &m.body,
        })
    }

    /// Whether a dead letter a pass meets passes.
    pub fn accepts_dead_letter(&self, d: &DeadLetter<'_>) -> bool {
        let header = |name: &str| d.header(name);
        self.accepts(&Seen {
            id: Some(d.envelope.id()),
            message_type: Some(d.message_type()),
            reason: d.error(),
            age: d.age(),
            header: &header,
            body: d.body,
        })
    }

    fn accepts(&self, m: &Seen<'_>) -> bool {
        if let Some(id) = set(&self.id)
            && m.id != Some(id)
        {
            return false;
        }
        if let Some(t) = set(&self.message_type)
            && m.message_type != Some(t)
        {
            return false;
        }
        if let Some(r) = set(&self.reason)
            && !m.reason.is_some_and(|e| e.contains(r))
        {
            return false;
        }
        if let Some(h) = set(&self.header) {
            let (name, want) = match h.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (h, None),
            };
            match ((m.header)(name), want) {
                (None, _) => return false,
                (Some(v), Some(want)) if v != want => return false,
                _ => {}
            }
        }
        // A message of unknown age is never "older than" anything; a bad duration
        // selects nothing (the page says why).
        if set(&self.older).is_some() {
            match (self.older_than(), m.age) {
                (Ok(Some(min)), Some(age)) if age >= min => {}
                _ => return false,
            }
        }
        if let Some(b) = set(&self.body)
            && !String::from_utf8_lossy(m.body).contains(b)
        {
            return false;
        }
        true
    }

    /// The filter as query-string pairs (the fields that are set).
    pub(crate) fn pairs(&self) -> Vec<(&'static str, String)> {
        [
            ("id", &self.id),
            ("type", &self.message_type),
            ("reason", &self.reason),
            ("header", &self.header),
            ("older", &self.older),
            ("body", &self.body),
        ]
        .into_iter()
        .filter_map(|(k, v)| set(v).map(|v| (k, v.to_owned())))
        .collect()
    }
}

/// `90s`, `10m`, `2h`, `3d` (or plain seconds).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let bad = || format!("age {s:?}: write it as 90s, 10m, 2h or 3d");
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "m" | "min" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(bad()),
    };
    Ok(Duration::from_secs(secs))
}

/// An age as people read it: `45 s`, `3 min`, `2 h`, `4 d`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_ages() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("soon").is_err());
        assert_eq!(age(Duration::from_secs(200)), "3 min");
        assert_eq!(age(Duration::from_secs(5)), "5 s");
    }
}
