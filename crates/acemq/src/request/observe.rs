//! The request's metrics and span (wire.md §9): `acemq.request.duration` (seconds,
//! histogram) and `acemq.request.total`, tagged `routing.key`, `message.type`, `transport`
//! and `outcome`; the CLIENT span `{destination} request`.

use std::time::Duration;

use tracing::Span;
use tracing::field::Empty;

use crate::observe::metrics::{
    REQUEST_DURATION, REQUEST_TOTAL, TAG_MESSAGE_TYPE, TAG_OUTCOME, TAG_ROUTING_KEY, TAG_TRANSPORT,
};
use crate::observe::trace::TraceContext;

/// How a request ended: the `outcome` tag of `acemq.request.*` (the family's closed set).
///
/// ```
/// use acemq::request::RequestOutcome;
/// assert_eq!(RequestOutcome::TimedOut.as_str(), "timed_out");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestOutcome {
    /// A matching reply came in time.
    Answered,
    /// No reply within the timeout.
    TimedOut,
    /// The responder answered with a fault reply (`acemq-error`): its handler failed.
    /// Go's name for the outcome.
    Failed,
}

impl RequestOutcome {
    /// The tag value.
    pub const fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Answered => "answered",
            RequestOutcome::TimedOut => "timed_out",
            RequestOutcome::Failed => "failed",
        }
    }
}

/// Counts one request and records its round trip.
pub(super) fn record(
    routing_key: &str,
    message_type: &str,
    transport: &'static str,
    outcome: RequestOutcome,
    elapsed: Duration,
) {
    let labels = [
        (TAG_ROUTING_KEY, routing_key.to_owned()),
        (TAG_MESSAGE_TYPE, message_type.to_owned()),
        (TAG_TRANSPORT, transport.to_owned()),
        (TAG_OUTCOME, outcome.as_str().to_owned()),
    ];
    metrics::histogram!(REQUEST_DURATION, &labels).record(elapsed.as_secs_f64());
    metrics::counter!(REQUEST_TOTAL, &labels).increment(1);
}

/// The CLIENT span of one request: static name `request`, `otel.name` =
/// `"{destination} request"` (the exchange, or the routing key for the default exchange),
/// `messaging.operation` = `request`, `messaging.message.conversation_id` = the
/// correlation id; the outcome is recorded when it ends.
pub(super) fn request_span(
    destination: &str,
    routing_key: &str,
    correlation_id: &str,
    message_type: &str,
    ctx: &TraceContext,
    parent: Option<&TraceContext>,
) -> Span {
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{destination} request"),
        otel.kind = "client",
        otel.status_code = Empty,
        messaging.system = "rabbitmq",
        messaging.destination.name = destination,
        messaging.operation = "request",
        messaging.message.conversation_id = correlation_id,
        messaging.rabbitmq.destination.routing_key = routing_key,
        messaging.acemq.message_type = message_type,
        messaging.acemq.outcome = Empty,
        trace_id = %ctx.trace_id_hex(),
        span_id = %ctx.span_id_hex(),
        parent_span_id = Empty,
    );
    if let Some(p) = parent {
        span.record("parent_span_id", tracing::field::display(p.span_id_hex()));
    }
    span
}
