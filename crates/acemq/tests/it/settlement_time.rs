//! Settlement on a paused clock, on `memory://`: the 5 s retry without a policy and a
//! six-hour exponential ladder that runs its rungs (by TTL expiry) to `.dlq` in virtual time.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::headers::HeaderValue;
use acemq::retry::RetryPolicy;
use acemq::topology::{QueueDecl, retry_queue};
use support::settle::{Seen, WAIT, send_json};
use support::{take_one, unique};

#[tokio::test(start_paused = true)]
async fn with_no_policy_a_failure_is_retried_every_five_seconds() {
    let mq = Connection::connect(&format!("memory://{}", unique("no-policy")))
        .await
        .unwrap();
    let q = "orders.no-policy";
    mq.transport()
        .declare_queue(&QueueDecl::classic(q))
        .await
        .unwrap();
    let runs: Arc<Mutex<Vec<(i32, tokio::time::Instant)>>> = Arc::default();
    let r = runs.clone();
    let consumer = mq
        .consume(
            q,
            ConsumerOptions::default(),
            move |m: Message<serde_json::Value>| {
                let r = r.clone();
                async move {
                    let mut runs = r.lock().unwrap();
                    runs.push((m.attempt(), tokio::time::Instant::now()));
                    if runs.len() < 4 {
                        Err(HandlerError::retry("not yet"))
                    } else {
                        Ok(())
                    }
                }
            },
        )
        .await
        .unwrap();
    send_json(&mq, q, "no-policy-1").await;
    // Poll in virtual 100 ms steps (each poll is itself a timer on the paused clock).
    for _ in 0..1000 {
        if consumer.stats().acked == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = consumer.stats();
    assert_eq!((stats.acked, stats.retried), (1, 3), "{stats:?}");
    assert_eq!(stats.dead_lettered, 0);
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        runs.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        vec![1, 2, 3, 4],
        "each retry is the next attempt"
    );
    for pair in runs.windows(2) {
        let gap = pair[1].1 - pair[0].1;
        assert!(
            gap >= Duration::from_secs(5) && gap < Duration::from_millis(5200),
            "retried after {gap:?}, not 5 s"
        );
    }
    assert_eq!(
        mq.transport()
            .inspect_queue(&format!("{q}.dlq"))
            .await
            .unwrap()
            .message_count,
        0,
        "nothing dead-lettered"
    );
    consumer.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_six_hour_ladder_runs_to_dlq_in_well_under_a_second_on_a_paused_clock() {
    let wall = std::time::Instant::now();
    let mq = Connection::connect(&format!("memory://{}", unique("paused-ladder")))
        .await
        .unwrap();
    let q = "orders.paused";
    mq.transport()
        .declare_queue(&QueueDecl::classic(q))
        .await
        .unwrap();
    let policy = RetryPolicy::exponential(
        5,
        Duration::from_secs(45 * 60),
        Duration::from_secs(6 * 3600),
    )
    .unwrap();
    assert_eq!(
        policy.broker_rungs().len(),
        4,
        "every wait is on a rung: {policy}"
    );
    let rungs = policy.broker_rungs();
    let ladder: Duration = rungs.iter().sum();
    let virtual_start = tokio::time::Instant::now();
    let seen = Seen::default();
    let s = seen.clone();
    let consumer = mq
        .consume(
            q,
            ConsumerOptions::default().retry(policy),
            move |m: Message<serde_json::Value>| {
                let s = s.clone();
                async move {
                    s.record(&m);
                    Err(HandlerError::retry("never works"))
                }
            },
        )
        .await
        .unwrap();
    send_json(&mq, q, "slow-1").await;
    // Poll in virtual minutes: a 10 ms poll would itself be the next timer and crawl.
    let dlq = format!("{q}.dlq");
    let mut dead = 0;
    for _ in 0..(24 * 60) {
        dead = mq
            .transport()
            .inspect_queue(&dlq)
            .await
            .unwrap()
            .message_count;
        if dead > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    assert_eq!(dead, 1);
    assert_eq!(seen.get("slow-1"), vec![1, 2, 3, 4, 5]);
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "took {:?} of wall time",
        wall.elapsed()
    );
    // The ladder's time was spent (in virtual time): at least the sum of its delays, and
    // not much more than that plus one poll.
    let spent = virtual_start.elapsed();
    assert!(
        spent >= ladder && spent <= ladder + Duration::from_secs(5 * 60),
        "virtual time spent {spent:?}, the ladder sums to {ladder:?}"
    );
    // The waits were spent on the rungs: the dead letter carries one `x-death` entry per
    // rung queue (reason `expired`, once each), which only the broker's TTL expiry writes.
    let d = take_one(&**mq.transport(), &dlq, WAIT).await;
    let deaths = d
        .properties
        .headers
        .get("x-death")
        .and_then(HeaderValue::as_array)
        .expect("x-death on the dead letter: it went through the rungs");
    let mut visited: Vec<(String, String, i64)> = deaths
        .iter()
        .map(|entry| {
            let t = entry.as_table().expect("x-death entries are tables");
            (
                t["queue"].as_str().unwrap_or_default().to_owned(),
                t["reason"].as_str().unwrap_or_default().to_owned(),
                t["count"].as_i64().unwrap_or_default(),
            )
        })
        .collect();
    visited.sort();
    let mut want: Vec<(String, String, i64)> = rungs
        .iter()
        .map(|delay| (retry_queue(q, *delay), "expired".to_owned(), 1))
        .collect();
    want.sort();
    assert_eq!(visited, want, "each rung visited once, by TTL expiry");
    consumer.close().await;
}
