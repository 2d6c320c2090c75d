//! Conformance: pause, drain and close (`docs/wire.md` §12) on `memory://`
//! and RabbitMQ.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::envelope;
use acemq::headers::HeaderValue;
use acemq::retry::RetryPolicy;
use support::{
    Broker, connect_with_classic_queue, delete_queues, eventually, on_each_target, take_one,
    wait_for_count,
};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(15);

/// Deletes the queues with a fresh connection (the test's own is closed by then).
async fn teardown(target: &Broker, q: &str) {
    let mq = Connection::connect(&target.url()).await.unwrap();
    delete_queues(&mq, q, &[]).await;
    mq.close_now().await.ok();
}

async fn ready_count(target: &Broker, q: &str, at_least: u32) -> u32 {
    let mq = Connection::connect(&target.url()).await.unwrap();
    let n = wait_for_count(&**mq.transport(), q, at_least, WAIT).await;
    mq.close_now().await.ok();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_answers_false_on_timeout_and_true_when_given_enough_time() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "drain").await;
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().concurrency(2),
                |_m: Message<u32>| async {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok(())
                },
            )
            .await
            .unwrap();
        mq.publisher::<u32>("", &q).send(&1).await.unwrap();
        eventually(WAIT, "the handler to start", || async {
            (mq.in_flight() == 1).then_some(())
        })
        .await;
        let started = Instant::now();
        assert!(
            !mq.drain_consumers(Duration::from_secs(1)).await,
            "a 3 s handler does not finish in 1 s"
        );
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(950) && took < Duration::from_millis(1800),
            "{took:?}"
        );
        assert!(mq.drain_consumers(Duration::from_secs(5)).await);
        assert_eq!(mq.in_flight(), 0);
        assert_eq!(consumer.stats().acked, 1);
        // Cancellation is an error, distinct from the timeout; consuming stays paused.
        let cancel = CancellationToken::new();
        cancel.cancel();
        let err = mq
            .drain_consumers_until(Duration::from_secs(5), &cancel)
            .await;
        assert!(matches!(err, Err(acemq::Error::Cancelled)));
        assert!(mq.is_consuming_paused());
        mq.close().await.unwrap();
        teardown(&target, &q).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_deliveries_are_counted_never_acked_and_back_on_the_queue_after_close() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "held").await;
        let handled = Arc::new(AtomicUsize::new(0));
        let h = handled.clone();
        mq.pause_consuming();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().concurrency(3).prefetch(10),
                move |_m: Message<u32>| {
                    let h = h.clone();
                    async move {
                        h.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        mq.publisher::<u32>("", &q)
            .send_all(&[1, 2, 3, 4, 5])
            .await
            .unwrap();
        let held = eventually(WAIT, "deliveries held at the gate", || async {
            (mq.held() == 3).then_some(mq.held())
        })
        .await;
        assert_eq!(held, 3, "bounded by the consumer's concurrency");
        assert_eq!(mq.in_flight(), 0);
        let started = Instant::now();
        mq.close().await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "held deliveries do not delay the close"
        );
        assert_eq!(handled.load(Ordering::SeqCst), 0);
        assert_eq!(consumer.stats().acked, 0);
        assert_eq!(
            ready_count(&target, &q, 5).await,
            5,
            "all five back on the queue"
        );
        teardown(&target, &q).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_hands_held_deliveries_over() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "resume").await;
        mq.pause_consuming();
        let consumer = mq
            .consume(&q, ConsumerOptions::default(), |_m: Message<u32>| async {
                Ok(())
            })
            .await
            .unwrap();
        mq.publisher::<u32>("", &q).send_all(&[1, 2]).await.unwrap();
        eventually(WAIT, "one held", || async {
            (mq.held() == 1).then_some(())
        })
        .await;
        mq.resume_consuming();
        eventually(WAIT, "both acked", || async {
            (consumer.stats().acked == 2).then_some(())
        })
        .await;
        assert_eq!(mq.held(), 0);
        mq.close().await.unwrap();
        teardown(&target, &q).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_cuts_a_retry_wait_short_and_requeues_with_the_attempt_unchanged() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "cut-wait").await;
        let policy = RetryPolicy::fixed(3, Duration::from_secs(20))
            .unwrap()
            .wait_in_broker_from(Duration::ZERO);
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                |_m: Message<u32>| async { Err(HandlerError::retry("down")) },
            )
            .await
            .unwrap();
        mq.publisher::<u32>("", &q).send(&7).await.unwrap();
        // The handler has failed and the delivery now waits out 20 s in the consumer.
        eventually(WAIT, "the failure", || async {
            (mq.in_flight() == 1).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        mq.close_now().await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "took {:?}",
            started.elapsed()
        );
        assert_eq!(consumer.stats().requeued_on_close, 1);
        let check = Connection::connect(&target.url()).await.unwrap();
        let d = take_one(&**check.transport(), &q, WAIT).await;
        assert_eq!(
            d.properties.headers[envelope::ATTEMPT],
            HeaderValue::I32(1),
            "attempt unchanged"
        );
        check.close_now().await.ok();
        teardown(&target, &q).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_ignoring_cancellation_is_abandoned_and_its_late_ack_is_dropped() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "abandon").await;
        let finished = Arc::new(tokio::sync::Notify::new());
        let f = finished.clone();
        let consumer = mq
            .consume(&q, ConsumerOptions::default(), move |_m: Message<u32>| {
                let f = f.clone();
                async move {
                    // Ignores its cancellation token.
                    tokio::time::sleep(Duration::from_secs(7)).await;
                    f.notify_one();
                    Ok(())
                }
            })
            .await
            .unwrap();
        mq.publisher::<u32>("", &q).send(&1).await.unwrap();
        eventually(WAIT, "the handler to start", || async {
            (mq.in_flight() == 1).then_some(())
        })
        .await;
        let started = Instant::now();
        mq.close_now().await.unwrap();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(4900) && took < Duration::from_secs(6),
            "{took:?}"
        );
        // The broker has the message back while the abandoned handler is still running.
        assert_eq!(ready_count(&target, &q, 1).await, 1);
        tokio::time::timeout(WAIT, finished.notified())
            .await
            .unwrap();
        eventually(WAIT, "the late ack to be dropped", || async {
            (consumer.stats().settle_failed == 1).then_some(())
        })
        .await;
        assert_eq!(consumer.stats().acked, 0);
        assert_eq!(
            ready_count(&target, &q, 1).await,
            1,
            "the late ack never reached the broker"
        );
        teardown(&target, &q).await;
    })
    .await;
}

/// `close()` drains running handlers for up to 20 s (README): a handler that
/// finishes within that time is waited for and acked; one that would run longer is cut
/// at 20 s (its token cancelled) and its message stays on the queue. Paused clock.
#[tokio::test(start_paused = true)]
async fn close_drains_running_handlers_for_twenty_seconds() {
    for (work, expect_close_after, expect_acked) in [
        (Duration::from_secs(12), Duration::from_secs(12), 1),
        (Duration::from_secs(60), Duration::from_secs(20), 0),
    ] {
        let name = support::unique("drain-20s");
        let mq = Connection::connect(&format!("memory://{name}"))
            .await
            .unwrap();
        let q = "orders.drain";
        support::declare_classic(&mq, q).await;
        let consumer = mq
            .consume(q, ConsumerOptions::default(), move |m: Message<u32>| async move {
                tokio::select! {
                    () = tokio::time::sleep(work) => Ok(()),
                    () = m.cancellation().cancelled() => Err(HandlerError::retry("cut short by close")),
                }
            })
            .await
            .unwrap();
        mq.publisher::<u32>("", q).send(&1).await.unwrap();
        for _ in 0..100 {
            if mq.in_flight() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(mq.in_flight(), 1, "the handler is running");
        let started = tokio::time::Instant::now();
        mq.close().await.unwrap();
        let took = started.elapsed();
        assert!(
            // (the handler started up to one 10 ms poll before the clock was read)
            took + Duration::from_millis(20) >= expect_close_after
                && took < expect_close_after + Duration::from_millis(500),
            "a {work:?} handler: close took {took:?}, expected {expect_close_after:?}"
        );
        assert_eq!(consumer.stats().acked, expect_acked, "a {work:?} handler");
        let broker = acemq::transport::memory::MemoryBroker::named(&name);
        assert_eq!(
            broker.message_count(q),
            Some(1 - u32::try_from(expect_acked).unwrap()),
            "a {work:?} handler: its message is acked, or back on the queue"
        );
    }
}

/// A message's cancellation token is its own (made on first use, a child of the consumer's):
/// a handler that cancels it cuts short nothing else. The consumer keeps consuming, the next
/// message's token is not cancelled, and both messages are acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_messages_token_cancels_nothing_else() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "own-token").await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let consumer = mq
            .consume(&q, ConsumerOptions::default(), move |m: Message<u32>| {
                let tx = tx.clone();
                async move {
                    let was_cancelled = m.cancellation().is_cancelled();
                    if *m.payload() == 1 {
                        m.cancellation().cancel();
                        assert!(m.cancellation().is_cancelled(), "the same token, cancelled");
                    }
                    tx.send((*m.payload(), was_cancelled)).ok();
                    Ok(())
                }
            })
            .await
            .unwrap();
        let publisher = mq.publisher::<u32>("", &q);
        publisher.send(&1).await.unwrap();
        let first = tokio::time::timeout(WAIT, rx.recv()).await.unwrap();
        assert_eq!(first, Some((1, false)), "a fresh token is not cancelled");
        publisher.send(&2).await.unwrap();
        let second = tokio::time::timeout(WAIT, rx.recv()).await.unwrap();
        assert_eq!(
            second,
            Some((2, false)),
            "the first message's cancel did not reach the consumer's token"
        );
        eventually(WAIT, "both messages acked", || async {
            (consumer.stats().acked == 2).then_some(())
        })
        .await;
        mq.close().await.unwrap();
        teardown(&target, &q).await;
    })
    .await;
}
