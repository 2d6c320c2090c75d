//! Subscriptions and settlement: prefetch, requeue, nack to a dead-letter exchange, close,
//! cancel, basic.get, multiple acks, taking what is at hand (`try_next`).

use crate::headers::HeaderValue;
use crate::topology::{ExchangeKind, QueueDecl};
use crate::transport::{Delivery, Outbound, Properties, Settlement, TransportError};

use super::Target;
use super::helpers::*;

/// Prefetch bounds the unacked window.
pub async fn prefetch_bounds_the_unacked_window(target: Target) {
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
}

/// Requeue puts the message back at the head marked redelivered.
pub async fn requeue_puts_the_message_back_at_the_head_marked_redelivered(target: Target) {
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
}

/// Nack without requeue dead letters with x death.
pub async fn nack_without_requeue_dead_letters_with_x_death(target: Target) {
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
}

/// Closing a subscription returns its unacked deliveries.
pub async fn closing_a_subscription_returns_its_unacked_deliveries(target: Target) {
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
}

/// Dropping a subscription (without closing it) returns its unacked deliveries, and a
/// settlement afterwards reaches nothing: a delivery held by the application does not keep
/// its subscription's channel open.
pub async fn dropping_a_subscription_returns_its_unacked_deliveries(target: Target) {
    let t = target.transport().await;
    let q = unique("drop.unacked");
    queue(&*t, &q).await;
    publish(&*t, "", &q, "m1").await;
    let mut sub = t.consume(spec(&q, 10)).await.expect("consume");
    let held = next(&mut sub).await;
    assert_eq!(t.inspect_queue(&q).await.expect("inspect").message_count, 0);
    drop(sub);
    wait_for_count(&*t, &q, 1, WAIT).await;
    assert!(matches!(
        held.acker.ack().await,
        Err(TransportError::AckNotSent)
    ));
    assert_eq!(drain(&*t, &q).await, ["m1"]);
    cleanup(&*t, &[&q], &[]).await;
}

/// Cancel stops deliveries but keeps unsettled ones settleable.
pub async fn cancel_stops_deliveries_but_keeps_unsettled_ones_settleable(target: Target) {
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
}

/// Deleting a queue cancels its consumers.
pub async fn deleting_a_queue_cancels_its_consumers(target: Target) {
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
}

/// Basic get takes the head and settles it.
pub async fn basic_get_takes_the_head_and_settles_it(target: Target) {
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
}

/// Multiple ack settles every earlier delivery.
pub async fn multiple_ack_settles_every_earlier_delivery(target: Target) {
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
}

/// Settling twice is ack not sent.
pub async fn settling_twice_is_ack_not_sent(target: Target) {
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
}

/// `try_next` takes a delivery that is at hand and answers `None` at once when there is
/// none (what a consumer relies on to coalesce acks between waits).
pub async fn try_next_takes_what_is_at_hand_without_waiting(target: Target) {
    let t = target.transport().await;
    let q = unique("try.next");
    queue(&*t, &q).await;
    let mut sub = t.consume(spec(&q, 10)).await.expect("consume");
    assert!(
        sub.try_next().is_none(),
        "nothing published, nothing at hand"
    );
    for m in ["m1", "m2"] {
        publish(&*t, "", &q, m).await;
    }
    // A broker's deliveries reach the client in their own time: polled, with a deadline.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < 2 {
        match sub.try_next() {
            Some(Some(Ok(d))) => got.push(d),
            Some(Some(Err(e))) => panic!("try_next failed: {e}"),
            Some(None) => panic!("the subscription ended"),
            None => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "2 deliveries in time"
                );
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
    }
    assert_eq!([body(&got[0]), body(&got[1])], ["m1", "m2"]);
    assert!(sub.try_next().is_none(), "both taken, nothing more at hand");
    for d in got {
        d.acker.ack().await.expect("ack");
    }
    sub.close().await.expect("close");
    assert_eq!(t.inspect_queue(&q).await.expect("inspect").message_count, 0);
    cleanup(&*t, &[&q], &[]).await;
}
