//! Ordered queues on `memory://` and RabbitMQ through the same cases: Java's partition
//! arithmetic, per-key order over 8 partitions consumed at once, halting (the held message,
//! the other partitions finishing, health Degraded and the actuator 200, resume), retry in
//! place, Skip to `.dlq` with the reason, and an undecodable body parked.

#[cfg(feature = "actuator")]
use crate::http_client;
use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{HandlerError, Message};
use acemq::envelope::ERROR;
use acemq::health::HealthStatus;
use acemq::ordered::{OnFailure, OrderedQueue, fnv1a32, partition_for, partition_queue};
use acemq::transport::{Outbound, Properties};
use support::{Broker, eventually, on_each_target, unique};

const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Step {
    key: String,
    seq: u32,
    fail: bool,
}

fn step(key: &str, seq: u32) -> Step {
    Step {
        key: key.to_owned(),
        seq,
        fail: false,
    }
}

/// Handled (key, seq) pairs, in handling order per key.
type Seen = Arc<Mutex<HashMap<String, Vec<u32>>>>;

fn seen_of(seen: &Seen, key: &str) -> Vec<u32> {
    seen.lock().unwrap().get(key).cloned().unwrap_or_default()
}

fn total(seen: &Seen) -> usize {
    seen.lock().unwrap().values().map(Vec::len).sum()
}

/// An ordered queue with a unique name, declared.
async fn declared(mq: &Connection, partitions: u32, on_failure: OnFailure) -> OrderedQueue<Step> {
    let q = mq
        .ordered::<Step>(&unique("ordered"))
        .partitions(partitions)
        .keyed_by(|s: &Step| s.key.clone())
        .on_failure(on_failure);
    q.declare().await.expect("declare");
    q
}

/// Deletes the partition queues, their `.dlq` / `.parked`, and the exchange.
async fn cleanup(mq: &Connection, q: &OrderedQueue<Step>) {
    let t = mq.transport();
    for name in q.queues() {
        for suffix in ["", ".dlq", ".parked"] {
            let _ = t.delete_queue(&format!("{name}{suffix}")).await;
        }
    }
    let _ = t.delete_exchange(q.name()).await;
}

/// A key that lands in partition `p` of `n`.
fn key_in(p: u32, n: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| partition_for(k, n) == p)
        .expect("some key lands there")
}

#[test]
fn the_partition_arithmetic_is_javas() {
    assert_eq!(fnv1a32(""), 0x811c_9dc5);
    assert_eq!(fnv1a32("a"), 0xe40c_292c);
    assert_eq!(fnv1a32("foobar"), 0xbf9c_f968);
    // n = 3: Java's signed floor_mod says 0, an unsigned modulo (Go) says 1.
    assert_eq!(partition_for("a", 3), 0);
    assert_eq!(fnv1a32("a") % 3, 1);
    assert_eq!(partition_queue("orders", 2), "orders.p2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sending_without_a_key_is_a_clear_error() {
    let mq = Connection::connect(&format!("memory://{}", unique("ordered-nokey")))
        .await
        .unwrap();
    let q = mq.ordered::<Step>("no-key");
    q.declare().await.unwrap();
    let e = q.send(&step("k", 1)).await.unwrap_err();
    assert!(e.to_string().contains("keyed_by"), "{e}");
    let e = mq
        .ordered::<Step>("zero")
        .partitions(0)
        .declare()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("partitions must be"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_over_200_keys_arrive_in_per_key_order() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let q = declared(&mq, 8, OnFailure::Stop).await;
        // The topology is Java's: quorum partition queues with no arguments.
        if target.kind() == "amqp" {
            support::assert_rabbit_queue_arguments(
                &q.queues()[0],
                &[("x-queue-type", "longstr", "quorum")],
            );
        }
        let seen: Seen = Arc::default();
        let (running, max_running) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (s, r, m) = (seen.clone(), running.clone(), max_running.clone());
        let consumer = q
            .consume(move |msg: Message<Step>| {
                let (s, r, m) = (s.clone(), r.clone(), m.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let p = msg.payload();
                    s.lock()
                        .unwrap()
                        .entry(p.key.clone())
                        .or_default()
                        .push(p.seq);
                    r.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .await
            .unwrap();
        let q = Arc::new(q);
        let sends = (0..200).map(|k| {
            let q = q.clone();
            async move {
                for seq in 0..50 {
                    q.send(&step(&format!("key-{k}"), seq)).await.expect("send");
                }
            }
        });
        futures::future::join_all(sends).await;
        eventually(Duration::from_secs(120), "10,000 handled", || async {
            (total(&seen) == 10_000).then_some(())
        })
        .await;
        for k in 0..200 {
            let got = seen_of(&seen, &format!("key-{k}"));
            assert_eq!(got, (0..50).collect::<Vec<_>>(), "key-{k} out of order");
        }
        // Counted once acked, a moment after the handler recorded it.
        eventually(WAIT, "10,000 counted", || async {
            (consumer.handled() == 10_000).then_some(())
        })
        .await;
        assert!(
            max_running.load(Ordering::SeqCst) >= 2,
            "the partitions were consumed one at a time"
        );
        assert_eq!(consumer.active_partitions(), (0..8).collect::<Vec<_>>());
        consumer.close().await;
        cleanup(&mq, &q).await;
        mq.close().await.ok();
    })
    .await;
}

/// A handler that fails on `fail` messages until `allow` is set, recording what it handled.
fn recording(
    seen: &Seen,
    allow: &Arc<AtomicBool>,
    calls: &Arc<AtomicUsize>,
) -> impl Fn(Message<Step>) -> futures::future::BoxFuture<'static, Result<(), HandlerError>>
+ Send
+ Sync
+ 'static {
    let (seen, allow, calls) = (seen.clone(), allow.clone(), calls.clone());
    move |m: Message<Step>| {
        let (seen, allow, calls) = (seen.clone(), allow.clone(), calls.clone());
        Box::pin(async move {
            let p = m.payload();
            if p.fail {
                calls.fetch_add(1, Ordering::SeqCst);
                if !allow.load(Ordering::SeqCst) {
                    return Err(HandlerError::retry(format!(
                        "cannot handle {}#{}",
                        p.key, p.seq
                    )));
                }
            }
            seen.lock()
                .unwrap()
                .entry(p.key.clone())
                .or_default()
                .push(p.seq);
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_partition_holds_its_message_while_the_others_finish_and_resume_completes_it() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let q = declared(&mq, 4, OnFailure::Stop).await;
        let (seen, allow, calls) = (
            Seen::default(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let consumer = q.consume(recording(&seen, &allow, &calls)).await.unwrap();
        let twice = q
            .consume(recording(&seen, &allow, &calls))
            .await
            .unwrap_err();
        assert!(twice.to_string().contains("already consumed"), "{twice}");
        let bad = key_in(1, 4, "bad");
        q.send(&step(&bad, 0)).await.unwrap();
        q.send(&Step {
            fail: true,
            ..step(&bad, 1)
        })
        .await
        .unwrap();
        q.send(&step(&bad, 2)).await.unwrap();
        let others: Vec<String> = [0, 2, 3].iter().map(|p| key_in(*p, 4, "good")).collect();
        for k in &others {
            for seq in 0..20 {
                q.send(&step(k, seq)).await.unwrap();
            }
        }
        eventually(WAIT, "partition 1 halted", || async {
            (consumer.halted_partitions() == [1]).then_some(())
        })
        .await;
        eventually(WAIT, "the other partitions finished", || async {
            others
                .iter()
                .all(|k| seen_of(&seen, k).len() == 20)
                .then_some(())
        })
        .await;
        // Held: run once, nothing behind it handed over, not acked (it is not in the queue
        // as ready, and not gone either).
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(seen_of(&seen, &bad), [0]);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let halt = consumer.halt(1).expect("halted");
        assert!(halt.reason.contains("cannot handle"), "{halt:?}");
        eventually(WAIT, "61 counted", || async {
            (consumer.handled() == 61).then_some(())
        })
        .await;
        let health = mq.health();
        assert_eq!(health.status, HealthStatus::Degraded);
        let report = health
            .report(&format!("ordered:{}", q.name()))
            .expect("ordered report");
        assert_eq!(report.status, HealthStatus::Degraded);
        assert_eq!(report.detail_value("halted"), Some(&serde_json::json!([1])));
        assert_eq!(
            report.detail_value("partitions"),
            Some(&serde_json::json!(4))
        );
        assert_eq!(report.detail_value("failed"), Some(&serde_json::json!(1)));
        assert_eq!(report.detail_value("handled"), Some(&serde_json::json!(61)));
        assert_eq!(report.detail_value("skipped"), Some(&serde_json::json!(0)));
        #[cfg(feature = "actuator")]
        {
            let actuator = mq
                .start_actuator("127.0.0.1:0".parse().unwrap())
                .await
                .unwrap();
            let a = http_client::get(actuator.local_addr(), "/acemq-health").await;
            assert_eq!(a.status, 200, "{}", a.body);
            assert_eq!(a.json()["status"], "DEGRADED");
            let details = &a.json()["components"][format!("ordered:{}", q.name())]["details"];
            assert_eq!(details["halted"], serde_json::json!([1]), "{}", a.body);
            assert_eq!(details["partitions"], serde_json::json!(4), "{}", a.body);
        }
        // Resume: the held message runs again (attempt 1) and the one behind it follows.
        allow.store(true, Ordering::SeqCst);
        assert!(consumer.resume(1));
        assert!(!consumer.resume(3), "partition 3 was not halted");
        eventually(WAIT, "the halted key completed", || async {
            (seen_of(&seen, &bad) == [0, 1, 2]).then_some(())
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(consumer.halted_partitions().is_empty());
        let report = mq.health();
        assert_eq!(
            report
                .report(&format!("ordered:{}", q.name()))
                .unwrap()
                .status,
            HealthStatus::Up
        );
        consumer.close().await;
        assert!(
            mq.health()
                .report(&format!("ordered:{}", q.name()))
                .is_none(),
            "unregistered on close"
        );
        cleanup(&mq, &q).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_in_place_runs_the_handler_again_then_halts() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let policy = OnFailure::RetryInPlace {
            attempts: 3,
            delay: Duration::from_millis(50),
        };
        let q = declared(&mq, 2, policy).await;
        let attempts: Arc<Mutex<Vec<(u32, i32)>>> = Arc::default();
        let a = attempts.clone();
        let consumer = q
            .consume(move |m: Message<Step>| {
                let a = a.clone();
                async move {
                    let p = m.payload();
                    a.lock().unwrap().push((p.seq, m.attempt()));
                    // seq 0 succeeds on its third run; seq 1 never does.
                    match (p.seq, m.attempt()) {
                        (0, 3) => Ok(()),
                        _ => Err(HandlerError::retry("not yet")),
                    }
                }
            })
            .await
            .unwrap();
        let key = key_in(0, 2, "retry");
        q.send(&step(&key, 0)).await.unwrap();
        q.send(&step(&key, 1)).await.unwrap();
        eventually(WAIT, "partition 0 halted on seq 1", || async {
            (consumer.halted_partitions() == [0]).then_some(())
        })
        .await;
        assert_eq!(
            *attempts.lock().unwrap(),
            [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
        );
        assert_eq!((consumer.handled(), consumer.failed()), (1, 1));
        consumer.close().await;
        cleanup(&mq, &q).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_dead_letters_with_the_reason_and_carries_on() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let q = declared(&mq, 2, OnFailure::Skip).await;
        let (seen, allow, calls) = (
            Seen::default(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let consumer = q.consume(recording(&seen, &allow, &calls)).await.unwrap();
        let key = key_in(1, 2, "skip");
        q.send(&Step {
            fail: true,
            ..step(&key, 0)
        })
        .await
        .unwrap();
        q.send(&step(&key, 1)).await.unwrap();
        eventually(WAIT, "the one behind handled", || async {
            (seen_of(&seen, &key) == [1]).then_some(())
        })
        .await;
        let dlq = format!("{}.dlq", partition_queue(q.name(), 1));
        let d = support::take_one(&**mq.transport(), &dlq, WAIT).await;
        let reason = d.properties.headers[ERROR].as_str().unwrap().to_owned();
        assert!(
            reason.contains("cannot handle") && reason.contains("skipped"),
            "{reason}"
        );
        let body: Step = serde_json::from_slice(&d.body).unwrap();
        assert_eq!((body.seq, body.fail), (0, true));
        eventually(WAIT, "the one behind counted", || async {
            (consumer.handled() == 1).then_some(())
        })
        .await;
        assert_eq!(
            (consumer.skipped(), consumer.failed(), consumer.handled()),
            (1, 1, 1)
        );
        assert!(consumer.halted_partitions().is_empty());
        consumer.close().await;
        cleanup(&mq, &q).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_body_is_parked_and_the_partition_carries_on() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let q = declared(&mq, 2, OnFailure::Stop).await;
        let (seen, allow, calls) = (
            Seen::default(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let consumer = q.consume(recording(&seen, &allow, &calls)).await.unwrap();
        let key = key_in(0, 2, "park");
        let raw = Outbound::new(q.name(), "p0", Properties::default(), "not json");
        support::publish_confirmed(&**mq.transport(), raw).await;
        q.send(&step(&key, 7)).await.unwrap();
        eventually(WAIT, "the next message handled", || async {
            (seen_of(&seen, &key) == [7]).then_some(())
        })
        .await;
        let parked = format!("{}.parked", partition_queue(q.name(), 0));
        let d = support::take_one(&**mq.transport(), &parked, WAIT).await;
        assert_eq!(&d.body[..], b"not json");
        let reason = d.properties.headers[ERROR].as_str().unwrap();
        assert!(reason.starts_with("could not be decoded"), "{reason}");
        assert_eq!(consumer.stats().parked, 1);
        assert!(consumer.halted_partitions().is_empty());
        consumer.close().await;
        cleanup(&mq, &q).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_queue_with_the_text_codec_sends_and_reads_text() {
    on_each_target(|target: Broker| async move {
        use acemq::codec::{TEXT, Text};
        let mq = Connection::connect(&target.url()).await.unwrap();
        let q = mq
            .ordered_with::<String, _>(&unique("ordered-text"), Text)
            .partitions(2)
            .keyed_by(|s: &String| s.split(':').next().unwrap_or_default().to_owned());
        q.declare().await.unwrap();
        let key = key_in(1, 2, "text");
        let p1 = partition_queue(q.name(), 1);
        // The wire: text, not JSON, on the key's partition.
        q.send(&format!("{key}:0")).await.unwrap();
        let d = support::take_one(&**mq.transport(), &p1, WAIT).await;
        assert_eq!(d.properties.content_type.as_deref(), Some(TEXT));
        assert_eq!(support::body(&d), format!("{key}:0"));
        // A JSON body is refused by the text decoder (parked); the text ones are read in order.
        let json = Properties {
            content_type: Some("application/json".into()),
            ..Properties::default()
        };
        let raw = Outbound::new(q.name(), "p1", json, r#""not text""#);
        support::publish_confirmed(&**mq.transport(), raw).await;
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        let consumer = q
            .consume(move |m: Message<String>| {
                let g = g.clone();
                async move {
                    let ct = m.content_type().map(str::to_owned);
                    g.lock().unwrap().push((ct, m.into_payload()));
                    Ok(())
                }
            })
            .await
            .unwrap();
        for i in 1..=3 {
            q.send(&format!("{key}:{i}")).await.unwrap();
        }
        eventually(WAIT, "three text messages handled", || async {
            (got.lock().unwrap().len() == 3).then_some(())
        })
        .await;
        let got = got.lock().unwrap().clone();
        let expected: Vec<_> = (1..=3)
            .map(|i| (Some(TEXT.to_owned()), format!("{key}:{i}")))
            .collect();
        assert_eq!(got, expected);
        let parked = support::take_one(&**mq.transport(), &format!("{p1}.parked"), WAIT).await;
        assert_eq!(support::body(&parked), r#""not text""#);
        assert_eq!(consumer.stats().parked, 1);
        consumer.close().await;
        let t = mq.transport();
        for name in q.queues() {
            for suffix in ["", ".dlq", ".parked"] {
                let _ = t.delete_queue(&format!("{name}{suffix}")).await;
            }
        }
        let _ = t.delete_exchange(q.name()).await;
        mq.close().await.ok();
    })
    .await;
}
