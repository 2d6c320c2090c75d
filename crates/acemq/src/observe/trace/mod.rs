//! W3C trace context in message headers, and the family's spans; the OpenTelemetry
//! propagator with the `opentelemetry` feature.
//!
#![doc = include_str!("../../../docs/trace.md")]

use std::fmt;
use std::future::Future;

use tracing::Span;
use tracing::field::Empty;

use crate::headers::{HeaderValue, Headers};
use crate::observe::metrics::{ConsumeOutcome, PublishOutcome};

/// The header carrying the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The header carrying the W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";
/// The longest `tracestate` kept (W3C: at most 512 characters are propagated).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// The `sampled` trace flag.
pub const FLAG_SAMPLED: u8 = 0x01;

/// Span attribute: `messaging.system` (always `rabbitmq`).
pub const ATTR_SYSTEM: &str = "messaging.system";
/// Span attribute: `messaging.destination.name`.
pub const ATTR_DESTINATION: &str = "messaging.destination.name";
/// Span attribute: `messaging.operation` (`publish`, `process`).
pub const ATTR_OPERATION: &str = "messaging.operation";
/// Span attribute: `messaging.message.id`.
pub const ATTR_MESSAGE_ID: &str = "messaging.message.id";
/// Span attribute: `messaging.rabbitmq.destination.routing_key`.
pub const ATTR_ROUTING_KEY: &str = "messaging.rabbitmq.destination.routing_key";
/// Span attribute: `messaging.acemq.message_type`.
pub const ATTR_MESSAGE_TYPE: &str = "messaging.acemq.message_type";
/// Span attribute: `messaging.acemq.attempt`.
pub const ATTR_ATTEMPT: &str = "messaging.acemq.attempt";
/// Span attribute: `messaging.acemq.outcome` (recorded when the outcome is known).
pub const ATTR_OUTCOME: &str = "messaging.acemq.outcome";

/// A W3C trace context: which trace, which span, flags and the vendor `tracestate`.
///
/// ```
/// use acemq::observe::trace::TraceContext;
/// let root = TraceContext::new_root();
/// let child = root.child();
/// assert_eq!(child.trace_id, root.trace_id);
/// assert_ne!(child.span_id, root.span_id);
/// let back = TraceContext::parse(&child.to_traceparent(), None).unwrap();
/// assert_eq!(back, child);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// 16-byte trace id (never all zero).
    pub trace_id: [u8; 16],
    /// 8-byte id of this span (never all zero).
    pub span_id: [u8; 8],
    /// Trace flags (bit 0: sampled).
    pub flags: u8,
    /// The vendor `tracestate`, carried unchanged.
    pub tracestate: Option<String>,
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceContext")
            .field("traceparent", &self.to_traceparent())
            .field("tracestate", &self.tracestate)
            .finish()
    }
}

impl TraceContext {
    /// A new trace: random trace and span ids, sampled, no `tracestate`.
    pub fn new_root() -> Self {
        // Both ids from one draw of the thread's generator (each draw has a fixed cost).
        let (mut trace_id, mut span_id) = ([0u8; 16], [0u8; 8]);
        while trace_id == [0; 16] || span_id == [0; 8] {
            let ids: [u8; 24] = rand::random();
            trace_id.copy_from_slice(&ids[..16]);
            span_id.copy_from_slice(&ids[16..]);
        }
        TraceContext {
            trace_id,
            span_id,
            flags: FLAG_SAMPLED,
            tracestate: None,
        }
    }

    /// A child: same trace, flags and `tracestate`; a new span id.
    pub fn child(&self) -> Self {
        TraceContext {
            trace_id: self.trace_id,
            span_id: random_nonzero(),
            flags: self.flags,
            tracestate: self.tracestate.clone(),
        }
    }

    /// Whether the sampled flag is set.
    pub fn is_sampled(&self) -> bool {
        self.flags & FLAG_SAMPLED != 0
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        Hex(&self.trace_id).to_string()
    }

    /// The span id as 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        Hex(&self.span_id).to_string()
    }

    /// `00-{trace id}-{span id}-{flags}`, all lowercase hex.
    ///
    /// ```
    /// use acemq::observe::trace::TraceContext;
    /// let c = TraceContext { trace_id: [0xab; 16], span_id: [0x01; 8], flags: 1, tracestate: None };
    /// assert_eq!(c.to_traceparent(), "00-abababababababababababababababab-0101010101010101-01");
    /// ```
    pub fn to_traceparent(&self) -> String {
        // On every publish: written into a fixed buffer, then copied once (pushing 55
        // `char`s checks the capacity and encodes each).
        let mut out = [0u8; 55];
        out[..3].copy_from_slice(b"00-");
        write_hex(&mut out[3..35], &self.trace_id);
        out[35] = b'-';
        write_hex(&mut out[36..52], &self.span_id);
        out[52] = b'-';
        write_hex(&mut out[53..], &[self.flags]);
        // Hex digits and dashes only: always UTF-8.
        String::from_utf8(out.to_vec()).unwrap_or_default()
    }

    /// Parses a `traceparent` (and keeps `tracestate` when it is non-empty and at most
    /// [`MAX_TRACESTATE_LEN`] characters). Strict: version `00`, exactly 55 characters,
    /// lowercase hex, non-zero ids. Anything else is `None` (the consumer then starts a new
    /// trace rather than joining a corrupt one).
    ///
    /// ```
    /// use acemq::observe::trace::TraceContext;
    /// let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// let c = TraceContext::parse(ok, Some("congo=t61rcWkgMzE")).unwrap();
    /// assert_eq!(c.span_id_hex(), "00f067aa0ba902b7");
    /// assert_eq!(c.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
    /// assert!(TraceContext::parse(&ok.to_uppercase(), None).is_none());
    /// assert!(TraceContext::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None).is_none());
    /// ```
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let b = traceparent.trim().as_bytes();
        if b.len() != 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        if &b[0..2] != b"00" {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        let mut flags = [0u8; 1];
        decode_hex(&b[3..35], &mut trace_id)?;
        decode_hex(&b[36..52], &mut span_id)?;
        decode_hex(&b[53..55], &mut flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE_LEN)
            .map(str::to_owned);
        Some(TraceContext {
            trace_id,
            span_id,
            flags: flags[0],
            tracestate,
        })
    }

    /// Writes `traceparent` (and `tracestate` when present) as string headers, replacing
    /// any already there; removes a stale `tracestate` when this context has none.
    ///
    /// ```
    /// use acemq::headers::Headers;
    /// use acemq::observe::trace::TraceContext;
    /// let mut h = Headers::new();
    /// let c = TraceContext::new_root();
    /// c.inject(&mut h);
    /// assert_eq!(TraceContext::extract(&h), Some(c));
    /// ```
    pub fn inject(&self, headers: &mut Headers) {
        headers.insert(TRACEPARENT.into(), HeaderValue::Str(self.to_traceparent()));
        match &self.tracestate {
            Some(state) => {
                headers.insert(TRACESTATE.into(), HeaderValue::Str(state.clone()));
            }
            None => {
                headers.remove(TRACESTATE);
            }
        }
    }

    /// Reads `traceparent` / `tracestate` (string or UTF-8 byte-array values); `None` when
    /// absent or malformed.
    pub fn extract(headers: &Headers) -> Option<Self> {
        let parent = header_text(headers.get(TRACEPARENT)?)?;
        let state = headers.get(TRACESTATE).and_then(header_text);
        Self::parse(parent, state)
    }

    /// The context for a publish: a child of [`current`] when inside a [`scope`] (a handler
    /// publishing), else a new root. Returns `(context, parent)`.
    pub fn for_publish() -> (TraceContext, Option<TraceContext>) {
        match current() {
            Some(parent) => (parent.child(), Some(parent)),
            None => (TraceContext::new_root(), None),
        }
    }

    /// The context for processing a delivery: a child of the message's `traceparent` when
    /// it has a valid one, else a new root. Returns `(context, parent)`.
    pub fn for_process(headers: &Headers) -> (TraceContext, Option<TraceContext>) {
        match Self::extract(headers) {
            Some(parent) => (parent.child(), Some(parent)),
            None => (TraceContext::new_root(), None),
        }
    }
}

fn header_text(v: &HeaderValue) -> Option<&str> {
    match v {
        HeaderValue::Str(s) => Some(s),
        HeaderValue::Bytes(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn random_nonzero<const N: usize>() -> [u8; N] {
    loop {
        let id: [u8; N] = rand::random();
        if id != [0u8; N] {
            return id;
        }
    }
}

/// Lowercase hex into bytes; `None` on any other character (W3C allows lowercase only).
fn decode_hex(src: &[u8], dst: &mut [u8]) -> Option<()> {
    if src.len() != dst.len() * 2 {
        return None;
    }
    // Looked up, not branched on, and checked once at the end: `NOT_HEX` has a bit no
    // nibble has.
    let mut bad = 0u8;
    for (pair, out) in src.chunks_exact(2).zip(dst.iter_mut()) {
        let (hi, lo) = (NIBBLE[usize::from(pair[0])], NIBBLE[usize::from(pair[1])]);
        bad |= hi | lo;
        *out = (hi << 4) | (lo & 0x0f);
    }
    (bad & NOT_HEX == 0).then_some(())
}

const NOT_HEX: u8 = 0x80;

/// Each byte's value as a lowercase hex digit, or [`NOT_HEX`].
const NIBBLE: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lowercase hex of `bytes` into `out`, which is twice as long.
fn write_hex(out: &mut [u8], bytes: &[u8]) {
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX_DIGITS[usize::from(b >> 4)];
        pair[1] = HEX_DIGITS[usize::from(b & 0x0f)];
    }
}

/// Lowercase hex, formatted only when displayed.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.chunks(16) {
            let mut buf = [0u8; 32];
            let hex = &mut buf[..chunk.len() * 2];
            write_hex(hex, chunk);
            f.write_str(std::str::from_utf8(hex).map_err(|_| fmt::Error)?)?;
        }
        Ok(())
    }
}

/// `"{destination} {operation}"`, formatted only when displayed.
struct SpanName<'a>(&'a str, &'static str);

impl fmt::Display for SpanName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// Runs `fut` with `ctx` as the task's current context (what [`current`] returns and what
/// [`TraceContext::for_publish`] parents from).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use acemq::observe::trace::{self, TraceContext};
/// let ctx = TraceContext::new_root();
/// let inside = trace::scope(ctx.clone(), async { trace::current() }).await;
/// assert_eq!(inside, Some(ctx));
/// assert_eq!(trace::current(), None);
/// # }
/// ```
// Not an `async fn`: one would hold `fut` beside the scope that holds it too, doubling the
// size of every future wrapped (a handler's, a request's) and of each copy of it.
pub fn scope<F: Future>(ctx: TraceContext, fut: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(ctx, fut)
}

/// Runs a closure with `ctx` as the current context (synchronous code).
pub fn sync_scope<R>(ctx: TraceContext, f: impl FnOnce() -> R) -> R {
    CURRENT.sync_scope(ctx, f)
}

/// The current context, when inside a [`scope`].
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(TraceContext::clone).ok()
}

/// The PRODUCER span of one publish: static name `publish`, `otel.name` =
/// `"{destination} publish"` where the destination is the exchange, or the routing key
/// when the exchange is empty. Fields: `otel.kind` = `producer`, `messaging.system` =
/// `rabbitmq`, `messaging.destination.name`, `messaging.operation` = `publish`,
/// `messaging.message.id`, `messaging.rabbitmq.destination.routing_key`,
/// `messaging.acemq.message_type`, `trace_id`, `span_id`, `parent_span_id` (when there is a
/// parent), and `messaging.acemq.outcome` / `otel.status_code` recorded later by
/// [`record_publish_outcome`].
///
/// ```
/// use acemq::observe::trace::{publish_span, TraceContext};
/// let ctx = TraceContext::new_root();
/// let span = publish_span("", "orders.placed", "m-1", "OrderPlaced", &ctx, None);
/// # drop(span);
/// ```
pub fn publish_span(
    exchange: &str,
    routing_key: &str,
    message_id: &str,
    message_type: &str,
    ctx: &TraceContext,
    parent: Option<&TraceContext>,
) -> Span {
    let destination = if exchange.is_empty() {
        routing_key
    } else {
        exchange
    };
    let span = tracing::info_span!(
        "publish",
        otel.name = %SpanName(destination, "publish"),
        otel.kind = "producer",
        otel.status_code = Empty,
        messaging.system = "rabbitmq",
        messaging.destination.name = destination,
        messaging.operation = "publish",
        messaging.message.id = message_id,
        messaging.rabbitmq.destination.routing_key = routing_key,
        messaging.acemq.message_type = message_type,
        messaging.acemq.outcome = Empty,
        trace_id = %Hex(&ctx.trace_id),
        span_id = %Hex(&ctx.span_id),
        parent_span_id = Empty,
    );
    if let Some(p) = parent {
        span.record("parent_span_id", tracing::field::display(Hex(&p.span_id)));
    }
    span
}

/// The CONSUMER span of one delivery's processing: static name `process`, `otel.name` =
/// `"{queue} process"`. Fields: `otel.kind` = `consumer`, `messaging.system` = `rabbitmq`,
/// `messaging.destination.name` = the queue, `messaging.operation` = `process`,
/// `messaging.message.id`, `messaging.acemq.message_type`, `messaging.acemq.attempt`,
/// `trace_id`, `span_id`, `parent_span_id` (the publisher's span, from `traceparent`), and
/// `messaging.acemq.outcome` / `otel.status_code` recorded later by
/// [`record_consume_outcome`].
///
/// ```
/// use acemq::observe::trace::{process_span, TraceContext};
/// let parent = TraceContext::new_root();
/// let ctx = parent.child();
/// let span = process_span("orders.placed", "m-1", "OrderPlaced", 2, &ctx, Some(&parent));
/// # drop(span);
/// ```
pub fn process_span(
    queue: &str,
    message_id: &str,
    message_type: &str,
    attempt: u32,
    ctx: &TraceContext,
    parent: Option<&TraceContext>,
) -> Span {
    let span = tracing::info_span!(
        "process",
        otel.name = %SpanName(queue, "process"),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = "rabbitmq",
        messaging.destination.name = queue,
        messaging.operation = "process",
        messaging.message.id = message_id,
        messaging.acemq.message_type = message_type,
        messaging.acemq.attempt = attempt,
        messaging.acemq.outcome = Empty,
        trace_id = %Hex(&ctx.trace_id),
        span_id = %Hex(&ctx.span_id),
        parent_span_id = Empty,
    );
    if let Some(p) = parent {
        span.record("parent_span_id", tracing::field::display(Hex(&p.span_id)));
    }
    span
}

/// Records a publish span's outcome, and `otel.status_code` = `ERROR` for `unroutable` and
/// `failed`.
pub fn record_publish_outcome(span: &Span, outcome: PublishOutcome) {
    record_outcome(span, outcome.as_str(), outcome.is_error());
}

/// Records a process span's outcome, and `otel.status_code` = `ERROR` for `dead_lettered`
/// and `rejected`.
pub fn record_consume_outcome(span: &Span, outcome: ConsumeOutcome) {
    record_outcome(span, outcome.as_str(), outcome.is_error());
}

/// Records any outcome (`failed` for a scope that ended without one, per the family).
pub fn record_outcome(span: &Span, outcome: &'static str, is_error: bool) {
    span.record(ATTR_OUTCOME, outcome);
    if is_error {
        span.record("otel.status_code", "ERROR");
    }
}

/// Publish side, after [`publish_span`]: with the `opentelemetry` feature and an
/// OpenTelemetry layer installed, `ctx` takes the publish span's OpenTelemetry ids and the
/// context is written into `headers` through the global propagator. Otherwise nothing
/// changes (the `traceparent` [`TraceContext::inject`] wrote stays).
pub(crate) fn link_publish(span: &Span, headers: &mut Headers, ctx: &mut TraceContext) {
    #[cfg(feature = "opentelemetry")]
    otel::inject(span, headers, ctx);
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, headers, ctx);
}

/// Process side, after [`process_span`]: with the `opentelemetry` feature and an
/// OpenTelemetry layer installed, the span's parent is the context extracted from
/// `headers` through the global propagator, and `ctx` takes the span's OpenTelemetry ids.
/// Otherwise nothing changes.
pub(crate) fn link_process(span: &Span, headers: &Headers, ctx: &mut TraceContext) {
    #[cfg(feature = "opentelemetry")]
    otel::extract(span, headers, ctx);
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, headers, ctx);
}

#[cfg(feature = "opentelemetry")]
mod otel;

#[cfg(test)]
mod tests;
