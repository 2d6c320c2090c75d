//! Transport conformance: every case runs on `memory://` and, when
//! `ACEMQ_TEST_AMQP_URL` is set, on RabbitMQ, and must pass on both. The cases are
//! written for RabbitMQ 3.10's behaviour; where the memory broker differs, it is wrong.
//!
//! Each case uses fresh names from `support::unique` and deletes what it declared.

mod support;

use std::time::Duration;

use acemq::headers::{HeaderValue, Headers};
use acemq::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl};
use acemq::transport::{
    Confirmation, Delivery, Outbound, Properties, Settlement, Subscription, Transport,
    TransportError,
};
use support::{body, eventually, on_each_target, publish_confirmed, spec, unique, wait_for_count};

const WAIT: Duration = Duration::from_secs(10);

async fn publish(t: &dyn Transport, exchange: &str, key: &str, text: &str) -> Confirmation {
    publish_confirmed(
        t,
        Outbound::new(exchange, key, Properties::default(), text.to_owned()),
    )
    .await
}

/// A transient classic queue (nothing left on disk if a case fails half-way).
async fn queue(t: &dyn Transport, name: &str) {
    t.declare_queue(&QueueDecl::classic(name).transient())
        .await
        .expect("declare queue");
}

async fn exchange(t: &dyn Transport, name: &str, kind: ExchangeKind) {
    let mut d = ExchangeDecl::durable(name, kind);
    d.durable = false;
    t.declare_exchange(&d).await.expect("declare exchange");
}

async fn bind(t: &dyn Transport, queue: &str, exchange: &str, key: &str) {
    t.bind_queue(&BindingDecl::new(queue, exchange, key))
        .await
        .expect("bind");
}

/// Takes every ready message with basic.get and acks it; returns the bodies in order.
async fn drain(t: &dyn Transport, q: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(d) = t.get(q).await.expect("basic.get") {
        out.push(body(&d));
        d.acker.ack().await.expect("ack");
    }
    out
}

async fn cleanup(t: &dyn Transport, queues: &[&str], exchanges: &[&str]) {
    for q in queues {
        t.delete_queue(q).await.expect("delete queue");
    }
    for x in exchanges {
        t.delete_exchange(x).await.expect("delete exchange");
    }
}

async fn next(sub: &mut Box<dyn Subscription>) -> Delivery {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a delivery within the timeout")
        .expect("the subscription is still open")
        .expect("a delivery, not an error")
}

/// Asserts nothing more is delivered for a short while (a negative check has to wait).
async fn nothing_more(sub: &mut Box<dyn Subscription>) {
    if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
        panic!("unexpected delivery {} (tag {})", body(&d), d.delivery_tag);
    }
}

fn x_death(d: &Delivery) -> Headers {
    d.properties.headers["x-death"]
        .as_array()
        .expect("x-death is an array")[0]
        .as_table()
        .expect("x-death entries are tables")
        .clone()
}

fn count_of(t: &Headers) -> i64 {
    t["count"].as_i64().expect("count is an integer")
}

fn str_of<'a>(t: &'a Headers, k: &str) -> &'a str {
    t[k].as_str()
        .unwrap_or_else(|| panic!("{k} is a string: {t:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_exchange_routes_by_queue_name() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let (a, b) = (unique("default.a"), unique("default.b"));
        queue(&*t, &a).await;
        queue(&*t, &b).await;
        assert_eq!(publish(&*t, "", &a, "to-a").await, Confirmation::Routed);
        assert_eq!(publish(&*t, "", &b, "to-b").await, Confirmation::Routed);
        assert_eq!(drain(&*t, &a).await, ["to-a"]);
        assert_eq!(drain(&*t, &b).await, ["to-b"]);
        cleanup(&*t, &[&a, &b], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_exchange_cannot_be_bound_declared_or_deleted() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("default.refused");
        queue(&*t, &q).await;
        let e = t.bind_queue(&BindingDecl::new(&q, "", "k")).await;
        assert!(
            matches!(e, Err(TransportError::AccessRefused { .. })),
            "{e:?}"
        );
        // A fresh connection: RabbitMQ closed the channel.
        let t = target.transport().await;
        let e = t.delete_exchange("").await;
        assert!(
            matches!(e, Err(TransportError::AccessRefused { .. })),
            "{e:?}"
        );
        let t = target.transport().await;
        let e = t
            .declare_exchange(&ExchangeDecl::durable("", ExchangeKind::Direct))
            .await;
        assert!(
            matches!(e, Err(TransportError::AccessRefused { .. })),
            "{e:?}"
        );
        let t = target.transport().await;
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_exchange_routes_on_exact_key() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let x = unique("direct.x");
        let (err, info) = (unique("direct.err"), unique("direct.info"));
        exchange(&*t, &x, ExchangeKind::Direct).await;
        queue(&*t, &err).await;
        queue(&*t, &info).await;
        bind(&*t, &err, &x, "error").await;
        bind(&*t, &info, &x, "info").await;
        bind(&*t, &info, &x, "error").await;
        assert_eq!(publish(&*t, &x, "error", "e1").await, Confirmation::Routed);
        assert_eq!(publish(&*t, &x, "info", "i1").await, Confirmation::Routed);
        assert!(matches!(
            publish(&*t, &x, "warning", "w1").await,
            Confirmation::Unroutable {
                reply_code: 312,
                ..
            }
        ));
        assert_eq!(drain(&*t, &err).await, ["e1"]);
        assert_eq!(drain(&*t, &info).await, ["e1", "i1"]);
        cleanup(&*t, &[&err, &info], &[&x]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_exchange_routes_to_every_bound_queue() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let x = unique("fanout.x");
        let (a, b, c) = (unique("fanout.a"), unique("fanout.b"), unique("fanout.c"));
        exchange(&*t, &x, ExchangeKind::Fanout).await;
        for q in [&a, &b, &c] {
            queue(&*t, q).await;
        }
        bind(&*t, &a, &x, "").await;
        bind(&*t, &b, &x, "ignored").await;
        assert_eq!(
            publish(&*t, &x, "any.key", "m1").await,
            Confirmation::Routed
        );
        assert_eq!(drain(&*t, &a).await, ["m1"]);
        assert_eq!(drain(&*t, &b).await, ["m1"]);
        assert!(drain(&*t, &c).await.is_empty());
        cleanup(&*t, &[&a, &b, &c], &[&x]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_exchange_matches_star_and_hash() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let x = unique("topic.x");
        let (star, hash, all) = (
            unique("topic.star"),
            unique("topic.hash"),
            unique("topic.all"),
        );
        exchange(&*t, &x, ExchangeKind::Topic).await;
        for q in [&star, &hash, &all] {
            queue(&*t, q).await;
        }
        bind(&*t, &star, &x, "sensor.*.temp").await;
        bind(&*t, &hash, &x, "sensor.rome.#").await;
        bind(&*t, &all, &x, "#").await;
        for key in [
            "sensor.rome.temp",
            "sensor.milan.temp",
            "sensor.rome",
            "sensor.rome.north.temp",
            "sensor.temp",
            "other",
        ] {
            assert_eq!(publish(&*t, &x, key, key).await, Confirmation::Routed);
        }
        assert_eq!(
            drain(&*t, &star).await,
            ["sensor.rome.temp", "sensor.milan.temp"]
        );
        assert_eq!(
            drain(&*t, &hash).await,
            ["sensor.rome.temp", "sensor.rome", "sensor.rome.north.temp"]
        );
        assert_eq!(drain(&*t, &all).await.len(), 6);
        cleanup(&*t, &[&star, &hash, &all], &[&x]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_exchange_all_and_any_as_in_the_seed() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let x = unique("headers.x");
        let (all, any) = (unique("headers.all"), unique("headers.any"));
        exchange(&*t, &x, ExchangeKind::Headers).await;
        queue(&*t, &all).await;
        queue(&*t, &any).await;
        let values = |class: &str, role: &str| -> Headers {
            [
                ("class".to_owned(), HeaderValue::from(class)),
                ("role".to_owned(), HeaderValue::from(role)),
            ]
            .into_iter()
            .collect()
        };
        t.bind_queue(&BindingDecl::headers(
            &all,
            &x,
            true,
            values("10-A", "parent"),
        ))
        .await
        .expect("bind all");
        t.bind_queue(&BindingDecl::headers(
            &any,
            &x,
            false,
            values("10-A", "teacher"),
        ))
        .await
        .expect("bind any");
        for (class, role) in [("10-A", "parent"), ("10-A", "student"), ("11-B", "teacher")] {
            let props = Properties {
                headers: values(class, role),
                ..Default::default()
            };
            let m = Outbound::new(&x, "", props, format!("{class}/{role}"));
            assert_eq!(publish_confirmed(&*t, m).await, Confirmation::Routed);
        }
        assert_eq!(drain(&*t, &all).await, ["10-A/parent"]);
        assert_eq!(
            drain(&*t, &any).await,
            ["10-A/parent", "10-A/student", "11-B/teacher"]
        );
        cleanup(&*t, &[&all, &any], &[&x]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_unroutable_is_returned_and_non_mandatory_is_acked() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let missing = unique("nobody");
        assert_eq!(
            publish(&*t, "", &missing, "lost").await,
            Confirmation::Unroutable {
                reply_code: 312,
                reply_text: "NO_ROUTE".into()
            }
        );
        let mut m = Outbound::new("", &missing, Properties::default(), "dropped");
        m.mandatory = false;
        assert_eq!(publish_confirmed(&*t, m).await, Confirmation::Routed);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_to_a_missing_exchange_is_not_found() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let x = unique("missing.x");
        let m = Outbound::new(&x, "k", Properties::default(), "m");
        // RabbitMQ reports it by closing the channel; a transport may surface it when
        // publishing or when confirming.
        let outcome = match t.publish(m).await {
            Err(e) => Err(e),
            Ok(confirm) => confirm.await,
        };
        match outcome {
            Err(e) => assert!(e.is_not_found(), "{e:?}"),
            Ok(c) => panic!("expected NotFound, got {c:?}"),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_bounds_the_unacked_window() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("prefetch");
        queue(&*t, &q).await;
        for i in 1..=5 {
            publish(&*t, "", &q, &format!("m{i}")).await;
        }
        let mut sub = t.consume(spec(&q, 3)).await.expect("consume");
        let first = next(&mut sub).await;
        let second = next(&mut sub).await;
        let third = next(&mut sub).await;
        assert_eq!(
            [body(&first), body(&second), body(&third)],
            ["m1", "m2", "m3"]
        );
        assert_eq!(
            [first.delivery_tag, second.delivery_tag, third.delivery_tag],
            [1, 2, 3]
        );
        nothing_more(&mut sub).await;
        wait_for_count(&*t, &q, 2, WAIT).await;
        first.acker.ack().await.expect("ack");
        let fourth = next(&mut sub).await;
        assert_eq!(body(&fourth), "m4");
        assert_eq!(fourth.delivery_tag, 4);
        nothing_more(&mut sub).await;
        for d in [second, third, fourth] {
            d.acker.ack().await.expect("ack");
        }
        assert_eq!(body(&next(&mut sub).await), "m5");
        sub.close().await.expect("close");
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_puts_the_message_back_at_the_head_marked_redelivered() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("requeue");
        queue(&*t, &q).await;
        for m in ["m1", "m2", "m3"] {
            publish(&*t, "", &q, m).await;
        }
        let mut sub = t.consume(spec(&q, 1)).await.expect("consume");
        let d = next(&mut sub).await;
        assert_eq!(body(&d), "m1");
        assert!(!d.redelivered);
        d.acker.nack(true).await.expect("nack requeue");
        let again = next(&mut sub).await;
        assert_eq!(body(&again), "m1");
        assert!(again.redelivered);
        assert_eq!(again.delivery_tag, 2);
        again.acker.ack().await.expect("ack");
        let d2 = next(&mut sub).await;
        assert_eq!(body(&d2), "m2");
        assert!(!d2.redelivered);
        d2.acker
            .settle(Settlement::Reject { requeue: true })
            .await
            .expect("reject requeue");
        let d2 = next(&mut sub).await;
        assert_eq!((body(&d2).as_str(), d2.redelivered), ("m2", true));
        d2.acker.ack().await.expect("ack");
        assert_eq!(body(&next(&mut sub).await), "m3");
        sub.close().await.expect("close");
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_without_requeue_dead_letters_with_x_death() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let dlx = unique("dlx");
        let (src, dlq) = (unique("dl.src"), unique("dl.dlq"));
        exchange(&*t, &dlx, ExchangeKind::Direct).await;
        t.declare_queue(
            &QueueDecl::classic(&src)
                .transient()
                .argument("x-dead-letter-exchange", dlx.as_str())
                .argument("x-dead-letter-routing-key", "dead"),
        )
        .await
        .expect("declare source");
        queue(&*t, &dlq).await;
        bind(&*t, &dlq, &dlx, "dead").await;
        let props = Properties {
            message_id: Some("id-1".into()),
            ..Default::default()
        };
        publish_confirmed(&*t, Outbound::new("", &src, props, "poison")).await;
        let d = t.get(&src).await.expect("get").expect("a message");
        d.acker.nack(false).await.expect("nack");
        wait_for_count(&*t, &dlq, 1, WAIT).await;
        let dead = t.get(&dlq).await.expect("get").expect("the dead letter");
        assert_eq!(body(&dead), "poison");
        assert_eq!(dead.exchange, dlx);
        assert_eq!(dead.routing_key, "dead");
        assert_eq!(dead.properties.message_id.as_deref(), Some("id-1"));
        let death = x_death(&dead);
        assert_eq!(count_of(&death), 1);
        assert_eq!(str_of(&death, "reason"), "rejected");
        assert_eq!(str_of(&death, "queue"), src);
        assert_eq!(str_of(&death, "exchange"), "");
        assert_eq!(
            death["routing-keys"].as_array().expect("routing-keys")[0].as_str(),
            Some(src.as_str())
        );
        assert!(matches!(death["time"], HeaderValue::Timestamp(_)));
        let h = &dead.properties.headers;
        assert_eq!(h["x-first-death-reason"].as_str(), Some("rejected"));
        assert_eq!(h["x-first-death-queue"].as_str(), Some(src.as_str()));
        assert_eq!(h["x-first-death-exchange"].as_str(), Some(""));
        dead.acker.ack().await.expect("ack");
        assert_eq!(t.inspect_queue(&src).await.expect("src").message_count, 0);
        cleanup(&*t, &[&src, &dlq], &[&dlx]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_subscription_returns_its_unacked_deliveries() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("close.unacked");
        queue(&*t, &q).await;
        for m in ["m1", "m2", "m3"] {
            publish(&*t, "", &q, m).await;
        }
        let mut sub = t.consume(spec(&q, 10)).await.expect("consume");
        let got: Vec<Delivery> = vec![
            next(&mut sub).await,
            next(&mut sub).await,
            next(&mut sub).await,
        ];
        assert_eq!(t.inspect_queue(&q).await.expect("inspect").message_count, 0);
        sub.close().await.expect("close");
        assert!(sub.cancelled_by_us());
        wait_for_count(&*t, &q, 3, WAIT).await;
        let mut back = Vec::new();
        while let Some(d) = t.get(&q).await.expect("get") {
            assert!(d.redelivered, "{} should be marked redelivered", body(&d));
            back.push(body(&d));
            d.acker.ack().await.expect("ack");
        }
        assert_eq!(back, ["m1", "m2", "m3"]);
        // A settlement after the close reaches nothing.
        assert!(matches!(
            got[0].acker.ack().await,
            Err(TransportError::AckNotSent)
        ));
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_deliveries_but_keeps_unsettled_ones_settleable() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("cancel");
        queue(&*t, &q).await;
        publish(&*t, "", &q, "m1").await;
        let mut sub = t.consume(spec(&q, 1)).await.expect("consume");
        let d = next(&mut sub).await;
        sub.cancel().await.expect("cancel");
        assert!(sub.cancelled_by_us());
        publish(&*t, "", &q, "m2").await;
        d.acker.ack().await.expect("ack after cancel");
        let ended = tokio::time::timeout(WAIT, sub.next()).await.expect("ends");
        assert!(ended.is_none(), "a cancelled subscription ends");
        sub.close().await.expect("close");
        assert_eq!(drain(&*t, &q).await, ["m2"]);
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_queue_cancels_its_consumers() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("delete.consumed");
        queue(&*t, &q).await;
        let mut sub = t.consume(spec(&q, 1)).await.expect("consume");
        for m in ["m1", "m2", "m3"] {
            publish(&*t, "", &q, m).await;
        }
        let d = next(&mut sub).await;
        assert_eq!(body(&d), "m1");
        let admin = target.transport().await;
        assert_eq!(admin.delete_queue(&q).await.expect("delete"), 2);
        let ended = tokio::time::timeout(WAIT, sub.next()).await.expect("ends");
        assert!(ended.is_none());
        assert!(!sub.cancelled_by_us());
        let e = admin.inspect_queue(&q).await;
        assert!(e.as_ref().is_err_and(TransportError::is_not_found), "{e:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_get_takes_the_head_and_settles_it() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("get");
        queue(&*t, &q).await;
        assert!(t.get(&q).await.expect("get").is_none());
        publish(&*t, "", &q, "a").await;
        publish(&*t, "", &q, "b").await;
        let a = t.get(&q).await.expect("get").expect("a");
        assert_eq!((body(&a).as_str(), a.redelivered), ("a", false));
        assert_eq!(t.inspect_queue(&q).await.expect("inspect").message_count, 1);
        a.acker.nack(true).await.expect("requeue");
        let a = t.get(&q).await.expect("get").expect("a again");
        assert_eq!((body(&a).as_str(), a.redelivered), ("a", true));
        a.acker.ack().await.expect("ack");
        let b = t.get(&q).await.expect("get").expect("b");
        assert_eq!(body(&b), "b");
        b.acker.ack().await.expect("ack");
        assert!(t.get(&q).await.expect("get").is_none());
        assert_eq!(t.inspect_queue(&q).await.expect("inspect").message_count, 0);
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiple_ack_settles_every_earlier_delivery() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("multi.ack");
        queue(&*t, &q).await;
        for m in ["m1", "m2", "m3", "m4"] {
            publish(&*t, "", &q, m).await;
        }
        let mut sub = t.consume(spec(&q, 10)).await.expect("consume");
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(next(&mut sub).await);
        }
        got[2]
            .acker
            .settle(Settlement::Ack { multiple: true })
            .await
            .expect("multiple ack");
        sub.close().await.expect("close");
        wait_for_count(&*t, &q, 1, WAIT).await;
        assert_eq!(drain(&*t, &q).await, ["m4"]);
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_twice_is_ack_not_sent() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("ack.twice");
        queue(&*t, &q).await;
        publish(&*t, "", &q, "m").await;
        let d = t.get(&q).await.expect("get").expect("m");
        d.acker.ack().await.expect("first ack");
        let again = d.acker.ack().await;
        assert!(
            matches!(again, Err(TransportError::AckNotSent)),
            "{again:?}"
        );
        let t = target.transport().await;
        assert_eq!(t.inspect_queue(&q).await.expect("inspect").message_count, 0);
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

/// A queue with a TTL and a dead-letter route through the default exchange.
async fn waiting_queue(t: &dyn Transport, name: &str, ttl: Option<i32>, target: &str) {
    let mut d = QueueDecl::classic(name)
        .transient()
        .argument("x-dead-letter-exchange", "")
        .argument("x-dead-letter-routing-key", target);
    if let Some(ttl) = ttl {
        d = d.argument("x-message-ttl", ttl);
    }
    t.declare_queue(&d).await.expect("declare waiting queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_ttl_dead_letters_into_another_queue() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let (wait, home) = (unique("ttl.wait"), unique("ttl.home"));
        queue(&*t, &home).await;
        waiting_queue(&*t, &wait, Some(200), &home).await;
        publish(&*t, "", &wait, "later").await;
        wait_for_count(&*t, &home, 1, WAIT).await;
        let d = t.get(&home).await.expect("get").expect("expired message");
        assert_eq!(body(&d), "later");
        assert_eq!(d.exchange, "");
        assert_eq!(d.routing_key, home);
        let death = x_death(&d);
        assert_eq!(str_of(&death, "reason"), "expired");
        assert_eq!(str_of(&death, "queue"), wait);
        assert_eq!(count_of(&death), 1);
        d.acker.ack().await.expect("ack");
        assert_eq!(
            t.inspect_queue(&wait).await.expect("inspect").message_count,
            0
        );
        cleanup(&*t, &[&wait, &home], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_message_expiration_dead_letters_and_is_removed() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let (wait, home) = (unique("exp.wait"), unique("exp.home"));
        queue(&*t, &home).await;
        waiting_queue(&*t, &wait, None, &home).await;
        let props = Properties {
            expiration: Some("100".into()),
            ..Default::default()
        };
        publish_confirmed(&*t, Outbound::new("", &wait, props, "short")).await;
        wait_for_count(&*t, &home, 1, WAIT).await;
        let d = t.get(&home).await.expect("get").expect("expired message");
        assert_eq!(body(&d), "short");
        assert_eq!(d.properties.expiration, None);
        let death = x_death(&d);
        assert_eq!(str_of(&death, "reason"), "expired");
        assert_eq!(str_of(&death, "original-expiration"), "100");
        d.acker.ack().await.expect("ack");
        cleanup(&*t, &[&wait, &home], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_head_of_a_queue_expires() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let (wait, home) = (unique("head.wait"), unique("head.home"));
        queue(&*t, &home).await;
        waiting_queue(&*t, &wait, None, &home).await;
        for (text, ms) in [("long", "60000"), ("short", "50")] {
            let props = Properties {
                expiration: Some(ms.into()),
                ..Default::default()
            };
            publish_confirmed(&*t, Outbound::new("", &wait, props, text)).await;
        }
        // "short" is long overdue but sits behind "long".
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(t.inspect_queue(&wait).await.expect("wait").message_count, 2);
        assert_eq!(t.inspect_queue(&home).await.expect("home").message_count, 0);
        let long = t.get(&wait).await.expect("get").expect("long");
        assert_eq!(body(&long), "long");
        long.acker.ack().await.expect("ack");
        // Now "short" is at the head and goes at once.
        wait_for_count(&*t, &home, 1, WAIT).await;
        assert_eq!(drain(&*t, &home).await, ["short"]);
        cleanup(&*t, &[&wait, &home], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclaring_with_a_different_ttl_is_precondition_failed() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("redeclare");
        let decl = QueueDecl::classic(&q)
            .transient()
            .argument("x-message-ttl", 1000);
        t.declare_queue(&decl).await.expect("declare");
        t.declare_queue(&decl)
            .await
            .expect("an equal redeclaration is fine");
        let e = t
            .declare_queue(
                &QueueDecl::classic(&q)
                    .transient()
                    .argument("x-message-ttl", 2000),
            )
            .await
            .expect_err("a different ttl must be refused");
        assert!(e.is_precondition_failed(), "{e:?}");
        assert!(e.to_string().contains("x-message-ttl"), "{e}");
        let t = target.transport().await;
        let e = t
            .declare_queue(&QueueDecl::classic(&q).transient())
            .await
            .expect_err("a missing ttl must be refused");
        assert!(e.is_precondition_failed(), "{e:?}");
        let t = target.transport().await;
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_and_classic_queues_are_told_apart() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let (quorum, classic) = (unique("type.quorum"), unique("type.classic"));
        assert!(
            !QueueDecl::classic(&classic)
                .arguments
                .contains_key("x-queue-type")
        );
        t.declare_queue(&QueueDecl::quorum(&quorum))
            .await
            .expect("declare quorum");
        t.declare_queue(&QueueDecl::quorum(&quorum))
            .await
            .expect("redeclare quorum");
        t.declare_queue(&QueueDecl::classic(&classic))
            .await
            .expect("declare classic");
        let e = t
            .declare_queue(&QueueDecl::classic(&quorum))
            .await
            .expect_err("a classic declaration of a quorum queue");
        assert!(e.is_precondition_failed(), "{e:?}");
        let t = target.transport().await;
        let mut transient = QueueDecl::quorum(unique("type.transient"));
        transient.durable = false;
        let e = t
            .declare_queue(&transient)
            .await
            .expect_err("a quorum queue must be durable");
        assert!(e.is_precondition_failed(), "{e:?}");
        let t = target.transport().await;
        publish(&*t, "", &quorum, "q").await;
        wait_for_count(&*t, &quorum, 1, WAIT).await;
        assert_eq!(drain(&*t, &quorum).await, ["q"]);
        cleanup(&*t, &[&quorum, &classic], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_name_gets_a_server_generated_queue() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let info = t
            .declare_queue(&QueueDecl::server_named())
            .await
            .expect("declare");
        assert!(info.name.starts_with("amq.gen-"), "{}", info.name);
        assert_eq!((info.message_count, info.consumer_count), (0, 0));
        assert_eq!(
            publish(&*t, "", &info.name, "hi").await,
            Confirmation::Routed
        );
        assert_eq!(drain(&*t, &info.name).await, ["hi"]);
        let other = t
            .declare_queue(&QueueDecl::server_named())
            .await
            .expect("declare");
        assert_ne!(other.name, info.name);
        cleanup(&*t, &[&info.name, &other.name], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_inspection_of_missing_things_is_not_found() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let e = t.inspect_queue(&unique("missing.q")).await;
        assert!(e.as_ref().is_err_and(TransportError::is_not_found), "{e:?}");
        let t = target.transport().await;
        let e = t.inspect_exchange(&unique("missing.x")).await;
        assert!(e.as_ref().is_err_and(TransportError::is_not_found), "{e:?}");
        let t = target.transport().await;
        let q = unique("bind.missing");
        queue(&*t, &q).await;
        let e = t
            .bind_queue(&BindingDecl::new(&q, unique("missing.x"), "k"))
            .await;
        assert!(e.as_ref().is_err_and(TransportError::is_not_found), "{e:?}");
        let t = target.transport().await;
        let info = t.inspect_queue(&q).await.expect("an existing queue");
        assert_eq!(info.name, q);
        t.inspect_exchange("amq.direct")
            .await
            .expect("amq.direct exists");
        cleanup(&*t, &[&q], &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_and_delete_report_ready_counts() {
    on_each_target(|target| async move {
        let t = target.transport().await;
        let q = unique("purge");
        queue(&*t, &q).await;
        for m in ["a", "b", "c"] {
            publish(&*t, "", &q, m).await;
        }
        assert_eq!(t.purge_queue(&q).await.expect("purge"), 3);
        publish(&*t, "", &q, "d").await;
        wait_for_count(&*t, &q, 1, WAIT).await;
        assert_eq!(t.delete_queue(&q).await.expect("delete"), 1);
        let gone = eventually(WAIT, "queue deleted", || async {
            t.inspect_queue(&q)
                .await
                .err()
                .filter(TransportError::is_not_found)
        })
        .await;
        assert!(gone.is_not_found());
    })
    .await;
}
