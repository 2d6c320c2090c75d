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
use std::time::Duration;

use acemq::Connection;
use acemq::topology::{QueueDecl, retry_queue};
use acemq::transport::memory::MemoryTransport;
use acemq::transport::{Confirmation, ConsumeSpec, Delivery, Outbound, Properties, Transport};

/// Written once, in the conformance kit, for its cases and for these tests (not every test
/// binary uses each).
#[allow(unused_imports)]
pub use acemq::transport::conformance::{
    Target, eventually, publish_confirmed, unique, wait_for_count,
};

/// The broker an engine test runs on (see [`on_each_target`]); [`Broker::target`] is the
/// conformance kit's [`Target`] for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Broker {
    /// `memory://{unique}`
    Memory(String),
    /// RabbitMQ at this URL.
    Amqp(String),
}

impl Broker {
    /// The URL `acemq::Connection::connect` takes.
    pub fn url(&self) -> String {
        match self {
            Broker::Memory(name) => format!("memory://{name}"),
            Broker::Amqp(url) => url.clone(),
        }
    }

    /// `"memory"` or `"amqp"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Broker::Memory(_) => "memory",
            Broker::Amqp(_) => "amqp",
        }
    }

    /// The conformance kit's [`Target`] for this broker: a `memory://` broker is opened as
    /// [`MemoryTransport::connect`] opens it, RabbitMQ with `acemq::transport::connect`.
    pub fn target(&self) -> Target {
        match self {
            Broker::Memory(name) => {
                let name = name.clone();
                Target::new(self.url(), move || {
                    let name = name.clone();
                    async move { Ok(Arc::new(MemoryTransport::connect(&name)) as Arc<dyn Transport>) }
                })
            }
            Broker::Amqp(url) => Target::url(url.clone()),
        }
    }

    /// Opens a raw transport to this broker; panics when it cannot.
    pub async fn transport(&self) -> Arc<dyn Transport> {
        self.target().transport().await
    }
}

/// The RabbitMQ URL for broker tests, if any. Panics when CI requires a broker and none is
/// configured. A build without the `amqp` feature has no RabbitMQ transport: its cases run
/// on `memory://` alone (what that build is for), whatever the environment says.
///
/// This module is shared with acemq-sql's tests, whose crate has no `amqp` feature of its
/// own: there acemq comes with its default features, RabbitMQ included.
#[allow(unexpected_cfgs)]
pub fn amqp_url() -> Option<String> {
    if env!("CARGO_PKG_NAME") == "acemq" && cfg!(not(feature = "amqp")) {
        return None;
    }
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
pub fn targets() -> Vec<Broker> {
    let mut t = vec![Broker::Memory(unique("mem"))];
    if let Some(url) = amqp_url() {
        t.push(Broker::Amqp(url));
    } else {
        eprintln!("note: ACEMQ_TEST_AMQP_URL unset; this case ran on memory:// only");
    }
    t
}

/// Runs a conformance case on every target, reporting which one failed.
pub async fn on_each_target<F, Fut>(case: F)
where
    F: Fn(Broker) -> Fut,
    Fut: Future<Output = ()>,
{
    for target in targets() {
        eprintln!("-- on {}", target.kind());
        case(target).await;
    }
}

/// The name a test binary lists the test `function` of module `module` under, where
/// `module` is that module's `module_path!()`: the path without the crate's own name. A
/// test that re-runs itself as a child process passes it to `--exact`, so the child runs
/// that one test whichever binary and module it is in.
pub fn this_test(module: &str, function: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{function}"),
        None => function.to_owned(),
    }
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
pub async fn connect_with_classic_queue(target: &Broker, prefix: &str) -> (Connection, String) {
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

/// A RabbitMQ queue whose process is suspended for the life of the guard (`sys:suspend`
/// through `rabbitmqctl eval`): the broker routes to it but withholds its confirms until it
/// is resumed, when the guard is dropped (also when the test fails). Only for a queue the
/// test owns.
pub struct SuspendedQueue(String);

impl SuspendedQueue {
    pub fn suspend(queue: &str) -> SuspendedQueue {
        rabbitmqctl(&["eval", &queue_process_call(queue, "suspend")]);
        SuspendedQueue(queue.to_owned())
    }
}

impl Drop for SuspendedQueue {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["eval", &queue_process_call(&self.0, "resume")])
            .status();
    }
}

fn queue_process_call(queue: &str, call: &str) -> String {
    format!(
        "{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<\"/\">>, queue, <<\"{queue}\">>)), sys:{call}(amqqueue:get_pid(Q))."
    )
}

/// Watches for what makes a timing judgement of this run meaningless: the machine stalling
/// the process (a virtual machine paused, a starved CPU) or the wall clock being stepped
/// (the scheduler's due times are wall-clock instants). A thread sleeps 10 ms at a time and
/// keeps its worst overshoot; the wall clock is compared with the monotonic one.
///
/// A test that asserts "on time" runs its scenario again when [`ClockWatch::disturbed`]
/// says so (a bounded number of times), never loosens the bound.
pub struct ClockWatch {
    wall: std::time::SystemTime,
    mono: std::time::Instant,
    worst_ms: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl ClockWatch {
    /// A disturbance smaller than this does not void a judgement.
    const TOLERANCE_MS: u64 = 250;

    pub fn start() -> ClockWatch {
        use std::sync::atomic::Ordering;
        let worst_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (worst, done) = (worst_ms.clone(), stop.clone());
        std::thread::spawn(move || {
            let tick = Duration::from_millis(10);
            while !done.load(Ordering::Relaxed) {
                let before = std::time::Instant::now();
                std::thread::sleep(tick);
                let over = before.elapsed().saturating_sub(tick).as_millis();
                worst.fetch_max(u64::try_from(over).unwrap_or(u64::MAX), Ordering::Relaxed);
            }
        });
        ClockWatch {
            wall: std::time::SystemTime::now(),
            mono: std::time::Instant::now(),
            worst_ms,
            stop,
        }
    }

    /// Why a timing judgement of the time since [`ClockWatch::start`] would be void, if it
    /// would.
    pub fn disturbed(&self) -> Option<String> {
        let stalled = self.worst_ms.load(std::sync::atomic::Ordering::Relaxed);
        let wall = std::time::SystemTime::now()
            .duration_since(self.wall)
            .map(|d| d.as_millis() as i128)
            .unwrap_or_else(|e| -(e.duration().as_millis() as i128));
        let step = wall - self.mono.elapsed().as_millis() as i128;
        if step.unsigned_abs() > u128::from(Self::TOLERANCE_MS) {
            Some(format!("the wall clock was stepped by {step} ms"))
        } else if stalled > Self::TOLERANCE_MS {
            Some(format!("the process was stalled for {stalled} ms"))
        } else {
            None
        }
    }
}

impl ClockWatch {
    /// Whether attempt `attempt` of `attempts` must be run again because the machine
    /// disturbed it (said on stderr, with `seen`: what this run measured). Panics when the
    /// last attempt was disturbed too: then the timing cannot be judged at all.
    pub fn run_again(&self, attempt: u32, attempts: u32, seen: &str) -> bool {
        let Some(why) = self.disturbed() else {
            return false;
        };
        assert!(
            attempt < attempts,
            "{why} in all {attempts} attempts: the timing cannot be judged"
        );
        eprintln!("{seen}, but {why}: running it again");
        true
    }
}

impl Drop for ClockWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
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
