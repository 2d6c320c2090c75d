//! The floor of scenario 5 (`--floor`): the per-message work the wire contract asks of every
//! `memory://` message, written bare, without AceMQ, so that its cost can be set beside
//! AceMQ's in one run.
//!
//! What every message of scenario 5 must carry and have read back, whatever library moves
//! it: its typed body encoded and decoded (the bench's JSON [`Payload`]), an id (UUID v4, as
//! text, `wire.md` §2), the seven envelope headers that are written always (id, type,
//! version, correlation, attempt, first-seen, origin) and the W3C `traceparent`, written on
//! one side and found and parsed on the other, and one hand-over from the publishing task
//! to the consuming one. The floor does that and nothing else: no broker, no confirm, no
//! prefetch window, no redelivery, no span, no metric. It is a lower bound, not a rival.
//!
//! Each step is timed alone on one thread (`steps`), and then all of them together in a
//! pipe (`pipe`): a producer task and a consumer task on the runtime, one unbounded tokio
//! mpsc between them (what the `memory://` broker hands each delivery through), with the
//! producer kept at most [`MEMORY_BACKLOG`] ahead as in scenario 5; once with one hand-over
//! per message and once with one per [`BATCH`] (as `send_all` publishes them).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

use crate::{Clock, MEMORY_BACKLOG, Payload, Result, Sample};

/// One step of the floor, timed alone.
#[derive(Clone, Debug)]
pub struct Step {
    /// What it does.
    pub what: &'static str,
    /// Nanoseconds per message.
    pub ns: f64,
}

/// The floor: its steps alone, their sum, and all of them in a pipe.
#[derive(Clone, Debug)]
pub struct Floor {
    /// Each step, timed alone on one thread.
    pub steps: Vec<Step>,
    /// The pipe: producer task to consumer task, every step on the way, one hand-over per
    /// message.
    pub pipe: Sample,
    /// The same pipe with one hand-over per [`BATCH`] messages.
    pub batched: Sample,
}

/// Messages per hand-over in the batched pipe (scenario 5 publishes with `send_all` in
/// batches of this size).
pub const BATCH: usize = 1_000;

impl Floor {
    /// The steps' sum: CPU nanoseconds per message before any hand-over.
    pub fn sum_ns(&self) -> f64 {
        self.steps.iter().map(|s| s.ns).sum()
    }

    /// The steps and their sum, as a Markdown table.
    pub fn table(&self) -> String {
        let mut out = String::from("| step (bare, one thread) | ns per message |\n|---|---|\n");
        for s in &self.steps {
            out.push_str(&format!("| {} | {:.0} |\n", s.what, s.ns));
        }
        out.push_str(&format!(
            "| sum: the contract's work on one core | {:.0} |\n",
            self.sum_ns()
        ));
        out
    }
}

/// A header value as the contract writes them: strings and integers.
#[derive(Debug)]
enum Value {
    Str(String),
    I32(i32),
    I64(i64),
}

/// A message as the floor moves it: headers in the cheapest honest carrier (a vector of
/// static names and owned values), the body as bytes.
#[derive(Debug)]
struct Bare {
    headers: Vec<(&'static str, Value)>,
    body: Vec<u8>,
}

const ID: &str = "x-acemq-id";
const TYPE: &str = "x-acemq-type";
const VERSION: &str = "x-acemq-version";
const CORRELATION: &str = "x-acemq-correlation";
const ATTEMPT: &str = "x-acemq-attempt";
const FIRST_SEEN: &str = "x-acemq-first-seen";
const ORIGIN: &str = "x-acemq-origin";
const TRACEPARENT: &str = "traceparent";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A `traceparent` (version 00, a fresh trace and span id, sampled), written without `fmt`.
fn traceparent() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let trace = Uuid::new_v4().as_u128();
    let span = (Uuid::new_v4().as_u128() as u64).max(1);
    let mut s = String::with_capacity(55);
    s.push_str("00-");
    for i in (0..32).rev() {
        s.push(HEX[((trace >> (i * 4)) & 0xf) as usize] as char);
    }
    s.push('-');
    for i in (0..16).rev() {
        s.push(HEX[((span >> (i * 4)) & 0xf) as usize] as char);
    }
    s.push_str("-01");
    s
}

/// Parses a `traceparent` back into its trace and span ids; `None` when malformed.
fn parse_traceparent(s: &str) -> Option<(u128, u64)> {
    let b = s.as_bytes();
    if b.len() != 55 || &b[..3] != b"00-" || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let trace = u128::from_str_radix(s.get(3..35)?, 16).ok()?;
    let span = u64::from_str_radix(s.get(36..52)?, 16).ok()?;
    Some((trace, span))
}

/// The seven envelope headers written always, and the trace context.
fn headers(id: String, origin: &str, traceparent: String) -> Vec<(&'static str, Value)> {
    vec![
        (CORRELATION, Value::Str(id.clone())),
        (ID, Value::Str(id)),
        (TYPE, Value::Str("bench".to_owned())),
        (VERSION, Value::I32(1)),
        (ATTEMPT, Value::I32(1)),
        (FIRST_SEEN, Value::I64(now_ms())),
        (ORIGIN, Value::Str(origin.to_owned())),
        (TRACEPARENT, Value::Str(traceparent)),
    ]
}

/// The publishing side of one message: id, body, envelope and trace context.
fn build(payload: &Payload, origin: &str) -> Result<Bare> {
    let id = Uuid::new_v4().hyphenated().to_string();
    let body = serde_json::to_vec(payload)?;
    Ok(Bare {
        headers: headers(id, origin, traceparent()),
        body,
    })
}

fn find<'a>(m: &'a Bare, name: &str) -> Option<&'a Value> {
    m.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
}

/// The consuming side of one message: every envelope field and the trace context found and
/// read, the body decoded. Answers the payload's sequence number.
fn read(m: &Bare) -> Result<u64> {
    let mut sum = 0i64;
    for name in [ID, TYPE, CORRELATION, ORIGIN] {
        match find(m, name) {
            Some(Value::Str(s)) => sum += s.len() as i64,
            _ => return Err(format!("floor: {name} is missing").into()),
        }
    }
    for name in [VERSION, ATTEMPT, FIRST_SEEN] {
        match find(m, name) {
            Some(Value::I32(v)) => sum += i64::from(*v),
            Some(Value::I64(v)) => sum += *v,
            _ => return Err(format!("floor: {name} is missing").into()),
        }
    }
    let Some(Value::Str(tp)) = find(m, TRACEPARENT) else {
        return Err("floor: traceparent is missing".into());
    };
    black_box(parse_traceparent(tp).ok_or("floor: traceparent is malformed")?);
    black_box(sum);
    let p: Payload = serde_json::from_slice(&m.body)?;
    Ok(p.seq)
}

/// Nanoseconds per call of `f` over `n` calls.
fn time_ns(n: u64, mut f: impl FnMut(u64) -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    for i in 0..n {
        f(i)?;
    }
    Ok(t.elapsed().as_nanos() as f64 / n.max(1) as f64)
}

/// Runs the floor with `n` messages of `size`-byte JSON bodies.
pub async fn run(n: u64, size: usize) -> Result<Floor> {
    let payloads: Vec<Payload> = (0..1_000).map(|i| Payload::new(i, size)).collect();
    let at = |i: u64| &payloads[(i % 1_000) as usize];
    let origin = format!("acemq@{}", std::process::id());
    let body = serde_json::to_vec(at(0))?;
    let sample = build(at(0), &origin)?;
    let steps = vec![
        Step {
            what: "encode the JSON body",
            ns: time_ns(n, |i| {
                black_box(serde_json::to_vec(at(i))?);
                Ok(())
            })?,
        },
        Step {
            what: "decode the JSON body",
            ns: time_ns(n, |_| {
                black_box(serde_json::from_slice::<Payload>(black_box(&body))?);
                Ok(())
            })?,
        },
        Step {
            what: "the id: a UUID v4, as text",
            ns: time_ns(n, |_| {
                black_box(Uuid::new_v4().hyphenated().to_string());
                Ok(())
            })?,
        },
        Step {
            what: "traceparent written and parsed",
            ns: time_ns(n, |_| {
                black_box(parse_traceparent(&traceparent()));
                Ok(())
            })?,
        },
        Step {
            what: "the seven envelope headers written, then found and read",
            ns: time_ns(n, |_| {
                let m = Bare {
                    headers: headers(
                        String::from("6f1e0c2a-8d4b-4f7e-9a51-0c3d2b1a4e5f"),
                        &origin,
                        String::new(),
                    ),
                    body: Vec::new(),
                };
                for name in [ID, TYPE, CORRELATION, ORIGIN, VERSION, ATTEMPT, FIRST_SEEN] {
                    black_box(find(&m, name));
                }
                black_box(m);
                Ok(())
            })?,
        },
    ];
    black_box(read(&sample)?);
    Ok(Floor {
        steps,
        pipe: pipe(n, 1, &payloads, &origin).await?,
        batched: pipe(n, BATCH, &payloads, &origin).await?,
    })
}

/// Every step, producer task to consumer task, as scenario 5 moves messages: `batch`
/// messages per hand-over.
async fn pipe(n: u64, batch: usize, payloads: &[Payload], origin: &str) -> Result<Sample> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<Bare>>();
    let handled = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Notify::new());
    let started = Clock::start();
    let consumer = {
        let (handled, progress) = (handled.clone(), progress.clone());
        tokio::spawn(async move {
            while let Some(ms) = rx.recv().await {
                for m in ms {
                    black_box(read(&m)?);
                    drop(m);
                    handled.fetch_add(1, Ordering::Release);
                }
                progress.notify_one();
            }
            Ok::<_, crate::BoxError>(())
        })
    };
    let mut i = 0u64;
    while i < n {
        while i.saturating_sub(handled.load(Ordering::Acquire)) > MEMORY_BACKLOG {
            progress.notified().await;
        }
        let end = n.min(i + batch as u64);
        let ms = (i..end)
            .map(|j| build(&payloads[(j % payloads.len() as u64) as usize], origin))
            .collect::<Result<Vec<Bare>>>()?;
        tx.send(ms)
            .map_err(|_| "floor: the consumer task ended early")?;
        i = end;
    }
    drop(tx);
    consumer.await??;
    let elapsed = started.elapsed();
    if handled.load(Ordering::Acquire) != n {
        return Err(format!("floor: handled {} of {n}", handled.load(Ordering::Acquire)).into());
    }
    Ok(Sample::new(n, elapsed, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let tp = traceparent();
        assert_eq!(tp.len(), 55);
        let (trace, span) = parse_traceparent(&tp).expect("parses");
        assert_eq!(tp[3..35], format!("{trace:032x}"));
        assert_eq!(tp[36..52], format!("{span:016x}"));
        assert_eq!(parse_traceparent("00-xyz"), None);
    }

    #[test]
    fn what_is_built_is_read_back() {
        let m = build(&Payload::new(42, 256), "acemq@test").expect("builds");
        assert_eq!(m.body.len(), 256);
        assert_eq!(read(&m).expect("reads"), 42);
        assert_eq!(m.headers.len(), 8);
    }
}
