//! A consumer running one handler at a time sends the acks of consecutive finished
//! deliveries as one `multiple` ack. A delivery in the middle of such a run whose
//! settlement is not an ack must never be covered by that ack, nor by a later one while it
//! is still unacked:
//!
//! - a dead-letter move that fails (its `.dlq` is gone): the delivery keeps its decision,
//!   is held unacked and not run again, and its move lands once `.dlq` is back;
//! - a retry wait in the consumer: the delivery waits outside the handler slot (still
//!   unacked) while the deliveries after it are handled and acked.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{Consumer, ConsumerOptions, HandlerError, Message};
use acemq::retry::RetryPolicy;
use acemq::topology::QueueDecl;
use acemq::transport::memory::MemoryBroker;
use support::{Broker, eventually, on_each_target, unique};
use tokio::sync::Semaphore;

const WAIT: Duration = Duration::from_secs(15);

/// What the handler saw: (id, redelivered, attempt).
type Seen = Arc<Mutex<Vec<(String, bool, u32)>>>;

/// How m3 fails on its first run.
#[derive(Clone, Copy, PartialEq)]
enum M3 {
    /// Fatal, with `.dlq` deleted: the dead-letter move fails.
    FailedMove,
    /// An ordinary failure with a 1 s consumer wait before the retry.
    Waits,
}

/// Publishes m1..m6, starts a consumer whose first handler waits for `gate`, and returns
/// the consumer and what it saw.
async fn start(mq: &Connection, q: &str, m3: M3, gate: Arc<Semaphore>) -> (Consumer, Seen) {
    mq.transport()
        .declare_queue(&QueueDecl::classic(q))
        .await
        .unwrap();
    let publisher = mq.publisher::<serde_json::Value>("", q);
    for i in 1..=6 {
        let id = format!("m{i}");
        publisher
            .send_with(
                &serde_json::json!({ "id": id }),
                acemq::publish::SendOptions::new().message_id(&id),
            )
            .await
            .unwrap();
    }
    let seen: Seen = Arc::default();
    let options = ConsumerOptions::default()
        .prefetch(20)
        .retry(RetryPolicy::fixed(2, Duration::from_secs(1)).unwrap());
    let consumer = {
        let seen = seen.clone();
        mq.consume(q, options, move |m: Message<serde_json::Value>| {
            let gate = gate.clone();
            let seen = seen.clone();
            async move {
                let id = m.envelope().id().to_owned();
                if id == "m1" && !m.redelivered() {
                    let _ = gate.acquire().await;
                }
                let attempt = m.attempt() as u32;
                seen.lock()
                    .unwrap()
                    .push((id.clone(), m.redelivered(), attempt));
                if id == "m3" && attempt == 1 && !m.redelivered() {
                    return Err(match m3 {
                        M3::FailedMove => HandlerError::fatal("m3 is rejected once"),
                        M3::Waits => HandlerError::retry("m3 fails once"),
                    });
                }
                Ok(())
            }
        })
        .await
        .unwrap()
    };
    (consumer, seen)
}

fn runs_of(seen: &Seen, id: &str) -> Vec<(bool, u32)> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(s, _, _)| s == id)
        .map(|(_, r, a)| (*r, *a))
        .collect()
}

async fn teardown(mq: Connection, q: &str) {
    for suffix in ["", ".dlq", ".parked"] {
        let _ = mq.transport().delete_queue(&format!("{q}{suffix}")).await;
    }
    mq.close().await.ok();
}

async fn failed_move(target: Broker) {
    let mq = Connection::connect(&target.url()).await.unwrap();
    let q = unique("coalesce");
    // The first handler waits until the dead-letter queue is gone, so every message is
    // buffered by then and the acks of m1, m2 would be held in a run when m3 fails.
    let gate = Arc::new(Semaphore::new(0));
    let (consumer, seen) = start(&mq, &q, M3::FailedMove, gate.clone()).await;
    // The dead-letter move of m3 will be unroutable: m3 must not be acked.
    let dlq = format!("{q}.dlq");
    mq.transport().delete_queue(&dlq).await.unwrap();
    gate.add_permits(1);

    // The decision is kept. m3 is held (unacked, not run again: a classic queue
    // has no dead-letter arguments to fall back on) while the others are acked.
    eventually(WAIT, "five acks and m3 held", || async {
        let s = consumer.stats();
        (s.acked == 5 && s.set_aside_failed >= 1 && consumer.moves().held_unsendable == 1)
            .then_some(())
    })
    .await;
    assert_eq!(
        consumer.in_flight(),
        1,
        "m3 waits, unacked: {:?}",
        consumer.moves()
    );
    // The dead-letter queue comes back: the held move lands on one of its next tries.
    mq.transport()
        .declare_queue(&QueueDecl::classic(&dlq))
        .await
        .unwrap();
    eventually(WAIT, "m3 moved to .dlq", || async {
        (consumer.stats().rejected == 1).then_some(())
    })
    .await;
    consumer.close().await;

    assert_eq!(
        runs_of(&seen, "m3"),
        vec![(false, 1)],
        "m3 failed once and was never run again: {seen:?}"
    );
    for i in [1, 2, 4, 5, 6] {
        let id = format!("m{i}");
        assert_eq!(runs_of(&seen, &id).len(), 1, "{id} handled once: {seen:?}");
    }
    let s = consumer.stats();
    assert_eq!(
        (s.acked, s.rejected, s.settle_failed, s.dead_lettered),
        (5, 1, 0, 0),
        "{s:?}"
    );
    assert_eq!(consumer.moves().held_unsendable, 0);
    let info = mq.transport().inspect_queue(&q).await.unwrap();
    assert_eq!(info.message_count, 0, "nothing left unacked or requeued");
    let dead = mq.transport().inspect_queue(&dlq).await.unwrap();
    assert_eq!(dead.message_count, 1, "m3 in .dlq");
    // What reached the broker (observable on memory://): m1+m2 as one `multiple` ack
    // before m3's move; while m3 was held, m4..m6 one by one (a `multiple` ack would have
    // covered m3); then m3's own ack. Every delivery covered exactly once, never a nack.
    if let Broker::Memory(name) = &target {
        let s = MemoryBroker::named(name).settlements();
        assert!(s.multiple_acks >= 1, "a multiple ack was sent: {s:?}");
        assert_eq!(
            s.single_acks + s.acked_by_multiple,
            6,
            "every delivery acked exactly once: {s:?}"
        );
        assert!(
            s.single_acks + s.multiple_acks <= 5,
            "six acks in at most five frames: {s:?}"
        );
        assert_eq!((s.nacks, s.rejects), (0, 0), "m3 never requeued: {s:?}");
    }
    teardown(mq, &q).await;
}

async fn waiting(target: Broker) {
    let mq = Connection::connect(&target.url()).await.unwrap();
    let q = unique("coalesce-wait");
    let gate = Arc::new(Semaphore::new(1));
    let (consumer, seen) = start(&mq, &q, M3::Waits, gate).await;

    // m3 waits 1 s in the consumer (unacked, its handler slot free): m4..m6 are handled
    // meanwhile, and their acks must not cover m3.
    eventually(WAIT, "m4..m6 handled while m3 waits", || async {
        let s = consumer.stats();
        (s.acked == 5 && consumer.moves().waiting == 1).then_some(())
    })
    .await;
    eventually(WAIT, "m3 retried and acked", || async {
        let s = consumer.stats();
        (s.acked == 6 && s.retried == 1).then_some(())
    })
    .await;
    consumer.close().await;

    let order: Vec<(String, u32)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _, a)| (id.clone(), *a))
        .collect();
    let at = |id: &str, a: u32| order.iter().position(|(i, x)| i == id && *x == a);
    assert!(
        at("m6", 1) < at("m3", 2),
        "m4..m6 ran during m3's wait: {order:?}"
    );
    assert_eq!(
        runs_of(&seen, "m3"),
        vec![(false, 1), (false, 2)],
        "m3: the first run, then its retry copy: {seen:?}"
    );
    for i in [1, 2, 4, 5, 6] {
        let id = format!("m{i}");
        assert_eq!(runs_of(&seen, &id).len(), 1, "{id} handled once: {seen:?}");
    }
    let s = consumer.stats();
    assert_eq!(
        (s.acked, s.retried, s.settle_failed, s.set_aside_failed),
        (6, 1, 0, 0),
        "{s:?}"
    );
    let info = mq.transport().inspect_queue(&q).await.unwrap();
    assert_eq!(info.message_count, 0, "nothing left unacked or requeued");
    if let Broker::Memory(name) = &target {
        // Six originals and m3's retry copy, each acked exactly once, nothing requeued.
        let s = MemoryBroker::named(name).settlements();
        assert_eq!(
            s.single_acks + s.acked_by_multiple,
            7,
            "every delivery acked exactly once: {s:?}"
        );
        assert_eq!((s.nacks, s.rejects), (0, 0), "{s:?}");
    }
    teardown(mq, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_in_the_middle_of_an_ack_run_is_not_acked() {
    on_each_target(failed_move).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_waiting_out_of_order_is_never_covered_by_a_later_multiple_ack() {
    on_each_target(waiting).await;
}
