//! The `opentelemetry` feature on `memory://` and RabbitMQ: with a `tracing-opentelemetry`
//! layer and the W3C propagator installed, the exported trace shows the consumer's
//! `{queue} process` span as the child of the producer's `{queue} publish` span, and a
//! publish made inside the handler as the child of the process span; the `traceparent` on
//! the wire names the exported publish span.

mod support;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::headers::HeaderValue;
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use support::{Broker, declare_classic, eventually, on_each_target, take_one, unique};
use tracing_subscriber::layer::SubscriberExt;

const WAIT: Duration = Duration::from_secs(20);

/// The process-wide subscriber: a tracing registry with the OpenTelemetry layer over an
/// in-memory exporter, and the W3C propagator as the global one.
fn exporter() -> &'static InMemorySpanExporter {
    static SETUP: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &SETUP
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let tracer = provider.tracer("acemq-test");
            opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
            let subscriber = tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(tracer));
            tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
            (exporter, provider)
        })
        .0
}

fn finished(name: &str) -> Option<SpanData> {
    exporter()
        .get_finished_spans()
        .expect("exporter")
        .into_iter()
        .find(|s| s.name == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_span_is_the_producers_child_in_the_exported_trace() {
    exporter();
    on_each_target(|target: Broker| async move {
        let mq = acemq::Connection::connect(&target.url()).await.unwrap();
        let (q, out_q) = (unique("otel-in"), unique("otel-out"));
        declare_classic(&mq, &q).await;
        declare_classic(&mq, &out_q).await;
        let out = mq.publisher::<u32>("", &out_q);
        let handled = Arc::new(Mutex::new(0));
        let consumer = {
            let handled = handled.clone();
            mq.consume(&q, ConsumerOptions::default(), move |m: Message<u32>| {
                let (out, handled) = (out.clone(), handled.clone());
                async move {
                    out.send(m.payload()).await.map_err(HandlerError::retry)?;
                    *handled.lock().unwrap() += 1;
                    Ok(())
                }
            })
            .await
            .unwrap()
        };
        mq.publisher::<u32>("", &q).send(&7).await.unwrap();

        let process_name = format!("{q} process");
        let process = eventually(WAIT, "the process span exported", || async {
            finished(&process_name)
        })
        .await;
        let publish = finished(&format!("{q} publish")).expect("the publish span");
        let inner = finished(&format!("{out_q} publish")).expect("the handler's publish span");

        assert_eq!(publish.span_kind, SpanKind::Producer);
        assert_eq!(process.span_kind, SpanKind::Consumer);
        assert_eq!(inner.span_kind, SpanKind::Producer);
        let trace = publish.span_context.trace_id();
        assert_eq!(process.span_context.trace_id(), trace, "one trace");
        assert_eq!(inner.span_context.trace_id(), trace, "one trace");
        assert_eq!(
            process.parent_span_id,
            publish.span_context.span_id(),
            "the consumer is the producer's child"
        );
        assert_eq!(
            inner.parent_span_id,
            process.span_context.span_id(),
            "a publish in the handler is the consumer's child"
        );

        // On the wire: the traceparent names the exported span that published it.
        let d = take_one(mq.transport().as_ref(), &out_q, WAIT).await;
        let expected = format!("00-{}-{}-01", trace, inner.span_context.span_id());
        assert_eq!(
            d.properties.headers.get("traceparent"),
            Some(&HeaderValue::Str(expected))
        );
        assert_eq!(*handled.lock().unwrap(), 1);
        consumer.close().await;
        for name in [&q, &out_q] {
            let _ = mq.transport().delete_queue(name).await;
        }
        mq.close().await.ok();
    })
    .await;
}
