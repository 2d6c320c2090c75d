//! Helpers shared by the transport conformance suites (`transport_*.rs`): small publish,
//! declare, bind, drain and subscription helpers over the raw [`Transport`] trait.
#![allow(dead_code)]

use std::time::Duration;

use acemq::headers::Headers;
use acemq::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl};
use acemq::transport::{Confirmation, Delivery, Outbound, Properties, Subscription, Transport};

use crate::support::{body, publish_confirmed};

pub const WAIT: Duration = Duration::from_secs(10);

pub async fn publish(t: &dyn Transport, exchange: &str, key: &str, text: &str) -> Confirmation {
    publish_confirmed(
        t,
        Outbound::new(exchange, key, Properties::default(), text.to_owned()),
    )
    .await
}

/// A transient classic queue (nothing left on disk if a case fails half-way).
pub async fn queue(t: &dyn Transport, name: &str) {
    t.declare_queue(&QueueDecl::classic(name).transient())
        .await
        .expect("declare queue");
}

pub async fn exchange(t: &dyn Transport, name: &str, kind: ExchangeKind) {
    let mut d = ExchangeDecl::durable(name, kind);
    d.durable = false;
    t.declare_exchange(&d).await.expect("declare exchange");
}

pub async fn bind(t: &dyn Transport, queue: &str, exchange: &str, key: &str) {
    t.bind_queue(&BindingDecl::new(queue, exchange, key))
        .await
        .expect("bind");
}

/// Takes every ready message with basic.get and acks it; returns the bodies in order.
pub async fn drain(t: &dyn Transport, q: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(d) = t.get(q).await.expect("basic.get") {
        out.push(body(&d));
        d.acker.ack().await.expect("ack");
    }
    out
}

pub async fn cleanup(t: &dyn Transport, queues: &[&str], exchanges: &[&str]) {
    for q in queues {
        t.delete_queue(q).await.expect("delete queue");
    }
    for x in exchanges {
        t.delete_exchange(x).await.expect("delete exchange");
    }
}

pub async fn next(sub: &mut Box<dyn Subscription>) -> Delivery {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a delivery within the timeout")
        .expect("the subscription is still open")
        .expect("a delivery, not an error")
}

/// Asserts nothing more is delivered for a short while (a negative check has to wait).
pub async fn nothing_more(sub: &mut Box<dyn Subscription>) {
    if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
        panic!("unexpected delivery {} (tag {})", body(&d), d.delivery_tag);
    }
}

pub fn x_death(d: &Delivery) -> Headers {
    d.properties.headers["x-death"]
        .as_array()
        .expect("x-death is an array")[0]
        .as_table()
        .expect("x-death entries are tables")
        .clone()
}

pub fn count_of(t: &Headers) -> i64 {
    t["count"].as_i64().expect("count is an integer")
}

pub fn str_of<'a>(t: &'a Headers, k: &str) -> &'a str {
    t[k].as_str()
        .unwrap_or_else(|| panic!("{k} is a string: {t:?}"))
}
