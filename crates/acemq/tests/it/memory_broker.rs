//! Memory-only behaviour: what cannot be (or should not be) checked against a real
//! RabbitMQ from a test: paused clocks, resource alarms, process-global brokers, drops.

use crate::support;

use std::time::Duration;

use acemq::headers::HeaderValue;
use acemq::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl};
use acemq::transport::memory::{MemoryBroker, MemoryTransport};
use acemq::transport::{
    Confirmation, Delivery, Outbound, Properties, Subscription, Transport, TransportError,
};
use support::{body, publish_raw, spec, unique};

const HOUR_MS: i32 = 3_600_000;

async fn publish(t: &MemoryTransport, queue: &str, text: &str) -> Confirmation {
    publish_raw(t, queue, Properties::default(), text.as_bytes()).await
}

async fn next(sub: &mut Box<dyn Subscription>) -> Delivery {
    tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("a delivery in time")
        .expect("subscription open")
        .expect("no error")
}

fn death_reason(d: &Delivery) -> String {
    d.properties.headers["x-death"].as_array().unwrap()[0]
        .as_table()
        .unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A queue whose messages wait `ttl_ms` and then dead-letter to `home` through the
/// default exchange.
async fn waiting(t: &MemoryTransport, name: &str, ttl_ms: Option<i32>, home: &str) {
    let mut d = QueueDecl::classic(name)
        .argument("x-dead-letter-exchange", "")
        .argument("x-dead-letter-routing-key", home);
    if let Some(ms) = ttl_ms {
        d = d.argument("x-message-ttl", ms);
    }
    t.declare_queue(&d).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_six_hour_ttl_passes_in_paused_time() {
    let wall = std::time::Instant::now();
    let start = tokio::time::Instant::now();
    let t = MemoryTransport::connect(&unique("paused"));
    t.declare_queue(&QueueDecl::classic("home")).await.unwrap();
    waiting(&t, "home.retry.6h", Some(6 * HOUR_MS), "home").await;
    publish(&t, "home.retry.6h", "later").await;
    assert_eq!(t.broker().message_count("home.retry.6h"), Some(1));

    let mut sub = t.consume(spec("home", 1)).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(7 * 3600), sub.next())
        .await
        .expect("dead-lettered within 7 virtual hours")
        .unwrap()
        .unwrap();
    assert_eq!(body(&d), "later");
    assert_eq!(death_reason(&d), "expired");
    let virtual_elapsed = start.elapsed();
    assert!(
        virtual_elapsed >= Duration::from_secs(6 * 3600),
        "{virtual_elapsed:?}"
    );
    assert!(
        virtual_elapsed < Duration::from_secs(6 * 3600 + 1),
        "{virtual_elapsed:?}"
    );
    assert_eq!(t.broker().message_count("home.retry.6h"), Some(0));
    d.acker.ack().await.unwrap();
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "{:?}",
        wall.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn head_only_expiry_under_a_paused_clock() {
    let t = MemoryTransport::connect(&unique("head-only"));
    t.declare_queue(&QueueDecl::classic("home")).await.unwrap();
    waiting(&t, "wait", None, "home").await;
    for (text, ms) in [("long", "7200000"), ("short", "1000")] {
        let props = Properties {
            expiration: Some(ms.into()),
            ..Default::default()
        };
        publish_raw(&t, "wait", props, text.as_bytes()).await;
    }
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(t.broker().message_count("wait"), Some(2));
    assert_eq!(t.broker().message_count("home"), Some(0));
    tokio::time::sleep(Duration::from_secs(3601)).await;
    // Both went, in order: "short" as soon as "long" left the head.
    let seen: Vec<_> = t
        .broker()
        .peek("home")
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(seen, ["long", "short"]);
}

#[tokio::test(start_paused = true)]
async fn a_requeued_message_keeps_its_expiry() {
    let t = MemoryTransport::connect(&unique("requeue-ttl"));
    t.declare_queue(&QueueDecl::classic("home")).await.unwrap();
    waiting(&t, "wait", Some(10_000), "home").await;
    publish(&t, "wait", "m").await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let d = t.get("wait").await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    d.acker.nack(true).await.unwrap();
    // Back at the head, already past its expiry: dead-lettered at once.
    tokio::task::yield_now().await;
    assert_eq!(t.broker().message_count("home"), Some(1));
    assert_eq!(t.broker().message_count("wait"), Some(0));
}

#[tokio::test(start_paused = true)]
async fn an_expiry_loop_between_two_queues_is_cut_as_a_cycle() {
    let t = MemoryTransport::connect(&unique("cycle"));
    waiting(&t, "a", Some(1000), "b").await;
    waiting(&t, "b", Some(1000), "a").await;
    publish(&t, "a", "m").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(t.broker().message_count("b"), Some(1));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Back into "a" would be a cycle without a rejection: RabbitMQ drops it.
    assert_eq!(t.broker().message_count("a"), Some(0));
    assert_eq!(t.broker().message_count("b"), Some(0));
}

#[tokio::test]
async fn a_zero_ttl_message_goes_to_a_waiting_consumer_or_expires() {
    let t = MemoryTransport::connect(&unique("ttl0"));
    t.declare_queue(&QueueDecl::classic("home")).await.unwrap();
    waiting(&t, "q", Some(0), "home").await;
    publish(&t, "q", "nobody").await;
    assert_eq!(t.broker().message_count("home"), Some(1));
    let mut sub = t.consume(spec("q", 1)).await.unwrap();
    publish(&t, "q", "taken").await;
    let d = next(&mut sub).await;
    assert_eq!(body(&d), "taken");
    assert_eq!(t.broker().message_count("home"), Some(1));
}

#[tokio::test]
async fn rejecting_into_the_same_queue_counts_up_x_death() {
    let t = MemoryTransport::connect(&unique("count"));
    waiting(&t, "q", None, "q").await;
    publish(&t, "q", "m").await;
    for expected in 1..=3_i64 {
        let d = t.get("q").await.unwrap().unwrap();
        d.acker.nack(false).await.unwrap();
        let again = t.broker().peek("q").unwrap();
        let deaths = again[0].properties.headers["x-death"]
            .as_array()
            .unwrap()
            .to_vec();
        assert_eq!(deaths.len(), 1);
        assert_eq!(
            deaths[0].as_table().unwrap()["count"],
            HeaderValue::I64(expected)
        );
    }
}

#[tokio::test]
async fn dead_lettering_to_a_missing_exchange_drops_the_message() {
    let t = MemoryTransport::connect(&unique("dl-missing"));
    t.declare_queue(&QueueDecl::classic("q").argument("x-dead-letter-exchange", "nowhere"))
        .await
        .unwrap();
    publish(&t, "q", "m").await;
    let d = t.get("q").await.unwrap().unwrap();
    d.acker.nack(false).await.unwrap();
    assert_eq!(t.broker().message_count("q"), Some(0));
    assert_eq!(t.broker().unacked_count("q"), Some(0));
}

#[tokio::test]
async fn blocking_refuses_publishes_and_is_watched() {
    let name = unique("blocked");
    let t = MemoryTransport::connect(&name);
    t.declare_queue(&QueueDecl::classic("q")).await.unwrap();
    let mut watch = t.watch_status();
    assert!(t.status().connected);
    MemoryBroker::named(&name).block("low on memory");
    watch.changed().await.unwrap();
    assert_eq!(watch.borrow().blocked.as_deref(), Some("low on memory"));
    assert_eq!(t.status().blocked.as_deref(), Some("low on memory"));
    match t
        .publish(Outbound::new("", "q", Properties::default(), "x"))
        .await
    {
        Err(TransportError::Blocked { reason }) => assert_eq!(reason, "low on memory"),
        Err(e) => panic!("expected Blocked, got {e:?}"),
        Ok(_) => panic!("expected Blocked, got a publish"),
    }
    // A connection opened while blocked starts blocked.
    assert!(MemoryTransport::connect(&name).status().blocked.is_some());
    // Consumers still drain while blocked.
    assert!(t.get("q").await.unwrap().is_none());
    t.broker().unblock();
    watch.changed().await.unwrap();
    assert_eq!(watch.borrow().blocked, None);
    assert_eq!(publish(&t, "q", "x").await, Confirmation::Routed);
    t.close().await.unwrap();
    assert!(!t.status().connected);
    assert!(matches!(
        t.declare_queue(&QueueDecl::classic("q")).await,
        Err(TransportError::Closed { .. })
    ));
}

#[tokio::test]
async fn a_reconnect_sees_the_same_queues_and_a_drop_requeues() {
    let name = unique("reconnect");
    {
        let t = MemoryTransport::connect(&name);
        t.declare_queue(&QueueDecl::classic("q")).await.unwrap();
        publish(&t, "q", "m1").await;
        publish(&t, "q", "m2").await;
        let mut sub = t.consume(spec("q", 10)).await.unwrap();
        let _held = (next(&mut sub).await, next(&mut sub).await);
        assert_eq!(t.broker().unacked_count("q"), Some(2));
        // The consumer "crashes": everything is dropped without settling.
    }
    let t = MemoryTransport::connect(&name);
    assert_eq!(t.inspect_queue("q").await.unwrap().message_count, 2);
    let d = t.get("q").await.unwrap().unwrap();
    assert_eq!((body(&d).as_str(), d.redelivered), ("m1", true));
}

#[tokio::test]
async fn closing_the_transport_ends_subscriptions_and_requeues() {
    let name = unique("transport-close");
    let t = MemoryTransport::connect(&name);
    t.declare_queue(&QueueDecl::classic("q")).await.unwrap();
    publish(&t, "q", "m1").await;
    let mut sub = t.consume(spec("q", 10)).await.unwrap();
    let d = next(&mut sub).await;
    t.close().await.unwrap();
    assert!(sub.next().await.is_none());
    assert!(!sub.cancelled_by_us());
    assert!(matches!(
        d.acker.ack().await,
        Err(TransportError::AckNotSent)
    ));
    assert_eq!(MemoryBroker::named(&name).message_count("q"), Some(1));
}

#[tokio::test]
async fn consumers_share_a_queue_round_robin() {
    let t = MemoryTransport::connect(&unique("rr"));
    t.declare_queue(&QueueDecl::classic("q")).await.unwrap();
    let mut a = t.consume(spec("q", 100)).await.unwrap();
    let mut b = t.consume(spec("q", 100)).await.unwrap();
    for i in 0..6 {
        publish(&t, "q", &format!("m{i}")).await;
    }
    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    for _ in 0..3 {
        got_a.push(body(&next(&mut a).await));
        got_b.push(body(&next(&mut b).await));
    }
    assert_eq!(got_a, ["m0", "m2", "m4"]);
    assert_eq!(got_b, ["m1", "m3", "m5"]);
    assert_eq!(t.broker().consumer_count("q"), Some(2));
}

#[tokio::test]
async fn exclusive_queues_belong_to_their_connection() {
    let name = unique("exclusive");
    let owner = MemoryTransport::connect(&name);
    let other = MemoryTransport::connect(&name);
    let info = owner
        .declare_queue(&QueueDecl::server_named())
        .await
        .unwrap();
    for e in [
        other.inspect_queue(&info.name).await.err(),
        other.consume(spec(&info.name, 1)).await.err(),
        other.get(&info.name).await.err(),
    ] {
        assert!(
            matches!(e, Some(TransportError::ResourceLocked { .. })),
            "{e:?}"
        );
    }
    // Publishing to it is fine.
    assert_eq!(publish(&other, &info.name, "m").await, Confirmation::Routed);
    owner.close().await.unwrap();
    assert!(!other.broker().queue_names().contains(&info.name));
}

#[tokio::test]
async fn deleting_an_exchange_removes_its_bindings() {
    let t = MemoryTransport::connect(&unique("x-delete"));
    t.declare_exchange(&ExchangeDecl::durable("x", ExchangeKind::Direct))
        .await
        .unwrap();
    t.declare_queue(&QueueDecl::classic("q")).await.unwrap();
    t.bind_queue(&BindingDecl::new("q", "x", "k"))
        .await
        .unwrap();
    t.bind_queue(&BindingDecl::new("q", "x", "k"))
        .await
        .unwrap();
    assert_eq!(t.broker().bindings("x").unwrap().len(), 1);
    t.delete_exchange("x").await.unwrap();
    assert_eq!(t.broker().bindings("x"), None);
    t.declare_exchange(&ExchangeDecl::durable("x", ExchangeKind::Direct))
        .await
        .unwrap();
    assert!(matches!(
        t.publish(Outbound::new("x", "k", Properties::default(), "m"))
            .await
            .unwrap()
            .await
            .unwrap(),
        Confirmation::Unroutable { .. }
    ));
    let e = t
        .declare_exchange(&ExchangeDecl::durable("x", ExchangeKind::Topic))
        .await
        .unwrap_err();
    assert!(e.is_precondition_failed(), "{e}");
    // Deleting the queue removes its bindings too.
    t.bind_queue(&BindingDecl::new("q", "x", "k"))
        .await
        .unwrap();
    t.delete_queue("q").await.unwrap();
    assert_eq!(t.broker().bindings("x"), Some(vec![]));
}

#[tokio::test]
async fn refusals_are_clear() {
    let t = MemoryTransport::connect(&unique("refusals"));
    let long = "q".repeat(256);
    assert!(matches!(
        t.declare_queue(&QueueDecl::classic(&long)).await,
        Err(TransportError::InvalidName { .. })
    ));
    assert!(matches!(
        t.declare_queue(&QueueDecl::classic("q").argument("x-max-priority", 10))
            .await,
        Err(TransportError::Unsupported(_))
    ));
    t.declare_queue(&QueueDecl::classic("q")).await.unwrap();
    let prio = Properties {
        priority: Some(5),
        ..Default::default()
    };
    assert!(matches!(
        t.publish(Outbound::new("", "q", prio, "m")).await,
        Err(TransportError::Unsupported(_))
    ));
    let bad = Properties {
        expiration: Some("soon".into()),
        ..Default::default()
    };
    assert!(matches!(
        t.publish(Outbound::new("", "q", bad, "m")).await,
        Err(TransportError::PreconditionFailed { .. })
    ));
    assert!(matches!(
        t.declare_queue(&QueueDecl::classic("amq.mine")).await,
        Err(TransportError::AccessRefused { .. })
    ));
    assert!(matches!(
        t.declare_exchange(&ExchangeDecl::durable("", ExchangeKind::Direct))
            .await,
        Err(TransportError::AccessRefused { .. })
    ));
    assert!(matches!(
        t.delete_exchange("amq.direct").await,
        Err(TransportError::AccessRefused { .. })
    ));
    let d = t.get("q").await.unwrap();
    assert!(d.is_none());
    publish(&t, "q", "m").await;
    let d = t.get("q").await.unwrap().unwrap();
    assert!(matches!(
        d.acker
            .settle(acemq::transport::Settlement::Reject { requeue: true })
            .await,
        Ok(())
    ));
    assert!(matches!(
        d.acker.ack().await,
        Err(TransportError::AckNotSent)
    ));
}

#[tokio::test]
async fn quorum_queues_count_redeliveries() {
    let t = MemoryTransport::connect(&unique("quorum"));
    t.declare_queue(&QueueDecl::quorum("q")).await.unwrap();
    publish(&t, "q", "m").await;
    let d = t.get("q").await.unwrap().unwrap();
    assert!(!d.properties.headers.contains_key("x-delivery-count"));
    d.acker.nack(true).await.unwrap();
    let d = t.get("q").await.unwrap().unwrap();
    assert_eq!(d.properties.headers["x-delivery-count"].as_i64(), Some(1));
}

#[test]
fn expiry_survives_the_runtime_that_started_it() {
    let name = unique("runtimes");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let t = MemoryTransport::connect(&name);
        t.declare_queue(&QueueDecl::classic("home")).await.unwrap();
        waiting(&t, "wait", Some(100), "home").await;
        publish(&t, "wait", "first").await;
        std::mem::forget(t);
    });
    drop(rt);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let t = MemoryTransport::connect(&name);
        publish(&t, "wait", "second").await;
        let b = t.broker();
        support::eventually(Duration::from_secs(5), "both expired", || async {
            (b.message_count("home") == Some(2)).then_some(())
        })
        .await;
    });
}
