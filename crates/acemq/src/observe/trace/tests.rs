use super::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn round_trip_through_headers() {
    let mut h = Headers::new();
    let c = TraceContext::parse(GOOD, Some("rojo=00f067aa0ba902b7")).unwrap();
    c.inject(&mut h);
    assert_eq!(h[TRACEPARENT], HeaderValue::Str(GOOD.into()));
    assert_eq!(
        h[TRACESTATE],
        HeaderValue::Str("rojo=00f067aa0ba902b7".into())
    );
    assert_eq!(TraceContext::extract(&h), Some(c.clone()));
    assert_eq!(c.to_traceparent(), GOOD);
    assert_eq!(c.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert!(c.is_sampled());

    // Byte-array header values (some clients write longstr as bytes) are read too.
    let mut h = Headers::new();
    h.insert(
        TRACEPARENT.into(),
        HeaderValue::Bytes(GOOD.as_bytes().to_vec()),
    );
    assert_eq!(
        TraceContext::extract(&h).map(|c| c.to_traceparent()),
        Some(GOOD.into())
    );

    // A context without tracestate removes a stale one.
    let mut h = Headers::new();
    h.insert(TRACESTATE.into(), HeaderValue::from("old=1"));
    TraceContext::new_root().inject(&mut h);
    assert!(!h.contains_key(TRACESTATE));
}

#[test]
fn malformed_traceparents_are_rejected() {
    let bad = [
        "",
        "garbage",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // uppercase
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero span
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  // short
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011", // long
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", // hex
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // separator
        "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e47é6-00f067aa0ba902b7-01", // non-ascii
    ];
    for b in bad {
        assert!(TraceContext::parse(b, None).is_none(), "{b:?}");
    }
    let mut h = Headers::new();
    h.insert(TRACEPARENT.into(), HeaderValue::I32(1));
    assert!(TraceContext::extract(&h).is_none());
    assert!(TraceContext::extract(&Headers::new()).is_none());
    // An unusable tracestate is dropped, not the context.
    let long = "a=".to_string() + &"b".repeat(600);
    let c = TraceContext::parse(GOOD, Some(&long)).unwrap();
    assert_eq!(c.tracestate, None);
    assert_eq!(
        TraceContext::parse(GOOD, Some("  ")).unwrap().tracestate,
        None
    );
}

#[test]
fn child_keeps_the_trace_and_flags() {
    let p = TraceContext::parse(GOOD, Some("k=v")).unwrap();
    let c = p.child();
    assert_eq!(c.trace_id, p.trace_id);
    assert_eq!(c.flags, p.flags);
    assert_eq!(c.tracestate, p.tracestate);
    assert_ne!(c.span_id, p.span_id);
    let a = TraceContext::new_root();
    let b = TraceContext::new_root();
    assert_ne!(a.trace_id, b.trace_id);
    assert_ne!(a.trace_id, [0; 16]);
}

#[tokio::test]
async fn publish_inside_a_handler_is_a_child_of_the_consumer_span() {
    let mut incoming = Headers::new();
    incoming.insert(TRACEPARENT.into(), HeaderValue::from(GOOD));
    let (ctx, parent) = TraceContext::for_process(&incoming);
    assert_eq!(
        parent.as_ref().map(|p| p.to_traceparent()),
        Some(GOOD.into())
    );
    assert_eq!(ctx.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");

    let (outgoing, out_parent) = scope(ctx.clone(), async {
        tokio::task::yield_now().await;
        TraceContext::for_publish()
    })
    .await;
    assert_eq!(out_parent, Some(ctx.clone()));
    assert_eq!(outgoing.trace_id, ctx.trace_id);
    assert_ne!(outgoing.span_id, ctx.span_id);

    // Outside any scope: a new root, no parent.
    assert!(current().is_none());
    let (root, none) = TraceContext::for_publish();
    assert!(none.is_none());
    assert_ne!(root.trace_id, ctx.trace_id);

    // No valid traceparent: a new root.
    let (_, p) = TraceContext::for_process(&Headers::new());
    assert!(p.is_none());

    assert_eq!(sync_scope(ctx.clone(), current), Some(ctx));
}

// A minimal subscriber that remembers every span's fields.
type Fields = BTreeMap<String, String>;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(&'static str, Fields)>>>);

struct Visit<'a>(&'a mut BTreeMap<String, String>);
impl tracing::field::Visit for Visit<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = BTreeMap::new();
        span.record(&mut Visit(&mut fields));
        let mut all = self.0.lock().unwrap();
        all.push((span.metadata().name(), fields));
        Id::from_u64(all.len() as u64)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut all = self.0.lock().unwrap();
        let idx = usize::try_from(span.into_u64()).unwrap() - 1;
        values.record(&mut Visit(&mut all[idx].1));
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn spans_carry_the_family_attributes() {
    let cap = Capture::default();
    let parent = TraceContext::parse(GOOD, None).unwrap();
    let ctx = parent.child();
    tracing::subscriber::with_default(cap.clone(), || {
        let s = publish_span("", "orders.placed", "m-1", "OrderPlaced", &ctx, None);
        record_publish_outcome(&s, PublishOutcome::Unroutable);
        let s = process_span(
            "orders.placed",
            "m-1",
            "OrderPlaced",
            3,
            &ctx,
            Some(&parent),
        );
        record_consume_outcome(&s, ConsumeOutcome::Acked);
        let _ = publish_span("orders", "orders.placed", "m-2", "T", &ctx, Some(&parent));
    });
    let spans = cap.0.lock().unwrap();
    let (name, p) = &spans[0];
    assert_eq!(*name, "publish");
    assert_eq!(p["otel.name"], "orders.placed publish");
    assert_eq!(p["otel.kind"], "producer");
    assert_eq!(p[ATTR_SYSTEM], "rabbitmq");
    assert_eq!(p[ATTR_DESTINATION], "orders.placed");
    assert_eq!(p[ATTR_OPERATION], "publish");
    assert_eq!(p[ATTR_MESSAGE_ID], "m-1");
    assert_eq!(p[ATTR_ROUTING_KEY], "orders.placed");
    assert_eq!(p[ATTR_MESSAGE_TYPE], "OrderPlaced");
    assert_eq!(p[ATTR_OUTCOME], "unroutable");
    assert_eq!(p["otel.status_code"], "ERROR");
    assert_eq!(p["trace_id"], ctx.trace_id_hex());
    assert_eq!(p["span_id"], ctx.span_id_hex());
    assert!(!p.contains_key("parent_span_id"));

    let (name, c) = &spans[1];
    assert_eq!(*name, "process");
    assert_eq!(c["otel.name"], "orders.placed process");
    assert_eq!(c["otel.kind"], "consumer");
    assert_eq!(c[ATTR_OPERATION], "process");
    assert_eq!(c[ATTR_ATTEMPT], "3");
    assert_eq!(c[ATTR_OUTCOME], "acked");
    assert!(!c.contains_key("otel.status_code"));
    assert_eq!(c["parent_span_id"], "00f067aa0ba902b7");

    assert_eq!(spans[2].1["otel.name"], "orders publish");
    assert_eq!(spans[2].1[ATTR_DESTINATION], "orders");
}

#[test]
fn hex_decodes_every_byte_and_refuses_every_other_digit() {
    for b in 0..=u8::MAX {
        let mut out = [0u8; 1];
        assert_eq!(
            decode_hex(format!("{b:02x}").as_bytes(), &mut out),
            Some(())
        );
        assert_eq!(out[0], b);
        if !(b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            assert_eq!(decode_hex(&[b, b'0'], &mut out), None, "{b:#04x} high");
            assert_eq!(decode_hex(&[b'0', b], &mut out), None, "{b:#04x} low");
        }
    }
    assert_eq!(decode_hex(b"abc", &mut [0u8; 1]), None);
}

#[test]
fn a_new_root_has_two_nonzero_ids_of_its_own() {
    let (a, b) = (TraceContext::new_root(), TraceContext::new_root());
    for c in [&a, &b] {
        assert_ne!(c.trace_id, [0; 16]);
        assert_ne!(c.span_id, [0; 8]);
        assert!(c.is_sampled());
        assert_eq!(
            TraceContext::parse(&c.to_traceparent(), None).as_ref(),
            Some(c)
        );
    }
    assert_ne!(a.trace_id, b.trace_id);
    assert_ne!(a.span_id, b.span_id);
}
