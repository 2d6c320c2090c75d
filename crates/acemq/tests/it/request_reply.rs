//! Request/reply, on `memory://` and RabbitMQ through the same cases: a round
//! trip, the wire form of a request and of a reply (Java §2.9: `acemq-reply-to` and
//! `reply_to`, correlation copied, causation = the request's id), timeouts and late replies,
//! a request without a reply address, cancel-safety, 1,000 concurrent requests, a handler
//! failure retried under the responder's policy, a final one answered with a fault reply
//! (`acemq-error`) and dead-lettered, a request that expires with its timeout, metrics and
//! the CLIENT span, and requests in flight across a lost connection.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::headers::HeaderValue;
use acemq::health::HealthStatus;
use acemq::request::{RequestError, Requester};
use acemq::retry::RetryPolicy;
use acemq::transport::Properties;
use acemq::transport::memory::MemoryTransport;
use acemq::transport::recovery::RecoveryPolicy;
use serde::{Deserialize, Serialize};
use support::Broker;
use tokio::sync::Semaphore;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Ping {
    n: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Pong {
    n: u32,
}

const LONG: Duration = Duration::from_secs(20);

fn header<'a>(p: &'a Properties, name: &str) -> Option<&'a str> {
    p.headers.get(name).and_then(HeaderValue::as_str)
}

/// A responder on `q` answering `Ping { n }` with `Pong { n * 2 }`.
async fn doubling(mq: &Connection, q: &str, options: ConsumerOptions) -> acemq::request::Responder {
    mq.respond(q, options, |m: Message<Ping>| async move {
        Ok(Pong {
            n: m.payload().n * 2,
        })
    })
    .await
    .expect("responder starts")
}

/// A responder on `q` whose handlers wait for a permit of `gate` before answering.
async fn gated(mq: &Connection, q: &str, gate: Arc<Semaphore>) -> acemq::request::Responder {
    mq.respond(
        q,
        ConsumerOptions::default().concurrency(16),
        move |m: Message<Ping>| {
            let gate = gate.clone();
            async move {
                gate.acquire().await.map_err(HandlerError::retry)?.forget();
                Ok(Pong { n: m.payload().n })
            }
        },
    )
    .await
    .expect("responder starts")
}

async fn done(mq: &Connection, q: &str, requester: &Requester) {
    requester.close().await;
    support::teardown(mq, q, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_answered_and_counted() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-trip").await;
        let responder = doubling(&mq, &q, ConsumerOptions::default()).await;
        let requester = mq.requester().await.unwrap();
        let pong: Pong = requester
            .request("", &q, &Ping { n: 21 }, LONG)
            .await
            .unwrap();
        assert_eq!(pong, Pong { n: 42 });
        let s = requester.stats();
        assert_eq!(
            (s.answered, s.timed_out, s.unmatched, s.pending),
            (1, 0, 0, 0)
        );
        support::eventually(LONG, "the request acked", || async {
            (responder.consumer_stats().acked == 1).then_some(())
        })
        .await;
        assert_eq!(responder.stats().answered, 1);
        assert_eq!(responder.stats().unanswerable, 0);
        // The reply queue: classic, x-expires 600000, deleted on close.
        let reply_queue = requester.reply_queue().to_owned();
        assert!(reply_queue.starts_with("acemq.reply."), "{reply_queue}");
        if target.kind() == "amqp" {
            support::assert_rabbit_queue_arguments(
                &reply_queue,
                &[("x-expires", "long", "600000")],
            );
        }
        done(&mq, &q, &requester).await;
        let t = target.transport().await;
        let gone = t.inspect_queue(&reply_queue).await.unwrap_err();
        assert!(gone.is_not_found(), "{gone}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_carries_the_reply_address_twice_and_a_fresh_correlation() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-wire").await;
        let requester = mq.requester().await.unwrap();
        // No responder: the request stays in the queue to be read raw.
        let waiting = {
            let (requester, q) = (requester.clone(), q.clone());
            tokio::spawn(async move {
                requester
                    .request::<Ping, Pong>("", &q, &Ping { n: 1 }, LONG)
                    .await
            })
        };
        let t = mq.transport().clone();
        let d = support::take_one(&*t, &q, LONG).await;
        waiting.abort();
        let p = &d.properties;
        let reply_queue = requester.reply_queue();
        assert_eq!(header(p, "acemq-reply-to"), Some(reply_queue));
        assert_eq!(p.reply_to.as_deref(), Some(reply_queue));
        let correlation = header(p, "x-acemq-correlation").expect("correlation");
        let id = header(p, "x-acemq-id").expect("id");
        assert_ne!(correlation, id, "a fresh correlation, not the id");
        assert!(uuid::Uuid::parse_str(correlation).is_ok(), "{correlation}");
        assert_eq!(header(p, "x-acemq-type"), Some("Ping"));
        assert!(header(p, "x-acemq-origin").is_some());
        assert!(p.headers.contains_key("x-acemq-first-seen"));
        assert!(header(p, "traceparent").is_some());
        assert_eq!(p.message_id.as_deref(), Some(id));
        assert_eq!(
            p.expiration.as_deref(),
            Some("20000"),
            "the request expires with its timeout"
        );
        assert_eq!(support::body(&d), r#"{"n":1}"#);
        done(&mq, &q, &requester).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_request_with_only_the_reply_to_property_is_answered_with_correlation_and_causation()
{
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-java").await;
        let replies = support::unique("rr-java-replies");
        support::declare_classic(&mq, &replies).await;
        let responder = doubling(&mq, &q, ConsumerOptions::default()).await;
        // As the Java member before 0.5.0 wrote it: the property only, no header.
        let mut props = Properties {
            message_id: Some("req-1".into()),
            content_type: Some("application/json".into()),
            reply_to: Some(replies.clone()),
            ..Properties::default()
        };
        for (k, v) in [("x-acemq-id", "req-1"), ("x-acemq-correlation", "conv-7")] {
            props.headers.insert(k.into(), HeaderValue::from(v));
        }
        let t = mq.transport().clone();
        support::publish_raw(&*t, &q, props, br#"{"n":5}"#).await;
        let reply = support::take_one(&*t, &replies, LONG).await;
        let p = &reply.properties;
        assert_eq!(reply.exchange, "", "through the default exchange");
        assert_eq!(reply.routing_key, replies);
        assert_eq!(header(p, "x-acemq-correlation"), Some("conv-7"));
        assert_eq!(header(p, "x-acemq-causation"), Some("req-1"));
        assert_eq!(header(p, "x-acemq-type"), Some("Pong"));
        let reply_id = header(p, "x-acemq-id").expect("a reply id");
        assert_ne!(reply_id, "req-1");
        assert!(p.reply_to.is_none() && !p.headers.contains_key("acemq-reply-to"));
        assert_eq!(
            p.delivery_mode,
            Some(1),
            "a reply is transient: it is worth nothing once its requester gave up"
        );
        assert_eq!(support::body(&reply), r#"{"n":10}"#);
        assert_eq!(responder.stats().answered, 1);
        let _ = t.delete_queue(&replies).await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_reply_address_is_acked_unanswered() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-noaddr").await;
        let ran = Arc::new(AtomicU32::new(0));
        let r = ran.clone();
        let responder = mq
            .respond(&q, ConsumerOptions::default(), move |m: Message<Ping>| {
                r.fetch_add(1, Ordering::SeqCst);
                async move { Ok(Pong { n: m.payload().n }) }
            })
            .await
            .unwrap();
        // A plain publish: no acemq-reply-to, no reply_to.
        mq.publisher::<Ping>("", &q)
            .send(&Ping { n: 3 })
            .await
            .unwrap();
        support::eventually(LONG, "the request counted unanswerable", || async {
            (responder.stats().unanswerable == 1).then_some(())
        })
        .await;
        support::eventually(LONG, "the request acked", || async {
            (responder.consumer_stats().acked == 1).then_some(())
        })
        .await;
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler is not run");
        assert_eq!(responder.stats().answered, 0);
        let t = mq.transport().clone();
        let info = t.inspect_queue(&q).await.unwrap();
        assert_eq!(info.message_count, 0);
        for side in [".dlq", ".parked"] {
            let info = t.inspect_queue(&format!("{q}{side}")).await.unwrap();
            assert_eq!(info.message_count, 0, "nothing set aside in {side}");
        }
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_says_the_request_may_still_be_processed_and_the_late_reply_is_unmatched() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-late").await;
        let gate = Arc::new(Semaphore::new(0));
        let responder = gated(&mq, &q, gate.clone()).await;
        let requester = mq.requester().await.unwrap();
        let e = requester
            .request::<Ping, Pong>("", &q, &Ping { n: 1 }, Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(matches!(e, RequestError::TimedOut { .. }), "{e:?}");
        assert_eq!(
            responder.consumer().in_flight(),
            1,
            "the request is in its handler"
        );
        let text = e.to_string();
        assert!(
            text.contains("may still be processed") && text.contains(&q),
            "{text}"
        );
        let s = requester.stats();
        assert_eq!((s.timed_out, s.pending, s.unmatched), (1, 0, 0));
        gate.add_permits(1);
        support::eventually(LONG, "the late reply counted unmatched", || async {
            (requester.stats().unmatched == 1).then_some(())
        })
        .await;
        assert_eq!(responder.stats().answered, 1);
        assert_eq!(requester.stats().answered, 0);
        // The reply was acked and dropped: nothing left in the reply queue.
        let t = mq.transport().clone();
        let info = t.inspect_queue(requester.reply_queue()).await.unwrap();
        assert_eq!(info.message_count, 0);
        done(&mq, &q, &requester).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_request_frees_its_slot() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-cancel").await;
        let gate = Arc::new(Semaphore::new(0));
        let responder = gated(&mq, &q, gate.clone()).await;
        let requester = mq.requester().await.unwrap();
        let mut request = Box::pin(requester.request::<Ping, Pong>("", &q, &Ping { n: 1 }, LONG));
        tokio::select! {
            r = &mut request => panic!("answered while the gate is shut: {r:?}"),
            () = support::eventually(LONG, "the request in its handler", || async {
                (responder.consumer().in_flight() == 1).then_some(())
            }) => {}
        }
        assert_eq!(requester.stats().pending, 1);
        drop(request);
        let s = requester.stats();
        assert_eq!((s.pending, s.timed_out), (0, 0), "the slot is free at once");
        gate.add_permits(1);
        support::eventually(LONG, "its reply counted unmatched", || async {
            (requester.stats().unmatched == 1).then_some(())
        })
        .await;
        // The requester goes on working.
        gate.add_permits(1);
        let pong: Pong = requester
            .request("", &q, &Ping { n: 9 }, LONG)
            .await
            .unwrap();
        assert_eq!(pong.n, 9);
        done(&mq, &q, &requester).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests_from_one_requester_are_all_answered_and_matched() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-1000").await;
        let responder = doubling(
            &mq,
            &q,
            ConsumerOptions::default().concurrency(8).prefetch(100),
        )
        .await;
        let requester = mq.requester().await.unwrap();
        let calls = (0..1000u32).map(|n| {
            let requester = requester.clone();
            let q = q.clone();
            async move {
                let pong: Pong = requester.request("", &q, &Ping { n }, LONG).await?;
                Ok::<_, RequestError>((n, pong.n))
            }
        });
        let results = futures::future::join_all(calls).await;
        for r in results {
            let (n, doubled) = r.unwrap();
            assert_eq!(doubled, n * 2, "the reply to {n} went to its own request");
        }
        let s = requester.stats();
        assert_eq!(
            (s.answered, s.unmatched, s.timed_out, s.pending),
            (1000, 0, 0, 0)
        );
        assert_eq!(responder.stats().answered, 1000);
        done(&mq, &q, &requester).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_is_retried_under_the_responders_policy_then_answers() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-retry").await;
        let attempts = Arc::new(AtomicU32::new(0));
        let a = attempts.clone();
        let policy = RetryPolicy::fixed(3, Duration::from_millis(50)).unwrap();
        let responder = mq
            .respond(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<Ping>| {
                    let a = a.clone();
                    async move {
                        if a.fetch_add(1, Ordering::SeqCst) == 0 {
                            return Err(HandlerError::retry("not yet"));
                        }
                        Ok(Pong {
                            n: m.payload().n + u32::try_from(m.attempt()).unwrap_or(0),
                        })
                    }
                },
            )
            .await
            .unwrap();
        let requester = mq.requester().await.unwrap();
        let pong: Pong = requester
            .request("", &q, &Ping { n: 10 }, LONG)
            .await
            .unwrap();
        assert_eq!(pong.n, 12, "answered on attempt 2");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        // A retry is counted once the original is acked, which can follow the copy's
        // handling (and so the reply) by a moment.
        support::eventually(LONG, "the retry counted", || async {
            (responder.consumer_stats().retried == 1).then_some(())
        })
        .await;
        assert_eq!(responder.stats().answered, 1);
        done(&mq, &q, &requester).await;
    })
    .await;
}

/// `acemq.request.*` series in one snapshot of this binary's global recorder (installed
/// once): `(name, routing key, outcome, count of the counter or of the histogram's values)`.
/// A snapshot drains what it reads, so each case takes one.
fn request_metrics() -> Vec<(String, String, String, u64)> {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    static SNAP: std::sync::OnceLock<Snapshotter> = std::sync::OnceLock::new();
    let snap = SNAP.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snap
    });
    let mut out = Vec::new();
    for (key, _, _, value) in snap.snapshot().into_vec() {
        let k = key.key();
        if !k.name().starts_with("acemq.request.") {
            continue;
        }
        let label = |name: &str| {
            k.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        assert_eq!(label("message.type"), "Ping", "{k:?}");
        assert!(
            matches!(label("transport").as_str(), "memory" | "rabbitmq"),
            "{k:?}"
        );
        let n = match value {
            DebugValue::Counter(n) => n,
            DebugValue::Histogram(v) => v.len() as u64,
            DebugValue::Gauge(_) => continue,
        };
        out.push((
            k.name().to_owned(),
            label("routing.key"),
            label("outcome"),
            n,
        ));
    }
    out
}

fn series(all: &[(String, String, String, u64)], name: &str, rk: &str, outcome: &str) -> u64 {
    all.iter()
        .filter(|(n, r, o, _)| n == name && r == rk && o == outcome)
        .map(|s| s.3)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_measured_and_traced_as_the_family_names_them() {
    support::spans::install();
    request_metrics();
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-observe").await;
        let _responder = doubling(&mq, &q, ConsumerOptions::default()).await;
        let requester = mq.requester().await.unwrap();
        let _: Pong = requester
            .request("", &q, &Ping { n: 1 }, LONG)
            .await
            .unwrap();
        let lonely = support::unique("rr-observe-lonely");
        support::declare_classic(&mq, &lonely).await;
        let e = requester
            .request::<Ping, Pong>("", &lonely, &Ping { n: 2 }, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(e.is_timeout());
        let m = request_metrics();
        for (rk, outcome) in [(&q, "answered"), (&lonely, "timed_out")] {
            assert_eq!(series(&m, "acemq.request.total", rk, outcome), 1, "{m:?}");
            assert_eq!(
                series(&m, "acemq.request.duration", rk, outcome),
                1,
                "{m:?}"
            );
        }
        let answered = support::spans::find("request", "otel.name", &format!("{q} request"));
        assert_eq!(answered.len(), 1, "{answered:?}");
        let span = &answered[0];
        assert_eq!(span.field("otel.kind"), Some("client"));
        assert_eq!(span.field("messaging.operation"), Some("request"));
        assert_eq!(span.field("messaging.acemq.outcome"), Some("answered"));
        assert!(span.field("messaging.message.conversation_id").is_some());
        let timed_out = support::spans::find("request", "otel.name", &format!("{lonely} request"));
        assert_eq!(
            timed_out[0].field("messaging.acemq.outcome"),
            Some("timed_out")
        );
        assert_eq!(timed_out[0].field("otel.status_code"), Some("ERROR"));
        // The request's publish span is a child of the request span.
        let trace_id = span.field("trace_id").unwrap();
        let publish: Vec<_> = support::spans::find("publish", "trace_id", trace_id)
            .into_iter()
            .filter(|p| p.field("messaging.rabbitmq.destination.routing_key") == Some(q.as_str()))
            .collect();
        assert_eq!(publish.len(), 1, "{publish:?}");
        assert_eq!(publish[0].field("parent_span_id"), span.field("span_id"));
        // The reply may come before the request's confirm (it does on RabbitMQ, which
        // confirms a persistent request once its responder acked it); the confirm is still
        // awaited and recorded on the publish span.
        let publish_id = publish[0].field("span_id").unwrap().to_owned();
        support::eventually(
            LONG,
            "the request's publish span records its confirm",
            || {
                let publish_id = publish_id.clone();
                async move {
                    let found = support::spans::find("publish", "span_id", &publish_id);
                    let outcome = found
                        .first()
                        .and_then(|p| p.field("messaging.acemq.outcome"));
                    (outcome == Some("confirmed")).then_some(())
                }
            },
        )
        .await;
        let _ = mq.transport().delete_queue(&lonely).await;
        done(&mq, &q, &requester).await;
    })
    .await;
}

/// How a test loses a connection: injected on memory://, a broker-side close of this
/// test's own named connections on RabbitMQ.
enum Fault {
    Memory(Arc<MemoryTransport>),
    Amqp(String),
}

fn fast() -> RecoveryPolicy {
    RecoveryPolicy::default().delays(Duration::from_millis(200), Duration::from_secs(2))
}

async fn connect_recovering(target: &Broker) -> (Connection, Fault) {
    let name = support::unique("rr-recover");
    let options = ConnectionOptions::default().name(&name).recovery(fast());
    match target {
        Broker::Memory(broker) => {
            let m = Arc::new(MemoryTransport::connect(broker).with_recovery(fast()));
            (
                Connection::with_transport(m.clone(), options),
                Fault::Memory(m),
            )
        }
        Broker::Amqp(url) => (
            Connection::connect_with(url, options).await.unwrap(),
            Fault::Amqp(name),
        ),
    }
}

impl Fault {
    async fn lose_connection(&self) {
        match self {
            Fault::Memory(m) => m.drop_connection("test"),
            Fault::Amqp(name) => {
                for side in ["publish", "consume"] {
                    support::close_rabbit_connection_named(&format!("{name} ({side})"))
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_across_a_lost_connection_are_answered_or_time_out_and_the_reply_queue_comes_back()
 {
    support::on_each_target(|target| async move {
        let (mq, fault) = connect_recovering(&target).await;
        let q = support::unique("rr-recover");
        support::declare_classic(&mq, &q).await;
        let gate = Arc::new(Semaphore::new(0));
        let responder = gated(&mq, &q, gate.clone()).await;
        let requester = mq.requester().await.unwrap();
        let timeout = Duration::from_secs(10);
        let in_flight: Vec<_> = (0..5u32)
            .map(|n| {
                let requester = requester.clone();
                let q = q.clone();
                tokio::spawn(async move {
                    requester
                        .request::<Ping, Pong>("", &q, &Ping { n }, timeout)
                        .await
                })
            })
            .collect();
        support::eventually(LONG, "five requests in their handlers", || async {
            (responder.consumer().in_flight() == 5).then_some(())
        })
        .await;
        fault.lose_connection().await;
        gate.add_permits(1000);
        // Every request ends within its timeout (plus slack): answered, or timed out.
        let ended = tokio::time::timeout(timeout + Duration::from_secs(5), async {
            let mut outcomes = Vec::new();
            for h in in_flight {
                outcomes.push(h.await.unwrap());
            }
            outcomes
        })
        .await
        .expect("no request hangs across a lost connection");
        for (n, r) in ended.iter().enumerate() {
            match r {
                Ok(pong) => assert_eq!(pong.n, n as u32),
                Err(e) => assert!(e.is_timeout(), "request {n}: {e}"),
            }
        }
        // The reply queue is consumed again: a new request is answered.
        let pong: Pong = requester
            .request("", &q, &Ping { n: 77 }, LONG)
            .await
            .unwrap();
        assert_eq!(pong.n, 77);
        done(&mq, &q, &requester).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requester_is_in_health_and_degraded_while_its_reply_queue_is_not_consumed() {
    support::on_each_target(|target| async move {
        let (mq, fault) = connect_recovering(&target).await;
        let requester = mq.requester().await.unwrap();
        let name = format!("requester:{}", requester.reply_queue());
        let status = |mq: &Connection| mq.health().report(&name).map(|r| r.status);
        let health = mq.health();
        let report = health
            .report(&name)
            .expect("the requester registers itself");
        assert_eq!(report.status, HealthStatus::Up);
        assert_eq!(report.detail_value("pending"), Some(&serde_json::json!(0)));
        // The broker down: the reply queue cannot be consumed, so replies cannot arrive.
        if let (Broker::Memory(broker), Fault::Memory(m)) = (&target, &fault) {
            let broker = acemq::transport::memory::MemoryBroker::named(broker);
            broker.set_down(true);
            m.drop_connection("test");
            support::eventually(LONG, "the requester Degraded", || async {
                (status(&mq) == Some(HealthStatus::Degraded)).then_some(())
            })
            .await;
            broker.set_down(false);
            support::eventually(LONG, "the requester Up again", || async {
                (status(&mq) == Some(HealthStatus::Up)).then_some(())
            })
            .await;
        }
        requester.close().await;
        assert_eq!(status(&mq), None, "a closed requester leaves health");
        mq.close().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_request_is_answered_in_text_by_a_text_responder() {
    support::on_each_target(|target| async move {
        use acemq::codec::{TEXT, Text};
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-text").await;
        let responder = mq
            .respond_with(
                &q,
                Text,
                ConsumerOptions::default(),
                |m: Message<String>| async move { Ok(format!("hello, {}", m.payload())) },
            )
            .await
            .unwrap();
        let requester = mq.requester().await.unwrap();
        let answer: String = requester
            .request_with("", &q, Text, "ann", LONG)
            .await
            .unwrap();
        assert_eq!(answer, "hello, ann");
        // The request on the wire: a queue with no responder, read raw.
        let unanswered = support::unique("rr-text-raw");
        support::declare_classic(&mq, &unanswered).await;
        let waiting = {
            let (requester, unanswered) = (requester.clone(), unanswered.clone());
            tokio::spawn(async move {
                requester
                    .request_with::<str, String, _>("", &unanswered, Text, "raw", LONG)
                    .await
            })
        };
        let t = mq.transport().clone();
        let d = support::take_one(&*t, &unanswered, LONG).await;
        waiting.abort();
        assert_eq!(d.properties.content_type.as_deref(), Some(TEXT));
        assert_eq!(support::body(&d), "raw");
        // The reply on the wire: text, with the request's correlation.
        let replies = support::unique("rr-text-replies");
        support::declare_classic(&mq, &replies).await;
        let mut props = Properties {
            content_type: Some("text/plain".into()),
            reply_to: Some(replies.clone()),
            ..Properties::default()
        };
        props
            .headers
            .insert("x-acemq-correlation".into(), HeaderValue::from("conv-t"));
        support::publish_raw(&*t, &q, props, b"bob").await;
        let reply = support::take_one(&*t, &replies, LONG).await;
        assert_eq!(reply.properties.content_type.as_deref(), Some(TEXT));
        assert_eq!(
            header(&reply.properties, "x-acemq-correlation"),
            Some("conv-t")
        );
        assert_eq!(support::body(&reply), "hello, bob");
        // A JSON request is refused by the text codec: parked, never answered.
        let json = Properties {
            content_type: Some("application/json".into()),
            reply_to: Some(replies.clone()),
            ..Properties::default()
        };
        support::publish_raw(&*t, &q, json, br#""carl""#).await;
        let parked = support::take_one(&*t, &format!("{q}.parked"), LONG).await;
        assert_eq!(support::body(&parked), r#""carl""#);
        assert_eq!(responder.stats().answered, 2);
        for name in [&unanswered, &replies] {
            let _ = t.delete_queue(name).await;
        }
        done(&mq, &q, &requester).await;
    })
    .await;
}

/// A responder on `q` whose handler fails every request: `n == 1` with an ordinary
/// (retried) error, `n == 2` fatally; counts its runs per `n`.
async fn failing(
    mq: &Connection,
    q: &str,
    options: ConsumerOptions,
    runs: Arc<[AtomicU32; 3]>,
) -> acemq::request::Responder {
    mq.respond(q, options, move |m: Message<Ping>| {
        let runs = runs.clone();
        async move {
            let n = m.payload().n;
            runs[n as usize].fetch_add(1, Ordering::SeqCst);
            match n {
                1 => Err::<Pong, _>(HandlerError::retry("no price for tea")),
                _ => Err(HandlerError::fatal("tea is not sold here")),
            }
        }
    })
    .await
    .expect("responder starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_handler_failure_goes_back_as_a_fault_reply_and_the_request_to_dlq() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-fault").await;
        let runs: Arc<[AtomicU32; 3]> = Arc::default();
        let policy = RetryPolicy::fixed(2, Duration::from_millis(20)).unwrap();
        let responder = failing(
            &mq,
            &q,
            ConsumerOptions::default().retry(policy),
            runs.clone(),
        )
        .await;
        let requester = mq.requester().await.unwrap();
        for (n, reason, tries) in [(1, "no price for tea", 2), (2, "tea is not sold here", 1)] {
            let started = std::time::Instant::now();
            let e = requester
                .request::<Ping, Pong>("", &q, &Ping { n }, LONG)
                .await
                .unwrap_err();
            match &e {
                RequestError::Failed {
                    reason: r,
                    destination,
                    ..
                } => {
                    assert_eq!((r.as_str(), destination.as_str()), (reason, q.as_str()));
                }
                other => panic!("expected a fault reply, got {other:?}"),
            }
            assert!(started.elapsed() < LONG / 2, "answered, not timed out");
            assert_eq!(e.kind(), acemq::error::ErrorKind::Refused);
            assert!(e.to_string().contains(".dlq"), "{e}");
            assert_eq!(
                runs[n as usize].load(Ordering::SeqCst),
                tries,
                "request {n}: the policy's attempts first, then the fault"
            );
        }
        let t = mq.transport().clone();
        support::eventually(LONG, "both requests in .dlq", || async {
            let info = t.inspect_queue(&format!("{q}.dlq")).await.ok()?;
            (info.message_count == 2).then_some(())
        })
        .await;
        let dead = support::take_one(&*t, &format!("{q}.dlq"), LONG).await;
        assert!(
            header(&dead.properties, "x-acemq-error")
                .is_some_and(|r| r.contains("no price for tea")),
            "{:?}",
            dead.properties.headers
        );
        assert_eq!(responder.stats().faulted, 2);
        assert_eq!(responder.stats().answered, 0);
        let s = requester.stats();
        assert_eq!((s.failed, s.answered, s.timed_out, s.pending), (2, 0, 0, 0));
        responder.close().await;

        // Without a retry policy the first failure is final: a fault reply, then .dlq
        // (a plain consumer would retry it forever, long after the caller gave up).
        let runs: Arc<[AtomicU32; 3]> = Arc::default();
        let responder = failing(&mq, &q, ConsumerOptions::default(), runs.clone()).await;
        let e = requester
            .request::<Ping, Pong>("", &q, &Ping { n: 1 }, LONG)
            .await
            .unwrap_err();
        assert!(matches!(e, RequestError::Failed { .. }), "{e:?}");
        assert_eq!(runs[1].load(Ordering::SeqCst), 1);
        support::eventually(LONG, "the third request in .dlq", || async {
            let info = t.inspect_queue(&format!("{q}.dlq")).await.ok()?;
            (info.message_count == 2 && responder.consumer_stats().dead_lettered == 1).then_some(())
        })
        .await;
        assert_eq!(responder.consumer_stats().retried, 0, "not retried");
        responder.close().await;
        done(&mq, &q, &requester).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_expires_with_its_timeout_and_is_not_handled_after_its_caller_gave_up() {
    support::on_each_target(|target| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "rr-expire").await;
        let requester = mq.requester().await.unwrap();
        // Nobody answers yet: the caller gives up after 300 ms.
        let e = requester
            .request::<Ping, Pong>("", &q, &Ping { n: 1 }, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(e.is_timeout(), "{e:?}");
        assert_eq!(e.kind(), acemq::error::ErrorKind::InDoubt);
        let t = mq.transport().clone();
        support::eventually(LONG, "the stale request gone from the queue", || async {
            let info = t.inspect_queue(&q).await.ok()?;
            (info.message_count == 0).then_some(())
        })
        .await;
        // A responder that starts now handles only the fresh request.
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let responder = mq
            .respond(&q, ConsumerOptions::default(), move |m: Message<Ping>| {
                s.lock().unwrap().push(m.payload().n);
                async move { Ok(Pong { n: m.payload().n }) }
            })
            .await
            .unwrap();
        let pong: Pong = requester
            .request("", &q, &Ping { n: 2 }, LONG)
            .await
            .unwrap();
        assert_eq!(pong.n, 2);
        assert_eq!(
            *seen.lock().unwrap(),
            [2],
            "the expired request was never handled"
        );
        responder.close().await;
        done(&mq, &q, &requester).await;
    })
    .await;
}
