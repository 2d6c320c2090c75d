//! One peeked message: as a table row, as JSON, and in full (headers, reason, body).

use acemq::replay::PeekedMessage;
use base64::Engine as _;
use serde_json::{Value, json};
use time::format_description::well_known::Rfc3339;

use crate::output::{Out, age, cut};
use crate::topo::plan::{args_json, value_text};

/// The table's columns.
pub const HEADER: [&str; 6] = ["#", "ID", "TYPE", "ATTEMPT", "AGE", "REASON"];

/// One table row.
pub fn row(i: usize, m: &PeekedMessage) -> Vec<String> {
    vec![
        (i + 1).to_string(),
        m.id.clone().unwrap_or_else(|| "-".into()),
        m.message_type.clone().unwrap_or_else(|| "-".into()),
        m.attempt.map_or_else(|| "-".into(), |a| a.to_string()),
        m.age.map_or_else(|| "-".into(), age),
        cut(m.error.as_deref().unwrap_or("-"), 80),
    ]
}

fn rfc3339(t: Option<time::OffsetDateTime>) -> Value {
    t.and_then(|t| t.format(&Rfc3339).ok())
        .map_or(Value::Null, Value::String)
}

/// The message as JSON; the body as JSON when it parses, else text, else base64.
pub fn to_json(m: &PeekedMessage, with_body: bool) -> Value {
    let mut v = json!({
        "id": m.id,
        "type": m.message_type,
        "attempt": m.attempt,
        "first_seen": rfc3339(m.first_seen),
        "age_seconds": m.age.map(|a| a.as_secs()),
        "origin": m.origin,
        "error": m.error,
        "replay_count": m.replay_count,
        "replayed_from": m.replayed_from,
        "replayed_at": m.replayed_at,
        "headers": args_json(&m.headers),
        "content_type": m.content_type,
        "body_bytes": m.body.len(),
        "redelivered": m.redelivered,
    });
    if with_body {
        let (body, encoding) = match (
            serde_json::from_slice::<Value>(&m.body),
            std::str::from_utf8(&m.body),
        ) {
            (Ok(j), _) => (j, "json"),
            (_, Ok(s)) => (Value::String(s.to_owned()), "text"),
            _ => (
                Value::String(base64::engine::general_purpose::STANDARD.encode(&m.body)),
                "base64",
            ),
        };
        v["body"] = body;
        v["body_encoding"] = json!(encoding);
    }
    v
}

/// The message in full, for people; the body cut at `max_body` bytes with a note.
pub fn print_full(out: &Out, queue: &str, m: &PeekedMessage, max_body: usize) {
    // Padded before it is coloured: the width must not count the colour codes.
    let field = |name: &str, value: String| println!("{}{value}", out.bold(&format!("{name:<14}")));
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    field("queue", queue.to_owned());
    field("id", opt(&m.id));
    field("type", opt(&m.message_type));
    field(
        "attempt",
        m.attempt.map_or_else(|| "-".into(), |a| a.to_string()),
    );
    let seen = match (rfc3339(m.first_seen), m.age) {
        (Value::String(t), Some(a)) => format!("{t} ({} ago)", age(a)),
        (Value::String(t), None) => t,
        _ => "-".into(),
    };
    field("first seen", seen);
    field("origin", opt(&m.origin));
    field("reason", opt(&m.error));
    if let Some(n) = m.replay_count {
        field(
            "replays",
            format!(
                "{n} (last from {} at {})",
                opt(&m.replayed_from),
                opt(&m.replayed_at)
            ),
        );
    }
    field("content type", opt(&m.content_type));
    if m.redelivered {
        field("redelivered", "yes".into());
    }
    if m.headers.is_empty() {
        field("headers", "-".into());
    } else {
        println!("{}", out.bold("headers"));
        for (k, v) in &m.headers {
            println!("  {k} = {}", value_text(v));
        }
    }
    println!("{} ({} bytes)", out.bold("body"), m.body.len());
    let text = match serde_json::from_slice::<Value>(&m.body) {
        Ok(j) => serde_json::to_string_pretty(&j).unwrap_or_default(),
        Err(_) => match std::str::from_utf8(&m.body) {
            Ok(s) => s.to_owned(),
            Err(_) => {
                println!("{}", out.dim("(binary; --json shows it as base64)"));
                return;
            }
        },
    };
    if text.len() <= max_body {
        println!("{text}");
    } else {
        let mut end = max_body;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        println!("{}", &text[..end]);
        println!(
            "{}",
            out.dim(&format!(
                "… truncated: {end} of {} bytes shown (--max-body N shows more, --json all of it)",
                text.len()
            ))
        );
    }
}
