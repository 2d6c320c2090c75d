//! How cost grows with scale (`--scale`): each measure taken at two sizes, ten times apart,
//! with the cost per item at each, so a cost that grows worse than linearly shows as a
//! per-item figure that grows ([`Growth::linear`](crate::scale::Growth::linear) is false
//! when it more than doubles).
//!
//! * **consumers**: `n` AceMQ consumers on one connection, each on its own queue: the time
//!   to start them all (each declares its `.dlq` and `.parked`), the resident memory they
//!   add, and the CPU they burn over two idle seconds;
//! * **topology**: the consumer topology (queue, `.dlq`, `.parked`, a retry rung and their
//!   bindings) of `n` queues, declared with `Connection::declare`;
//! * **waits**: `n` deliveries each failing once and waiting 2 s in the consumer at the same
//!   time (prefetch `n`, one handler at a time): the wall time until all are handled (about
//!   2 s whatever `n`, since the waits overlap) and the CPU they cost;
//! * **outstanding confirms**: `n` publishes sent at once and their confirms awaited, AceMQ
//!   (`send_all`) beside raw lapin (publish all, then await every `PublisherConfirm`).
//!
//! The first three run on `memory://` and, when a broker is reachable, on RabbitMQ; the
//! third on RabbitMQ only. Queues are named `acemq-bench.scale.{pid}.…` and deleted after.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::retry::RetryPolicy;
use acemq::topology::{QueueDecl, Topology};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

use crate::raw::{check_confirm, raw_properties};
use crate::scenario::short;
use crate::{Clock, Payload, Result, process_cpu};

/// A measure at two sizes.
#[derive(Clone, Debug)]
pub struct Growth {
    /// What was measured, and where.
    pub what: String,
    /// The unit of `per_item`.
    pub unit: &'static str,
    /// `(size, total, per item)` at each size.
    pub points: Vec<(u64, f64, f64)>,
}

impl Growth {
    /// Whether the per-item cost at the larger size stays within twice the smaller's.
    pub fn linear(&self) -> bool {
        match self.points.as_slice() {
            [(_, _, small), .., (_, _, large)] => *large <= small.max(f64::MIN_POSITIVE) * 2.0,
            _ => true,
        }
    }

    /// One table line.
    pub fn line(&self) -> String {
        let points: Vec<String> = self
            .points
            .iter()
            .map(|(n, total, per)| format!("{n}: {total:.1} total, {per:.2} {}/item", self.unit))
            .collect();
        format!(
            "| {:<44} | {:<66} | {:<6} |",
            self.what,
            points.join("; "),
            if self.linear() { "linear" } else { "WORSE" }
        )
    }
}

fn queue_name(tag: &str, i: u64) -> String {
    format!("acemq-bench.scale.{}.{tag}.{i}", std::process::id())
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

async fn delete_all(mq: &Connection, names: &[String]) {
    let t = mq.transport();
    for q in names {
        for name in [q.clone(), format!("{q}.dlq"), format!("{q}.parked")] {
            let _ = t.delete_queue(&name).await;
        }
    }
}

/// `n` consumers on one connection: `(ms to start all, KiB of RSS added, ms of CPU over
/// 2 s idle)`.
async fn consumers(mq: &Connection, n: u64) -> Result<(f64, f64, f64)> {
    let names: Vec<String> = (0..n).map(|i| queue_name("consumers", i)).collect();
    let t = mq.transport();
    for q in &names {
        t.declare_queue(&QueueDecl::classic(q)).await?;
    }
    let rss = rss_kib();
    let started = Instant::now();
    let mut running = Vec::with_capacity(names.len());
    for q in &names {
        let c = mq
            .consume(
                q,
                ConsumerOptions::default(),
                |_m: Message<Payload>| async { Ok(()) },
            )
            .await?;
        running.push(c);
    }
    let took = started.elapsed();
    let added = rss_kib().saturating_sub(rss);
    let cpu = process_cpu();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = process_cpu().saturating_sub(cpu);
    for c in &running {
        c.close().await;
    }
    delete_all(mq, &names).await;
    Ok((
        took.as_secs_f64() * 1e3,
        added as f64,
        idle.as_secs_f64() * 1e3,
    ))
}

/// Declares `n` queues, each with its consumer topology (with one broker rung): ms in all.
async fn topology(mq: &Connection, n: u64) -> Result<f64> {
    let policy = RetryPolicy::fixed(3, Duration::from_secs(60))?;
    let names: Vec<String> = (0..n).map(|i| queue_name("topology", i)).collect();
    let started = Instant::now();
    for q in &names {
        mq.transport().declare_queue(&QueueDecl::classic(q)).await?;
        mq.declare(&Topology::for_consumer(q, Some(&policy)))
            .await?;
    }
    let took = started.elapsed();
    let t = mq.transport();
    for q in &names {
        let _ = t.delete_queue(&format!("{q}.retry.1m")).await;
    }
    delete_all(mq, &names).await;
    Ok(took.as_secs_f64() * 1e3)
}

/// `n` deliveries failing once, all waiting 2 s in the consumer at once (prefetch `n`,
/// concurrency 1): `(ms until all are handled, ms of CPU)`.
async fn waits(mq: &Connection, n: u64) -> Result<(f64, f64)> {
    let q = queue_name("waits", n);
    mq.transport()
        .declare_queue(&QueueDecl::classic(&q))
        .await?;
    let payloads: Vec<Payload> = (0..n).map(|s| Payload::new(s, 256)).collect();
    mq.publisher::<Payload>("", &q).send_all(&payloads).await?;
    let handled = Arc::new(AtomicU64::new(0));
    let counted = handled.clone();
    let prefetch = u16::try_from(n).unwrap_or(u16::MAX);
    let clock = Clock::start();
    let consumer = mq
        .consume(
            &q,
            ConsumerOptions::default()
                .prefetch(prefetch)
                .concurrency(1)
                .retry(RetryPolicy::fixed(2, Duration::from_secs(2))?),
            move |m: Message<Payload>| {
                let counted = counted.clone();
                async move {
                    if m.attempt() < 2 {
                        return Err(HandlerError::retry("fails once"));
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while handled.load(Ordering::SeqCst) < n {
        if Instant::now() > deadline {
            return Err(format!(
                "waits: {} of {n} handled in 60 s",
                handled.load(Ordering::SeqCst)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let span = clock.elapsed();
    consumer.close().await;
    delete_all(mq, &[q]).await;
    Ok((span.wall.as_secs_f64() * 1e3, span.cpu.as_secs_f64() * 1e3))
}

/// `n` publishes at once, every confirm awaited: ms, AceMQ then raw.
async fn confirms(mq: &Connection, raw: &lapin::Connection, n: u64) -> Result<(f64, f64)> {
    let q = queue_name("confirms", n);
    mq.transport()
        .declare_queue(&QueueDecl::classic(&q))
        .await?;
    let payloads: Vec<Payload> = (0..n).map(|s| Payload::new(s, 256)).collect();
    let publisher = mq.publisher::<Payload>("", &q);
    let clock = Clock::start();
    publisher.send_all(&payloads).await?;
    let ace = clock.elapsed().wall;
    mq.transport().purge_queue(&q).await?;

    let ch = raw.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let bodies: Vec<Vec<u8>> = payloads
        .iter()
        .map(serde_json::to_vec)
        .collect::<std::result::Result<_, _>>()?;
    let clock = Clock::start();
    let mut pending = Vec::with_capacity(bodies.len());
    for (i, body) in bodies.iter().enumerate() {
        pending.push(
            ch.basic_publish(
                "".into(),
                short(&q)?,
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                raw_properties(format!("scale-{i}")),
            )
            .await?,
        );
    }
    for p in pending {
        check_confirm(p.await?)?;
    }
    let raw_took = clock.elapsed().wall;
    ch.close(200, "OK".into()).await?;
    let _ = mq.transport().delete_queue(&q).await;
    Ok((ace.as_secs_f64() * 1e3, raw_took.as_secs_f64() * 1e3))
}

/// Every scale measure at `sizes` (two, ten times apart), on `memory://` and, with
/// `broker` (its AceMQ and raw connections), on RabbitMQ.
pub async fn run(
    broker: Option<(&Connection, &lapin::Connection)>,
    sizes: [u64; 2],
    confirm_sizes: [u64; 2],
) -> Result<Vec<Growth>> {
    let memory =
        Connection::connect(&format!("memory://bench-scale-{}", std::process::id())).await?;
    let mut targets = vec![("memory://", &memory)];
    if let Some((mq, _)) = broker {
        targets.push(("RabbitMQ", mq));
    }
    let mut out = Vec::new();
    for (name, mq) in targets {
        let mut start = Growth {
            what: format!("{name}: start n consumers"),
            unit: "ms",
            points: Vec::new(),
        };
        let mut rss = Growth {
            what: format!("{name}: resident memory of n consumers"),
            unit: "KiB",
            points: Vec::new(),
        };
        let mut idle = Growth {
            what: format!("{name}: CPU of n idle consumers over 2 s"),
            unit: "ms",
            points: Vec::new(),
        };
        let mut declare = Growth {
            what: format!("{name}: declare n consumer topologies"),
            unit: "ms",
            points: Vec::new(),
        };
        let mut waited = Growth {
            what: format!("{name}: n waiting 2 s at once, until handled"),
            unit: "ms",
            points: Vec::new(),
        };
        let mut waits_cpu = Growth {
            what: format!("{name}: n waiting 2 s at once, CPU"),
            unit: "ms",
            points: Vec::new(),
        };
        for n in sizes {
            let (took, added, burnt) = consumers(mq, n).await?;
            let per = |x: f64| x / n as f64;
            start.points.push((n, took, per(took)));
            rss.points.push((n, added, per(added)));
            idle.points.push((n, burnt, per(burnt)));
            let took = topology(mq, n).await?;
            declare.points.push((n, took, per(took)));
            let (wall, cpu) = waits(mq, n).await?;
            waited.points.push((n, wall, per(wall)));
            waits_cpu.points.push((n, cpu, per(cpu)));
        }
        out.extend([start, rss, idle, declare, waited, waits_cpu]);
    }
    if let Some((mq, raw)) = broker {
        let mut ace = Growth {
            what: "RabbitMQ: n confirms outstanding, AceMQ".into(),
            unit: "ms",
            points: Vec::new(),
        };
        let mut lapin_side = Growth {
            what: "RabbitMQ: n confirms outstanding, raw lapin".into(),
            unit: "ms",
            points: Vec::new(),
        };
        for n in confirm_sizes {
            let (a, r) = confirms(mq, raw, n).await?;
            ace.points.push((n, a, a / n as f64));
            lapin_side.points.push((n, r, r / n as f64));
        }
        out.extend([ace, lapin_side]);
    }
    memory.close().await?;
    Ok(out)
}
