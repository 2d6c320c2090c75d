//! Helpers shared by the settlement test files: who saw which attempts, waiting for a
//! consumer's counters, publishing a JSON message with an id, reading a header.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::Message;
use acemq::headers::HeaderValue;
use acemq::transport::Delivery;

use super::eventually;

pub const WAIT: Duration = Duration::from_secs(15);

/// Attempts each message id was handled with, in order.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<HashMap<String, Vec<i32>>>>);

impl Seen {
    pub fn record(&self, m: &Message<serde_json::Value>) -> usize {
        let mut map = self.0.lock().unwrap();
        let runs = map.entry(m.envelope().id().to_owned()).or_default();
        runs.push(m.attempt());
        runs.len()
    }
    pub fn get(&self, id: &str) -> Vec<i32> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }
    pub fn total(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }
}

/// Waits until the consumer's counters satisfy `check` (the copy can be read from its
/// queue a moment before the original is acked and counted).
pub async fn settled(
    consumer: &acemq::consume::Consumer,
    check: impl Fn(&acemq::consume::ConsumerStats) -> bool,
) {
    eventually(WAIT, "the consumer's counters", || async {
        check(&consumer.stats()).then_some(())
    })
    .await;
}

pub async fn send_json(mq: &Connection, q: &str, id: &str) {
    mq.publisher::<serde_json::Value>("", q)
        .send_with(
            &serde_json::json!({"id": id}),
            acemq::publish::SendOptions::new().message_id(id),
        )
        .await
        .unwrap();
}

pub fn header_str(d: &Delivery, name: &str) -> String {
    d.properties
        .headers
        .get(name)
        .and_then(HeaderValue::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// A consumer of `q` under `policy` whose handler records each run in the [`Seen`] it
/// returns and always fails with a retryable error.
pub async fn consume_always_failing(
    mq: &Connection,
    q: &str,
    policy: acemq::retry::RetryPolicy,
) -> (acemq::consume::Consumer, Seen) {
    let seen = Seen::default();
    let s = seen.clone();
    let consumer = mq
        .consume(
            q,
            acemq::consume::ConsumerOptions::default()
                .prefetch(20)
                .retry(policy),
            move |m: Message<serde_json::Value>| {
                let s = s.clone();
                async move {
                    s.record(&m);
                    Err::<(), _>(acemq::consume::HandlerError::retry("always fails"))
                }
            },
        )
        .await
        .unwrap();
    (consumer, seen)
}

/// What [`assert_runs_equal_attempts`] expects of each message: its handler runs, one per
/// attempt, and how many messages may have one retry hop delivered twice.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub attempts: i32,
    pub duplicated_hops: u32,
}

/// Waits until the messages `ids` of `q` have all ended in `{q}.dlq` and nothing of them
/// is left anywhere (the consumer holds none, `q` is empty), then asserts each one's
/// handler ran exactly `expected.attempts` times, with attempts 1..=attempts, and `{q}.dlq` holds
/// exactly one copy of each — except for at most `expected.duplicated_hops` messages whose runs
/// repeat a tail of their attempts once (a retry hop delivered twice: `[1, 2, 3, 2, 3]`),
/// each with one extra copy in `{q}.dlq`.
pub async fn assert_runs_equal_attempts(
    t: &dyn acemq::transport::Transport,
    consumer: &acemq::consume::Consumer,
    seen: &Seen,
    q: &str,
    ids: &[String],
    expected: Expected,
    timeout: Duration,
) {
    let Expected {
        attempts,
        duplicated_hops,
    } = expected;
    let dlq = format!("{q}.dlq");
    let n = u32::try_from(ids.len()).unwrap();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut state = (0, 0, 0);
    while tokio::time::Instant::now() < deadline {
        let dead = t.inspect_queue(&dlq).await.map_or(0, |i| i.message_count);
        let left = t.inspect_queue(q).await.map_or(0, |i| i.message_count);
        state = (dead, left, consumer.in_flight());
        if dead >= n && left == 0 && consumer.in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "observed: (dead letters, left in {q}, in flight) = {state:?}; {:?}; {:?}",
        consumer.stats(),
        consumer.moves()
    );
    let runs: Vec<(String, Vec<i32>)> = ids.iter().map(|id| (id.clone(), seen.get(id))).collect();
    eprintln!(
        "observed: {} handler runs for {} messages: {runs:?}",
        seen.total(),
        ids.len()
    );
    let want: Vec<i32> = (1..=attempts).collect();
    let mut duplicated = 0;
    for (id, got) in &runs {
        let hop_twice = got.len() > want.len()
            && got.starts_with(&want)
            && want.ends_with(&got[want.len()..])
            && got[want.len()] > 1;
        if hop_twice && duplicated < duplicated_hops {
            duplicated += 1;
            eprintln!("observed: {id} had one retry hop delivered twice: {got:?}");
            continue;
        }
        assert_eq!(got, &want, "{id}: one run per attempt");
    }
    assert_eq!(
        t.inspect_queue(&dlq).await.unwrap().message_count,
        n + duplicated,
        "one dead letter each (and one per duplicated hop)"
    );
}
