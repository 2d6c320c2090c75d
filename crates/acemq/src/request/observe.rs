//! The request's metrics and span (wire.md §9): `acemq.request.duration` (seconds,
//! histogram) and `acemq.request.total`, tagged `routing.key`, `message.type`, `transport`
//! and `outcome`; the CLIENT span `{destination} request`.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram};
use tracing::Span;
use tracing::field::Empty;

use crate::observe::metrics::{
    PublishMetrics, REQUEST_DURATION, REQUEST_TOTAL, TAG_MESSAGE_TYPE, TAG_OUTCOME,
    TAG_ROUTING_KEY, TAG_TRANSPORT,
};
use crate::observe::trace::TraceContext;
use crate::util::lock;

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
    const ALL: [RequestOutcome; 3] = [
        RequestOutcome::Answered,
        RequestOutcome::TimedOut,
        RequestOutcome::Failed,
    ];

    fn index(self) -> usize {
        match self {
            RequestOutcome::Answered => 0,
            RequestOutcome::TimedOut => 1,
            RequestOutcome::Failed => 2,
        }
    }

    /// The tag value.
    pub const fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Answered => "answered",
            RequestOutcome::TimedOut => "timed_out",
            RequestOutcome::Failed => "failed",
        }
    }
}

/// The metric handles of one destination and request type: what its requests publish
/// under (`acemq.publish.*`) and how they end (`acemq.request.*`), registered once, so a
/// request builds no labels and looks nothing up.
pub(super) struct DestinationMetrics {
    pub(super) publish: Arc<PublishMetrics>,
    exchange: String,
    routing_key: String,
    message_type: String,
    transport: &'static str,
    outcomes: [OnceLock<(Counter, Histogram)>; RequestOutcome::ALL.len()],
}

impl DestinationMetrics {
    fn new(transport: &'static str, exchange: &str, routing_key: &str, message_type: &str) -> Self {
        DestinationMetrics {
            publish: Arc::new(PublishMetrics::for_destination(
                transport,
                exchange,
                routing_key,
            )),
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            message_type: message_type.to_owned(),
            transport,
            outcomes: Default::default(),
        }
    }

    /// Counts one request and records its round trip.
    pub(super) fn record(&self, outcome: RequestOutcome, elapsed: Duration) {
        let (total, duration) = self.outcomes[outcome.index()].get_or_init(|| {
            let labels = [
                (TAG_ROUTING_KEY, self.routing_key.clone()),
                (TAG_MESSAGE_TYPE, self.message_type.clone()),
                (TAG_TRANSPORT, self.transport.to_owned()),
                (TAG_OUTCOME, outcome.as_str().to_owned()),
            ];
            (
                metrics::counter!(REQUEST_TOTAL, &labels),
                metrics::histogram!(REQUEST_DURATION, &labels),
            )
        });
        duration.record(elapsed.as_secs_f64());
        total.increment(1);
    }
}

/// A requester's [`DestinationMetrics`], by exchange, routing key and request type (found
/// by a scan: a requester talks to few destinations). It keeps at most
/// [`MetricsCache::MAX`] of them: a requester that sends to ever-new routing keys gets
/// fresh handles for the ones past that, as a one-off publisher would.
#[derive(Default)]
pub(super) struct MetricsCache(Mutex<Vec<Arc<DestinationMetrics>>>);

impl MetricsCache {
    const MAX: usize = 256;

    pub(super) fn get(
        &self,
        transport: &'static str,
        exchange: &str,
        routing_key: &str,
        message_type: &str,
    ) -> Arc<DestinationMetrics> {
        let mut cache = lock(&self.0);
        let found = cache.iter().find(|m| {
            m.routing_key == routing_key && m.exchange == exchange && m.message_type == message_type
        });
        if let Some(found) = found {
            return found.clone();
        }
        let made = Arc::new(DestinationMetrics::new(
            transport,
            exchange,
            routing_key,
            message_type,
        ));
        if cache.len() < Self::MAX {
            cache.push(made.clone());
        }
        made
    }
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
