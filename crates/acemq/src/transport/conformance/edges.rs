//! Edges of settlement and ownership: `x-death` counting up on a message dead-lettered into
//! its own queue again and again, a dead-letter exchange that does not exist, quorum
//! queues' `x-delivery-count`, exclusive queues and the connection that owns them.

use crate::topology::QueueDecl;
use crate::transport::{Confirmation, TransportError};

use super::Target;
use super::helpers::*;

/// Rejecting into the same queue counts up one `x-death` entry.
pub async fn rejecting_into_the_same_queue_counts_up_x_death(target: Target) {
    let t = target.transport().await;
    let q = unique("count");
    t.declare_queue(
        &QueueDecl::classic(&q)
            .transient()
            .argument("x-dead-letter-exchange", "")
            .argument("x-dead-letter-routing-key", q.as_str()),
    )
    .await
    .expect("declare");
    publish(&*t, "", &q, "m").await;
    for expected in 1..=3_i64 {
        let d = t.get(&q).await.expect("get").expect("the message");
        d.acker.nack(false).await.expect("nack");
        let again = eventually(WAIT, "the dead letter back in its queue", || async {
            t.get(&q).await.expect("get")
        })
        .await;
        let deaths = again.properties.headers["x-death"]
            .as_array()
            .expect("x-death is an array")
            .to_vec();
        assert_eq!(deaths.len(), 1, "{deaths:?}");
        let death = deaths[0].as_table().expect("a table");
        assert_eq!(count_of(death), expected);
        assert_eq!(str_of(death, "reason"), "rejected");
        again.acker.nack(true).await.expect("put it back");
    }
    cleanup(&*t, &[&q], &[]).await;
}

/// Dead-lettering to a missing exchange drops the message.
pub async fn dead_lettering_to_a_missing_exchange_drops_the_message(target: Target) {
    let t = target.transport().await;
    let q = unique("dl.missing");
    t.declare_queue(
        &QueueDecl::classic(&q)
            .transient()
            .argument("x-dead-letter-exchange", unique("nowhere")),
    )
    .await
    .expect("declare");
    publish(&*t, "", &q, "m").await;
    let d = t.get(&q).await.expect("get").expect("the message");
    d.acker.nack(false).await.expect("nack");
    let info = t.inspect_queue(&q).await.expect("inspect");
    assert_eq!((info.message_count, info.consumer_count), (0, 0));
    assert!(t.get(&q).await.expect("get").is_none());
    cleanup(&*t, &[&q], &[]).await;
}

/// Quorum queues count redeliveries in `x-delivery-count` (0 or absent on a first delivery:
/// RabbitMQ 3.10 sends 0, the memory broker leaves it out).
pub async fn quorum_queues_count_redeliveries(target: Target) {
    let t = target.transport().await;
    let q = unique("quorum.count");
    t.declare_queue(&QueueDecl::quorum(&q))
        .await
        .expect("declare quorum");
    publish(&*t, "", &q, "m").await;
    let d = eventually(WAIT, "the message", || async {
        t.get(&q).await.expect("get")
    })
    .await;
    // RabbitMQ 3.10 says 0 on a first delivery; a transport may also leave it out.
    let first = d.properties.headers.get("x-delivery-count");
    assert!(
        first.is_none_or(|c| c.as_i64() == Some(0)),
        "a first delivery counts no redelivery: {first:?}"
    );
    d.acker.nack(true).await.expect("requeue");
    let d = eventually(WAIT, "the message again", || async {
        t.get(&q).await.expect("get")
    })
    .await;
    assert_eq!(d.properties.headers["x-delivery-count"].as_i64(), Some(1));
    d.acker.ack().await.expect("ack");
    cleanup(&*t, &[&q], &[]).await;
}

/// Exclusive queues belong to their connection: others are locked out (but may publish to
/// them), and the queue goes when its connection closes.
pub async fn exclusive_queues_belong_to_their_connection(target: Target) {
    let owner = target.transport().await;
    let info = owner
        .declare_queue(&QueueDecl::server_named())
        .await
        .expect("declare");
    let other = target.transport().await;
    let e = other.inspect_queue(&info.name).await.err();
    assert!(
        matches!(e, Some(TransportError::ResourceLocked { .. })),
        "{e:?}"
    );
    let other = target.transport().await;
    let e = other.consume(spec(&info.name, 1)).await.err();
    assert!(
        matches!(e, Some(TransportError::ResourceLocked { .. })),
        "{e:?}"
    );
    let other = target.transport().await;
    let e = other.get(&info.name).await.err();
    assert!(
        matches!(e, Some(TransportError::ResourceLocked { .. })),
        "{e:?}"
    );
    // Publishing to it is fine.
    let other = target.transport().await;
    assert_eq!(
        publish(&*other, "", &info.name, "m").await,
        Confirmation::Routed
    );
    owner.close().await.expect("close the owner");
    let gone = eventually(
        WAIT,
        "the exclusive queue deleted with its owner",
        || async {
            other
                .inspect_queue(&info.name)
                .await
                .err()
                .filter(TransportError::is_not_found)
        },
    )
    .await;
    assert!(gone.is_not_found());
}

/// An exclusive consumer locks a classic queue: another connection's consumer, exclusive or not,
/// is refused with 403 ACCESS_REFUSED, and so is an exclusive consumer while another
/// consumer exists; once the holder's connection closes, an exclusive consumer is taken,
/// and the holder's unacked message comes to it first. A quorum queue ignores the flag.
pub async fn an_exclusive_consumer_locks_the_queue_until_its_connection_closes(target: Target) {
    let owner = target.transport().await;
    let q = unique("exclusive-consume");
    queue(&*owner, &q).await;
    publish(&*owner, "", &q, "first").await;
    let exclusive = |prefetch| crate::transport::ConsumeSpec {
        exclusive: true,
        ..spec(&q, prefetch)
    };
    let mut held = owner
        .consume(exclusive(1))
        .await
        .expect("exclusive consume");
    let d = next(&mut held).await;
    assert_eq!(body(&d), "first");
    let other = target.transport().await;
    for s in [spec(&q, 1), exclusive(1)] {
        let e = other.consume(s).await.err();
        assert!(
            matches!(e, Some(TransportError::AccessRefused { .. })),
            "a second consumer while an exclusive one holds the queue: {e:?}"
        );
    }
    // The other way round: a plain consumer makes an exclusive one be refused.
    let plain_q = unique("exclusive-after-plain");
    queue(&*owner, &plain_q).await;
    let _plain = owner
        .consume(spec(&plain_q, 1))
        .await
        .expect("plain consume");
    let e = other
        .consume(crate::transport::ConsumeSpec {
            exclusive: true,
            ..spec(&plain_q, 1)
        })
        .await
        .err();
    assert!(
        matches!(e, Some(TransportError::AccessRefused { .. })),
        "an exclusive consumer while another consumer exists: {e:?}"
    );
    // The holder goes: the queue can be taken, and its unacked message comes back first.
    drop(d);
    owner.close().await.expect("close the owner");
    let mut taken = eventually(WAIT, "the exclusive consumer taken over", || async {
        other.consume(exclusive(1)).await.ok()
    })
    .await;
    let d = next(&mut taken).await;
    assert_eq!(body(&d), "first");
    assert!(d.redelivered);
    d.acker.ack().await.expect("ack");
    taken.close().await.expect("close");
    // A quorum queue accepts the flag and ignores it (RabbitMQ 3.10): a second exclusive
    // consumer is not refused, so exclusivity cannot be had from basic.consume there.
    let quorum = unique("exclusive-quorum");
    other
        .declare_queue(&QueueDecl::quorum(&quorum))
        .await
        .expect("declare quorum");
    let mut first = other.consume(exclusive_on(&quorum)).await.expect("first");
    let third = target.transport().await;
    let mut second = third
        .consume(exclusive_on(&quorum))
        .await
        .expect("a quorum queue does not refuse a second exclusive consumer");
    second.close().await.expect("close");
    first.close().await.expect("close");
    third.close().await.expect("close");
    cleanup(&*other, &[&q, &plain_q, &quorum], &[]).await;
}

/// An exclusive subscription to `queue`.
fn exclusive_on(queue: &str) -> crate::transport::ConsumeSpec {
    crate::transport::ConsumeSpec {
        exclusive: true,
        ..spec(queue, 1)
    }
}
