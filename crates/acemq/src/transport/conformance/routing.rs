//! Routing through the default, direct, fanout, topic and headers exchanges; mandatory
//! returns; missing exchanges.

use crate::headers::{HeaderValue, Headers};
use crate::topology::{BindingDecl, ExchangeDecl, ExchangeKind};
use crate::transport::{Confirmation, Outbound, Properties, TransportError};

use super::Target;
use super::helpers::*;

/// Default exchange routes by queue name.
pub async fn default_exchange_routes_by_queue_name(target: Target) {
    let t = target.transport().await;
    let (a, b) = (unique("default.a"), unique("default.b"));
    queue(&*t, &a).await;
    queue(&*t, &b).await;
    assert_eq!(publish(&*t, "", &a, "to-a").await, Confirmation::Routed);
    assert_eq!(publish(&*t, "", &b, "to-b").await, Confirmation::Routed);
    assert_eq!(drain(&*t, &a).await, ["to-a"]);
    assert_eq!(drain(&*t, &b).await, ["to-b"]);
    cleanup(&*t, &[&a, &b], &[]).await;
}

/// The default exchange cannot be bound declared or deleted.
pub async fn the_default_exchange_cannot_be_bound_declared_or_deleted(target: Target) {
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
}

/// Direct exchange routes on exact key.
pub async fn direct_exchange_routes_on_exact_key(target: Target) {
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
}

/// Fanout exchange routes to every bound queue.
pub async fn fanout_exchange_routes_to_every_bound_queue(target: Target) {
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
}

/// Topic exchange matches star and hash.
pub async fn topic_exchange_matches_star_and_hash(target: Target) {
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
}

/// A headers exchange routes on `x-match`: an `all` binding when every header matches, an
/// `any` binding when one does.
pub async fn headers_exchange_matches_all_or_any_header(target: Target) {
    let t = target.transport().await;
    let x = unique("headers.x");
    let (all, any) = (unique("headers.all"), unique("headers.any"));
    exchange(&*t, &x, ExchangeKind::Headers).await;
    queue(&*t, &all).await;
    queue(&*t, &any).await;
    let values = |class: &str, role: &str| -> Headers {
        [
            ("class".into(), HeaderValue::from(class)),
            ("role".into(), HeaderValue::from(role)),
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
}

/// Mandatory unroutable is returned and non mandatory is acked.
pub async fn mandatory_unroutable_is_returned_and_non_mandatory_is_acked(target: Target) {
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
}

/// Publishing to a missing exchange is not found.
pub async fn publishing_to_a_missing_exchange_is_not_found(target: Target) {
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
}
