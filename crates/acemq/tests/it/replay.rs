//! Conformance: replay of dead letters and parked messages (wire.md §7) on
//! `memory://` and RabbitMQ.

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use acemq::Connection;
use acemq::envelope::{self, Envelope};
use acemq::headers::HeaderValue;
use acemq::transport::{Delivery, Outbound, Properties, Transport};
use support::{
    Broker, connect_with_classic_queue, declare_classic, on_each_target, teardown, wait_for_count,
};

const WAIT: Duration = Duration::from_secs(20);

async fn setup(target: &Broker, prefix: &str) -> (Connection, String) {
    let (mq, q) = connect_with_classic_queue(target, prefix).await;
    for name in [format!("{q}.dlq"), format!("{q}.parked")] {
        declare_classic(&mq, &name).await;
    }
    (mq, q)
}

/// Puts `n` dead letters into `{q}.dlq` the way the engine writes them.
async fn dead_letters(t: &dyn Transport, q: &str, n: usize, attempt: i32, first_seen: i64) {
    let mut confirms = Vec::with_capacity(n);
    for i in 0..n {
        let mut props = Properties {
            message_id: Some(format!("dl-{i}")),
            content_type: Some("application/json".into()),
            delivery_mode: Some(2),
            ..Default::default()
        };
        Envelope::new("order.placed")
            .with_id(format!("dl-{i}"))
            .with_attempt(attempt)
            .with_first_seen_millis(first_seen)
            .with_error(Some(format!("exhausted {attempt} attempts: boom {i}")))
            .write(&mut props.headers, "java@host");
        props.headers.insert(
            "x-tenant".into(),
            HeaderValue::from(if i % 2 == 0 { "even" } else { "odd" }),
        );
        let body = format!("{{\"n\":{i}}}").into_bytes();
        confirms.push(
            t.publish(Outbound::new("", format!("{q}.dlq"), props, body))
                .await
                .unwrap(),
        );
    }
    for c in confirms {
        c.await.unwrap();
    }
}

async fn drain(t: &dyn Transport, queue: &str) -> Vec<Delivery> {
    let mut out = Vec::new();
    while let Some(d) = t.get(queue).await.unwrap() {
        d.acker.ack().await.unwrap();
        out.push(d);
    }
    out
}

fn int(d: &Delivery, name: &str) -> i64 {
    d.properties
        .headers
        .get(name)
        .and_then(HeaderValue::as_i64)
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_a_thousand_dead_letters_puts_each_back_once_with_provenance() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-all").await;
        let t = mq.transport();
        let first_seen = 1_767_323_045_678;
        dead_letters(&**t, &q, 1000, 5, first_seen).await;
        let replay = mq.replay(&q);
        assert_eq!(
            wait_for_count(&**t, replay.from_queue(), 1000, WAIT).await,
            1000
        );
        assert_eq!(replay.pending().await.unwrap(), 1000);
        let report = replay.replay_all().await.unwrap();
        assert_eq!((report.replayed, report.declined), (1000, 0));
        assert_eq!(replay.pending().await.unwrap(), 0);
        wait_for_count(&**t, &q, 1000, WAIT).await;
        let back = drain(&**t, &q).await;
        assert_eq!(back.len(), 1000);
        let ids: HashSet<_> = back
            .iter()
            .map(|d| d.properties.message_id.clone().unwrap())
            .collect();
        assert_eq!(ids.len(), 1000, "each once");
        for d in &back {
            let id = d.properties.message_id.as_deref().unwrap();
            let n: usize = id.trim_start_matches("dl-").parse().unwrap();
            assert_eq!(
                &d.body[..],
                format!("{{\"n\":{n}}}").as_bytes(),
                "body byte for byte"
            );
            assert_eq!(
                d.properties.headers[envelope::ATTEMPT],
                HeaderValue::I32(1),
                "attempt reset"
            );
            assert_eq!(
                int(d, envelope::FIRST_SEEN),
                first_seen,
                "first-seen unchanged"
            );
            assert_eq!(
                d.properties.headers[envelope::REPLAYED_FROM],
                HeaderValue::from(format!("{q}.dlq"))
            );
            assert_eq!(
                d.properties.headers[envelope::REPLAY_COUNT],
                HeaderValue::I32(1)
            );
            let at = d.properties.headers[envelope::REPLAYED_AT]
                .as_str()
                .unwrap();
            assert!(
                at.ends_with('Z') && at.len() == 24,
                "RFC 3339 with millis: {at}"
            );
            assert!(
                d.properties.headers.contains_key(envelope::ERROR),
                "x-acemq-error kept (Java's choice)"
            );
            assert_eq!(
                d.properties.content_type.as_deref(),
                Some("application/json")
            );
            assert_eq!(d.exchange, "", "through the default exchange");
            let env = Envelope::read(&d.properties, &d.routing_key);
            assert_eq!(env.replay_count(), 1);
            assert_eq!(env.replayed_from(), Some(format!("{q}.dlq").as_str()));
        }
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_replay_moves_exactly_that_many_and_keeping_attempts_keeps_the_count() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-50").await;
        let t = mq.transport();
        dead_letters(&**t, &q, 120, 4, 1).await;
        wait_for_count(&**t, &format!("{q}.dlq"), 120, WAIT).await;
        let report = mq.replay(&q).replay(50).await.unwrap();
        assert_eq!(report.replayed, 50);
        assert_eq!(mq.replay(&q).pending().await.unwrap(), 70);
        assert_eq!(wait_for_count(&**t, &q, 50, WAIT).await, 50);
        let report = mq.replay(&q).keeping_attempts().replay(10).await.unwrap();
        assert_eq!(report.replayed, 10);
        wait_for_count(&**t, &q, 60, WAIT).await;
        let back = drain(&**t, &q).await;
        let kept = back
            .iter()
            .filter(|d| d.properties.headers[envelope::ATTEMPT] == HeaderValue::I32(4))
            .count();
        let reset = back
            .iter()
            .filter(|d| d.properties.headers[envelope::ATTEMPT] == HeaderValue::I32(1))
            .count();
        assert_eq!((reset, kept), (50, 10));
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_replays_what_it_accepts_and_returns_the_rest_together() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-filter").await;
        let t = mq.transport();
        dead_letters(&**t, &q, 20, 3, 1).await;
        wait_for_count(&**t, &format!("{q}.dlq"), 20, WAIT).await;
        let report = mq
            .replay(&q)
            .replay_matching(usize::MAX, |dl| {
                dl.headers.get("x-tenant") == Some(&HeaderValue::from("even"))
            })
            .await
            .unwrap();
        assert_eq!((report.replayed, report.declined), (10, 10));
        assert_eq!(
            wait_for_count(&**t, &format!("{q}.dlq"), 10, WAIT).await,
            10
        );
        let left = drain(&**t, &format!("{q}.dlq")).await;
        assert!(
            left.iter()
                .all(|d| d.properties.headers["x-tenant"] == HeaderValue::from("odd"))
        );
        assert_eq!(drain(&**t, &q).await.len(), 10);
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_parked_messages_and_replaying_into_a_missing_queue() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-parked").await;
        let t = mq.transport();
        let props = Properties {
            message_id: Some("p-1".into()),
            ..Default::default()
        };
        t.publish(Outbound::new(
            "",
            format!("{q}.parked"),
            props,
            b"\x00raw bytes".to_vec(),
        ))
        .await
        .unwrap()
        .await
        .unwrap();
        let parked = mq.replay(&q).parked();
        assert_eq!(parked.from_queue(), format!("{q}.parked"));
        assert_eq!(parked.replay_all().await.unwrap().replayed, 1);
        let back = drain(&**t, &q).await;
        assert_eq!(&back[0].body[..], b"\x00raw bytes");
        assert_eq!(
            back[0].properties.headers[envelope::REPLAYED_FROM],
            HeaderValue::from(format!("{q}.parked"))
        );

        // The destination is gone: the replay fails and the dead letter stays put.
        dead_letters(&**t, &q, 1, 5, 1).await;
        wait_for_count(&**t, &format!("{q}.dlq"), 1, WAIT).await;
        t.delete_queue(&q).await.unwrap();
        let err = mq.replay(&q).replay_all().await.unwrap_err();
        assert!(
            matches!(&err, acemq::Error::Transport(e) if e.is_not_found()),
            "{err}"
        );
        assert_eq!(wait_for_count(&**t, &format!("{q}.dlq"), 1, WAIT).await, 1);
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_killed_half_way_loses_nothing() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-kill").await;
        dead_letters(&**mq.transport(), &q, 1000, 2, 1).await;
        wait_for_count(&**mq.transport(), &format!("{q}.dlq"), 1000, WAIT).await;
        // The pass stops at its 501st message until the test has killed it: the kill lands
        // half-way on any transport, however fast (on memory:// a whole pass takes a few
        // milliseconds, less than one poll).
        let (at_gate_tx, mut at_gate) = tokio::sync::mpsc::unbounded_channel();
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let mut calls = 0usize;
        let replay = mq.replay(&q);
        let task = tokio::spawn(async move {
            replay
                .replay_matching(usize::MAX, move |_| {
                    calls += 1;
                    if calls == 501 {
                        at_gate_tx.send(()).ok();
                        gate.recv().ok();
                    }
                    true
                })
                .await
        });
        wait_for_count(&**mq.transport(), &q, 100, WAIT).await;
        tokio::time::timeout(WAIT, at_gate.recv())
            .await
            .expect("the pass reaches its 501st message")
            .expect("gate signal");
        task.abort();
        drop(release);
        let ended = task.await;
        assert!(
            ended.as_ref().is_err_and(|e| e.is_cancelled()),
            "the pass was killed, not finished: {ended:?}"
        );
        // Whatever the pass held unacked goes back when its connection closes.
        mq.close().await.unwrap();
        let mq = Connection::connect(&target.url()).await.unwrap();
        let t = mq.transport();
        let mut ids = HashSet::new();
        let mut replayed = HashSet::new();
        let mut waiting = HashSet::new();
        for queue in [q.clone(), format!("{q}.dlq")] {
            for d in drain(&**t, &queue).await {
                let id = d.properties.message_id.clone().unwrap();
                if queue == q {
                    replayed.insert(id.clone());
                } else {
                    waiting.insert(id.clone());
                }
                ids.insert(id);
            }
        }
        // The kill landed mid-way: at least the 500 before the gate were replayed, and the
        // rest of the thousand were not yet.
        assert!(
            (500..1000).contains(&replayed.len()),
            "replayed before the kill: {}",
            replayed.len()
        );
        assert!(
            !waiting.is_empty() && waiting.len() <= 500,
            "still dead-lettered after the kill: {}",
            waiting.len()
        );
        assert_eq!(
            ids.len(),
            1000,
            "every message is in one queue or the other"
        );
        teardown(&mq, &q, &[]).await;
    })
    .await;
}
