//! Support for the end-to-end tests: run the built `acemq` binary, make unique queues on
//! RabbitMQ, seed dead letters, watch a queue from a second connection.
//!
//! RabbitMQ is reached through `ACEMQ_TEST_AMQP_URL`; when it is unset the broker tests
//! skip, unless `ACEMQ_TEST_REQUIRE_BROKER=1` (CI), where they fail.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq::Connection;
use acemq::headers::{HeaderValue, Headers};
use acemq::topology::{Topology, dead_letter_queue, parked_queue};
use acemq::transport::{Outbound, Properties, Transport};

/// The broker URL, if broker tests run.
pub fn amqp_url() -> Option<String> {
    match std::env::var("ACEMQ_TEST_AMQP_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                "ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_AMQP_URL is not set"
            );
            None
        }
    }
}

/// A name no other test or run uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "acemq-cli-test.{prefix}.{}.{}.{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The built binary, with a clean environment for colour and the broker.
pub fn acemq(url: Option<&str>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_acemq"));
    c.env_remove("ACEMQ_URL").env("NO_COLOR", "1");
    if let Some(url) = url {
        c.env("ACEMQ_URL", url);
    }
    c.stdin(Stdio::null());
    c
}

/// Runs the binary with `args` and returns what it did.
pub fn run(url: Option<&str>, args: &[&str]) -> Output {
    acemq(url)
        .args(args)
        .output()
        .expect("the acemq binary runs")
}

/// Stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stdout parsed as JSON; panics with both streams when it is not.
pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            stdout(o),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// A source queue `q` with its `.dlq` and `.parked`, as a service declares it.
pub async fn declare_dead_lettered(mq: &Connection, q: &str) {
    let t = Topology::define()
        .queue_with_dead_letter(q)
        .build()
        .expect("topology");
    mq.declare(&t).await.expect("declared");
}

/// Deletes `q`, `q.dlq`, `q.parked`.
pub async fn cleanup(mq: &Connection, q: &str) {
    for name in [q.to_owned(), dead_letter_queue(q), parked_queue(q)] {
        let _ = mq.transport().delete_queue(&name).await;
    }
}

/// One dead letter to seed: type, reason, and application headers.
pub struct Seed<'a> {
    /// `x-acemq-type`.
    pub message_type: &'a str,
    /// `x-acemq-error`.
    pub error: &'a str,
    /// Application headers.
    pub headers: &'a [(&'a str, &'a str)],
}

/// Publishes dead letters straight into `queue` (as AceMQ writes them: envelope headers
/// and a JSON body), confirmed, pipelined in chunks. Returns their ids in order.
pub async fn seed(t: &Arc<dyn Transport>, queue: &str, n: usize, s: &Seed<'_>) -> Vec<String> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut pending = Vec::with_capacity(chunk.len());
        for i in chunk {
            let id = format!("{}-{i}", uuid::Uuid::new_v4());
            let mut h = Headers::new();
            h.insert("x-acemq-id".into(), HeaderValue::from(id.as_str()));
            h.insert("x-acemq-type".into(), HeaderValue::from(s.message_type));
            h.insert("x-acemq-version".into(), HeaderValue::I32(1));
            h.insert("x-acemq-correlation".into(), HeaderValue::from(id.as_str()));
            h.insert("x-acemq-attempt".into(), HeaderValue::I32(3));
            h.insert(
                "x-acemq-first-seen".into(),
                HeaderValue::I64(now_ms - 3_600_000),
            );
            h.insert("x-acemq-origin".into(), HeaderValue::from("orders-service"));
            h.insert("x-acemq-error".into(), HeaderValue::from(s.error));
            for (k, v) in s.headers {
                h.insert(k.to_string().into(), HeaderValue::from(*v));
            }
            let props = Properties {
                message_id: Some(id.clone()),
                content_type: Some("application/json".into()),
                delivery_mode: Some(2),
                headers: h,
                ..Properties::default()
            };
            let body = format!("{{\"order\":\"o-{i}\",\"amount_cents\":1250}}");
            let out = Outbound::new("", queue, props, body.into_bytes());
            pending.push(t.publish(out).await.expect("publish handed over"));
            ids.push(id);
        }
        for p in pending {
            p.await.expect("publish confirmed");
        }
    }
    ids
}

/// Ready messages in `queue`, read by a passive declare.
pub async fn ready(t: &Arc<dyn Transport>, queue: &str) -> u32 {
    t.inspect_queue(queue)
        .await
        .expect("queue exists")
        .message_count
}

/// Polls until `check` holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the binary while a second connection samples `queue`'s ready count as fast as it
/// can; returns the output and the lowest count seen.
pub async fn run_watching(url: &str, args: &[&str], queue: &str) -> (Output, u32) {
    let watcher = acemq::transport::connect(url)
        .await
        .expect("second connection");
    let mut child = acemq(Some(url))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the acemq binary runs");
    let mut lowest = u32::MAX;
    loop {
        lowest = lowest.min(ready(&watcher, queue).await);
        if child.try_wait().expect("child").is_some() {
            break;
        }
    }
    let _ = watcher.close().await;
    (child.wait_with_output().expect("output"), lowest)
}

/// Deletes `q`, `q.dlq` and `q.parked` through the management API when dropped, so a
/// failing test leaves nothing behind (best effort; the tests also clean up in line).
pub struct Cleanup {
    base: String,
    auth: (String, String),
    vhost: String,
    names: Vec<String>,
}

impl Cleanup {
    /// A guard for the queue family of `q` on the broker at `amqp_url`.
    pub fn new(amqp_url: &str, q: &str) -> Cleanup {
        let u = url::Url::parse(amqp_url).expect("an AMQP URL");
        let vhost = match u.path() {
            "" | "/" => "/".to_owned(),
            p => percent_encoding::percent_decode_str(&p[1..])
                .decode_utf8_lossy()
                .into_owned(),
        };
        Cleanup {
            base: format!("http://{}:15672", u.host_str().unwrap_or("127.0.0.1")),
            auth: (
                u.username().to_owned(),
                u.password().unwrap_or("guest").to_owned(),
            ),
            vhost,
            names: vec![q.to_owned(), dead_letter_queue(q), parked_queue(q)],
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        use base64::Engine as _;
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let auth = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", self.auth.0, self.auth.1));
        for name in &self.names {
            let url = format!(
                "{}/api/queues/{}/{}",
                self.base,
                enc(&self.vhost),
                enc(name)
            );
            let _ = ureq::delete(&url)
                .header("Authorization", &format!("Basic {auth}"))
                .call();
        }
    }
}

/// A file in the temp dir, removed when dropped.
pub struct TempFile(pub std::path::PathBuf);

impl TempFile {
    /// Writes `text` to a new uniquely named `.toml` file.
    pub fn toml(text: &str) -> TempFile {
        let p = std::env::temp_dir().join(format!("{}.toml", unique("file")));
        std::fs::write(&p, text).expect("temp file written");
        TempFile(p)
    }

    /// The path as an argument.
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
