//! Observability end to end on `memory://` and RabbitMQ: interceptors around
//! publish and consume, health from local state, the family's metrics on `/acemq-metrics`
//! after a run with retries, dead letters and parks, a trace that crosses connections, and
//! health Down after a dropped connection.
//!
//! This binary installs the global Prometheus recorder (through the actuator), once.

mod http_client;
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::health::{HealthContributor, HealthReport, HealthStatus};
use acemq::intercept::{
    ConsumeContext, ConsumeInterceptor, HandleResult, PublishContext, PublishInterceptor,
};
use acemq::observe::trace::{self, TraceContext};
use acemq::retry::RetryPolicy;
use acemq::transport::{Outbound, Properties};
use support::{
    Broker, connect_with_classic_queue, declare_classic, eventually, on_each_target, spans,
    take_one, teardown, unique,
};

const WAIT: Duration = Duration::from_secs(15);

/// The sum of the samples of `metric` whose labels contain every one of `labels`, from a
/// Prometheus exposition.
fn sample_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

type Log = Arc<Mutex<Vec<String>>>;

/// (payload, trace context inside the handler, the message's traceparent)
type Seen = Arc<Mutex<Vec<(u32, Option<TraceContext>, Option<String>)>>>;

struct Named(&'static str, Log, bool);

impl ConsumeInterceptor for Named {
    fn before_handle(&self, _ctx: &ConsumeContext<'_>) -> Result<(), HandlerError> {
        self.1.lock().unwrap().push(format!("before {}", self.0));
        if self.2 {
            Err(HandlerError::retry(format!("{} refused it", self.0)))
        } else {
            Ok(())
        }
    }
    fn after_handle(&self, _ctx: &ConsumeContext<'_>, result: &HandleResult<'_>) {
        let r = match result {
            HandleResult::Succeeded => "ok".to_owned(),
            HandleResult::Failed(e) => format!("failed: {e}"),
            _ => "other".to_owned(),
        };
        self.1
            .lock()
            .unwrap()
            .push(format!("after {} ({r})", self.0));
    }
}

struct Stamp;

impl PublishInterceptor for Stamp {
    fn before_publish(&self, ctx: &mut PublishContext<'_>) -> Result<(), acemq::Error> {
        if ctx.routing_key.ends_with(".refused") {
            return Err(acemq::Error::InvalidArgument(
                "refused by the interceptor".into(),
            ));
        }
        ctx.headers.insert("x-stamped".into(), "yes".into());
        *ctx.envelope = ctx.envelope.clone().with_causation_id("stamp-cause");
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interceptors_run_in_order_after_handle_always_and_in_reverse() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "intercept").await;
        let log: Log = Arc::default();
        mq.intercept_publish(Stamp);
        mq.intercept_consume(Named("outer", log.clone(), false));
        mq.intercept_consume(Named("inner", log.clone(), false));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let l = log.clone();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(RetryPolicy::none()),
                move |m: Message<u32>| {
                    let (tx, l) = (tx.clone(), l.clone());
                    async move {
                        l.lock().unwrap().push(format!("handler {}", m.payload()));
                        tx.send((
                            m.headers().get("x-stamped").cloned(),
                            m.envelope().causation_id().map(str::to_owned),
                        ))
                        .ok();
                        if *m.payload() == 2 {
                            Err(HandlerError::fatal("two is bad"))
                        } else {
                            Ok(())
                        }
                    }
                },
            )
            .await
            .unwrap();
        mq.publisher::<u32>("", &q).send(&1).await.unwrap();
        let (stamped, cause) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stamped, Some("yes".into()));
        assert_eq!(cause.as_deref(), Some("stamp-cause"));
        mq.publisher::<u32>("", &q).send(&2).await.unwrap();
        tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        eventually(WAIT, "both settled", || async {
            let s = consumer.stats();
            (s.acked == 1 && s.rejected == 1).then_some(())
        })
        .await;
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                "before outer",
                "before inner",
                "handler 1",
                "after inner (ok)",
                "after outer (ok)",
                "before outer",
                "before inner",
                "handler 2",
                "after inner (failed: two is bad)",
                "after outer (failed: two is bad)",
            ]
        );
        // A publish interceptor's error refuses the publish.
        let err = mq
            .publisher::<u32>("", format!("{q}.refused"))
            .send(&3)
            .await
            .unwrap_err();
        assert!(matches!(err, acemq::Error::InvalidArgument(_)));
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_before_handle_error_ends_in_dlq_after_the_policys_attempts() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "intercept-refuse").await;
        let log: Log = Arc::default();
        mq.intercept_consume(Named("gate", log.clone(), true));
        let ran = Arc::new(Mutex::new(0));
        let r = ran.clone();
        let policy = RetryPolicy::fixed(3, Duration::from_millis(10)).unwrap();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |_m: Message<u32>| {
                    let r = r.clone();
                    async move {
                        *r.lock().unwrap() += 1;
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        mq.publisher::<u32>("", &q).send(&1).await.unwrap();
        let d = take_one(&**mq.transport(), &format!("{q}.dlq"), WAIT).await;
        assert_eq!(
            d.properties.headers["x-acemq-attempt"],
            acemq::headers::HeaderValue::I32(3)
        );
        assert_eq!(
            d.properties.headers["x-acemq-error"].as_str(),
            Some("exhausted 3 attempts: gate refused it")
        );
        assert_eq!(*ran.lock().unwrap(), 0, "the handler never ran");
        assert_eq!(
            log.lock()
                .unwrap()
                .iter()
                .filter(|l| l.starts_with("after"))
                .count(),
            3,
            "after_handle ran every time"
        );
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

struct Flaky;

impl HealthContributor for Flaky {
    fn name(&self) -> String {
        "flaky".into()
    }
    fn report(&self) -> Result<HealthReport, String> {
        panic!("contributor bug")
    }
}

struct Pressure;

impl HealthContributor for Pressure {
    fn name(&self) -> String {
        "broker-pressure".into()
    }
    fn report(&self) -> Result<HealthReport, String> {
        Ok(HealthReport::degraded("broker-pressure"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_local_state_and_a_blocked_connection_is_up_with_its_reason() {
    let name = unique("health");
    let mq = Connection::connect(&format!("memory://{name}"))
        .await
        .unwrap();
    assert_eq!(mq.health().status, HealthStatus::Up);
    let broker = acemq::transport::memory::MemoryBroker::named(&name);
    broker.block("low on memory");
    eventually(WAIT, "the blocked state", || async {
        mq.status().blocked.is_some().then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    let health = mq.health();
    assert!(
        started.elapsed() < Duration::from_millis(5),
        "health answers from local state"
    );
    let connection = health.report("acemq").unwrap();
    assert_eq!(connection.status, HealthStatus::Up);
    assert_eq!(connection.details["blocked"], true);
    assert_eq!(connection.detail("blockedReason"), Some("low on memory"));
    let err = mq
        .publisher::<u32>("", "anything")
        .send(&1)
        .await
        .unwrap_err();
    assert!(err.is_refused(), "{err}");
    broker.unblock();
    mq.pause_consuming();
    assert_eq!(
        mq.health().report("acemq").unwrap().detail("consuming"),
        Some("paused")
    );
    mq.register_health(Flaky);
    mq.register_health(Pressure);
    let health = mq.health();
    assert_eq!(health.report("flaky").unwrap().status, HealthStatus::Down);
    assert_eq!(
        health.report("broker-pressure").unwrap().status,
        HealthStatus::Degraded
    );
    assert_eq!(health.report("acemq").unwrap().status, HealthStatus::Up);
    mq.close_now().await.unwrap();
    assert_eq!(
        mq.health().report("acemq").unwrap().status,
        HealthStatus::Down
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_counts_outcomes_and_a_trace_crosses_connections() {
    spans::install();
    let actuator_conn = Connection::connect("memory://observability-actuator")
        .await
        .unwrap();
    let actuator = acemq::actuator::Actuator::for_connection(&actuator_conn)
        .bind("127.0.0.1:0".parse().unwrap())
        .install_prometheus_recorder()
        .start()
        .await
        .unwrap();
    let addr = actuator.local_addr();
    on_each_target(|target: Broker| async move {
        let publisher = Connection::connect(&target.url()).await.unwrap();
        let consumer_conn = Connection::connect(&target.url()).await.unwrap();
        let q = unique("metrics");
        declare_classic(&publisher, &q).await;
        let seen: Seen = Arc::default();
        let s = seen.clone();
        let policy = RetryPolicy::fixed(2, Duration::from_millis(10)).unwrap();
        let consumer = consumer_conn
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<u32>| {
                    let s = s.clone();
                    async move {
                        let parent = m
                            .headers()
                            .get("traceparent")
                            .and_then(|v| v.as_str())
                            .map(str::to_owned);
                        s.lock()
                            .unwrap()
                            .push((*m.payload(), trace::current(), parent));
                        match m.payload() {
                            1 => Ok(()),
                            2 if m.attempt() == 1 => Err(HandlerError::retry("once")),
                            2 => Ok(()),
                            _ => Err(HandlerError::retry("always")),
                        }
                    }
                },
            )
            .await
            .unwrap();
        let root = TraceContext::new_root();
        let orders = publisher.publisher::<u32>("", &q);
        // One more publish in the same trace, to a queue nobody consumes: read raw.
        let wire_q = unique("trace-wire");
        declare_classic(&publisher, &wire_q).await;
        trace::scope(root.clone(), async {
            orders.send(&1).await.unwrap();
            orders.send(&2).await.unwrap();
            orders.send(&3).await.unwrap();
            publisher
                .publisher::<u32>("", &wire_q)
                .send(&4)
                .await
                .unwrap();
        })
        .await;
        // On the wire: the publish carries `traceparent`, a child of the caller's context,
        // whose span id is the publish span's.
        let raw = take_one(&**publisher.transport(), &wire_q, WAIT).await;
        let on_wire = raw
            .properties
            .headers
            .get("traceparent")
            .and_then(|v| v.as_str())
            .expect("the published message carries a traceparent header on the wire");
        let wire_ctx = TraceContext::parse(on_wire, None).expect("a valid traceparent");
        assert_eq!(wire_ctx.trace_id, root.trace_id, "the caller's trace");
        assert_ne!(wire_ctx.span_id, root.span_id, "the publish's own span");
        let publish_span = spans::find("publish", "span_id", &wire_ctx.span_id_hex());
        assert_eq!(
            publish_span.len(),
            1,
            "exactly one publish span has the traceparent's span id"
        );
        assert_eq!(
            publish_span[0].field("parent_span_id"),
            Some(root.span_id_hex().as_str()),
            "the publish span is a child of the caller's span"
        );
        assert_eq!(
            publish_span[0].field("trace_id"),
            Some(root.trace_id_hex().as_str())
        );
        publisher.transport().delete_queue(&wire_q).await.ok();
        let raw = Properties {
            content_type: Some("application/json".into()),
            ..Default::default()
        };
        publisher
            .transport()
            .publish(Outbound::new("", q.clone(), raw, b"not json".to_vec()))
            .await
            .unwrap()
            .await
            .unwrap();
        eventually(WAIT, "all outcomes", || async {
            let st = consumer.stats();
            (st.acked == 2 && st.retried == 2 && st.dead_lettered == 1 && st.parked == 1)
                .then_some(())
        })
        .await;
        // Every handler run (1 + 2 + 2 attempts) saw the publisher's traceparent.
        {
            let seen = seen.lock().unwrap();
            let mut runs: Vec<u32> = seen.iter().map(|(n, _, _)| *n).collect();
            runs.sort_unstable();
            assert_eq!(runs, vec![1, 2, 2, 3, 3], "handler runs");
            assert!(
                seen.iter().all(|(_, _, p)| p.is_some()),
                "every delivery carries a traceparent: {seen:?}"
            );
        }
        // The consumer's span is a child of the publisher's, in the caller's trace.
        for (n, current, parent) in seen.lock().unwrap().iter().filter(|(_, _, p)| p.is_some()) {
            let current = current
                .as_ref()
                .expect("a current trace context inside the handler");
            assert_eq!(
                current.trace_id, root.trace_id,
                "message {n} continues the publisher's trace"
            );
            let parent = TraceContext::parse(parent.as_deref().unwrap(), None).unwrap();
            assert_eq!(parent.trace_id, root.trace_id);
            assert_ne!(parent.span_id, root.span_id, "the publish had its own span");
            assert_ne!(
                current.span_id, parent.span_id,
                "the handler runs in a child span"
            );
            // The process span the handler ran in names the publish span as its parent.
            let process = spans::find("process", "span_id", &current.span_id_hex());
            assert_eq!(process.len(), 1, "message {n}: one process span");
            assert_eq!(
                process[0].field("parent_span_id"),
                Some(parent.span_id_hex().as_str()),
                "message {n}: the consumer span's parent is the publish span"
            );
            assert_eq!(
                process[0].field("trace_id"),
                Some(root.trace_id_hex().as_str())
            );
            let publish = spans::find("publish", "span_id", &parent.span_id_hex());
            assert_eq!(publish.len(), 1, "message {n}: its publish span exists");
            assert_eq!(
                publish[0].field("parent_span_id"),
                Some(root.span_id_hex().as_str())
            );
        }
        // The scheduler's metrics: one message scheduled 1.2 s ahead hops once (1 s rung)
        // and is delivered after its due time.
        let scheduler = publisher.scheduler().await.unwrap();
        let scheduled_to = unique("metrics-scheduled");
        declare_classic(&publisher, &scheduled_to).await;
        let before = http_client::get(addr, "/acemq-metrics").await.body;
        let transport = format!(
            "transport=\"{}\"",
            if target.kind() == "amqp" {
                "rabbitmq"
            } else {
                "memory"
            }
        );
        let count = |text: &str, metric: &str| sample_sum(text, metric, &[&transport]);
        scheduler
            .after(Duration::from_millis(1_200), "", &scheduled_to, &1u32)
            .await
            .unwrap();
        let text = eventually(
            WAIT,
            "the scheduled message delivered and counted",
            || async {
                let text = http_client::get(addr, "/acemq-metrics").await.body;
                (count(&text, "acemq_schedule_delivered_total")
                    > count(&before, "acemq_schedule_delivered_total"))
                .then_some(text)
            },
        )
        .await;
        assert!(
            count(&text, "acemq_schedule_scheduled_total")
                > count(&before, "acemq_schedule_scheduled_total"),
            "{text}"
        );
        assert!(
            count(&text, "acemq_schedule_hops_total") > count(&before, "acemq_schedule_hops_total"),
            "{text}"
        );
        assert!(
            count(&text, "acemq_schedule_lateness_seconds_count")
                > count(&before, "acemq_schedule_lateness_seconds_count"),
            "{text}"
        );
        scheduler.close().await;
        let _ = publisher.transport().delete_queue(&scheduled_to).await;
        let text = http_client::get(addr, "/acemq-metrics").await.body;
        for outcome in ["acked", "retried", "dead_lettered", "parked"] {
            let line = text
                .lines()
                .find(|l| {
                    l.starts_with("acemq_consume_total{")
                        && l.contains(&format!("outcome=\"{outcome}\""))
                        && l.contains(&q)
                })
                .unwrap_or_else(|| {
                    panic!("no acemq_consume_total for {outcome} on {q} in:\n{text}")
                });
            assert!(!line.ends_with(" 0"), "{line}");
        }
        // Exact counts for this run's queue: 1 and 2 (second attempt) acked, 2 and 3 retried
        // once each, 3 dead-lettered after two attempts, the bad body parked.
        let queue_label = format!("\"{q}\"");
        for (outcome, want) in [
            ("acked", 2.0),
            ("retried", 2.0),
            ("dead_lettered", 1.0),
            ("parked", 1.0),
        ] {
            let got = sample_sum(
                &text,
                "acemq_consume_total",
                &[&format!("outcome=\"{outcome}\""), &queue_label],
            );
            assert_eq!(got, want, "acemq_consume_total {outcome} on {q}:\n{text}");
        }
        assert!(text.lines().any(|l| l.starts_with("acemq_publish_total{")
            && l.contains("outcome=\"confirmed\"")
            && l.contains(&q)));
        assert!(
            text.lines()
                .any(|l| l.starts_with("acemq_messages_dead_lettered_total{"))
        );
        // The set-aside counter carries the queue: one dead letter and one park here.
        for (outcome, want) in [("dead_lettered", 1.0), ("parked", 1.0)] {
            assert_eq!(
                sample_sum(
                    &text,
                    "acemq_messages_dead_lettered_total",
                    &[&format!("outcome=\"{outcome}\""), &queue_label]
                ),
                want,
                "acemq_messages_dead_lettered_total {outcome} on {q}:\n{text}"
            );
        }
        // The three sends to this queue were confirmed (the raw publish bypasses the
        // publisher).
        assert_eq!(
            sample_sum(
                &text,
                "acemq_publish_total",
                &["outcome=\"confirmed\"", &queue_label]
            ),
            3.0,
            "acemq_publish_total confirmed on {q}:\n{text}"
        );

        let health = http_client::get(addr, "/acemq-health").await;
        assert_eq!(health.status, 200);
        consumer.close().await;
        teardown(&publisher, &q, &[]).await;
        consumer_conn.close().await.ok();
    })
    .await;
    actuator.shutdown().await;
}

/// A dropped connection (README "Not yet"): health shows the connection Down, and nothing
/// is lost: the delivery its handler was holding is back on the queue. On `memory://` the
/// transport underneath is closed; on RabbitMQ the broker closes this test's own consuming
/// connection, found by its unique name (no other client's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_down_in_health_and_loses_nothing() {
    on_each_target(|target: Broker| async move {
        let name = unique("dropped");
        let mq = match &target {
            // Recovery off: Down is for a connection that is closed and stays closed (while
            // recovery redials, health says Degraded; tests/recovery_consumers.rs).
            Broker::Memory(_) => Connection::connect_with(
                &target.url(),
                acemq::connection::ConnectionOptions::default()
                    .recovery(acemq::transport::recovery::RecoveryPolicy::disabled()),
            )
            .await
            .unwrap(),
            Broker::Amqp(url) => {
                let t = acemq::transport::amqp::AmqpTransport::connect_with(
                    url,
                    acemq::transport::amqp::AmqpOptions::default()
                        .connection_name(&name)
                        .recovery(acemq::transport::recovery::RecoveryPolicy::disabled()),
                )
                .await
                .unwrap();
                Connection::with_transport(
                    Arc::new(t),
                    acemq::connection::ConnectionOptions::default(),
                )
            }
        };
        let q = unique("dropped");
        declare_classic(&mq, &q).await;
        let release = Arc::new(tokio::sync::Notify::new());
        let r = release.clone();
        let consumer = mq
            .consume(&q, ConsumerOptions::default(), move |_m: Message<u32>| {
                let r = r.clone();
                async move {
                    r.notified().await;
                    Ok(())
                }
            })
            .await
            .unwrap();
        mq.publisher::<u32>("", &q).send(&1).await.unwrap();
        eventually(WAIT, "the handler holds the delivery", || async {
            (mq.in_flight() == 1).then_some(())
        })
        .await;
        assert_eq!(mq.health().status, HealthStatus::Up);

        match &target {
            Broker::Memory(_) => mq.transport().close().await.unwrap(),
            Broker::Amqp(_) => {
                support::close_rabbit_connection_named(&format!("{name} (consume)"))
                    .await
                    .unwrap_or_else(|why| panic!("closing our own connection: {why}"));
            }
        }
        let health = eventually(WAIT, "health to show the connection Down", || async {
            let h = mq.health();
            (h.report("acemq").map(|r| r.status) == Some(HealthStatus::Down)).then_some(h)
        })
        .await;
        assert_eq!(health.status, HealthStatus::Down, "overall Down");
        assert_eq!(health.report("acemq").unwrap().details["open"], false);
        release.notify_waiters();

        // Nothing lost: the unacked delivery is back on the queue, for a new connection.
        let fresh = Connection::connect(&target.url()).await.unwrap();
        let d = take_one(&**fresh.transport(), &q, WAIT).await;
        assert_eq!(&d.body[..], b"1");
        assert_eq!(consumer.stats().acked, 0, "nothing was acked");
        teardown(&fresh, &q, &[]).await;
        mq.close_now().await.ok();
    })
    .await;
}
