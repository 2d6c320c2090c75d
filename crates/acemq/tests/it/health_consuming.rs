//! Health that cannot say UP while nothing is consumed, on `memory://` and on
//! RabbitMQ:
//! * a consumer whose handler is stuck while the queue has ready messages is `DEGRADED`
//!   with the reason ("N ready, no delivery for S s") within the stall window plus one
//!   broker check, and `/acemq-health/readiness` answers 503 while liveness stays 200;
//! * a consumer the broker silently forgot (`memory://`'s `forget_consumers`: RabbitMQ
//!   3.10 was seen to do it) is found by the broker check, shown `DEGRADED`, subscribed
//!   again by itself and consuming;
//! * a paused or draining connection is not ready.

use crate::http_client;
use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};
use acemq::health::HealthStatus;
use acemq::transport::memory::MemoryBroker;
use support::{Broker, eventually, on_each_target, unique};
use tokio::sync::Semaphore;

const WAIT: Duration = Duration::from_secs(20);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

fn consumers_status(mq: &Connection) -> (HealthStatus, String) {
    let h = mq.health();
    let r = h.report("consumers").cloned().expect("a consumers report");
    (
        r.status,
        serde_json::to_string(&r.details).unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_consumer_with_ready_messages_is_degraded_and_not_ready() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.expect("connect");
        let q = unique("health.stall");
        support::declare_classic(&mq, &q).await;
        let actuator = mq.start_actuator(any_port()).await.expect("actuator");
        let gate = Arc::new(Semaphore::new(0));
        let g = gate.clone();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default()
                    .prefetch(2)
                    .broker_check(Some(Duration::from_millis(200)))
                    .ready_stall_after(Duration::from_secs(1)),
                move |_: Message<u32>| {
                    let g = g.clone();
                    async move {
                        let _held = g.acquire().await;
                        Ok(())
                    }
                },
            )
            .await
            .expect("consume");
        let p = mq.publisher::<u32>("", &q);
        for n in 0..6 {
            p.send(&n).await.expect("publish");
        }
        let answer = http_client::get(actuator.local_addr(), "/acemq-health/readiness").await;
        // Not stalled yet (the window is 1 s): ready, and the consumers are Up.
        assert_eq!(answer.status, 200, "{}: {}", target.kind(), answer.json());
        let reason = eventually(WAIT, "the consumer to be reported stalled", || {
            let (status, details) = consumers_status(&mq);
            async move { (status == HealthStatus::Degraded).then_some(details) }
        })
        .await;
        assert!(
            reason.contains("4 ready, no delivery for"),
            "{}: the reason names the ready count and the quiet time: {reason}",
            target.kind()
        );
        let ready = http_client::get(actuator.local_addr(), "/acemq-health/readiness").await;
        assert_eq!(ready.status, 503, "{}: {}", target.kind(), ready.json());
        assert_eq!(
            ready.json()["components"]["consumers"]["status"],
            "DEGRADED"
        );
        let live = http_client::get(actuator.local_addr(), "/acemq-health/liveness").await;
        assert_eq!(live.status, 200, "degraded is alive: {}", live.json());
        // Unstuck: everything is handled and the consumer is Up again.
        gate.add_permits(100);
        eventually(WAIT, "the consumer to be Up again", || {
            let (status, _) = consumers_status(&mq);
            async move { (status == HealthStatus::Up).then_some(()) }
        })
        .await;
        assert_eq!(consumer.stats().acked, 6);
        consumer.close().await;
        let _ = mq.transport().delete_queue(&q).await;
        actuator.shutdown().await;
        mq.close().await.expect("close");
    })
    .await;
}

#[tokio::test]
async fn a_consumer_the_broker_forgot_is_found_shown_and_subscribed_again() {
    let name = unique("health-forgot");
    let mq = Connection::connect(&format!("memory://{name}"))
        .await
        .expect("connect");
    let broker = MemoryBroker::named(&name);
    let q = "forgot.q";
    support::declare_classic(&mq, q).await;
    let handled = Arc::new(AtomicU64::new(0));
    let h = handled.clone();
    let consumer = mq
        .consume(
            q,
            ConsumerOptions::default().broker_check(Some(Duration::from_millis(100))),
            move |_: Message<u32>| {
                h.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }
            },
        )
        .await
        .expect("consume");
    assert_eq!(broker.forget_consumers(q), 1);
    let p = mq.publisher::<u32>("", q);
    p.send(&1).await.expect("publish");
    // The broker check finds it (saying so, while it subscribes again) …
    eventually(WAIT, "the forgotten consumer to consume again", || {
        let (status, details) = consumers_status(&mq);
        if status == HealthStatus::Degraded {
            assert!(
                details.contains("the broker lists no consumer"),
                "{details}"
            );
        }
        let n = handled.load(Ordering::SeqCst);
        async move { (n == 1).then_some(()) }
    })
    .await;
    let info = mq.transport().inspect_queue(q).await.expect("inspect");
    assert_eq!(info.consumer_count, 1, "subscribed exactly once again");
    eventually(WAIT, "health Up again", || {
        let (status, _) = consumers_status(&mq);
        async move { (status == HealthStatus::Up).then_some(()) }
    })
    .await;
    consumer.close().await;
    mq.close().await.expect("close");
}

#[tokio::test]
async fn paused_and_draining_connections_are_not_ready() {
    let mq = Connection::connect(&format!("memory://{}", unique("health-ready")))
        .await
        .expect("connect");
    assert!(mq.health().is_ready());
    mq.pause_consuming();
    assert!(!mq.health().is_ready(), "paused: {}", mq.health().to_json());
    mq.resume_consuming();
    assert!(mq.health().is_ready());
    assert!(mq.drain_consumers(Duration::from_millis(10)).await);
    let h = mq.health();
    assert!(!h.is_ready(), "draining: {}", h.to_json());
    assert_eq!(
        h.to_json()["components"]["acemq"]["details"]["draining"],
        true
    );
    mq.close().await.expect("close");
}
