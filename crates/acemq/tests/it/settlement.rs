//! Conformance: the settlement engine on `memory://` and RabbitMQ.
//!
//! Pins what lands in which queue, with which headers, after how many handler runs: retries
//! as republishes with the attempt on the message, the rung ladder, the age limit, `.dlq`
//! for exhaustion and fatal errors, `.parked` for undecodable bodies, and the "never ack
//! into nothing" rule when the target is missing.

use crate::support;

use std::time::Duration;

use acemq::Error;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::envelope::{self, Envelope};
use acemq::headers::HeaderValue;
use acemq::retry::RetryPolicy;
use acemq::topology::rung_decl;
use acemq::transport::Properties;
use support::{
    Broker, connect_with_classic_queue, eventually, on_each_target, publish_raw, take_one, teardown,
};

use support::settle::{Seen, WAIT, header_str, send_json, settled};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_failing_k_times_runs_k_plus_one_times_with_attempts_from_the_header() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "k-failures").await;
        let seen = Seen::default();
        let s = seen.clone();
        let policy =
            RetryPolicy::exponential(5, Duration::from_millis(10), Duration::from_millis(80))
                .unwrap();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<serde_json::Value>| {
                    let s = s.clone();
                    async move {
                        s.record(&m);
                        let k: i32 = m.envelope().id().trim_start_matches('k').parse().unwrap();
                        if m.attempt() <= k {
                            Err(HandlerError::retry(format!("failure {}", m.attempt())))
                        } else {
                            Ok(())
                        }
                    }
                },
            )
            .await
            .unwrap();
        for k in 0..=4 {
            send_json(&mq, &q, &format!("k{k}")).await;
        }
        // A retry is counted once its copy is confirmed and the original acked, which can
        // be a moment after the copy was handled: wait for both counts.
        eventually(WAIT, "5 acks and 10 retries counted", || async {
            let s = consumer.stats();
            (s.acked == 5 && s.retried >= 10).then_some(())
        })
        .await;
        for k in 0..=4 {
            let expected: Vec<i32> = (1..=k + 1).collect();
            assert_eq!(seen.get(&format!("k{k}")), expected, "k = {k}");
        }
        let stats = consumer.stats();
        assert_eq!((stats.retried, stats.dead_lettered), (10, 0));
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_waits_visit_the_rung_and_exhaustion_lands_in_dlq_with_the_reason() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "ladder").await;
        let second = Duration::from_secs(1);
        let policy = RetryPolicy::fixed(3, second)
            .unwrap()
            .wait_in_broker_from(second);
        let seen = Seen::default();
        let s = seen.clone();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<serde_json::Value>| {
                    let s = s.clone();
                    async move {
                        s.record(&m);
                        Err(HandlerError::retry("payment service down"))
                    }
                },
            )
            .await
            .unwrap();
        // The consumer declared the rung with exactly the contract's arguments: an identical
        // redeclare is accepted, a different TTL or target is refused by the broker.
        let t = mq.transport();
        t.declare_queue(&rung_decl(&q, second)).await.unwrap();
        let other_ttl = rung_decl(&q, second).argument("x-message-ttl", 2000i64);
        assert!(
            t.declare_queue(&other_ttl)
                .await
                .unwrap_err()
                .is_precondition_failed()
        );
        let other_target = rung_decl(&q, second).argument("x-dead-letter-routing-key", "elsewhere");
        assert!(
            t.declare_queue(&other_target)
                .await
                .unwrap_err()
                .is_precondition_failed()
        );
        if let Broker::Amqp(_) = target {
            support::assert_rabbit_queue_arguments(
                &format!("{q}.retry.1s"),
                &[
                    ("x-dead-letter-exchange", "longstr", "acemq.retry"),
                    ("x-dead-letter-routing-key", "longstr", &q),
                    ("x-message-ttl", "long", "1000"),
                ],
            );
        }
        let started = std::time::Instant::now();
        send_json(&mq, &q, "m-ladder").await;
        let dead = take_one(&**t, &format!("{q}.dlq"), WAIT).await;
        assert!(
            started.elapsed() >= Duration::from_millis(1900),
            "two 1 s waits in the broker"
        );
        assert_eq!(seen.get("m-ladder"), vec![1, 2, 3]);
        assert_eq!(
            dead.properties.headers[envelope::ATTEMPT],
            HeaderValue::I32(3)
        );
        assert_eq!(
            header_str(&dead, envelope::ERROR),
            "exhausted 3 attempts: payment service down"
        );
        assert_eq!(dead.properties.message_id.as_deref(), Some("m-ladder"));
        assert_eq!(&dead.body[..], br#"{"id":"m-ladder"}"#);
        settled(&consumer, |s| {
            (s.retried, s.dead_lettered, s.rung_missing) == (2, 1, 0)
        })
        .await;
        consumer.close().await;
        teardown(&mq, &q, &[second]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_restarted_during_a_broker_wait_keeps_the_wait_and_the_count() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "restart").await;
        let wait = Duration::from_secs(2);
        let policy = RetryPolicy::fixed(3, wait)
            .unwrap()
            .wait_in_broker_from(Duration::from_secs(1));
        let first = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy.clone()),
                |_m: Message<serde_json::Value>| async { Err(HandlerError::retry("down")) },
            )
            .await
            .unwrap();
        send_json(&mq, &q, "m-restart").await;
        eventually(WAIT, "the first retry hop", || async {
            (first.stats().retried == 1).then_some(())
        })
        .await;
        first.close().await;
        let rung = acemq::topology::retry_queue(&q, wait);
        // Still waiting on the rung while no consumer runs (the broker holds it).
        assert_eq!(
            mq.transport()
                .inspect_queue(&rung)
                .await
                .unwrap()
                .message_count,
            1
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let second = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<serde_json::Value>| {
                    let tx = tx.clone();
                    async move {
                        tx.send(m.attempt()).ok();
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        let attempt = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(attempt, 2, "the count travelled with the message");
        second.close().await;
        teardown(&mq, &q, &[wait]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_age_limit_dead_letters_on_the_first_failure() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "age").await;
        let policy = RetryPolicy::exponential(5, Duration::from_millis(10), Duration::from_secs(1))
            .unwrap()
            .give_up_after(Duration::from_secs(120));
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                |_m: Message<serde_json::Value>| async {
                    Err(HandlerError::retry("still failing"))
                },
            )
            .await
            .unwrap();
        let mut props = Properties {
            message_id: Some("old-1".into()),
            ..Default::default()
        };
        Envelope::new("t")
            .with_id("old-1")
            .with_first_seen_millis(envelope::now_millis() - 180_000)
            .write(&mut props.headers, "test@host");
        publish_raw(&**mq.transport(), &q, props, br#"{"id":"old-1"}"#).await;
        let dead = take_one(&**mq.transport(), &format!("{q}.dlq"), WAIT).await;
        assert_eq!(
            header_str(&dead, envelope::ERROR),
            "exceeded the maximum message age of 2m: still failing"
        );
        assert_eq!(
            dead.properties.headers[envelope::ATTEMPT],
            HeaderValue::I32(1)
        );
        settled(&consumer, |s| (s.dead_lettered, s.retried) == (1, 0)).await;
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_body_is_parked_as_delivered_without_running_the_handler() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "park").await;
        let seen = Seen::default();
        let s = seen.clone();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default(),
                move |m: Message<serde_json::Value>| {
                    let s = s.clone();
                    async move {
                        s.record(&m);
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        let mut props = Properties {
            message_id: Some("bad-json".into()),
            content_type: Some("application/json".into()),
            ..Default::default()
        };
        props
            .headers
            .insert("x-custom".into(), HeaderValue::from("kept"));
        props
            .headers
            .insert(envelope::ATTEMPT.into(), HeaderValue::I32(1));
        let body = b"{not json at all \xff";
        publish_raw(&**mq.transport(), &q, props, body).await;
        let parked = take_one(&**mq.transport(), &format!("{q}.parked"), WAIT).await;
        assert_eq!(&parked.body[..], &body[..], "bytes unchanged");
        assert_eq!(header_str(&parked, "x-custom"), "kept");
        assert_eq!(
            parked.properties.headers[envelope::ATTEMPT],
            HeaderValue::I32(1)
        );
        assert!(
            header_str(&parked, envelope::ERROR).starts_with("could not be decoded: invalid JSON")
        );
        assert_eq!(parked.properties.message_id.as_deref(), Some("bad-json"));
        assert_eq!(seen.total(), 0, "the handler never ran");
        settled(&consumer, |s| s.parked == 1).await;
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dlq_leaves_the_message_in_its_queue_and_the_consumer_serving() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "no-dlq").await;
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default(),
                |m: Message<serde_json::Value>| async move {
                    if m.payload()["id"] == "bad" {
                        Err(HandlerError::fatal("unprocessable"))
                    } else {
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        mq.transport()
            .delete_queue(&format!("{q}.dlq"))
            .await
            .unwrap();
        send_json(&mq, &q, "bad").await;
        eventually(WAIT, "a failed move", || async {
            (consumer.stats().set_aside_failed >= 1).then_some(())
        })
        .await;
        send_json(&mq, &q, "good").await;
        eventually(WAIT, "the good one acked", || async {
            (consumer.stats().acked == 1).then_some(())
        })
        .await;
        consumer.close().await;
        let stats = consumer.stats();
        assert_eq!(stats.rejected, 0, "nothing counted as moved");
        let d = take_one(&**mq.transport(), &q, WAIT).await;
        assert_eq!(
            d.properties.message_id.as_deref(),
            Some("bad"),
            "the original is still there"
        );
        assert_eq!(
            mq.transport()
                .inspect_queue(&q)
                .await
                .unwrap()
                .message_count,
            0
        );
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fatal_goes_to_dlq_after_one_attempt_and_a_huge_reason_is_cut() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "fatal").await;
        let seen = Seen::default();
        let s = seen.clone();
        let policy =
            RetryPolicy::exponential(5, Duration::from_millis(10), Duration::from_millis(50))
                .unwrap();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<serde_json::Value>| {
                    let s = s.clone();
                    async move {
                        s.record(&m);
                        Err(HandlerError::fatal("x".repeat(1 << 20)))
                    }
                },
            )
            .await
            .unwrap();
        send_json(&mq, &q, "poison").await;
        let dead = take_one(&**mq.transport(), &format!("{q}.dlq"), WAIT).await;
        let reason = header_str(&dead, envelope::ERROR);
        assert!(reason.starts_with("the handler reported an unprocessable message: xxx"));
        assert!(
            reason.len() <= acemq::consume::MAX_REASON_BYTES && reason.ends_with("[truncated]")
        );
        assert_eq!(seen.get("poison"), vec![1]);
        settled(&consumer, |s| s.rejected == 1).await;
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried_and_the_consumer_survives() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "panic").await;
        let policy =
            RetryPolicy::exponential(3, Duration::from_millis(10), Duration::from_millis(50))
                .unwrap();
        let seen = Seen::default();
        let s = seen.clone();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<serde_json::Value>| {
                    let s = s.clone();
                    async move {
                        s.record(&m);
                        if m.attempt() == 1 {
                            panic!("handler bug on attempt {}", m.attempt());
                        }
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        send_json(&mq, &q, "p-1").await;
        send_json(&mq, &q, "p-2").await;
        eventually(WAIT, "both acked and both retries counted", || async {
            let s = consumer.stats();
            (s.acked == 2 && s.retried >= 2).then_some(())
        })
        .await;
        assert_eq!(seen.get("p-1"), vec![1, 2]);
        assert_eq!(seen.get("p-2"), vec![1, 2]);
        assert_eq!(consumer.stats().retried, 2);
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_message_is_retried_and_dead_lettered_like_any_other() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "raw-retry").await;
        let policy = RetryPolicy::fixed(2, Duration::from_millis(10)).unwrap();
        let seen = Seen::default();
        let s = seen.clone();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<serde_json::Value>| {
                    let s = s.clone();
                    async move {
                        s.record(&m);
                        Err(HandlerError::retry("nope"))
                    }
                },
            )
            .await
            .unwrap();
        let props = Properties {
            message_id: Some("raw-1".into()),
            ..Default::default()
        };
        publish_raw(&**mq.transport(), &q, props, br#"{"plain":true}"#).await;
        let dead = take_one(&**mq.transport(), &format!("{q}.dlq"), WAIT).await;
        assert_eq!(seen.get("raw-1"), vec![1, 2]);
        assert_eq!(
            dead.properties.headers[envelope::ATTEMPT],
            HeaderValue::I32(2)
        );
        assert_eq!(header_str(&dead, envelope::ID), "raw-1");
        assert_eq!(
            header_str(&dead, envelope::ERROR),
            "exhausted 2 attempts: nope"
        );
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_refuses_to_start_when_its_rung_exists_with_other_arguments() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "bad-rung").await;
        let delay = Duration::from_secs(60);
        let wrong = rung_decl(&q, delay).argument("x-message-ttl", 1234i64);
        mq.transport().declare_queue(&wrong).await.unwrap();
        let policy = RetryPolicy::fixed(2, delay).unwrap();
        let err = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                |_m: Message<serde_json::Value>| async { Ok(()) },
            )
            .await
            .unwrap_err();
        match err {
            Error::ConsumerTopology {
                queue,
                item,
                source,
            } => {
                assert_eq!(queue, q);
                assert_eq!(item, format!("queue {q}.retry.1m"));
                assert!(source.is_precondition_failed(), "{source}");
            }
            other => panic!("expected a topology refusal, got {other}"),
        }
        teardown(&mq, &q, &[delay]).await;
    })
    .await;
}

/// With no retry policy, a failing message is retried every 5 s (README), and
/// never dead-lettered. On a paused clock the gaps are exactly the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rung_deleted_under_a_running_consumer_is_counted_waited_in_the_consumer_and_nothing_lands_in_dlq()
 {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "rung-gone").await;
        let second = Duration::from_secs(1);
        let policy = RetryPolicy::fixed(3, second)
            .unwrap()
            .wait_in_broker_from(second);
        let seen = Seen::default();
        let s = seen.clone();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy),
                move |m: Message<serde_json::Value>| {
                    let s = s.clone();
                    async move {
                        if s.record(&m) == 1 {
                            return Err(HandlerError::retry("first try fails"));
                        }
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        // The consumer declared its rung; someone deletes it while the consumer runs.
        let t = mq.transport();
        let rung = acemq::topology::retry_queue(&q, second);
        t.inspect_queue(&rung)
            .await
            .expect("the consumer declared its rung");
        t.delete_queue(&rung).await.unwrap();
        let started = std::time::Instant::now();
        send_json(&mq, &q, "m-rung-gone").await;
        // The hop to the missing rung is counted, and the delivery is held in the consumer
        // for the wait (in flight, not in any queue).
        settled(&consumer, |s| s.rung_missing == 1).await;
        assert_eq!(consumer.in_flight(), 1, "the wait is spent in the consumer");
        settled(&consumer, |s| s.acked == 1 && s.retried >= 1).await;
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "the 1 s wait was served in the consumer, took {:?}",
            started.elapsed()
        );
        assert_eq!(
            seen.get("m-rung-gone"),
            vec![1, 2],
            "retried once, attempt advanced"
        );
        let s = consumer.stats();
        assert_eq!(
            (
                s.rung_missing,
                s.retried,
                s.acked,
                s.dead_lettered,
                s.set_aside_failed
            ),
            (1, 1, 1, 0, 0),
            "{s:?}"
        );
        assert_eq!(
            t.inspect_queue(&format!("{q}.dlq"))
                .await
                .unwrap()
                .message_count,
            0,
            "nothing lands in .dlq"
        );
        assert!(
            t.inspect_queue(&rung).await.is_err(),
            "the rung stays deleted"
        );
        assert_eq!(t.inspect_queue(&q).await.unwrap().message_count, 0);
        consumer.close().await;
        teardown(&mq, &q, &[second]).await;
    })
    .await;
}
