//! The raw lapin side, written "the straightforward, competent way": its building blocks
//! (properties, envelope headers, confirm channels), the untimed [`fill`] of a queue, and
//! scenarios 1 to 4.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation};

use crate::scenario::{payloads, short};
use crate::{BATCH, Clock, PREFETCH, Payload, RETRY_WAIT, Result, Sample};

// ---------------------------------------------------------------------------------------
// Building blocks.

/// Properties like AceMQ's for a publish: message id, JSON content type, persistent.
pub(crate) fn raw_properties(message_id: String) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(message_id.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
}

static RAW_ENVELOPE_HEADERS: AtomicBool = AtomicBool::new(false);

static RAW_CONTRACT: AtomicBool = AtomicBool::new(false);

static RAW_TWO_CONNECTIONS: AtomicBool = AtomicBool::new(false);

/// Makes the raw publishers of scenarios 1, 2 and 7 also send AceMQ's envelope headers (a
/// diagnostic: it shows what the headers cost the broker).
pub fn set_raw_envelope_headers(on: bool) {
    RAW_ENVELOPE_HEADERS.store(on, Ordering::Relaxed);
}

/// Makes the raw publishers of scenarios 1, 2 and 7 write everything the wire contract asks
/// of an AceMQ publish (a diagnostic: raw lapin like with like). On top of the envelope
/// headers: every id a UUID v4 as text and a `traceparent`; in scenario 7, the correlation
/// in `x-acemq-correlation` only (no `correlation_id` property, which the contract does not
/// write) and matched from there, the reply address in `acemq-reply-to` too, the request's
/// `expiration` (its timeout) and the reply's `x-acemq-causation`.
pub fn set_raw_contract(on: bool) {
    RAW_CONTRACT.store(on, Ordering::Relaxed);
    if on {
        set_raw_envelope_headers(true);
    }
}

/// Whether the raw side writes the whole contract (`--raw-contract`).
pub(crate) fn raw_contract() -> bool {
    RAW_CONTRACT.load(Ordering::Relaxed)
}

/// Makes raw request/reply (scenario 7) publish on one connection and consume on another,
/// as AceMQ does (a diagnostic: it shows what the split costs).
pub fn set_raw_two_connections(on: bool) {
    RAW_TWO_CONNECTIONS.store(on, Ordering::Relaxed);
}

/// Whether raw request/reply publishes on a connection of its own.
pub(crate) fn raw_two_connections() -> bool {
    RAW_TWO_CONNECTIONS.load(Ordering::Relaxed)
}

/// A raw publish's properties: a message id, and the envelope headers when asked for.
fn raw_publish_properties(seq: u64) -> BasicProperties {
    raw_properties_with_envelope(format!("raw-{seq}"))
}

/// [`raw_properties`], with the envelope headers when asked for (the correlation is the id).
pub(crate) fn raw_properties_with_envelope(id: String) -> BasicProperties {
    let id = raw_id(id);
    match raw_headers(&id, &id, None) {
        Some(headers) => raw_properties(id).with_headers(headers),
        None => raw_properties(id),
    }
}

/// A raw publish's id: `id`, or a UUID v4 as text under `--raw-contract`.
pub(crate) fn raw_id(id: String) -> String {
    if raw_contract() {
        uuid::Uuid::new_v4().to_string()
    } else {
        id
    }
}

/// The headers of a raw publish: none, or the envelope's under `--raw-envelope-headers`, plus
/// a `traceparent` under `--raw-contract` (a child of `parent`'s trace when given one).
pub(crate) fn raw_headers(id: &str, correlation: &str, parent: Option<&str>) -> Option<FieldTable> {
    if !RAW_ENVELOPE_HEADERS.load(Ordering::Relaxed) {
        return None;
    }
    let mut h = envelope_headers(id, correlation);
    if raw_contract() {
        h.insert("traceparent".into(), text(&traceparent(parent)));
    }
    Some(h)
}

/// A header's text value (a long string).
pub(crate) fn text(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

/// A header's text, if `name` is there as a long string.
pub(crate) fn header<'a>(properties: &'a BasicProperties, name: &str) -> Option<&'a str> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
        _ => None,
    }
}

/// A W3C `traceparent` with a fresh span id, in `parent`'s trace or a new one.
fn traceparent(parent: Option<&str>) -> String {
    let (_, span) = uuid::Uuid::new_v4().as_u64_pair();
    match parent.and_then(|p| p.get(3..35)) {
        Some(trace) => format!("00-{trace}-{span:016x}-01"),
        None => format!("00-{}-{span:016x}-01", uuid::Uuid::new_v4().simple()),
    }
}

/// The envelope headers an AceMQ publisher writes, so that both consumers read the same
/// messages (attempt 1).
fn envelope_headers(id: &str, correlation: &str) -> FieldTable {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut h = FieldTable::default();
    h.insert("x-acemq-id".into(), text(id));
    h.insert("x-acemq-type".into(), text("bench"));
    h.insert("x-acemq-version".into(), AMQPValue::LongInt(1));
    h.insert("x-acemq-correlation".into(), text(correlation));
    h.insert("x-acemq-attempt".into(), AMQPValue::LongInt(1));
    h.insert("x-acemq-first-seen".into(), AMQPValue::LongLongInt(now));
    h.insert("x-acemq-origin".into(), text("acemq-bench@localhost"));
    h
}

pub(crate) async fn confirm_channel(conn: &lapin::Connection) -> Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

pub(crate) fn check_confirm(c: Confirmation) -> Result<()> {
    match c {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(ret)) => Err(format!("unroutable: {}", ret.reply_text).into()),
        Confirmation::Nack(_) => Err("nacked".into()),
        Confirmation::NotRequested => Err("confirms not enabled".into()),
    }
}

pub(crate) const MANDATORY: BasicPublishOptions = BasicPublishOptions {
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
        let props = raw_properties(id.clone()).with_headers(envelope_headers(&id, &id));
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
