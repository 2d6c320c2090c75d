//! Queue declarations and time-to-live: TTL and per-message expiration dead-lettering,
//! head-only expiry, PRECONDITION_FAILED, queue types, server-named queues.

use std::time::Duration;

use crate::topology::{BindingDecl, QueueDecl};
use crate::transport::{Confirmation, Outbound, Properties, Transport, TransportError};

use super::Target;
use super::helpers::*;

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

/// Queue ttl dead letters into another queue.
pub async fn queue_ttl_dead_letters_into_another_queue(target: Target) {
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
}

/// Per message expiration dead letters and is removed.
pub async fn per_message_expiration_dead_letters_and_is_removed(target: Target) {
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
}

/// Only the head of a queue expires.
pub async fn only_the_head_of_a_queue_expires(target: Target) {
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
}

/// Redeclaring with a different ttl is precondition failed.
pub async fn redeclaring_with_a_different_ttl_is_precondition_failed(target: Target) {
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
}

/// Quorum and classic queues are told apart.
pub async fn quorum_and_classic_queues_are_told_apart(target: Target) {
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
}

/// An empty name gets a server generated queue.
pub async fn an_empty_name_gets_a_server_generated_queue(target: Target) {
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
}

/// Passive inspection of missing things is not found.
pub async fn passive_inspection_of_missing_things_is_not_found(target: Target) {
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
}

/// Purge and delete report ready counts.
pub async fn purge_and_delete_report_ready_counts(target: Target) {
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
}
