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
