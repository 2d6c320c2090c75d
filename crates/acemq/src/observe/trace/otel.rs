//! The `opentelemetry` feature: the W3C context of the publish and process spans goes
//! through OpenTelemetry, so the spans `tracing-opentelemetry` exports are parented across
//! the broker.
//!
//! Publish: the OpenTelemetry context of the publish span is injected into the headers with
//! the global propagator ([`opentelemetry::global::get_text_map_propagator`]), after the
//! span's own ids were written as `traceparent` / `tracestate` (so the header is right even
//! when no propagator was installed). Process: the parent is extracted with the global
//! propagator (falling back to the `traceparent` header read by [`TraceContext::extract`])
//! and set as the process span's parent. Either way the library's [`TraceContext`] and the
//! span's `trace_id` / `span_id` fields take the OpenTelemetry span's ids, so logs, headers
//! and exported spans agree. Without an OpenTelemetry layer in the subscriber, nothing
//! changes: the spans have no OpenTelemetry context and the built-in ids stay.

use std::str::FromStr;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{Hex, TraceContext, header_text};
use crate::headers::{HeaderValue, Headers};

/// Message headers as an OpenTelemetry carrier (string values).
struct HeaderInjector<'a>(&'a mut Headers);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0
            .insert(key.to_owned().into(), HeaderValue::Str(value));
    }
}

/// Message headers as an OpenTelemetry carrier (string or UTF-8 byte-array values).
struct HeaderExtractor<'a>(&'a Headers);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(header_text)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span's OpenTelemetry context as a [`TraceContext`], when it has a valid one.
fn adopt(span: &Span, cx: &opentelemetry::Context, ctx: &mut TraceContext) -> bool {
    let otel_span = cx.span();
    let sc = otel_span.span_context();
    if !sc.is_valid() {
        return false;
    }
    *ctx = TraceContext {
        trace_id: sc.trace_id().to_bytes(),
        span_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
        tracestate: Some(sc.trace_state().header()).filter(|s| !s.is_empty()),
    };
    span.record("trace_id", tracing::field::display(Hex(&ctx.trace_id)));
    span.record("span_id", tracing::field::display(Hex(&ctx.span_id)));
    true
}

/// Publish side: writes the publish span's OpenTelemetry context into `headers`.
pub(super) fn inject(span: &Span, headers: &mut Headers, ctx: &mut TraceContext) {
    let cx = span.context();
    if !adopt(span, &cx, ctx) {
        return;
    }
    ctx.inject(headers);
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(headers));
    });
}

/// Process side: parents the process span on the context the headers carry.
pub(super) fn extract(span: &Span, headers: &Headers, ctx: &mut TraceContext) {
    let mut parent =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    if !parent.span().span_context().is_valid() {
        // No propagator installed (the global default does nothing): read `traceparent`.
        if let Some(tp) = TraceContext::extract(headers) {
            let state = tp
                .tracestate
                .as_deref()
                .and_then(|s| TraceState::from_str(s).ok())
                .unwrap_or_default();
            let remote = SpanContext::new(
                TraceId::from_bytes(tp.trace_id),
                SpanId::from_bytes(tp.span_id),
                TraceFlags::new(tp.flags),
                true,
                state,
            );
            parent = parent.with_remote_span_context(remote);
        }
    }
    if parent.span().span_context().is_valid() && span.set_parent(parent).is_err() {
        // No OpenTelemetry layer (or the span is disabled): the built-in ids stay.
        return;
    }
    let cx = span.context();
    adopt(span, &cx, ctx);
}
