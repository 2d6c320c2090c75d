//! Crash-loop protection: on a quorum queue, deliveries that ended
//! without a settlement (the broker's `x-delivery-count`) count as attempts, so a message
//! that keeps killing its consumers is dead-lettered once the policy's attempts are used
//! up, without running its handler again.
//!
//! - On `memory://` and RabbitMQ, three consumers die holding the message (their
//!   connections close without a settlement, as a crashed process's would); the fourth
//!   delivery, to a consumer with a policy of 3 attempts, goes to `.dlq` unhandled.
//! - On RabbitMQ, the same with real processes: this test binary runs itself as a child
//!   consumer that aborts (`std::process::abort`) in its handler, three times.

use crate::support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};
use acemq::retry::RetryPolicy;
use acemq::topology::QueueDecl;
use support::{Broker, eventually, on_each_target, spec, take_one, unique};

const WAIT: Duration = Duration::from_secs(30);

fn three_attempts() -> ConsumerOptions {
    ConsumerOptions::default().retry(RetryPolicy::fixed(3, Duration::from_millis(10)).unwrap())
}

async fn declare_quorum(mq: &Connection, q: &str) {
    mq.transport()
        .declare_queue(&QueueDecl::quorum(q))
        .await
        .expect("declare quorum queue");
}

/// Consumes `q` with a policy of 3 attempts and asserts the message goes to `.dlq` with
/// the crash-loop reason, its handler never running.
async fn fourth_delivery_is_dead_lettered(mq: &Connection, q: &str) {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let consumer = mq
        .consume(q, three_attempts(), move |_m: Message<u32>| {
            r.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        })
        .await
        .unwrap();
    let dead = take_one(&**mq.transport(), &format!("{q}.dlq"), WAIT).await;
    let reason = dead.properties.headers["x-acemq-error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reason.starts_with("exhausted 3 attempts: delivered 3 times without a settlement"),
        "{reason}"
    );
    eventually(WAIT, "the dead letter counted", || async {
        (consumer.stats().dead_lettered == 1).then_some(())
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
    assert_eq!(
        dead.properties.headers["x-acemq-attempt"].as_i64(),
        Some(3),
        "it keeps the last attempt that ran"
    );
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_three_consumers_goes_to_the_dlq_unhandled() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let q = unique("crash-loop");
        declare_quorum(&mq, &q).await;
        mq.publisher::<u32>("", &q).send(&1).await.unwrap();
        for round in 1..=3 {
            // A consumer that dies holding the message: its connection closes unsettled.
            let t = target.transport().await;
            let mut sub = t.consume(spec(&q, 1)).await.unwrap();
            let d = tokio::time::timeout(WAIT, sub.next())
                .await
                .expect("a delivery")
                .expect("subscription open")
                .expect("delivery");
            assert_eq!(d.redelivered, round > 1);
            t.close().await.unwrap();
        }
        fourth_delivery_is_dead_lettered(&mq, &q).await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_counts_as_an_attempt_and_is_not_counted_twice() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let q = unique("crash-once");
        declare_quorum(&mq, &q).await;
        mq.publisher::<u32>("", &q).send(&1).await.unwrap();
        // One consumer dies holding it.
        let t = target.transport().await;
        let mut sub = t.consume(spec(&q, 1)).await.unwrap();
        tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("a delivery")
            .expect("subscription open")
            .expect("delivery");
        t.close().await.unwrap();
        // Then every run fails: attempts 2 and 3 run (the crash was attempt 1), and the
        // retry copy does not carry the broker's count on top of its attempt.
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let consumer = mq
            .consume(&q, three_attempts(), move |m: Message<u32>| {
                s.lock().unwrap().push(m.envelope().attempt());
                async { Err(acemq::consume::HandlerError::retry("still failing")) }
            })
            .await
            .unwrap();
        let dead = take_one(&**mq.transport(), &format!("{q}.dlq"), WAIT).await;
        assert_eq!(
            dead.properties.headers["x-acemq-error"].as_str(),
            Some("exhausted 3 attempts: still failing")
        );
        assert!(!dead.properties.headers.contains_key("x-delivery-count"));
        assert_eq!(*seen.lock().unwrap(), [2, 3]);
        consumer.close().await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Real processes (RabbitMQ only): with `ACEMQ_CRASH_QUEUE` set, this test, run alone with
// `--exact`, is a consumer whose handler aborts the process.
// ---------------------------------------------------------------------------------------

const CRASH_TEST: &str = "a_consumer_process_aborted_three_times_ends_the_loop";

async fn aborting_child(amqp: &str, queue: &str) {
    let mq = Connection::connect(amqp).await.unwrap();
    let _consumer = mq
        .consume(queue, three_attempts(), move |m: Message<u32>| async move {
            let marker = std::env::temp_dir().join(format!("{}.ran", m.queue()));
            let runs = std::fs::read_to_string(&marker)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .unwrap_or(0);
            std::fs::write(&marker, (runs + 1).to_string()).unwrap();
            std::process::abort();
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_process_aborted_three_times_ends_the_loop() {
    let Some(amqp) = support::amqp_url() else {
        eprintln!("note: needs RabbitMQ; skipped");
        return;
    };
    if let Ok(queue) = std::env::var("ACEMQ_CRASH_QUEUE") {
        return aborting_child(&amqp, &queue).await;
    }
    let q = unique("crash-abort");
    let mq = Connection::connect(&amqp).await.unwrap();
    declare_quorum(&mq, &q).await;
    let marker = std::env::temp_dir().join(format!("{q}.ran"));
    let _ = std::fs::remove_file(&marker);
    mq.publisher::<u32>("", &q).send(&1).await.unwrap();
    let runs = || {
        std::fs::read_to_string(&marker)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0)
    };
    for round in 1..=3u32 {
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &support::this_test(module_path!(), CRASH_TEST),
                "--test-threads",
                "1",
            ])
            .env("ACEMQ_CRASH_QUEUE", &q)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "round {round}: the child aborted");
        assert_eq!(
            runs(),
            round,
            "round {round}: its handler ran, then it died"
        );
        // The broker has the message back once the dead connection is noticed.
        eventually(WAIT, "the message back in the queue", || async {
            let info = mq.transport().inspect_queue(&q).await.ok()?;
            (info.message_count == 1).then_some(())
        })
        .await;
    }
    fourth_delivery_is_dead_lettered(&mq, &q).await;
    assert_eq!(runs(), 3, "no fourth run");
    let _ = std::fs::remove_file(&marker);
    support::teardown(&mq, &q, &[]).await;
}
