//! Dead-lettering: turning a message that left a queue (expired or rejected without
//! requeue) into the message RabbitMQ republishes through the queue's
//! `x-dead-letter-exchange`.
//!
//! This module owns the `x-death` header (an array of tables, most recent death first,
//! one entry per queue and reason with a `count`), the `x-first-death-*` headers, the
//! removal of the `expiration` property (kept as `original-expiration` in the entry), and
//! RabbitMQ's cycle rule (a message is not dead-lettered back into a queue it already died
//! in unless one of its deaths since was a rejection).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::headers::{HeaderValue, Headers};

use super::queue::Message;

/// Why a message was dead-lettered (RabbitMQ's `reason` values we produce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Its TTL ran out at the head of the queue.
    Expired,
    /// basic.nack / basic.reject without requeue.
    Rejected,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Expired => "expired",
            Reason::Rejected => "rejected",
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn str_field<'a>(t: &'a Headers, k: &str) -> Option<&'a str> {
    t.get(k).and_then(HeaderValue::as_str)
}

/// The message as it leaves `queue` for `dlx`: `x-death` updated, `x-first-death-*` set
/// once, `expiration` removed, exchange and routing key replaced (the routing key is the
/// queue's `x-dead-letter-routing-key`, or the original one).
pub(crate) fn dead_letter(
    msg: &Message,
    queue: &str,
    reason: Reason,
    dlx: &str,
    dlrk: Option<&str>,
) -> Message {
    let mut properties = crate::transport::Properties::clone(&msg.properties);
    let headers = &mut properties.headers;

    let mut entry = Headers::new();
    entry.insert("count".into(), HeaderValue::I64(1));
    entry.insert("reason".into(), HeaderValue::from(reason.as_str()));
    entry.insert("queue".into(), HeaderValue::from(queue));
    entry.insert("time".into(), HeaderValue::Timestamp(now_secs()));
    entry.insert("exchange".into(), HeaderValue::from(msg.exchange.as_str()));
    entry.insert(
        "routing-keys".into(),
        HeaderValue::Array(vec![HeaderValue::from(msg.routing_key.as_str())]),
    );
    if let Some(exp) = properties.expiration.take() {
        entry.insert("original-expiration".into(), HeaderValue::Str(exp));
    }

    let mut deaths: Vec<HeaderValue> = match headers.remove("x-death") {
        Some(HeaderValue::Array(a)) => a,
        _ => Vec::new(),
    };
    let same = deaths.iter().position(|d| {
        d.as_table().is_some_and(|t| {
            str_field(t, "queue") == Some(queue) && str_field(t, "reason") == Some(reason.as_str())
        })
    });
    let first = match same {
        Some(i) => {
            let mut old = match deaths.remove(i) {
                HeaderValue::Table(t) => t,
                _ => entry,
            };
            let count = old.get("count").and_then(HeaderValue::as_i64).unwrap_or(0);
            old.insert("count".into(), HeaderValue::I64(count.saturating_add(1)));
            old
        }
        None => entry,
    };
    deaths.insert(0, HeaderValue::Table(first));
    headers.insert("x-death".into(), HeaderValue::Array(deaths));

    headers
        .entry("x-first-death-reason".into())
        .or_insert_with(|| HeaderValue::from(reason.as_str()));
    headers
        .entry("x-first-death-queue".into())
        .or_insert_with(|| HeaderValue::from(queue));
    headers
        .entry("x-first-death-exchange".into())
        .or_insert_with(|| HeaderValue::from(msg.exchange.as_str()));

    Message {
        exchange: dlx.to_owned(),
        routing_key: dlrk.unwrap_or(&msg.routing_key).to_owned(),
        properties: Arc::new(properties),
        body: msg.body.clone(),
    }
}

/// RabbitMQ's cycle rule: dead-lettering `msg` (already carrying its new `x-death`) into
/// `target` is a cycle when `target` appears among its deaths and no death up to that one
/// (most recent first) was a rejection. Such a copy is dropped.
pub(crate) fn is_cycle(msg: &Message, target: &str) -> bool {
    let Some(deaths) = msg
        .properties
        .headers
        .get("x-death")
        .and_then(HeaderValue::as_array)
    else {
        return false;
    };
    for d in deaths {
        let Some(t) = d.as_table() else { continue };
        if str_field(t, "reason") == Some(Reason::Rejected.as_str()) {
            return false;
        }
        if str_field(t, "queue") == Some(target) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Properties;
    use bytes::Bytes;

    fn original() -> Message {
        Message {
            exchange: "orders".into(),
            routing_key: "order.new".into(),
            properties: Arc::new(Properties {
                expiration: Some("500".into()),
                ..Default::default()
            }),
            body: Bytes::from_static(b"x"),
        }
    }

    fn deaths(m: &Message) -> &[HeaderValue] {
        m.properties.headers["x-death"].as_array().unwrap()
    }

    #[test]
    fn first_death_writes_x_death_and_first_death_headers() {
        let m = dead_letter(&original(), "q1", Reason::Expired, "dlx", None);
        assert_eq!(m.exchange, "dlx");
        assert_eq!(m.routing_key, "order.new");
        assert_eq!(m.properties.expiration, None);
        let d = deaths(&m);
        assert_eq!(d.len(), 1);
        let t = d[0].as_table().unwrap();
        assert_eq!(t["count"], HeaderValue::I64(1));
        assert_eq!(t["reason"].as_str(), Some("expired"));
        assert_eq!(t["queue"].as_str(), Some("q1"));
        assert_eq!(t["exchange"].as_str(), Some("orders"));
        assert_eq!(t["original-expiration"].as_str(), Some("500"));
        assert!(matches!(t["time"], HeaderValue::Timestamp(_)));
        assert_eq!(
            t["routing-keys"],
            HeaderValue::Array(vec![HeaderValue::from("order.new")])
        );
        let h = &m.properties.headers;
        assert_eq!(h["x-first-death-reason"].as_str(), Some("expired"));
        assert_eq!(h["x-first-death-queue"].as_str(), Some("q1"));
        assert_eq!(h["x-first-death-exchange"].as_str(), Some("orders"));
    }

    #[test]
    fn same_queue_and_reason_counts_up_and_moves_first() {
        let m1 = dead_letter(&original(), "q1", Reason::Rejected, "", Some("q2"));
        assert_eq!(m1.routing_key, "q2");
        let m2 = dead_letter(&m1, "q2", Reason::Expired, "", Some("q1"));
        let m3 = dead_letter(&m2, "q1", Reason::Rejected, "", Some("q2"));
        let d = deaths(&m3);
        assert_eq!(d.len(), 2);
        let t0 = d[0].as_table().unwrap();
        assert_eq!(t0["queue"].as_str(), Some("q1"));
        assert_eq!(t0["count"], HeaderValue::I64(2));
        assert_eq!(
            m3.properties.headers["x-first-death-queue"].as_str(),
            Some("q1")
        );
        assert_eq!(
            m3.properties.headers["x-first-death-reason"].as_str(),
            Some("rejected")
        );
    }

    #[test]
    fn cycles_without_rejection_are_detected() {
        let m = dead_letter(&original(), "a", Reason::Expired, "", Some("b"));
        assert!(!is_cycle(&m, "b"));
        let m = dead_letter(&m, "b", Reason::Expired, "", Some("a"));
        assert!(is_cycle(&m, "a"));
        let r = dead_letter(&original(), "a", Reason::Rejected, "", Some("a"));
        assert!(!is_cycle(&r, "a"));
    }
}
