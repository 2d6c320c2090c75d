//! Consumers across a lost connection and a deleted queue, on `memory://` (faults injected)
//! and on RabbitMQ (the broker force-closes this test's own connections, found by name):
//! the consumer comes back by itself with the same options, health says Degraded (not
//! Down) while it waits, a publish during the outage is refused as safe to resend, and no
//! confirmed message is lost.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::consume::{ConsumerOptions, Message};
use acemq::error::ErrorKind;
use acemq::health::HealthStatus;
use acemq::topology::QueueDecl;
use acemq::transport::Transport;
use acemq::transport::memory::MemoryTransport;
use acemq::transport::recovery::RecoveryPolicy;
use support::Broker;

type Seen = Arc<Mutex<HashMap<u32, u32>>>;

fn fast() -> RecoveryPolicy {
    RecoveryPolicy::default().delays(Duration::from_millis(200), Duration::from_secs(2))
}

/// How a test loses a connection: injected on memory://, a broker-side close of both
/// named connections on RabbitMQ.
enum Fault {
    Memory(Arc<MemoryTransport>),
    Amqp(String),
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

/// A connection on `target` with fast recovery and a unique name.
async fn connect(target: &Broker) -> (Connection, Fault) {
    let name = support::unique("recover-consumer");
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
            Connection::connect_with(url, options)
                .await
                .unwrap_or_else(|e| panic!("connect: {e}")),
            Fault::Amqp(name),
        ),
    }
}

async fn consume_counting(mq: &Connection, q: &str) -> (acemq::consume::Consumer, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let consumer = mq
        .consume(
            q,
            ConsumerOptions::default().prefetch(5),
            move |m: Message<u32>| {
                let s = s.clone();
                async move {
                    *s.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(*m.payload())
                        .or_default() += 1;
                    Ok(())
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("consume: {e}"));
    (consumer, seen)
}

async fn wait_all(seen: &Seen, ids: std::ops::Range<u32>, within: Duration) {
    let want = ids.clone();
    support::eventually(within, "every confirmed id handled", || {
        let done = {
            let s = seen.lock().unwrap_or_else(|e| e.into_inner());
            want.clone().all(|i| s.contains_key(&i))
        };
        async move { done.then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_comes_back_after_its_connection_is_lost() {
    for target in support::targets() {
        let (mq, fault) = connect(&target).await;
        let q = support::unique("recover.consumer");
        support::declare_classic(&mq, &q).await;
        let (consumer, seen) = consume_counting(&mq, &q).await;
        let publisher = mq.publisher::<u32>("", &q);
        for i in 0..20 {
            publisher
                .send(&i)
                .await
                .unwrap_or_else(|e| panic!("send {i}: {e}"));
        }
        wait_all(&seen, 0..20, Duration::from_secs(10)).await;

        fault.lose_connection().await;
        // While it is down: Degraded with `recovering`, never Down; a publish is refused
        // with nothing sent (or, if recovery already finished, it is confirmed).
        let health = mq.health();
        let conn = health.report("acemq").expect("acemq report");
        if conn.status != HealthStatus::Up {
            assert_eq!(conn.status, HealthStatus::Degraded, "{health:?}");
            assert_eq!(conn.details["recovering"], true);
        }
        let mut refused = 0;
        let mut next = 20;
        // Publish through the outage: a refusal is transient (not sent; send again).
        while next < 40 {
            match publisher.send(&next).await {
                Ok(_) => next += 1,
                Err(e) => {
                    assert!(
                        matches!(e.kind(), ErrorKind::Transient | ErrorKind::InDoubt),
                        "{target:?}: {e} is {:?}",
                        e.kind()
                    );
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        wait_all(&seen, 0..40, Duration::from_secs(30)).await;
        support::eventually(Duration::from_secs(10), "health Up again", || {
            let up = mq.health().status == HealthStatus::Up;
            async move { up.then_some(()) }
        })
        .await;
        let runs: u32 = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum();
        eprintln!(
            "{}: 40 confirmed, handled {} distinct in {runs} runs, {refused} refused publishes",
            target.kind(),
            seen.lock().unwrap_or_else(|e| e.into_inner()).len()
        );
        // Duplicates are bounded by the prefetch window per loss (plus in-doubt resends).
        assert!(runs <= 40 + 5 + refused, "{runs} runs");
        // Acks of consecutive deliveries are sent (and counted) as one run, just after the
        // last handler of the run returned.
        support::eventually(Duration::from_secs(10), "every delivery acked", || {
            let acked = consumer.stats().acked;
            async move { (acked >= 40).then_some(()) }
        })
        .await;
        consumer.close().await;
        mq.transport().delete_queue(&q).await.ok();
        mq.close().await.unwrap_or_else(|e| panic!("close: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_queue_is_deleted_waits_degraded_and_resumes_when_it_is_declared_again() {
    for target in support::targets() {
        let (mq, _) = connect(&target).await;
        let q = support::unique("recover.deleted");
        support::declare_classic(&mq, &q).await;
        let (consumer, seen) = consume_counting(&mq, &q).await;
        let publisher = mq.publisher::<u32>("", &q);
        publisher
            .send(&1)
            .await
            .unwrap_or_else(|e| panic!("send: {e}"));
        wait_all(&seen, 1..2, Duration::from_secs(10)).await;

        // An operator deletes the queue (through another connection).
        let operator = target.transport().await;
        operator
            .delete_queue(&q)
            .await
            .unwrap_or_else(|e| panic!("delete: {e}"));
        let reason = support::eventually(Duration::from_secs(10), "consumer Degraded", || {
            let h = mq.health();
            let key = format!("stopped.{q}");
            let r = h
                .report(acemq::connection::CONSUMERS)
                .filter(|r| r.status == HealthStatus::Degraded)
                .and_then(|r| r.detail(&key).map(str::to_owned));
            async move { r }
        })
        .await;
        assert!(!reason.is_empty());
        // ... and declares it again: the same consumer resumes.
        operator
            .declare_queue(&QueueDecl::classic(&q))
            .await
            .unwrap_or_else(|e| panic!("declare: {e}"));
        support::eventually(Duration::from_secs(20), "consumer Up again", || {
            let up = mq
                .health()
                .report(acemq::connection::CONSUMERS)
                .is_some_and(|r| r.status == HealthStatus::Up);
            async move { up.then_some(()) }
        })
        .await;
        publisher
            .send(&2)
            .await
            .unwrap_or_else(|e| panic!("send: {e}"));
        wait_all(&seen, 1..3, Duration::from_secs(10)).await;
        consumer.close().await;
        operator.delete_queue(&q).await.ok();
        operator.close().await.ok();
        mq.close().await.unwrap_or_else(|e| panic!("close: {e}"));
    }
}

#[tokio::test(start_paused = true)]
async fn with_recovery_off_a_lost_connection_is_down() {
    let m = Arc::new(
        MemoryTransport::connect(&support::unique("mem-off"))
            .with_recovery(RecoveryPolicy::disabled()),
    );
    let mq = Connection::with_transport(m.clone(), ConnectionOptions::default());
    m.drop_connection("test");
    tokio::time::sleep(Duration::from_secs(60)).await;
    let health = mq.health();
    assert_eq!(health.status, HealthStatus::Down, "{health:?}");
    assert_eq!(
        health
            .report("acemq")
            .and_then(|r| r.detail_value("recovering")),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_window_permits_come_back_after_a_loss() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    // A window of 8: if publishes in flight at the loss kept their permits, the batches
    // after the recovery would wait forever.
    let name = support::unique("recover-window");
    let mq = Connection::connect_with(
        &url,
        ConnectionOptions::default()
            .name(&name)
            .recovery(fast())
            .max_outstanding_confirms(8),
    )
    .await
    .unwrap_or_else(|e| panic!("connect: {e}"));
    let q = support::unique("recover.window");
    support::declare_classic(&mq, &q).await;
    let publisher = mq.publisher::<u32>("", &q);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let in_flight = {
        let (p, stop) = (publisher.clone(), stop.clone());
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut round = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let batch: Vec<u32> = (0..8).map(|i| round * 8 + i).collect();
                if let Err(e) = p.send_all(&batch).await {
                    failures.push(e);
                }
                round += 1;
            }
            failures
        })
    };
    support::close_rabbit_connection_named(&format!("{name} (publish)"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    support::eventually(Duration::from_secs(20), "recovered", || {
        let up = mq.status().connected;
        async move { up.then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let failures = tokio::time::timeout(Duration::from_secs(60), in_flight)
        .await
        .expect("publishing did not stall")
        .expect("task");
    assert!(!failures.is_empty(), "the loss hit publishes under way");
    for e in &failures {
        assert!(
            matches!(e.kind(), ErrorKind::Transient | ErrorKind::InDoubt),
            "{e}"
        );
    }
    // After recovery the whole window is free again: 10 full batches go through.
    support::eventually(Duration::from_secs(20), "publishing works again", || {
        let p = publisher.clone();
        async move { p.send(&0).await.ok() }
    })
    .await;
    for round in 0..10u32 {
        let batch: Vec<u32> = (0..8).map(|i| round * 8 + i).collect();
        tokio::time::timeout(Duration::from_secs(10), publisher.send_all(&batch))
            .await
            .expect("a full window is available")
            .unwrap_or_else(|e| panic!("send_all: {e}"));
    }
    mq.transport().delete_queue(&q).await.ok();
    mq.close().await.unwrap_or_else(|e| panic!("close: {e}"));
}

#[tokio::test(start_paused = true)]
async fn a_consumer_the_broker_forgot_without_a_cancel_subscribes_again() {
    let m = Arc::new(MemoryTransport::connect(&support::unique("mem-forgot")));
    let mq = Connection::with_transport(m.clone(), ConnectionOptions::default());
    let q = support::unique("forgot.q");
    support::declare_classic(&mq, &q).await;
    let (consumer, seen) = consume_counting(&mq, &q).await;
    // The broker drops the consumer silently: nothing ends the subscription.
    assert_eq!(m.broker().forget_consumers(&q), 1);
    mq.publisher::<u32>("", &q)
        .send(&7)
        .await
        .unwrap_or_else(|e| panic!("send: {e}"));
    let started = tokio::time::Instant::now();
    wait_all(&seen, 7..8, Duration::from_secs(120)).await;
    // Found by the broker-side check, not before it ran.
    assert!(started.elapsed() >= acemq::consume::DEFAULT_BROKER_CHECK);
    assert_eq!(
        m.inspect_queue(&q)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .consumer_count,
        1
    );
    consumer.close().await;
    mq.close().await.unwrap_or_else(|e| panic!("close: {e}"));
}
