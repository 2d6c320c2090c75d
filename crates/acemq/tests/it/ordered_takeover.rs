//! Ordered queues across instances and connection losses, on `memory://` and RabbitMQ:
//! two consumers on two connections (one holds every partition with exclusive consumers,
//! the other waits on standby; per-key order holds, and closing the active one's connection
//! hands its partitions over within seconds), and a halted partition that stays halted
//! across a reconnect (its redelivered message is held again, not run). On RabbitMQ the
//! connection is lost by closing this test's own consume connection, found by name.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::consume::{HandlerError, Message};
use acemq::ordered::{OnFailure, OrderedConsumer, OrderedQueue, PartitionRole, partition_for};
use acemq::transport::memory::MemoryTransport;
use acemq::transport::recovery::RecoveryPolicy;
use support::{Broker, eventually, on_each_target, unique};

const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Step {
    key: String,
    seq: u32,
    fail: bool,
}

type Seen = Arc<Mutex<HashMap<String, Vec<u32>>>>;

fn total(seen: &Seen) -> usize {
    seen.lock().unwrap().values().map(Vec::len).sum()
}

fn ordered(mq: &Connection, name: &str, on_failure: OnFailure) -> OrderedQueue<Step> {
    mq.ordered::<Step>(name)
        .partitions(8)
        .keyed_by(|s: &Step| s.key.clone())
        .on_failure(on_failure)
}

async fn cleanup(mq: &Connection, q: &OrderedQueue<Step>) {
    let t = mq.transport();
    for name in q.queues() {
        for suffix in ["", ".dlq", ".parked"] {
            let _ = t.delete_queue(&format!("{name}{suffix}")).await;
        }
    }
    let _ = t.delete_exchange(q.name()).await;
}

/// Records every handled step into `seen` (shared by both instances); fails `fail` steps
/// while `failing` is set, counting their runs in `calls`.
async fn consume(
    q: &OrderedQueue<Step>,
    seen: &Seen,
    failing: Arc<std::sync::atomic::AtomicBool>,
    calls: Arc<AtomicUsize>,
) -> OrderedConsumer {
    let seen = seen.clone();
    q.consume(move |m: Message<Step>| {
        let (seen, failing, calls) = (seen.clone(), failing.clone(), calls.clone());
        async move {
            let p = m.payload();
            if p.fail {
                calls.fetch_add(1, Ordering::SeqCst);
                if failing.load(Ordering::SeqCst) {
                    return Err(HandlerError::retry("not now"));
                }
            }
            seen.lock()
                .unwrap()
                .entry(p.key.clone())
                .or_default()
                .push(p.seq);
            Ok(())
        }
    })
    .await
    .unwrap()
}

async fn send_range(q: &OrderedQueue<Step>, keys: usize, seqs: std::ops::Range<u32>) {
    for seq in seqs {
        for k in 0..keys {
            let s = Step {
                key: format!("key-{k}"),
                seq,
                fail: false,
            };
            q.send(&s).await.expect("send");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_stands_by_and_takes_over_when_the_first_connection_closes() {
    on_each_target(|target: Broker| async move {
        let name = unique("ordered-two");
        let a = Connection::connect(&target.url()).await.unwrap();
        let b = Connection::connect(&target.url()).await.unwrap();
        let qa = ordered(&a, &name, OnFailure::Stop);
        let qb = ordered(&b, &name, OnFailure::Stop);
        qa.declare().await.unwrap();
        qb.declare().await.unwrap();
        let seen = Seen::default();
        let never = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ca = consume(&qa, &seen, never.clone(), Arc::default()).await;
        eventually(WAIT, "A holds every partition", || async {
            (ca.active_partitions().len() == 8).then_some(())
        })
        .await;
        let cb = consume(&qb, &seen, never.clone(), Arc::default()).await;
        eventually(WAIT, "B on standby for every partition", || async {
            cb.roles()
                .iter()
                .all(|r| *r == PartitionRole::Standby)
                .then_some(())
        })
        .await;
        let report = b.health();
        let report = report.report(&format!("ordered:{name}")).unwrap();
        assert_eq!(report.detail_value("standby"), Some(&serde_json::json!(8)));

        send_range(&qa, 40, 0..25).await;
        eventually(WAIT, "the first 1,000 handled", || async {
            (total(&seen) == 1000).then_some(())
        })
        .await;
        eventually(WAIT, "A counted 1,000", || async {
            (ca.handled() == 1000).then_some(())
        })
        .await;
        assert_eq!(cb.handled(), 0);

        // The active instance goes: its connection closes; B takes every partition over.
        let closed = Instant::now();
        a.close().await.unwrap();
        eventually(
            Duration::from_secs(10),
            "B holds every partition",
            || async { (cb.active_partitions().len() == 8).then_some(()) },
        )
        .await;
        let took = closed.elapsed();
        assert!(took < Duration::from_secs(5), "takeover took {took:?}");
        eprintln!("takeover of 8 partitions took {took:?}");

        send_range(&qb, 40, 25..50).await;
        eventually(WAIT, "all 2,000 handled", || async {
            (total(&seen) == 2000).then_some(())
        })
        .await;
        // Counted once acked, a moment after the handler recorded it.
        eventually(WAIT, "B counted 1,000", || async {
            (cb.handled() == 1000).then_some(())
        })
        .await;
        for k in 0..40 {
            let got = seen.lock().unwrap()[&format!("key-{k}")].clone();
            assert_eq!(got, (0..50).collect::<Vec<_>>(), "key-{k} out of order");
        }
        cb.close().await;
        cleanup(&b, &qb).await;
        b.close().await.ok();
    })
    .await;
}

fn fast() -> RecoveryPolicy {
    RecoveryPolicy::default().delays(Duration::from_millis(200), Duration::from_secs(2))
}

/// A connection that a test can lose: injected on memory://, the consume connection
/// closed by name on RabbitMQ.
async fn losable(
    target: &Broker,
) -> (
    Connection,
    Box<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>,
) {
    let name = unique("ordered-recover");
    let options = ConnectionOptions::default().name(&name).recovery(fast());
    match target {
        Broker::Memory(broker) => {
            let m = Arc::new(MemoryTransport::connect(broker).with_recovery(fast()));
            let mq = Connection::with_transport(m.clone(), options);
            (
                mq,
                Box::new(move || {
                    m.drop_connection("test");
                    Box::pin(async {})
                }),
            )
        }
        Broker::Amqp(url) => {
            let mq = Connection::connect_with(url, options).await.unwrap();
            (
                mq,
                Box::new(move || {
                    let name = name.clone();
                    Box::pin(async move {
                        support::close_rabbit_connection_named(&format!("{name} (consume)"))
                            .await
                            .unwrap_or_else(|e| panic!("{e}"));
                    })
                }),
            )
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_partition_stays_halted_across_a_reconnect() {
    on_each_target(|target: Broker| async move {
        let (mq, lose) = losable(&target).await;
        let q = ordered(&mq, &unique("ordered-halt-recover"), OnFailure::Stop);
        q.declare().await.unwrap();
        let seen = Seen::default();
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let calls = Arc::new(AtomicUsize::new(0));
        let consumer = consume(&q, &seen, failing.clone(), calls.clone()).await;
        let key = "held-key".to_owned();
        let p = partition_for(&key, 8);
        let s = |seq, fail| Step {
            key: key.clone(),
            seq,
            fail,
        };
        q.send(&s(0, true)).await.unwrap();
        q.send(&s(1, false)).await.unwrap();
        eventually(WAIT, "the partition halted", || async {
            (consumer.halted_partitions() == [p]).then_some(())
        })
        .await;
        let held = consumer.halt(p).unwrap().message_id;

        lose().await;
        eventually(
            WAIT,
            "the held message redelivered and held again",
            || async { (consumer.stats().held_again >= 1).then_some(()) },
        )
        .await;
        assert_eq!(consumer.halted_partitions(), [p]);
        assert_eq!(consumer.halt(p).unwrap().message_id, held);
        assert_eq!(consumer.roles()[p as usize], PartitionRole::Active);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the held message ran again"
        );
        assert!(
            seen.lock().unwrap().get(&key).is_none(),
            "a message behind it ran"
        );

        failing.store(false, Ordering::SeqCst);
        assert!(consumer.resume(p));
        eventually(WAIT, "both handled, in order", || async {
            (seen.lock().unwrap().get(&key) == Some(&vec![0, 1])).then_some(())
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        consumer.close().await;
        cleanup(&mq, &q).await;
        mq.close().await.ok();
    })
    .await;
}
