//! The scheduler restart drill: messages waiting on the scheduler's rungs (classic,
//! durable, persistent messages) when the broker's application stops; after `start_app`
//! every one of them is delivered, none before its due time. Rung TTLs do not run while the
//! node is down, so messages due during the outage arrive late, not lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};

use super::broker::AppStopped;

/// Messages scheduled before the stop.
pub const SCHEDULED: u32 = 20;
/// How long the node stays down.
const OUTAGE: Duration = Duration::from_secs(5);
/// How long after `start_app` every message must have arrived.
const DELIVERED_WITHIN: Duration = Duration::from_secs(90);

/// Runs the drill; returns the accounting line after asserting lost = 0 and none early.
pub async fn run(mq: &Connection, node: Option<String>) -> String {
    let q = crate::support::unique("drill.schedule");
    crate::support::declare_classic(mq, &q).await;
    let scheduler = mq.scheduler().await.expect("the scheduler starts");
    // id → due time (epoch ms): due from 3 s to 12.5 s ahead, so some fall due during
    // the outage and some after it.
    let mut due = HashMap::new();
    for n in 0..SCHEDULED {
        let delay = Duration::from_millis(3_000 + u64::from(n) * 500);
        let at = acemq::envelope::now_millis() + i64::try_from(delay.as_millis()).unwrap_or(0);
        let id = scheduler.after(delay, "", &q, &n).await.expect("scheduled");
        due.insert(id, at);
    }
    let seen: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let s = seen.clone();
    let consumer = mq
        .consume(&q, ConsumerOptions::default(), move |m: Message<u32>| {
            let s = s.clone();
            async move {
                let at = acemq::envelope::now_millis();
                s.lock().unwrap().push((m.envelope().id().to_owned(), at));
                Ok(())
            }
        })
        .await
        .expect("the destination consumer starts");
    let stopped = tokio::task::spawn_blocking(move || AppStopped::stop(node.as_deref()))
        .await
        .expect("stop task")
        .expect("rabbitmqctl stop_app");
    tokio::time::sleep(OUTAGE).await; // the outage itself
    let took = stopped.start_async().await.expect("rabbitmqctl start_app");
    eprintln!("drill schedule-restart: start_app took {took:?}");
    let deadline = tokio::time::Instant::now() + DELIVERED_WITHIN;
    loop {
        let arrived: std::collections::HashSet<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|(id, _)| id.clone())
            .collect();
        if due.keys().all(|id| arrived.contains(id)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "drill schedule-restart: {} of {SCHEDULED} scheduled messages arrived within {DELIVERED_WITHIN:?} of start_app",
            arrived.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = seen.lock().unwrap().clone();
    let early: Vec<_> = seen
        .iter()
        .filter(|(id, at)| due.get(id).is_some_and(|d| at < d))
        .collect();
    assert!(
        early.is_empty(),
        "delivered before their due time: {early:?}"
    );
    let duplicates = seen.len() - due.len();
    let line = format!(
        "drill schedule-restart: scheduled={SCHEDULED} delivered={} lost=0 duplicates={duplicates} early=0",
        due.len()
    );
    eprintln!("{line}");
    consumer.close().await;
    scheduler.close().await;
    let _ = mq.transport().delete_queue(&q).await;
    line
}
