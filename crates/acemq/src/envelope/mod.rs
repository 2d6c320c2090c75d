//! The envelope: AceMQ's wire contract in the message headers (`docs/wire.md` §1–§3).
//!
//! This module owns the `x-acemq-*` header names and their exact wire types (strings,
//! int32 attempt and version, int64 epoch-millisecond first-seen), the shared `acemq-*`
//! replay provenance headers, tolerant reading with the family's defaults, the reserved
//! prefix rule (stripped from what handlers see, refused on publish), and the origin stamp.

pub(crate) mod cause;
mod fields;
mod route;

pub use route::{ROUTE, ROUTE_ID, ROUTE_POSITION, Route};

use fields::{Fields, positive, text};

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::error::Error;
use crate::headers::{HeaderName, HeaderValue, Headers};
use crate::transport::Properties;

/// The reserved prefix: every header with it belongs to the engine.
pub const RESERVED_PREFIX: &str = "x-acemq-";
/// Message id (string); also the AMQP `message_id`.
pub const ID: &str = "x-acemq-id";
/// Logical message type (string).
pub const TYPE: &str = "x-acemq-type";
/// Payload schema version (int32, >= 1).
pub const VERSION: &str = "x-acemq-version";
/// Correlation id (string).
pub const CORRELATION: &str = "x-acemq-correlation";
/// Causation id (string, only when set).
pub const CAUSATION: &str = "x-acemq-causation";
/// Delivery attempt (int32, first = 1).
pub const ATTEMPT: &str = "x-acemq-attempt";
/// First publish, epoch milliseconds (int64).
pub const FIRST_SEEN: &str = "x-acemq-first-seen";
/// `{client}@{hostname}` (string).
pub const ORIGIN: &str = "x-acemq-origin";
/// Reason on `.dlq` / `.parked` copies (string).
pub const ERROR: &str = "x-acemq-error";
/// Pointer to an external payload (string, only when set).
pub const CLAIM: &str = "x-acemq-claim";
/// Queue a replayed copy came out of (shared header).
pub const REPLAYED_FROM: &str = "acemq-replayed-from";
/// When it was replayed, RFC 3339 UTC (shared header).
pub const REPLAYED_AT: &str = "acemq-replayed-at";
/// How many times it was replayed (int32, shared header).
pub const REPLAY_COUNT: &str = "acemq-replay-count";
/// Reply queue of a request (shared header; also the `reply_to` property).
pub const REPLY_TO: &str = "acemq-reply-to";
/// On a reply: the responder's handler failed, and this is why (shared header, string;
/// the reply's body is empty). Go and Ruby write and read it too.
pub const REPLY_ERROR: &str = "acemq-error";
/// The default client name in the origin stamp.
pub const DEFAULT_CLIENT_NAME: &str = "acemq";

/// The AceMQ envelope of one message.
///
/// ```
/// use acemq::envelope::Envelope;
/// let e = Envelope::new("order.placed").with_correlation_id("c-1");
/// assert_eq!(e.message_type(), "order.placed");
/// assert_eq!(e.attempt(), 1);
/// assert_eq!(e.correlation_id(), "c-1");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    id: String,
    message_type: String,
    version: i32,
    correlation_id: String,
    causation_id: Option<String>,
    attempt: i32,
    first_seen_ms: Option<i64>,
    origin: Option<String>,
    error: Option<String>,
    claim: Option<String>,
    replayed_from: Option<String>,
    replayed_at: Option<OffsetDateTime>,
    replay_count: i32,
    reply_to: Option<String>,
    route: Option<Route>,
}

impl Envelope {
    /// A fresh envelope: new UUID v4 id, correlation = id, attempt 1, version 1,
    /// first-seen now. An empty type reads as `message`.
    pub fn new(message_type: impl Into<String>) -> Self {
        Self::fresh(message_type.into(), None, None)
    }

    /// [`Envelope::new`] with the id and correlation a publish was given, if any: a fresh
    /// id is made only when none was given, and copied into the correlation only when that
    /// was not given either (what `new` followed by `with_id` and `with_correlation_id`
    /// gives, without the copies they replace).
    pub(crate) fn fresh(
        message_type: String,
        id: Option<String>,
        correlation_id: Option<String>,
    ) -> Self {
        let id = id.unwrap_or_else(new_id);
        let message_type = non_empty(message_type).unwrap_or_else(|| "message".into());
        Envelope {
            correlation_id: correlation_id.unwrap_or_else(|| id.clone()),
            id,
            message_type,
            version: 1,
            causation_id: None,
            attempt: 1,
            first_seen_ms: Some(now_millis()),
            origin: None,
            error: None,
            claim: None,
            replayed_from: None,
            replayed_at: None,
            replay_count: 0,
            reply_to: None,
            route: None,
        }
    }

    /// Reads an envelope from delivered properties, tolerantly (`docs/wire.md` §2): id falls back
    /// to `message_id` then a fresh UUID; correlation to the id; type to the routing key or
    /// `message`; version and attempt to 1 when missing, below 1 or unreadable; integers at
    /// any width or as numeric strings; empty strings read as absent; a missing first-seen
    /// is an unknown age.
    ///
    /// ```
    /// use acemq::envelope::Envelope;
    /// use acemq::transport::Properties;
    /// let e = Envelope::read(&Properties::default(), "orders.new");
    /// assert_eq!(e.message_type(), "orders.new");
    /// assert_eq!(e.attempt(), 1);
    /// assert_eq!(e.first_seen_millis(), None);
    /// ```
    pub fn read(properties: &Properties, routing_key: &str) -> Self {
        let f = Fields::of(&properties.headers);
        let id =
            f.id.and_then(text)
                .or_else(|| properties.message_id.clone().and_then(non_empty))
                .unwrap_or_else(new_id);
        let message_type = f
            .message_type
            .and_then(text)
            .or_else(|| non_empty(routing_key.to_owned()))
            .unwrap_or_else(|| "message".into());
        Envelope {
            correlation_id: f.correlation.and_then(text).unwrap_or_else(|| id.clone()),
            id,
            message_type,
            version: positive(f.version),
            causation_id: f.causation.and_then(text),
            attempt: positive(f.attempt),
            first_seen_ms: f.first_seen.and_then(HeaderValue::as_i64),
            origin: f.origin.and_then(text),
            error: f.error.and_then(text),
            claim: f.claim.and_then(text),
            replayed_from: f.replayed_from.and_then(text),
            replayed_at: f.replayed_at.and_then(read_instant),
            replay_count: f
                .replay_count
                .and_then(HeaderValue::as_i64)
                .and_then(|v| i32::try_from(v).ok())
                .filter(|v| *v >= 0)
                .unwrap_or(0),
            reply_to: f
                .reply_to
                .and_then(text)
                .or_else(|| properties.reply_to.clone().and_then(non_empty)),
            route: if f.route {
                Route::read(&properties.headers)
            } else {
                None
            },
        }
    }

    /// Writes every `x-acemq-*` field into `headers` with its wire type, replacing what
    /// was there, and removes optional ones that are unset. Stamps `origin` when unset.
    /// Replay provenance (`acemq-*`) is written only when present.
    ///
    /// ```
    /// use acemq::envelope::Envelope;
    /// use acemq::headers::Headers;
    /// let mut h = Headers::new();
    /// Envelope::new("order.placed").write(&mut h, "svc@host");
    /// assert_eq!(h["x-acemq-type"].as_str(), Some("order.placed"));
    /// assert_eq!(h["x-acemq-origin"].as_str(), Some("svc@host"));
    /// ```
    pub fn write(&self, headers: &mut Headers, default_origin: &str) {
        self.clone().into_headers(headers, default_origin);
    }

    /// [`Envelope::write`], consuming the envelope: its strings move into the headers
    /// instead of being copied (what every publish does once it has built its envelope).
    ///
    /// ```
    /// use acemq::envelope::Envelope;
    /// use acemq::headers::Headers;
    /// let mut h = Headers::new();
    /// Envelope::new("order.placed").with_id("o-1").into_headers(&mut h, "svc@host");
    /// assert_eq!(h["x-acemq-id"].as_str(), Some("o-1"));
    /// assert_eq!(h["x-acemq-correlation"].as_str(), Some("o-1"));
    /// ```
    pub fn into_headers(self, headers: &mut Headers, default_origin: &str) {
        // Unset fields are removed only where some reserved header is there to remove: a
        // publish's headers carry none (they were refused), and each removal is a lookup.
        let stale = headers.keys().any(|k| is_reserved(k));
        let origin = self.origin.unwrap_or_else(|| default_origin.to_owned());
        // The seven fields every message carries, in ascending name order.
        let always: [(HeaderName, HeaderValue); 7] = [
            (ATTEMPT.into(), HeaderValue::I32(self.attempt)),
            (CORRELATION.into(), HeaderValue::Str(self.correlation_id)),
            (
                FIRST_SEEN.into(),
                HeaderValue::I64(self.first_seen_ms.unwrap_or_else(now_millis)),
            ),
            (ID.into(), HeaderValue::Str(self.id)),
            (ORIGIN.into(), HeaderValue::Str(origin)),
            (TYPE.into(), HeaderValue::Str(self.message_type)),
            (VERSION.into(), HeaderValue::I32(self.version)),
        ];
        if headers.is_empty() {
            // Built in one pass from names already in order (what most publishes write
            // into): no search, and no entries shifted to make room, per field.
            *headers = Headers::from(always);
        } else {
            // Last name first: a B-tree node is searched from its first key, so each name,
            // smaller than every one already there, is compared with one name only.
            for (name, value) in always.into_iter().rev() {
                headers.insert(name, value);
            }
        }
        let opt = |headers: &mut Headers, name, value| set_opt(headers, name, value, stale);
        match &self.route {
            Some(route) => route.write(headers),
            None if stale => Route::clear(headers),
            None => {}
        }
        opt(headers, ERROR, self.error);
        opt(headers, CLAIM, self.claim);
        opt(headers, CAUSATION, self.causation_id);
        if let Some(r) = self.reply_to {
            headers.insert(REPLY_TO.into(), HeaderValue::Str(r));
        }
        if let Some(from) = self.replayed_from {
            headers.insert(REPLAYED_FROM.into(), HeaderValue::Str(from));
        }
        if let Some(at) = self.replayed_at {
            headers.insert(REPLAYED_AT.into(), HeaderValue::Str(format_instant(at)));
        }
        if self.replay_count > 0 {
            headers.insert(REPLAY_COUNT.into(), HeaderValue::I32(self.replay_count));
        }
    }

    /// The message id (also the AMQP `message_id` and the idempotency key).
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The logical type.
    pub fn message_type(&self) -> &str {
        &self.message_type
    }
    /// The payload schema version (>= 1).
    pub fn version(&self) -> i32 {
        self.version
    }
    /// The correlation id.
    pub fn correlation_id(&self) -> &str {
        &self.correlation_id
    }
    /// The id of the parent message, when set.
    pub fn causation_id(&self) -> Option<&str> {
        self.causation_id.as_deref()
    }
    /// The delivery attempt, first = 1.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
    /// Epoch milliseconds of the first publish, if known.
    pub fn first_seen_millis(&self) -> Option<i64> {
        self.first_seen_ms
    }
    /// Age since the first publish; `None` when unknown (an unknown age counts as young).
    pub fn age(&self) -> Option<Duration> {
        let first = self.first_seen_ms?;
        let now = now_millis();
        Some(Duration::from_millis(
            u64::try_from(now.saturating_sub(first)).unwrap_or(0),
        ))
    }
    /// `{client}@{hostname}` of the publisher, when known.
    pub fn origin(&self) -> Option<&str> {
        self.origin.as_deref()
    }
    /// The reason on a `.dlq` / `.parked` copy.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
    /// The application's pointer to an external payload.
    pub fn claim(&self) -> Option<&str> {
        self.claim.as_deref()
    }
    /// The queue this copy was replayed out of.
    pub fn replayed_from(&self) -> Option<&str> {
        self.replayed_from.as_deref()
    }
    /// When this copy was replayed.
    pub fn replayed_at(&self) -> Option<OffsetDateTime> {
        self.replayed_at
    }
    /// How many times this message has been replayed (0 = never).
    pub fn replay_count(&self) -> i32 {
        self.replay_count
    }
    /// The reply queue of a request.
    pub fn reply_to(&self) -> Option<&str> {
        self.reply_to.as_deref()
    }

    /// Sets the id (and the correlation, when it still equals the old id).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        let id = id.into();
        if self.correlation_id == self.id {
            self.correlation_id = id.clone();
        }
        self.id = id;
        self
    }
    /// Sets the logical type.
    pub fn with_message_type(mut self, t: impl Into<String>) -> Self {
        self.message_type = t.into();
        self
    }
    /// Sets the schema version (values below 1 are refused on publish).
    pub fn with_version(mut self, v: i32) -> Self {
        self.version = v;
        self
    }
    /// Sets the correlation id.
    pub fn with_correlation_id(mut self, c: impl Into<String>) -> Self {
        self.correlation_id = c.into();
        self
    }
    /// Sets the causation id.
    pub fn with_causation_id(mut self, c: impl Into<String>) -> Self {
        self.causation_id = non_empty(c.into());
        self
    }
    /// Sets the attempt.
    pub fn with_attempt(mut self, a: i32) -> Self {
        self.attempt = a;
        self
    }
    /// Sets the first-seen instant (epoch ms).
    pub fn with_first_seen_millis(mut self, ms: i64) -> Self {
        self.first_seen_ms = Some(ms);
        self
    }
    /// Sets the origin.
    pub fn with_origin(mut self, o: impl Into<String>) -> Self {
        self.origin = non_empty(o.into());
        self
    }
    /// Sets (or clears) the error reason.
    pub fn with_error(mut self, e: Option<String>) -> Self {
        self.error = e.and_then(non_empty);
        self
    }
    /// Sets the claim pointer (an empty one reads as absent).
    pub fn with_claim(mut self, c: impl Into<String>) -> Self {
        self.claim = non_empty(c.into());
        self
    }
    /// Records a replay: from which queue, when, and the count + 1.
    pub fn replayed(mut self, from: impl Into<String>, at: OffsetDateTime) -> Self {
        self.replayed_from = Some(from.into());
        self.replayed_at = Some(at);
        self.replay_count = self.replay_count.saturating_add(1);
        self
    }
    /// The declared routing slip (a pipeline's message), if any.
    pub fn route(&self) -> Option<&Route> {
        self.route.as_ref()
    }

    /// With the declared routing slip `route` (`None` removes it).
    pub fn with_route(mut self, route: Option<Route>) -> Self {
        self.route = route;
        self
    }

    /// Sets the reply queue.
    pub fn with_reply_to(mut self, r: impl Into<String>) -> Self {
        self.reply_to = non_empty(r.into());
        self
    }
}

/// The headers a handler sees: everything except the reserved `x-acemq-*` ones.
///
/// ```
/// use acemq::envelope::application_headers;
/// use acemq::headers::{Headers, HeaderValue};
/// let mut h = Headers::new();
/// h.insert("x-acemq-attempt".into(), HeaderValue::I32(2));
/// h.insert("x-tenant".into(), HeaderValue::from("acme"));
/// let app = application_headers(&h);
/// assert_eq!(app.len(), 1);
/// assert!(app.contains_key("x-tenant"));
/// ```
pub fn application_headers(headers: &Headers) -> Headers {
    // Inserted one by one (`collect` would gather them in a vector and sort it first), last
    // name first: a node is searched from its first key, so each is compared with one name.
    let mut app = Headers::new();
    for (k, v) in headers.iter().rev().filter(|(k, _)| !is_reserved(k)) {
        app.insert(k.clone(), v.clone());
    }
    app
}

/// Refuses application headers that use the reserved prefix.
///
/// ```
/// use acemq::envelope::check_application_headers;
/// use acemq::headers::{Headers, HeaderValue};
/// let mut h = Headers::new();
/// h.insert("X-AceMQ-attempt".into(), HeaderValue::I32(9));
/// assert!(check_application_headers(&h).is_err());
/// ```
pub fn check_application_headers(headers: &Headers) -> Result<(), Error> {
    match headers.keys().find(|k| is_reserved(k)) {
        Some(name) => Err(Error::ReservedHeader {
            name: name.to_string(),
        }),
        None => Ok(()),
    }
}

/// Whether a header name is in the engine's reserved namespace (case-insensitive).
pub fn is_reserved(name: &str) -> bool {
    name.len() >= RESERVED_PREFIX.len()
        && name.as_bytes()[..RESERVED_PREFIX.len()].eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes())
}

/// `{client_name}@{hostname}` (hostname falls back to `unknown-host`).
///
/// ```
/// let o = acemq::envelope::origin_for("orders");
/// assert!(o.starts_with("orders@"));
/// ```
pub fn origin_for(client_name: &str) -> String {
    format!("{client_name}@{}", hostname())
}

fn hostname() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown-host".into())
    })
}

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Formats an instant the way AceMQ writes `acemq-replayed-at`: RFC 3339, UTC, with
/// milliseconds (`2026-02-03T04:05:06.789Z`).
pub fn format_instant(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.millisecond()
    )
}

/// Reads `acemq-replayed-at` in its three forms: epoch milliseconds as a number (older
/// Java), RFC 3339 with `Z` (Go, Ruby), RFC 3339 with `+00:00` and microseconds (Python).
pub fn read_instant(value: &HeaderValue) -> Option<OffsetDateTime> {
    match value {
        HeaderValue::Str(s) => {
            let s = s.trim();
            OffsetDateTime::parse(s, &Rfc3339).ok().or_else(|| {
                s.parse::<i64>()
                    .ok()
                    .and_then(|ms| from_millis(i128::from(ms)))
            })
        }
        HeaderValue::Timestamp(secs) => OffsetDateTime::from_unix_timestamp(*secs as i64).ok(),
        other => other.as_i64().and_then(|ms| from_millis(i128::from(ms))),
    }
}

fn from_millis(ms: i128) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(ms.checked_mul(1_000_000)?).ok()
}

/// A fresh message id: a UUID v4, lowercase and hyphenated (written straight into its
/// string, not through `fmt`: one per publish).
pub(crate) fn new_id() -> String {
    id_text(uuid::Uuid::new_v4())
}

/// A UUID as an id's text: lowercase and hyphenated, written straight into its string.
pub(crate) fn id_text(id: uuid::Uuid) -> String {
    let mut buf = uuid::Uuid::encode_buffer();
    id.hyphenated().encode_lower(&mut buf).to_owned()
}

fn non_empty(s: String) -> Option<String> {
    if s.is_empty() { None } else { Some(s) }
}

/// Writes an optional field, or removes a stale one when `stale` says there may be one.
fn set_opt(headers: &mut Headers, name: &'static str, value: Option<String>, stale: bool) {
    match value {
        Some(v) if !v.is_empty() => {
            headers.insert(name.into(), HeaderValue::Str(v));
        }
        _ if stale => {
            headers.remove(name);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
