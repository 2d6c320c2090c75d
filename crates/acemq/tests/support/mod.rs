//! Test support shared by every integration test: the conformance harness that runs a
//! broker-facing test on `memory://` and on RabbitMQ, unique names, polling with deadlines,
//! queue setup and teardown, raw publishing, and the RabbitMQ memory-alarm guard.
//!
//! RabbitMQ is reached through `ACEMQ_TEST_AMQP_URL`. When it is unset, broker tests run on
//! `memory://` only, unless `ACEMQ_TEST_REQUIRE_BROKER=1` (CI), in which case the test fails.
#![allow(dead_code)]

pub mod spans;

pub mod settle;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::topology::{QueueDecl, retry_queue};
use acemq::transport::memory::MemoryTransport;
use acemq::transport::{Confirmation, ConsumeSpec, Delivery, Outbound, Properties, Transport};

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
            Target::Amqp(url) => acemq::transport::connect(url)
                .await
                .unwrap_or_else(|e| panic!("cannot connect to RabbitMQ at {url}: {e}")),
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

/// The family's fixture directory: `ACEMQ_FAMILY_FIXTURES`, else `../shared/fixtures`
/// beside the repository. Panics when the variable is set and `file` is missing there.
pub fn fixture(file: &str) -> Option<serde_json::Value> {
    let dir = match std::env::var("ACEMQ_FAMILY_FIXTURES") {
        Ok(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => {
            let d =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures");
            if !d.exists() {
                assert!(
                    std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                    "ACEMQ_TEST_REQUIRE_BROKER=1 (CI) but no family fixtures: set ACEMQ_FAMILY_FIXTURES"
                );
                eprintln!("note: no family fixtures (set ACEMQ_FAMILY_FIXTURES); not read");
                return None;
            }
            d
        }
    };
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {} is missing or unreadable: {e}", path.display()));
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {file}: {e}")))
}

/// Asserts, through `rabbitmqctl`, that a RabbitMQ queue has exactly these arguments:
/// `(name, AMQP type as rabbitmqctl names it, value)`.
pub fn assert_rabbit_queue_arguments(queue: &str, expected: &[(&str, &str, &str)]) {
    let out = std::process::Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_queues",
            "name",
            "arguments",
            "--formatter",
            "json",
        ])
        .output()
        .expect("rabbitmqctl must be available for broker tests");
    assert!(
        out.status.success(),
        "rabbitmqctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("rabbitmqctl json");
    let q = all
        .as_array()
        .and_then(|a| a.iter().find(|q| q["name"] == queue))
        .unwrap_or_else(|| panic!("queue {queue} not on the broker"));
    let mut got: Vec<(String, String, String)> = q["arguments"]
        .as_array()
        .expect("arguments as [name, type, value] triples")
        .iter()
        .map(|t| {
            let v = &t[2];
            (
                t[0].as_str().unwrap_or_default().to_owned(),
                t[1].as_str().unwrap_or_default().to_owned(),
                v.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string()),
            )
        })
        .collect();
    got.sort();
    let mut want: Vec<(String, String, String)> = expected
        .iter()
        .map(|(k, t, v)| ((*k).to_owned(), (*t).to_owned(), (*v).to_owned()))
        .collect();
    want.sort();
    assert_eq!(got, want, "arguments of {queue}");
}

/// Declares a durable classic queue named `name`.
pub async fn declare_classic(mq: &Connection, name: &str) {
    mq.transport()
        .declare_queue(&QueueDecl::classic(name))
        .await
        .expect("declare classic queue");
}

/// Connects to `target` and declares a classic queue with a [`unique`] name.
pub async fn connect_with_classic_queue(target: &Target, prefix: &str) -> (Connection, String) {
    let mq = Connection::connect(&target.url()).await.unwrap();
    let q = unique(prefix);
    declare_classic(&mq, &q).await;
    (mq, q)
}

/// Deletes, ignoring errors, the rung queues `{q}.retry.{delay}` for `rungs`, then `{q}`,
/// `{q}.dlq` and `{q}.parked`.
pub async fn delete_queues(mq: &Connection, q: &str, rungs: &[Duration]) {
    let t = mq.transport();
    for d in rungs {
        let _ = t.delete_queue(&retry_queue(q, *d)).await;
    }
    for suffix in ["", ".dlq", ".parked"] {
        let _ = t.delete_queue(&format!("{q}{suffix}")).await;
    }
}

/// [`delete_queues`], then closes the connection.
pub async fn teardown(mq: &Connection, q: &str, rungs: &[Duration]) {
    delete_queues(mq, q, rungs).await;
    mq.close().await.ok();
}

/// Takes one message from `queue` (waiting up to `timeout` for one), acks it, returns it.
pub async fn take_one(t: &dyn Transport, queue: &str, timeout: Duration) -> Delivery {
    let d = eventually(timeout, &format!("a message in {queue}"), || async {
        t.get(queue).await.unwrap()
    })
    .await;
    d.acker.ack().await.unwrap();
    d
}

/// Publishes `m` and waits for its confirmation; panics when either fails.
pub async fn publish_confirmed(t: &dyn Transport, m: Outbound) -> Confirmation {
    t.publish(m)
        .await
        .expect("publish handed over")
        .await
        .expect("publish confirmed")
}

/// Publishes `body` with `props` straight to `queue` through the default exchange, as a
/// plain AMQP client would, and waits for the confirmation.
pub async fn publish_raw(
    t: &dyn Transport,
    queue: &str,
    props: Properties,
    body: &[u8],
) -> Confirmation {
    publish_confirmed(t, Outbound::new("", queue, props, body.to_vec())).await
}

/// A non-exclusive subscription to `queue` with a broker-chosen consumer tag.
pub fn spec(queue: &str, prefetch: u16) -> ConsumeSpec {
    ConsumeSpec::new(queue, prefetch)
}

/// A delivery's body as text.
pub fn body(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.body).into_owned()
}

/// Runs `rabbitmqctl` with `args`; panics when it cannot be run or fails.
pub fn rabbitmqctl(args: &[&str]) {
    let status = std::process::Command::new("rabbitmqctl")
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("rabbitmqctl {args:?}: {e}"));
    assert!(status.success(), "rabbitmqctl {args:?} failed");
}

/// A RabbitMQ memory alarm for the life of the guard: sets the memory watermark to 0, and
/// restores 0.4 when dropped (also when the test fails).
pub struct MemoryAlarm;

impl MemoryAlarm {
    pub fn raise() -> MemoryAlarm {
        rabbitmqctl(&["set_vm_memory_high_watermark", "0"]);
        MemoryAlarm
    }
}

impl Drop for MemoryAlarm {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["set_vm_memory_high_watermark", "0.4"])
            .status();
    }
}

/// True when CI requires every broker test to run (`ACEMQ_TEST_REQUIRE_BROKER=1`).
pub fn broker_required() -> bool {
    std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() == Ok("1")
}

/// Closes, from the broker side, the one RabbitMQ connection whose client-provided
/// `connection_name` is exactly `name` (never another client's): lists connections with
/// `rabbitmqctl` until it appears (up to 10 s), then `rabbitmqctl close_connection` on its
/// pid. `Err` says why it could not (rabbitmqctl missing or failing, connection not listed).
pub async fn close_rabbit_connection_named(name: &str) -> Result<(), String> {
    // In the `client_properties` column: `{"connection_name","{name}"}`.
    let needle = format!("{{\"connection_name\",\"{name}\"}}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let pid = loop {
        let out = std::process::Command::new("rabbitmqctl")
            .args([
                "list_connections",
                "-q",
                "--no-table-headers",
                "pid",
                "client_properties",
            ])
            .output()
            .map_err(|e| format!("rabbitmqctl could not be run: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "rabbitmqctl list_connections failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let mine: Vec<&str> = listing
            .lines()
            .filter(|l| l.contains(&needle))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        match mine.as_slice() {
            [pid] => break (*pid).to_owned(),
            [] if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            [] => return Err(format!("no connection named {name:?} in:\n{listing}")),
            more => return Err(format!("{} connections named {name:?}", more.len())),
        }
    };
    let out = std::process::Command::new("rabbitmqctl")
        .args(["close_connection", &pid, "acemq test"])
        .output()
        .map_err(|e| format!("rabbitmqctl close_connection could not be run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "rabbitmqctl close_connection {pid} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
