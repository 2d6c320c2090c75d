//! The scheduler's wire, as pure functions: the family's ladder (names, exact arguments),
//! the routing rule, the `x-schedule-*` headers, and the two messages the scheduler
//! writes (a hop, a delivery). `docs/scheduling.md` and `docs/wire.md` describe it.
//!
//! Nothing here does I/O or reads a clock: the caller passes `now` in epoch milliseconds.

use std::time::Duration;

use bytes::Bytes;

use crate::envelope::{self, Envelope, RESERVED_PREFIX, is_reserved};
use crate::headers::{HeaderValue, Headers};
use crate::topology::{ExchangeDecl, ExchangeKind, QueueDecl, Topology};
use crate::transport::{Outbound, Properties};

/// The scheduler's exchange (direct, durable): rungs are bound to it on their own names,
/// and every rung dead-letters back to it with [`CONTROL_QUEUE`] as the key.
pub const EXCHANGE: &str = "acemq.schedule";

/// The queue every expired message returns to, consumed by the schedulers.
pub const CONTROL_QUEUE: &str = "acemq.schedule.due";

/// Where a scheduled message that cannot be delivered (or read) is kept, with the reason
/// in `x-acemq-error`: the name the Java member's control consumer already declares.
pub const DEAD_LETTER_QUEUE: &str = "acemq.schedule.due.dlq";

/// Header: the exchange the message is finally published to (`""` = default).
pub const TARGET_EXCHANGE: &str = "x-schedule-exchange";
/// Header: the routing key the message is finally published with.
pub const TARGET_ROUTING_KEY: &str = "x-schedule-routing-key";
/// Header: when it is due, epoch milliseconds (written as a long-long; read at any integer
/// width or as a numeric string).
pub const DUE_AT: &str = "x-schedule-due-at";
/// Header: the content type the payload was encoded as (delivered under it; absent means
/// `application/json`).
pub const CONTENT_TYPE: &str = "x-schedule-content-type";

/// Prefix of the headers (Rust member only) that carry the scheduled message's own
/// envelope across hops: `x-acemq-id` travels as `x-schedule-acemq-id`, and so on for every
/// envelope field. Not `x-acemq-`: that prefix is the envelope's and is not passed on by
/// other members' hops.
pub const CARRIED_ENVELOPE_PREFIX: &str = "x-schedule-acemq-";
/// Header (Rust member only): the scheduled message's `traceparent`, carried across hops so
/// the delivered message continues the trace it was scheduled in.
pub const CARRIED_TRACEPARENT: &str = "x-schedule-traceparent";
/// Header (Rust member only): the scheduled message's `tracestate`.
pub const CARRIED_TRACESTATE: &str = "x-schedule-tracestate";

/// The envelope type of a hop, and of a delivered message whose own envelope did not
/// travel with it (scheduled by another member).
pub const HOP_TYPE: &str = "ScheduledMessage";

/// The content type a hop is published under (its body is the payload's bytes).
pub const HOP_CONTENT_TYPE: &str = "application/octet-stream";

/// What a delivered message is published under when no `x-schedule-content-type` says.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";

/// The rungs, longest first: the time a message waits in each, in milliseconds.
pub const RUNGS_MS: [i64; 5] = [3_600_000, 600_000, 60_000, 10_000, 1_000];

/// The smallest rung: less than this remaining, a message is not hopped again.
const SMALLEST_RUNG_MS: i64 = RUNGS_MS[4];

/// A rung's queue name: `acemq.schedule.{n}{h|m|s}` (whole hours, else whole minutes,
/// else seconds; the family has no `ms` branch).
///
/// ```
/// use std::time::Duration;
/// use acemq::schedule::rung_name;
/// assert_eq!(rung_name(Duration::from_secs(3600)), "acemq.schedule.1h");
/// assert_eq!(rung_name(Duration::from_secs(90)), "acemq.schedule.90s");
/// ```
pub fn rung_name(rung: Duration) -> String {
    let ms = rung.as_millis();
    let described = if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1_000)
    };
    format!("{EXCHANGE}.{described}")
}

/// A rung's arguments, exactly Java's table: `x-message-ttl` (a long-long),
/// `x-dead-letter-exchange = acemq.schedule`, `x-dead-letter-routing-key =
/// acemq.schedule.due`, and no `x-queue-type`.
///
/// ```
/// use std::time::Duration;
/// use acemq::headers::HeaderValue;
/// let args = acemq::schedule::rung_arguments(Duration::from_secs(600));
/// assert_eq!(args["x-message-ttl"], HeaderValue::I64(600_000));
/// assert_eq!(args.len(), 3);
/// ```
pub fn rung_arguments(rung: Duration) -> Headers {
    let ttl = i64::try_from(rung.as_millis()).unwrap_or(i64::MAX);
    let mut args = Headers::new();
    args.insert("x-message-ttl".into(), HeaderValue::I64(ttl));
    args.insert("x-dead-letter-exchange".into(), HeaderValue::from(EXCHANGE));
    args.insert(
        "x-dead-letter-routing-key".into(),
        HeaderValue::from(CONTROL_QUEUE),
    );
    args
}

/// The whole ladder: the exchange, the five rungs and the control queue, each bound on its
/// own name. Declaring it is what a process that only schedules needs.
///
/// ```
/// let t = acemq::schedule::topology();
/// assert_eq!(t.queues().len(), 6);
/// assert!(t.queues().iter().all(|q| !q.arguments.contains_key("x-queue-type")));
/// ```
pub fn topology() -> Topology {
    let mut builder =
        Topology::define().exchange_decl(ExchangeDecl::durable(EXCHANGE, ExchangeKind::Direct));
    for ms in RUNGS_MS {
        let rung = Duration::from_millis(ms.unsigned_abs());
        let name = rung_name(rung);
        let mut decl = QueueDecl::classic(name.clone());
        decl.arguments = rung_arguments(rung);
        builder = builder.queue_decl(decl).bind(name.clone(), EXCHANGE, name);
    }
    builder
        .queue_decl(QueueDecl::classic(CONTROL_QUEUE))
        .bind(CONTROL_QUEUE, EXCHANGE, CONTROL_QUEUE)
        .build()
        // Every item is fixed and distinct: a conflict would be a bug in this table.
        .unwrap_or_else(|e| unreachable!("the scheduler's ladder is consistent: {e}"))
}

/// Where a message goes next, `remaining` milliseconds before it is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Due (or overdue): publish it to its destination now.
    Deliver,
    /// Due in less than the smallest rung: wait this long in the consumer, then deliver
    /// (never early). A message scheduled this close is published to the control queue.
    Soon(Duration),
    /// Wait on this rung (its queue name), the largest not past the remaining time.
    Rung(String),
}

/// The routing rule: due → deliver; under a second → wait it out; otherwise the largest
/// rung not longer than the remaining time.
///
/// ```
/// use acemq::schedule::{route, Route};
/// assert_eq!(route(86_400_000), Route::Rung("acemq.schedule.1h".into()));
/// assert_eq!(route(3_599_000), Route::Rung("acemq.schedule.10m".into()));
/// assert_eq!(route(0), Route::Deliver);
/// ```
pub fn route(remaining_ms: i64) -> Route {
    if remaining_ms <= 0 {
        return Route::Deliver;
    }
    if remaining_ms < SMALLEST_RUNG_MS {
        return Route::Soon(Duration::from_millis(remaining_ms.unsigned_abs()));
    }
    let rung = RUNGS_MS
        .iter()
        .copied()
        .find(|r| *r <= remaining_ms)
        .unwrap_or(SMALLEST_RUNG_MS);
    Route::Rung(rung_name(Duration::from_millis(rung.unsigned_abs())))
}

/// Where and when a scheduled message goes, read from its `x-schedule-*` headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) due_at_ms: i64,
    pub(crate) content_type: String,
}

impl Target {
    /// Reads the four headers (the due time at any integer width, a float, or a numeric
    /// string); the error names what is missing, for the dead-letter reason.
    pub(crate) fn read(headers: &Headers) -> Result<Target, String> {
        let text = |name: &str| -> Result<String, String> {
            match headers.get(name) {
                Some(HeaderValue::Str(s)) => Ok(s.clone()),
                Some(HeaderValue::Bytes(b)) => {
                    String::from_utf8(b.clone()).map_err(|_| format!("{name} is not text"))
                }
                Some(other) => Err(format!("{name} is not a string: {other:?}")),
                None => Err(format!("{name} is missing")),
            }
        };
        let exchange = text(TARGET_EXCHANGE);
        let routing_key = text(TARGET_ROUTING_KEY);
        let due_at = headers
            .get(DUE_AT)
            .ok_or_else(|| format!("{DUE_AT} is missing"))
            .and_then(|v| millis(v).ok_or_else(|| format!("{DUE_AT} is not a number: {v:?}")));
        let problems: Vec<String> = [&exchange, &routing_key]
            .into_iter()
            .filter_map(|r| r.as_ref().err().cloned())
            .chain(due_at.as_ref().err().cloned())
            .collect();
        if !problems.is_empty() {
            return Err(format!(
                "not a scheduled message ({}): something other than a scheduler publishes into {EXCHANGE}'s queues",
                problems.join("; ")
            ));
        }
        let content_type = match headers.get(CONTENT_TYPE) {
            Some(HeaderValue::Str(s)) if !s.is_empty() => s.clone(),
            _ => DEFAULT_CONTENT_TYPE.to_owned(),
        };
        Ok(Target {
            exchange: exchange.unwrap_or_default(),
            routing_key: routing_key.unwrap_or_default(),
            due_at_ms: due_at.unwrap_or_default(),
            content_type,
        })
    }
}

/// Epoch milliseconds from any integer width, a float (Go writes what it is given) or a
/// numeric string; a boolean is not a number.
fn millis(v: &HeaderValue) -> Option<i64> {
    match v {
        HeaderValue::Bool(_) => None,
        // Saturating on purpose: a due time past i64 is "never", not an error.
        #[allow(clippy::cast_possible_truncation)]
        HeaderValue::F64(f) if f.is_finite() => Some(*f as i64),
        #[allow(clippy::cast_possible_truncation)]
        HeaderValue::F32(f) if f.is_finite() => Some(*f as i64),
        HeaderValue::Str(s) => {
            let s = s.trim();
            s.parse::<i64>().ok().or_else(|| {
                #[allow(clippy::cast_possible_truncation)]
                s.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(|f| f as i64)
            })
        }
        other => other.as_i64(),
    }
}

/// Whether a header is bookkeeping the broker's dead-lettering added (`x-death`,
/// `x-first-death-*`, `x-last-death-*`), stripped before a hop and a delivery.
fn is_death(name: &str) -> bool {
    name == "x-death" || name.starts_with("x-first-death-") || name.starts_with("x-last-death-")
}

/// Whether a header is the scheduler's own (never passed on to the destination).
fn is_schedule(name: &str) -> bool {
    name.starts_with("x-schedule-")
}

/// The message a new schedule puts on the wire, from the message as the application built
/// it (`original`: envelope, trace context, headers, encoded body): its envelope and trace
/// context move into `x-schedule-acemq-*` / `x-schedule-traceparent`, the four family
/// headers are added, and it gets a hop envelope (below); published to `key` on
/// [`EXCHANGE`] (a rung, or the control queue when due within a second).
pub(crate) fn scheduled(original: Outbound, due_at_ms: i64, key: &str, origin: &str) -> Outbound {
    let Outbound {
        exchange,
        routing_key,
        properties,
        body,
        ..
    } = original;
    let content_type = properties
        .content_type
        .clone()
        .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned());
    let mut headers = Headers::new();
    for (name, value) in properties.headers {
        if let Some(field) = name.strip_prefix(RESERVED_PREFIX) {
            headers.insert(format!("{CARRIED_ENVELOPE_PREFIX}{field}").into(), value);
        } else if name == "traceparent" {
            headers.insert(CARRIED_TRACEPARENT.into(), value);
        } else if name == "tracestate" {
            headers.insert(CARRIED_TRACESTATE.into(), value);
        } else {
            headers.insert(name, value);
        }
    }
    headers.insert(TARGET_EXCHANGE.into(), HeaderValue::Str(exchange));
    headers.insert(TARGET_ROUTING_KEY.into(), HeaderValue::Str(routing_key));
    headers.insert(DUE_AT.into(), HeaderValue::I64(due_at_ms));
    headers.insert(CONTENT_TYPE.into(), HeaderValue::Str(content_type));
    hop_message(headers, body, key.to_owned(), origin)
}

/// A hop of a message the control queue delivered (its application headers and body) to
/// `key` on [`EXCHANGE`]: the same bytes, everything the message carried except the
/// broker's death bookkeeping, a fresh hop envelope.
pub(crate) fn hop(headers: &Headers, body: Bytes, key: &str, origin: &str) -> Outbound {
    let carried: Headers = headers
        .iter()
        .filter(|(k, _)| !is_death(k) && !is_reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    hop_message(carried, body, key.to_owned(), origin)
}

/// A hop: `x-acemq-type: ScheduledMessage`, a new id, attempt 1, first seen now (what the
/// family writes), correlated with the scheduled message's id when it travels with it;
/// body as bytes under `application/octet-stream`, persistent.
fn hop_message(mut headers: Headers, body: Bytes, key: String, origin: &str) -> Outbound {
    let mut envelope = Envelope::new(HOP_TYPE);
    if let Some(HeaderValue::Str(id)) = headers.get(carried(envelope::ID).as_str()) {
        envelope = envelope.with_correlation_id(id.clone());
    }
    envelope.write(&mut headers, origin);
    let properties = Properties {
        message_id: Some(envelope.id().to_owned()),
        content_type: Some(HOP_CONTENT_TYPE.to_owned()),
        delivery_mode: Some(2),
        headers,
        ..Properties::default()
    };
    Outbound::new(EXCHANGE, key, properties, body)
}

/// The carried name of an envelope header (`x-acemq-id` → `x-schedule-acemq-id`).
fn carried(envelope_header: &str) -> String {
    let field = envelope_header
        .strip_prefix(RESERVED_PREFIX)
        .unwrap_or(envelope_header);
    format!("{CARRIED_ENVELOPE_PREFIX}{field}")
}

/// The message delivered to the destination, from a due control message (its application
/// headers and body): the body verbatim under the carried content type; the scheduled
/// message's own envelope and trace context rebuilt from what travelled with it (a
/// message scheduled by another member, which carries none, gets the family's fresh
/// `ScheduledMessage` envelope); no `x-schedule-*` header and no death bookkeeping passed
/// on. Returns the message and its envelope id.
pub(crate) fn delivery(
    headers: &Headers,
    body: Bytes,
    target: &Target,
    origin: &str,
) -> (Outbound, String) {
    let mut out = Headers::new();
    let mut own_envelope = false;
    for (name, value) in headers {
        if let Some(field) = name.strip_prefix(CARRIED_ENVELOPE_PREFIX) {
            own_envelope = true;
            out.insert(format!("{RESERVED_PREFIX}{field}").into(), value.clone());
        } else if name == CARRIED_TRACEPARENT {
            out.insert("traceparent".into(), value.clone());
        } else if name == CARRIED_TRACESTATE {
            out.insert("tracestate".into(), value.clone());
        } else if !is_schedule(name) && !is_death(name) && !is_reserved(name) {
            out.entry(name.clone()).or_insert_with(|| value.clone());
        }
    }
    let probe = Properties {
        headers: out.clone(),
        ..Properties::default()
    };
    let envelope = if own_envelope {
        // The attempt starts again: nothing has handled it yet.
        Envelope::read(&probe, &target.routing_key).with_attempt(1)
    } else {
        Envelope::new(HOP_TYPE)
    };
    envelope.write(&mut out, origin);
    let id = envelope.id().to_owned();
    let properties = Properties {
        message_id: Some(id.clone()),
        content_type: Some(target.content_type.clone()),
        delivery_mode: Some(2),
        headers: out,
        ..Properties::default()
    };
    let message = Outbound::new(
        target.exchange.clone(),
        target.routing_key.clone(),
        properties,
        body,
    );
    (message, id)
}

/// The scheduled message's id as it travels (for cancellation and logs), if it does.
pub(crate) fn carried_id(headers: &Headers) -> Option<&str> {
    headers
        .get(carried(envelope::ID).as_str())
        .and_then(HeaderValue::as_str)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
