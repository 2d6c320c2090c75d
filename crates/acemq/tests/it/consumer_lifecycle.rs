//! One consumer's life on `memory://` and RabbitMQ: closing it while its handler works lets
//! the handler's move finish and leaves the rest of the connection working; a consumer the
//! broker cancels (its queue deleted) shows up in health as Degraded, not silently gone.

use crate::support;

use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::health::HealthStatus;
use acemq::topology::QueueDecl;
use support::{Broker, eventually, on_each_target, unique, wait_for_count};

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_one_consumer_lets_its_handler_finish_its_move_and_the_rest_keeps_working() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let (q1, q2) = (unique("close-one"), unique("close-other"));
        for q in [&q1, &q2] {
            mq.transport()
                .declare_queue(&QueueDecl::classic(q.as_str()))
                .await
                .unwrap();
        }
        let started = std::sync::Arc::new(tokio::sync::Notify::new());
        let s = started.clone();
        let first = mq
            .consume(&q1, ConsumerOptions::default(), move |_m: Message<u32>| {
                let s = s.clone();
                async move {
                    s.notify_one();
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    Err(HandlerError::fatal("unprocessable"))
                }
            })
            .await
            .unwrap();
        let second = mq
            .consume(&q2, ConsumerOptions::default(), |_m: Message<u32>| async {
                Ok(())
            })
            .await
            .unwrap();
        mq.publisher::<u32>("", &q1).send(&1).await.unwrap();
        tokio::time::timeout(WAIT, started.notified())
            .await
            .unwrap();
        assert_eq!(first.in_flight(), 1, "its handler is running");
        first.close().await;
        // close() returned after the handler did, with its move to .dlq confirmed and acked.
        assert_eq!(first.stats().rejected, 1);
        assert_eq!(
            wait_for_count(&**mq.transport(), &format!("{q1}.dlq"), 1, WAIT).await,
            1
        );
        assert_eq!(
            mq.transport()
                .inspect_queue(&q1)
                .await
                .unwrap()
                .message_count,
            0
        );
        // The other consumer, and publishing, go on.
        mq.publisher::<u32>("", &q2).send(&2).await.unwrap();
        eventually(WAIT, "the other consumer to ack", || async {
            (second.stats().acked == 1).then_some(())
        })
        .await;
        second.close().await;
        for q in [&q1, &q2] {
            for s in ["", ".dlq", ".parked"] {
                let _ = mq.transport().delete_queue(&format!("{q}{s}")).await;
            }
        }
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_the_broker_cancels_is_reported_degraded() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let q = unique("cancelled");
        mq.transport()
            .declare_queue(&QueueDecl::classic(&q))
            .await
            .unwrap();
        let _consumer = mq
            .consume(&q, ConsumerOptions::default(), |_m: Message<u32>| async {
                Ok(())
            })
            .await
            .unwrap();
        let report = mq.health();
        assert_eq!(report.report("consumers").unwrap().status, HealthStatus::Up);
        assert_eq!(report.report("consumers").unwrap().details["running"], 1);
        mq.transport().delete_queue(&q).await.unwrap();
        let health = eventually(WAIT, "the stopped consumer in health", || async {
            let h = mq.health();
            (h.report("consumers").unwrap().status == HealthStatus::Degraded).then_some(h)
        })
        .await;
        assert_eq!(
            health.status,
            HealthStatus::Degraded,
            "Degraded, not Down: the connection is fine"
        );
        assert_eq!(health.report("acemq").unwrap().status, HealthStatus::Up);
        let consumers = health.report("consumers").unwrap();
        assert!(
            consumers
                .detail(&format!("stopped.{q}"))
                .unwrap()
                .contains("ended the subscription")
        );
        // Since recovery the consumer keeps running: it re-subscribes with
        // backoff and resumes when the queue is declared again (tests/recovery_consumers.rs).
        assert_eq!(consumers.details["running"], 1);
        for s in [".dlq", ".parked"] {
            let _ = mq.transport().delete_queue(&format!("{q}{s}")).await;
        }
        mq.close().await.ok();
    })
    .await;
}
