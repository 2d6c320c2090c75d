//! The scenarios of the AceMQ benchmark, each written twice: through AceMQ and through raw
//! lapin "the straightforward, competent way". `main.rs` runs them in alternating rounds and
//! prints the table; `tests/smoke.rs` runs them with tiny counts so CI proves they still work.
//!
//! Every AMQP run gets its own durable queue (classic or quorum), deleted afterwards together
//! with the `{q}.dlq` / `{q}.parked` queues an AceMQ consumer declares.

use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::retry::RetryPolicy;
use acemq::topology::QueueDecl;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, ConnectionProperties};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// The codec scenarios (`--codecs`).
pub mod codecs;
mod request;
mod wait;
/// Codec-wrapper scenarios: encryption and claim check (issue 15).
pub mod wrappers;
pub use request::{
    REQUEST_TIMEOUT, REQUEST_WINDOW, RESPONDER_CONCURRENCY, acemq_request_reply,
    memory_request_reply, raw_request_reply,
};
pub use wait::{FAIL_EVERY, FAILURE_WAIT, WAIT_PREFETCH, WORK, acemq_waits};

/// The error type of the benchmark.
pub type BoxError = Box<dyn StdError + Send + Sync>;
/// The result type of the benchmark.
pub type Result<T> = std::result::Result<T, BoxError>;

/// Publishes per batch in the pipelined scenario (raw lapin awaits each batch's confirms).
pub const BATCH: usize = 100;
/// The prefetch of every consumer.
pub const PREFETCH: u16 = 100;
/// How far the `memory://` publisher may run ahead of its consumer.
pub const MEMORY_BACKLOG: u64 = 10_000;
/// The in-consumer wait before the retry in scenario 4.
pub const RETRY_WAIT: Duration = Duration::from_millis(1);

/// The message body: JSON of exactly the configured size (when the size allows it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Payload {
    /// Sequence number.
    pub seq: u64,
    /// Padding up to the size.
    pub pad: String,
}

impl Payload {
    /// A payload whose JSON encoding is `size` bytes (or the minimum, when smaller).
    pub fn new(seq: u64, size: usize) -> Payload {
        let empty = serde_json::to_vec(&Payload {
            seq,
            pad: String::new(),
        })
        .map(|v| v.len())
        .unwrap_or(0);
        Payload {
            seq,
            pad: "x".repeat(size.saturating_sub(empty)),
        }
    }
}

/// One timed run.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Messages in the run.
    pub messages: u64,
    /// Wall time of the timed part.
    pub elapsed: Duration,
    /// CPU time (user + system, every thread of this process) spent in the timed part.
    pub cpu: Duration,
    /// Median latency, where it applies.
    pub p50: Option<Duration>,
    /// 99th percentile latency, where it applies.
    pub p99: Option<Duration>,
}

impl Sample {
    fn new(messages: u64, span: Span, mut latencies: Vec<Duration>) -> Sample {
        latencies.sort_unstable();
        Sample {
            messages,
            elapsed: span.wall,
            cpu: span.cpu,
            p50: percentile(&latencies, 0.50),
            p99: percentile(&latencies, 0.99),
        }
    }

    /// Messages per second.
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Client CPU microseconds per message (10 ms clock-tick resolution over the run).
    pub fn cpu_us_per_message(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / (self.messages.max(1) as f64)
    }
}

/// Wall and CPU time of a timed part.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// Wall time.
    pub wall: Duration,
    /// Process CPU time.
    pub cpu: Duration,
}

/// Starts timing wall and process CPU time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall: Instant,
    cpu: Duration,
}

impl Clock {
    /// Now.
    pub fn start() -> Clock {
        Clock {
            wall: Instant::now(),
            cpu: process_cpu(),
        }
    }

    /// Since [`Clock::start`].
    pub fn elapsed(&self) -> Span {
        Span {
            wall: self.wall.elapsed(),
            cpu: process_cpu().saturating_sub(self.cpu),
        }
    }
}

/// User + system CPU time of this process (all threads) from `/proc/self/stat`; zero where
/// unavailable. Clock ticks are taken as 100 Hz (Linux's USER_HZ).
pub fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may contain spaces) start at field 3.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime is field 14 and stime field 15 (1-based), i.e. 11 and 12 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The `q` quantile of sorted values (nearest rank); `None` when empty.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The process's peak resident set size in KiB (`VmHWM` from `/proc/self/status`).
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Durable classic or quorum queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueKind {
    /// A durable classic queue.
    Classic,
    /// A durable quorum queue.
    Quorum,
}

impl QueueKind {
    /// `classic` / `quorum`.
    pub fn name(self) -> &'static str {
        match self {
            QueueKind::Classic => "classic",
            QueueKind::Quorum => "quorum",
        }
    }
}

/// The scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// 1: publish, await each confirm.
    ConfirmEach,
    /// 2: publish with confirms pipelined (batches of 100).
    Pipelined,
    /// 3: consume, one manual ack per message, prefetch 100.
    Consume,
    /// 4: consume where every message fails once and succeeds on the retry.
    Retry,
    /// 5: memory:// publish + consume (AceMQ only).
    Memory,
    /// 6: concurrency 1, 10% fail once with a 2 s consumer wait; the others' rate against
    /// a run without failures (AceMQ only).
    Waits,
    /// 7: request/reply round trips, 16 in flight (and AceMQ alone on memory://).
    RequestReply,
}

impl Scenario {
    /// Every scenario, in table order.
    pub const ALL: [Scenario; 7] = [
        Scenario::ConfirmEach,
        Scenario::Pipelined,
        Scenario::Consume,
        Scenario::Retry,
        Scenario::Memory,
        Scenario::Waits,
        Scenario::RequestReply,
    ];

    /// The table label.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::ConfirmEach => "1 publish, confirm each",
            Scenario::Pipelined => "2 publish, pipelined x100",
            Scenario::Consume => "3 consume, ack each",
            Scenario::Retry => "4 fail once, retry 1 ms",
            Scenario::Memory => "5 memory:// pub+consume",
            Scenario::Waits => "6 10% wait 2 s, conc. 1",
            Scenario::RequestReply => "7 request/reply x16",
        }
    }

    /// Whether the scenario has a raw lapin counterpart (all but `memory://` and the
    /// waits, which compare AceMQ with itself).
    pub fn has_raw(self) -> bool {
        !matches!(self, Scenario::Memory | Scenario::Waits)
    }

    /// What the latency columns measure.
    pub fn latency_unit(self) -> Option<&'static str> {
        match self {
            Scenario::ConfirmEach => Some("per publish"),
            Scenario::Pipelined => Some("per batch of 100"),
            Scenario::RequestReply => Some("per round trip"),
            _ => None,
        }
    }
}

/// Which implementation a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Raw lapin.
    Raw,
    /// AceMQ.
    AceMq,
}

/// The connections the AMQP scenarios share.
pub struct Broker {
    /// AceMQ's connection (its own publishing and consuming connections underneath).
    pub acemq: acemq::Connection,
    /// The raw lapin connection.
    pub raw: lapin::Connection,
    /// A separate raw connection used only to pre-fill queues and for topology.
    admin: lapin::Connection,
    prefix: String,
    counter: AtomicU64,
}

impl Broker {
    /// Connects AceMQ and raw lapin to `url`.
    pub async fn connect(url: &str) -> Result<Broker> {
        let acemq = acemq::Connection::connect(url).await?;
        let raw = lapin::Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name("acemq-bench raw".into()),
        )
        .await?;
        let admin = lapin::Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name("acemq-bench admin".into()),
        )
        .await?;
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Ok(Broker {
            acemq,
            raw,
            admin,
            prefix: format!("acemq-bench.{}.{stamp}", std::process::id()),
            counter: AtomicU64::new(0),
        })
    }

    /// Closes every connection.
    pub async fn close(self) -> Result<()> {
        self.acemq.close().await?;
        self.raw.close(200, "OK".into()).await?;
        self.admin.close(200, "OK".into()).await?;
        Ok(())
    }

    fn fresh_name(&self, scenario: Scenario, kind: QueueKind, side: Side) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let side = match side {
            Side::Raw => "raw",
            Side::AceMq => "acemq",
        };
        format!("{}.{scenario:?}.{}.{side}.{n}", self.prefix, kind.name())
    }

    async fn declare(&self, name: &str, kind: QueueKind) -> Result<()> {
        let ch = self.admin.create_channel().await?;
        let mut args = FieldTable::default();
        if kind == QueueKind::Quorum {
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString(LongString::from("quorum")),
            );
        }
        ch.queue_declare(
            short(name)?,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await?;
        ch.close(200, "OK".into()).await?;
        Ok(())
    }

    /// Deletes the queue and what an AceMQ consumer declared next to it.
    async fn delete(&self, name: &str) -> Result<()> {
        let ch = self.admin.create_channel().await?;
        for q in [
            name.to_owned(),
            format!("{name}.dlq"),
            format!("{name}.parked"),
        ] {
            ch.queue_delete(short(&q)?, QueueDeleteOptions::default())
                .await?;
        }
        ch.close(200, "OK".into()).await?;
        Ok(())
    }

    /// Runs one scenario once on a fresh queue, then deletes the queue.
    pub async fn run(
        &self,
        scenario: Scenario,
        kind: QueueKind,
        side: Side,
        messages: u64,
        size: usize,
    ) -> Result<Sample> {
        let queue = self.fresh_name(scenario, kind, side);
        self.declare(&queue, kind).await?;
        let result = self.run_on(scenario, side, &queue, messages, size).await;
        let deleted = self.delete(&queue).await;
        let sample = result?;
        deleted?;
        Ok(sample)
    }

    async fn run_on(
        &self,
        scenario: Scenario,
        side: Side,
        queue: &str,
        n: u64,
        size: usize,
    ) -> Result<Sample> {
        match (scenario, side) {
            (Scenario::ConfirmEach, Side::AceMq) => {
                acemq_confirm_each(&self.acemq, queue, n, size).await
            }
            (Scenario::ConfirmEach, Side::Raw) => raw_confirm_each(&self.raw, queue, n, size).await,
            (Scenario::Pipelined, Side::AceMq) => {
                acemq_pipelined(&self.acemq, queue, n, size).await
            }
            (Scenario::Pipelined, Side::Raw) => raw_pipelined(&self.raw, queue, n, size).await,
            (Scenario::Consume, side) => {
                fill(&self.admin, queue, n, size).await?;
                match side {
                    Side::AceMq => acemq_consume(&self.acemq, queue, n).await,
                    Side::Raw => raw_consume(&self.raw, queue, n).await,
                }
            }
            (Scenario::Retry, side) => {
                fill(&self.admin, queue, n, size).await?;
                match side {
                    Side::AceMq => acemq_retry(&self.acemq, queue, n).await,
                    Side::Raw => raw_retry(&self.raw, queue, n).await,
                }
            }
            (Scenario::Memory, _) => {
                Err("memory:// runs without a broker: use memory_publish_consume".into())
            }
            (Scenario::Waits, _) => Err("the waits scenario runs through Broker::run_waits".into()),
            (Scenario::RequestReply, Side::AceMq) => {
                acemq_request_reply(&self.acemq, queue, n, size).await
            }
            (Scenario::RequestReply, Side::Raw) => {
                raw_request_reply(&self.raw, queue, n, size).await
            }
        }
    }
}

fn short(s: &str) -> Result<ShortString> {
    Ok(ShortString::try_new(s.to_owned())?)
}

fn payloads(n: u64, size: usize) -> Vec<Payload> {
    (0..n).map(|i| Payload::new(i, size)).collect()
}

// ---------------------------------------------------------------------------------------
// Raw lapin building blocks.

/// Properties like AceMQ's for a publish: message id, JSON content type, persistent.
fn raw_properties(message_id: String) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(message_id.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
}

static RAW_ENVELOPE_HEADERS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Makes the raw publishers of scenarios 1 and 2 also send AceMQ's envelope headers (a
/// diagnostic: it shows what the headers cost the broker).
pub fn set_raw_envelope_headers(on: bool) {
    RAW_ENVELOPE_HEADERS.store(on, Ordering::Relaxed);
}

/// A raw publish's properties: a message id, and the envelope headers when asked for.
fn raw_publish_properties(seq: u64) -> BasicProperties {
    let id = format!("raw-{seq}");
    if RAW_ENVELOPE_HEADERS.load(Ordering::Relaxed) {
        let headers = envelope_headers(&id);
        raw_properties(id).with_headers(headers)
    } else {
        raw_properties(id)
    }
}

/// The envelope headers an AceMQ publisher writes, so that both consumers read the same
/// messages (attempt 1).
fn envelope_headers(id: &str) -> FieldTable {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut h = FieldTable::default();
    let s = |v: &str| AMQPValue::LongString(LongString::from(v));
    h.insert("x-acemq-id".into(), s(id));
    h.insert("x-acemq-type".into(), s("bench"));
    h.insert("x-acemq-version".into(), AMQPValue::LongInt(1));
    h.insert("x-acemq-correlation".into(), s(id));
    h.insert("x-acemq-attempt".into(), AMQPValue::LongInt(1));
    h.insert("x-acemq-first-seen".into(), AMQPValue::LongLongInt(now));
    h.insert("x-acemq-origin".into(), s("acemq-bench@localhost"));
    h
}

async fn confirm_channel(conn: &lapin::Connection) -> Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

fn check_confirm(c: Confirmation) -> Result<()> {
    match c {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(ret)) => Err(format!("unroutable: {}", ret.reply_text).into()),
        Confirmation::Nack(_) => Err("nacked".into()),
        Confirmation::NotRequested => Err("confirms not enabled".into()),
    }
}

const MANDATORY: BasicPublishOptions = BasicPublishOptions {
    mandatory: true,
    immediate: false,
};

/// Pre-fills `queue` with `n` messages as AceMQ would have published them (raw lapin,
/// pipelined, every confirm checked). Not timed.
pub async fn fill(conn: &lapin::Connection, queue: &str, n: u64, size: usize) -> Result<()> {
    let ch = confirm_channel(conn).await?;
    let mut confirms = Vec::with_capacity(1000);
    for i in 0..n {
        let id = format!("fill-{i}");
        let body = serde_json::to_vec(&Payload::new(i, size))?;
        let props = raw_properties(id.clone()).with_headers(envelope_headers(&id));
        confirms.push(
            ch.basic_publish("".into(), short(queue)?, MANDATORY, &body, props)
                .await?,
        );
        if confirms.len() == 1000 || i + 1 == n {
            for c in confirms.drain(..) {
                check_confirm(c.await?)?;
            }
        }
    }
    ch.close(200, "OK".into()).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 1: publish, confirm each.

/// AceMQ: `Publisher::send`, one at a time.
pub async fn acemq_confirm_each(
    mq: &acemq::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let items = payloads(n, size);
    let publisher = mq.publisher::<Payload>("", queue);
    let mut latencies = Vec::with_capacity(items.len());
    let started = Clock::start();
    for p in &items {
        let t = Instant::now();
        publisher.send(p).await?;
        latencies.push(t.elapsed());
    }
    Ok(Sample::new(n, started.elapsed(), latencies))
}

/// Raw lapin: confirm channel, mandatory publish with a message id, await its confirm.
pub async fn raw_confirm_each(
    conn: &lapin::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let items = payloads(n, size);
    let ch = confirm_channel(conn).await?;
    let routing_key = short(queue)?;
    let mut latencies = Vec::with_capacity(items.len());
    let started = Clock::start();
    for p in &items {
        let t = Instant::now();
        let body = serde_json::to_vec(p)?;
        let props = raw_publish_properties(p.seq);
        let confirm = ch
            .basic_publish("".into(), routing_key.clone(), MANDATORY, &body, props)
            .await?;
        check_confirm(confirm.await?)?;
        latencies.push(t.elapsed());
    }
    let elapsed = started.elapsed();
    ch.close(200, "OK".into()).await?;
    Ok(Sample::new(n, elapsed, latencies))
}

// ---------------------------------------------------------------------------------------
// 2: publish, confirms pipelined.

/// AceMQ: `Publisher::send_all` over batches of [`BATCH`].
pub async fn acemq_pipelined(
    mq: &acemq::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let items = payloads(n, size);
    let publisher = mq.publisher::<Payload>("", queue);
    let mut latencies = Vec::with_capacity(items.len() / BATCH + 1);
    let started = Clock::start();
    for chunk in items.chunks(BATCH) {
        let t = Instant::now();
        publisher.send_all(chunk).await?;
        latencies.push(t.elapsed());
    }
    Ok(Sample::new(n, started.elapsed(), latencies))
}

/// Raw lapin: publish a batch of [`BATCH`], then await each of its confirms.
pub async fn raw_pipelined(
    conn: &lapin::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let items = payloads(n, size);
    let ch = confirm_channel(conn).await?;
    let routing_key = short(queue)?;
    let mut latencies = Vec::with_capacity(items.len() / BATCH + 1);
    let mut confirms = Vec::with_capacity(BATCH);
    let started = Clock::start();
    for chunk in items.chunks(BATCH) {
        let t = Instant::now();
        for p in chunk {
            let body = serde_json::to_vec(p)?;
            let props = raw_publish_properties(p.seq);
            confirms.push(
                ch.basic_publish("".into(), routing_key.clone(), MANDATORY, &body, props)
                    .await?,
            );
        }
        for c in confirms.drain(..) {
            check_confirm(c.await?)?;
        }
        latencies.push(t.elapsed());
    }
    let elapsed = started.elapsed();
    ch.close(200, "OK".into()).await?;
    Ok(Sample::new(n, elapsed, latencies))
}

// ---------------------------------------------------------------------------------------
// 3: consume, ack each.

/// Counts handled messages and wakes the waiter at the target.
struct Counter {
    count: AtomicU64,
    target: u64,
    done: Notify,
    /// Woken every 1,000 messages.
    progress: Notify,
}

impl Counter {
    fn new(target: u64) -> Arc<Counter> {
        Arc::new(Counter {
            count: AtomicU64::new(0),
            target,
            done: Notify::new(),
            progress: Notify::new(),
        })
    }

    fn bump(&self) {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.target {
            self.done.notify_one();
        }
        if n.is_multiple_of(1000) {
            self.progress.notify_waiters();
        }
    }

    async fn wait(&self) {
        if self.target > 0 {
            self.done.notified().await;
        }
    }
}

/// AceMQ: typed JSON consumer, prefetch [`PREFETCH`], the handler returns `Ok` (acked).
pub async fn acemq_consume(mq: &acemq::Connection, queue: &str, n: u64) -> Result<Sample> {
    let counter = Counter::new(n);
    let c = counter.clone();
    let started = Clock::start();
    let consumer = mq
        .consume(
            queue,
            ConsumerOptions::default().prefetch(PREFETCH),
            move |m: Message<Payload>| {
                let c = c.clone();
                async move {
                    std::hint::black_box(m.payload().seq);
                    c.bump();
                    Ok(())
                }
            },
        )
        .await?;
    counter.wait().await;
    consumer.close().await;
    let elapsed = started.elapsed();
    let acked = consumer.stats().acked;
    if acked != n {
        return Err(format!("acemq consumer acked {acked} of {n}").into());
    }
    Ok(Sample::new(n, elapsed, Vec::new()))
}

/// Raw lapin: basic_qos, basic_consume, decode the JSON, ack each delivery (awaited).
pub async fn raw_consume(conn: &lapin::Connection, queue: &str, n: u64) -> Result<Sample> {
    let started = Clock::start();
    let ch = conn.create_channel().await?;
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            short(queue)?,
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut done = 0;
    while done < n {
        let d = consumer.next().await.ok_or("consumer ended")??;
        let p: Payload = serde_json::from_slice(&d.data)?;
        std::hint::black_box(p.seq);
        if !d.ack(BasicAckOptions::default()).await? {
            return Err("ack not sent".into());
        }
        done += 1;
    }
    ch.close(200, "OK".into()).await?;
    Ok(Sample::new(n, started.elapsed(), Vec::new()))
}

// ---------------------------------------------------------------------------------------
// 4: every message fails once, succeeds on the retry after a 1 ms in-consumer wait.

/// AceMQ: the handler fails attempt 1; the policy waits 1 ms in the consumer, republishes
/// with the attempt advanced (confirmed and routed), then acks the original.
pub async fn acemq_retry(mq: &acemq::Connection, queue: &str, n: u64) -> Result<Sample> {
    let counter = Counter::new(n);
    let c = counter.clone();
    let policy = RetryPolicy::fixed(2, RETRY_WAIT)?;
    let started = Clock::start();
    let consumer = mq
        .consume(
            queue,
            ConsumerOptions::default().prefetch(PREFETCH).retry(policy),
            move |m: Message<Payload>| {
                let c = c.clone();
                async move {
                    if m.attempt() < 2 {
                        return Err(HandlerError::retry("fails once"));
                    }
                    c.bump();
                    Ok(())
                }
            },
        )
        .await?;
    counter.wait().await;
    consumer.close().await;
    let elapsed = started.elapsed();
    let s = consumer.stats();
    if s.acked != n || s.retried != n {
        return Err(format!(
            "acemq retry: acked {} retried {} of {n}",
            s.acked, s.retried
        )
        .into());
    }
    Ok(Sample::new(n, elapsed, Vec::new()))
}

/// Reads an integer header of any width (absent: 1).
fn attempt_of(headers: Option<&FieldTable>) -> i64 {
    let Some(v) = headers.and_then(|h| h.inner().get("x-acemq-attempt")) else {
        return 1;
    };
    match v {
        AMQPValue::LongInt(v) => i64::from(*v),
        AMQPValue::LongLongInt(v) => *v,
        AMQPValue::ShortInt(v) => i64::from(*v),
        AMQPValue::ShortShortInt(v) => i64::from(*v),
        _ => 1,
    }
}

/// Raw lapin, by hand: on attempt 1 wait 1 ms, republish through the default exchange with
/// the attempt header bumped (mandatory, on a confirm channel), await the confirm, then ack.
pub async fn raw_retry(conn: &lapin::Connection, queue: &str, n: u64) -> Result<Sample> {
    let started = Clock::start();
    let publish = confirm_channel(conn).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    let routing_key = short(queue)?;
    let mut consumer = ch
        .basic_consume(
            routing_key.clone(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut done = 0;
    while done < n {
        let d = consumer.next().await.ok_or("consumer ended")??;
        let p: Payload = serde_json::from_slice(&d.data)?;
        std::hint::black_box(p.seq);
        let attempt = attempt_of(d.properties.headers().as_ref());
        if attempt < 2 {
            tokio::time::sleep(RETRY_WAIT).await;
            let mut headers = d.properties.headers().clone().unwrap_or_default();
            headers.insert(
                "x-acemq-attempt".into(),
                AMQPValue::LongInt((attempt + 1) as i32),
            );
            let props = d.properties.clone().with_headers(headers);
            let confirm = publish
                .basic_publish("".into(), routing_key.clone(), MANDATORY, &d.data, props)
                .await?;
            check_confirm(confirm.await?)?;
        } else {
            done += 1;
        }
        if !d.ack(BasicAckOptions::default()).await? {
            return Err("ack not sent".into());
        }
    }
    ch.close(200, "OK".into()).await?;
    publish.close(200, "OK".into()).await?;
    Ok(Sample::new(n, started.elapsed(), Vec::new()))
}

// ---------------------------------------------------------------------------------------
// 5: memory:// publish + consume.

/// AceMQ on `memory://`: a typed consumer (prefetch [`PREFETCH`]) runs while `send_all`
/// publishes every message in batches of 1,000, at most [`MEMORY_BACKLOG`] ahead of the
/// consumer; timed until the last one is handled.
pub async fn memory_publish_consume(n: u64, size: usize) -> Result<Sample> {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "memory://acemq-bench-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    );
    let mq = acemq::Connection::connect(&name).await?;
    mq.transport()
        .declare_queue(&QueueDecl::classic("bench"))
        .await?;
    let items = payloads(n, size);
    let counter = Counter::new(n);
    let c = counter.clone();
    let started = Clock::start();
    let consumer = mq
        .consume(
            "bench",
            ConsumerOptions::default().prefetch(PREFETCH),
            move |m: Message<Payload>| {
                let c = c.clone();
                async move {
                    std::hint::black_box(m.payload().seq);
                    c.bump();
                    Ok(())
                }
            },
        )
        .await?;
    let publisher = mq.publisher::<Payload>("", "bench");
    let mut published = 0u64;
    for chunk in items.chunks(1000) {
        // Stay at most MEMORY_BACKLOG ahead of the consumer: the figure is the steady-state
        // rate, not the cost of growing the heap for a queue of every message.
        while published.saturating_sub(counter.count.load(Ordering::SeqCst)) > MEMORY_BACKLOG {
            let progress = counter.progress.notified();
            if published.saturating_sub(counter.count.load(Ordering::SeqCst)) <= MEMORY_BACKLOG {
                break;
            }
            progress.await;
        }
        publisher.send_all(chunk).await?;
        published += chunk.len() as u64;
    }
    counter.wait().await;
    let elapsed = started.elapsed();
    consumer.close().await;
    mq.close().await?;
    Ok(Sample::new(n, elapsed, Vec::new()))
}
