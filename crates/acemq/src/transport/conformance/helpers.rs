//! Small publish, declare, bind, drain and subscription helpers over the raw [`Transport`]
//! trait, shared by the cases. They panic on failure, as the assertions around them do.
//! [`unique`], [`eventually`], [`wait_for_count`] and [`publish_confirmed`] are public (at
//! [`super`]'s root), for tests of your own beside the cases.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::headers::Headers;
use crate::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl};
use crate::transport::{
    Confirmation, ConsumeSpec, Delivery, Outbound, Properties, Subscription, Transport,
};

/// How long a case waits for something that must happen.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// A name no other case, test or earlier run uses: `acemq-test.{prefix}.{pid}.{n}.{nanos}`.
///
/// ```
/// let (a, b) = (acemq::transport::conformance::unique("q"), acemq::transport::conformance::unique("q"));
/// assert!(a.starts_with("acemq-test.q."));
/// assert_ne!(a, b);
/// ```
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "acemq-test.{prefix}.{}.{}.{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Polls `check` every 10 ms until it returns `Some`, and returns its value; panics with
/// `what` after `timeout`.
///
/// ```
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut n = 0;
/// let got = acemq::transport::conformance::eventually(Duration::from_secs(1), "n to reach 3", || {
///     n += 1;
///     let now = n;
///     async move { (now >= 3).then_some(now) }
/// })
/// .await;
/// assert_eq!(got, 3);
/// # }
/// ```
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until a queue holds at least `n` ready messages; returns the count. Panics after
/// `timeout`.
pub async fn wait_for_count(t: &dyn Transport, queue: &str, n: u32, timeout: Duration) -> u32 {
    eventually(
        timeout,
        &format!("{queue} to hold {n} messages"),
        || async {
            match t.inspect_queue(queue).await {
                Ok(info) if info.message_count >= n => Some(info.message_count),
                _ => None,
            }
        },
    )
    .await
}

/// Publishes `m` and waits for its confirmation; panics when either fails.
pub async fn publish_confirmed(t: &dyn Transport, m: Outbound) -> Confirmation {
    t.publish(m)
        .await
        .expect("publish handed over")
        .await
        .expect("publish confirmed")
}

/// A mandatory publish of `text` and its confirmation.
pub(crate) async fn publish(
    t: &dyn Transport,
    exchange: &str,
    key: &str,
    text: &str,
) -> Confirmation {
    publish_confirmed(
        t,
        Outbound::new(exchange, key, Properties::default(), text.to_owned()),
    )
    .await
}

/// A non-exclusive subscription to `queue` with a broker-chosen consumer tag.
pub(crate) fn spec(queue: &str, prefetch: u16) -> ConsumeSpec {
    ConsumeSpec {
        queue: queue.to_owned(),
        prefetch,
        consumer_tag: String::new(),
        exclusive: false,
        arguments: Default::default(),
    }
}

/// A delivery's body as text.
pub(crate) fn body(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.body).into_owned()
}

/// A transient classic queue (nothing left on disk if a case fails half-way).
pub(crate) async fn queue(t: &dyn Transport, name: &str) {
    t.declare_queue(&QueueDecl::classic(name).transient())
        .await
        .expect("declare queue");
}

/// A transient exchange.
pub(crate) async fn exchange(t: &dyn Transport, name: &str, kind: ExchangeKind) {
    let mut d = ExchangeDecl::durable(name, kind);
    d.durable = false;
    t.declare_exchange(&d).await.expect("declare exchange");
}

/// Binds `queue` to `exchange` with `key`.
pub(crate) async fn bind(t: &dyn Transport, queue: &str, exchange: &str, key: &str) {
    t.bind_queue(&BindingDecl::new(queue, exchange, key))
        .await
        .expect("bind");
}

/// Takes every ready message with basic.get and acks it; returns the bodies in order.
pub(crate) async fn drain(t: &dyn Transport, q: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(d) = t.get(q).await.expect("basic.get") {
        out.push(body(&d));
        d.acker.ack().await.expect("ack");
    }
    out
}

/// Deletes what a case declared.
pub(crate) async fn cleanup(t: &dyn Transport, queues: &[&str], exchanges: &[&str]) {
    for q in queues {
        t.delete_queue(q).await.expect("delete queue");
    }
    for x in exchanges {
        t.delete_exchange(x).await.expect("delete exchange");
    }
}

/// The next delivery, within [`WAIT`].
pub(crate) async fn next(sub: &mut Box<dyn Subscription>) -> Delivery {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a delivery within the timeout")
        .expect("the subscription is still open")
        .expect("a delivery, not an error")
}

/// Asserts nothing more is delivered for a short while (a negative check has to wait).
pub(crate) async fn nothing_more(sub: &mut Box<dyn Subscription>) {
    if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
        panic!("unexpected delivery {} (tag {})", body(&d), d.delivery_tag);
    }
}

/// The first `x-death` entry of a dead letter.
pub(crate) fn x_death(d: &Delivery) -> Headers {
    d.properties.headers["x-death"]
        .as_array()
        .expect("x-death is an array")[0]
        .as_table()
        .expect("x-death entries are tables")
        .clone()
}

/// An `x-death` entry's `count`.
pub(crate) fn count_of(t: &Headers) -> i64 {
    t["count"].as_i64().expect("count is an integer")
}

/// A string field of an `x-death` entry.
pub(crate) fn str_of<'a>(t: &'a Headers, k: &str) -> &'a str {
    t[k].as_str()
        .unwrap_or_else(|| panic!("{k} is a string: {t:?}"))
}
