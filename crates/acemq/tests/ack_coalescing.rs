//! A consumer running one handler at a time sends the acks of consecutive finished
//! deliveries as one `multiple` ack. A delivery in the middle of such a run whose
//! settlement is not an ack (here a dead-letter move that fails, so it is requeued) must
//! never be covered by that ack: it comes back and is handled again.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::topology::QueueDecl;
use acemq::transport::memory::MemoryBroker;
use support::{Target, eventually, on_each_target, unique};
use tokio::sync::Semaphore;

const WAIT: Duration = Duration::from_secs(15);

async fn case(target: Target) {
    let mq = Connection::connect(&target.url()).await.unwrap();
    let q = unique("coalesce");
    mq.transport()
        .declare_queue(&QueueDecl::classic(&q))
        .await
        .unwrap();
    let publisher = mq.publisher::<serde_json::Value>("", &q);
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

    // The first handler waits until the dead-letter queue is gone, so every message is
    // buffered by then and the acks of m1, m2 would be held in a run when m3 fails.
    let gate = Arc::new(Semaphore::new(0));
    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let consumer = {
        let gate = gate.clone();
        let seen = seen.clone();
        mq.consume(
            &q,
            ConsumerOptions::default().prefetch(20),
            move |m: Message<serde_json::Value>| {
                let gate = gate.clone();
                let seen = seen.clone();
                async move {
                    let id = m.envelope().id().to_owned();
                    if id == "m1" && !m.redelivered() {
                        let _ = gate.acquire().await;
                    }
                    seen.lock().unwrap().push((id.clone(), m.redelivered()));
                    if id == "m3" && !m.redelivered() {
                        return Err(HandlerError::fatal("m3 is rejected once"));
                    }
                    Ok(())
                }
            },
        )
        .await
        .unwrap()
    };
    // The dead-letter move of m3 will be unroutable: m3 must be requeued, not acked.
    mq.transport()
        .delete_queue(&format!("{q}.dlq"))
        .await
        .unwrap();
    gate.add_permits(1);

    eventually(WAIT, "six acks and one failed move", || async {
        let s = consumer.stats();
        (s.acked == 6 && s.set_aside_failed == 1).then_some(())
    })
    .await;
    consumer.close().await;

    let seen = seen.lock().unwrap().clone();
    let m3: Vec<bool> = seen
        .iter()
        .filter(|(id, _)| id == "m3")
        .map(|(_, r)| *r)
        .collect();
    assert_eq!(
        m3,
        vec![false, true],
        "m3 failed once and came back redelivered: {seen:?}"
    );
    for i in [1, 2, 4, 5, 6] {
        let id = format!("m{i}");
        assert_eq!(
            seen.iter().filter(|(s, _)| *s == id).count(),
            1,
            "{id} handled once: {seen:?}"
        );
    }
    let s = consumer.stats();
    assert_eq!(
        (s.acked, s.settle_failed, s.dead_lettered, s.rejected),
        (6, 0, 0, 0)
    );
    let info = mq.transport().inspect_queue(&q).await.unwrap();
    assert_eq!(info.message_count, 0, "nothing left unacked or requeued");
    // What reached the broker (observable on memory://): the six acks went out coalesced,
    // as `multiple` acks (m1+m2 before m3's requeue, then m4..m6 and m3's redelivery) in at
    // most three frames, each delivery covered exactly once, and m3 nacked (requeued) once.
    if let Target::Memory(name) = &target {
        let s = MemoryBroker::named(name).settlements();
        assert!(s.multiple_acks >= 1, "a multiple ack was sent: {s:?}");
        assert_eq!(
            s.single_acks + s.acked_by_multiple,
            6,
            "every delivery acked exactly once: {s:?}"
        );
        assert!(
            s.single_acks + s.multiple_acks <= 3,
            "six acks in at most three frames: {s:?}"
        );
        assert_eq!((s.nacks, s.rejects), (1, 0), "m3 requeued once: {s:?}");
    }

    for suffix in ["", ".dlq", ".parked"] {
        let _ = mq.transport().delete_queue(&format!("{q}{suffix}")).await;
    }
    mq.close().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_in_the_middle_of_an_ack_run_is_not_acked() {
    on_each_target(case).await;
}
