//! A resource alarm on a real RabbitMQ, seen through the AceMQ connection: the
//! actuator answers 200 at once with the connection Up and the broker's reason, a publish
//! is refused with a distinct error instead of hanging, and consuming goes on on its own
//! connection.
//!
//! It changes global broker state (`rabbitmqctl set_vm_memory_high_watermark 0`), so it is a
//! serial test (see `main.rs`); a drop guard restores the watermark even on failure.

use crate::http_client;
use crate::support;

use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};
use support::{MemoryAlarm, declare_classic, eventually, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "serial: changes global broker state"]
async fn a_blocked_connection_is_up_with_its_reason_publishes_are_refused_and_consuming_goes_on() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    let mq = Connection::connect(&url).await.unwrap();
    let actuator = mq
        .start_actuator("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let q = unique("blocked");
    declare_classic(&mq, &q).await;
    let orders = mq.publisher::<u32>("", &q);
    orders.send_all(&[1, 2]).await.unwrap();

    let alarm = MemoryAlarm::raise();
    // RabbitMQ blocks a connection when it next publishes; that publish is in doubt.
    let first = tokio::time::timeout(Duration::from_secs(10), orders.send(&3)).await;
    assert!(
        matches!(first, Ok(Err(_))),
        "the publish that meets the alarm is not confirmed: {first:?}"
    );
    eventually(Duration::from_secs(10), "the blocked state", || async {
        mq.status().blocked.is_some().then_some(())
    })
    .await;

    let started = Instant::now();
    let answer = http_client::get(actuator.local_addr(), "/acemq-health").await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(250), "health took {took:?}");
    assert_eq!(answer.status, 200);
    let json = answer.json();
    assert_eq!(json["status"], "UP", "{json}");
    let connection = &json["components"]["acemq"];
    assert_eq!(connection["status"], "UP");
    assert_eq!(connection["details"]["blocked"], true);
    let reason = connection["details"]["blockedReason"].as_str().unwrap();
    assert!(reason.contains("memory"), "{reason}");

    let started = Instant::now();
    let refused = orders.send(&4).await.unwrap_err();
    assert!(refused.is_refused(), "{refused}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once, not hung"
    );

    // Consuming and acking use the other connection, which the alarm does not block.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let consumer = mq
        .consume(&q, ConsumerOptions::default(), move |m: Message<u32>| {
            let tx = tx.clone();
            async move {
                tx.send(*m.payload()).ok();
                Ok(())
            }
        })
        .await
        .unwrap();
    for expected in [1, 2] {
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap();
        assert_eq!(got, Some(expected));
    }
    eventually(Duration::from_secs(10), "both acked", || async {
        (consumer.stats().acked == 2).then_some(())
    })
    .await;

    drop(alarm);
    eventually(Duration::from_secs(20), "the unblock", || async {
        mq.status().blocked.is_none().then_some(())
    })
    .await;
    orders.send(&5).await.unwrap();
    consumer.close().await;
    let _ = mq.transport().delete_queue(&q).await;
    for s in [".dlq", ".parked"] {
        let _ = mq.transport().delete_queue(&format!("{q}{s}")).await;
    }
    mq.close().await.ok();
    actuator.shutdown().await;
}
