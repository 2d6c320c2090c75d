//! A resource alarm on a real broker: publishing is refused at once, consuming and acking go
//! on (they use the other connection).
//!
//! This test changes global broker state (`rabbitmqctl set_vm_memory_high_watermark 0`), so
//! it is a serial test (see `main.rs`); the watermark is restored by a drop guard even when
//! the test fails.

use crate::support;

use std::time::{Duration, Instant};

use acemq::topology::QueueDecl;
use acemq::transport::amqp::{AmqpOptions, AmqpTransport};
use acemq::transport::{
    Confirmation, ConsumeSpec, Outbound, Properties, Transport, TransportError,
};
use support::{MemoryAlarm, publish_confirmed, rabbitmqctl};

fn message(queue: &str, id: &str) -> Outbound {
    let p = Properties {
        message_id: Some(id.to_owned()),
        delivery_mode: Some(2),
        ..Default::default()
    };
    Outbound::new("", queue, p, "x")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "serial: changes global broker state"]
async fn a_blocked_publisher_fails_fast_while_consumers_keep_acking() {
    let Some(url) = support::amqp_url() else {
        eprintln!("note: ACEMQ_TEST_AMQP_URL unset; RabbitMQ test skipped");
        return;
    };
    let t = AmqpTransport::connect_with(
        &url,
        AmqpOptions::default()
            .connection_name(support::unique("amqp-blocked"))
            .confirm_timeout(Duration::from_secs(5)),
    )
    .await
    .expect("connect");
    let q = support::unique("amqp-blocked");
    t.declare_queue(&QueueDecl::classic(&q))
        .await
        .expect("declare");
    let before = publish_confirmed(&t, message(&q, "before")).await;
    assert_eq!(before, Confirmation::Routed);
    let mut status = t.watch_status();

    let alarm = MemoryAlarm::raise();
    // RabbitMQ 3.10 does not notify an idle connection: it moves it to "blocking" and sends
    // connection.blocked only when the connection next publishes.
    let quiet = tokio::time::timeout(
        Duration::from_secs(2),
        status.wait_for(|s| s.blocked.is_some()),
    )
    .await
    .is_ok();
    eprintln!("observed: connection.blocked without a publish within 2 s: {quiet}");
    // The publish that triggers the block is written (the broker read it before it stopped
    // reading); its confirm is withheld until the alarm clears. The transport answers it in
    // doubt as soon as the block is seen, well before the 5 s confirm timeout.
    let started = Instant::now();
    let trigger = tokio::time::timeout(Duration::from_secs(8), async {
        t.publish(message(&q, "trigger")).await?.await
    })
    .await
    .expect("the triggering publish does not hang");
    let took = started.elapsed();
    eprintln!("observed: the publish that triggered the block returned {trigger:?} after {took:?}");
    assert!(
        matches!(
            trigger,
            Ok(Confirmation::Routed) | Err(TransportError::ConfirmTimeout { .. })
        ),
        "{trigger:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "answered in {took:?}, not at the timeout"
    );
    let reason = tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.blocked.is_some()),
    )
    .await
    .expect("connection.blocked within 10 s")
    .expect("status watch open")
    .blocked
    .clone()
    .unwrap_or_default();
    eprintln!("observed: status().blocked = {reason:?}");
    assert!(reason.contains("memory"), "broker reason kept: {reason}");
    assert_eq!(t.status().blocked.as_deref(), Some(reason.as_str()));
    assert!(t.status().connected);

    // Publishing is refused at once, nothing sent.
    let started = Instant::now();
    let refused = t.publish(message(&q, "during")).await.map(drop);
    let took = started.elapsed();
    match refused {
        Err(TransportError::Blocked { reason: r }) => assert_eq!(r, reason),
        other => panic!("expected Blocked, got {other:?}"),
    }
    assert!(took < Duration::from_secs(1), "refused in {took:?}");

    // The consuming connection is not blocked: consume, ack, inspect, declare.
    let mut sub = t
        .consume(ConsumeSpec::new(&q, 5))
        .await
        .expect("consume while blocked");
    let d = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("delivery while blocked")
        .expect("a delivery")
        .expect("ok");
    assert_eq!(d.properties.message_id.as_deref(), Some("before"));
    tokio::time::timeout(Duration::from_secs(5), d.acker.ack())
        .await
        .expect("the ack is not stalled")
        .expect("ack sent");
    let info = tokio::time::timeout(Duration::from_secs(5), t.inspect_queue(&q))
        .await
        .expect("topology works while blocked")
        .expect("inspect");
    assert_eq!(info.message_count, 0, "the ack reached the broker");
    assert_eq!(info.consumer_count, 1);
    sub.close().await.expect("close subscription");

    // Lift the alarm: publishing resumes.
    drop(alarm);
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.blocked.is_none()),
    )
    .await
    .expect("connection.unblocked within 10 s")
    .expect("status watch open");
    assert_eq!(t.status().blocked, None);
    let after = publish_confirmed(&t, message(&q, "after")).await;
    assert_eq!(after, Confirmation::Routed);
    // What the queue holds now: "after", and the in-doubt "trigger" if it landed.
    let mut ids = Vec::new();
    while let Some(d) = t.get(&q).await.expect("get") {
        ids.push(d.properties.message_id.clone().unwrap_or_default());
        d.acker.ack().await.expect("ack");
    }
    eprintln!("observed: after the unblock the queue held {ids:?}");
    assert!(ids.contains(&"after".to_owned()));
    assert!(
        !ids.contains(&"during".to_owned()),
        "a refused publish sent nothing"
    );
    t.delete_queue(&q).await.expect("delete");
    t.close().await.expect("close");
    // Belt and braces: the guard already restored it.
    rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"]);
}
