//! Test support shared by every integration test: the conformance harness that runs a
//! broker-facing test on `memory://` and on RabbitMQ, unique names, polling with deadlines.
//!
//! RabbitMQ is reached through `ACEMQ_TEST_AMQP_URL`. When it is unset, broker tests run on
//! `memory://` only, unless `ACEMQ_TEST_REQUIRE_BROKER=1` (CI), in which case the test fails.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use acemq::transport::Transport;
use acemq::transport::amqp::AmqpTransport;
use acemq::transport::memory::MemoryTransport;

/// Which transport a conformance case runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `memory://{unique}`
    Memory(String),
    /// RabbitMQ at this URL.
    Amqp(String),
}

impl Target {
    /// The URL `acemq::Connection::connect` takes.
    pub fn url(&self) -> String {
        match self {
            Target::Memory(name) => format!("memory://{name}"),
            Target::Amqp(url) => url.clone(),
        }
    }

    /// `"memory"` or `"amqp"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Memory(_) => "memory",
            Target::Amqp(_) => "amqp",
        }
    }

    /// Opens a raw transport to this target.
    pub async fn transport(&self) -> Arc<dyn Transport> {
        match self {
            Target::Memory(name) => Arc::new(MemoryTransport::connect(name)),
            Target::Amqp(url) => Arc::new(
                AmqpTransport::connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot connect to RabbitMQ at {url}: {e}")),
            ),
        }
    }
}

/// The RabbitMQ URL for broker tests, if any. Panics when CI requires a broker and none is
/// configured.
pub fn amqp_url() -> Option<String> {
    match std::env::var("ACEMQ_TEST_AMQP_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() == Ok("1") {
                panic!(
                    "ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_AMQP_URL is not set: broker tests must run"
                );
            }
            None
        }
    }
}

/// Every target a conformance case must pass on: a fresh `memory://` broker, and RabbitMQ
/// when configured.
pub fn targets() -> Vec<Target> {
    let mut t = vec![Target::Memory(unique("mem"))];
    if let Some(url) = amqp_url() {
        t.push(Target::Amqp(url));
    } else {
        eprintln!("note: ACEMQ_TEST_AMQP_URL unset; this case ran on memory:// only");
    }
    t
}

/// Runs a conformance case on every target, reporting which one failed.
pub async fn on_each_target<F, Fut>(case: F)
where
    F: Fn(Target) -> Fut,
    Fut: Future<Output = ()>,
{
    for target in targets() {
        eprintln!("-- on {}", target.kind());
        case(target).await;
    }
}

/// A name no other test (or earlier run) uses: `acemq-test.{prefix}.{pid}.{n}.{nanos}`.
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

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
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

/// Waits until a queue holds at least `n` ready messages; returns the count.
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
