//! The recovery model test: thousands of generated schedules of faults on
//! `memory://`, in virtual time, each ending with the consumer subscribed exactly once,
//! nothing confirmed lost and duplicates within a prefetch window per fault.
//!
//! A schedule is drawn from a seed: 10–40 steps at random gaps of 0–600 ms, each one of
//! * a lost connection (`drop_connection`), sometimes twice in a row;
//! * a lost connection a random 0–60 ms after the next `consume-ok` (the moment a consumer
//!   has just subscribed again, during its first deliveries);
//! * the broker down for 0–3 s while the connection is lost (redials fail meanwhile);
//! * a broker cancel of the consumer (as when a queue's node goes down);
//! * a silent detach (the broker forgets the consumer and says nothing, as RabbitMQ 3.10
//!   was seen to do), which only the broker-side check can notice;
//!
//! while another connection publishes a steady stream of numbered, confirmed messages.
//!
//! After the last step: the broker must list exactly one consumer of the queue within
//! [`SETTLE`] (virtual), every confirmed message must be handled, duplicates must stay
//! within `prefetch × faults`, and `close()` must return within its budget.
//!
//! `ACEMQ_MODEL_SEEDS` sets how many schedules run (default [`DEFAULT_SEEDS`]);
//! `ACEMQ_MODEL_SEED=N` replays one. A failure names its seed.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::consume::{ConsumerOptions, Message};
use acemq::topology::QueueDecl;
use acemq::transport::Transport;
use acemq::transport::memory::MemoryTransport;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Schedules run by default.
const DEFAULT_SEEDS: u64 = 2000;
/// The consumer's prefetch: the duplicate window per fault.
const PREFETCH: u16 = 8;
/// How long after the last step everything must be back (virtual time).
const SETTLE: Duration = Duration::from_secs(10);
/// The broker-side check's interval in the model (virtual time).
const CHECK: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug)]
enum Step {
    Lose,
    LoseTwice,
    LoseAfterConsume(u64),
    Down(u64),
    Cancel,
    Forget,
}

/// The schedule of `seed`: `(gap before, step)`.
fn schedule(seed: u64) -> Vec<(u64, Step)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = rng.random_range(10..=40);
    (0..n)
        .map(|_| {
            let gap = rng.random_range(0..600);
            let step = match rng.random_range(0..100) {
                0..30 => Step::Lose,
                30..40 => Step::LoseTwice,
                40..65 => Step::LoseAfterConsume(rng.random_range(0..60)),
                65..75 => Step::Down(rng.random_range(0..3000)),
                75..88 => Step::Cancel,
                _ => Step::Forget,
            };
            (gap, step)
        })
        .collect()
}

/// What the handler saw: runs per message number.
type Seen = Arc<Mutex<HashMap<u64, u32>>>;

/// Runs one schedule; `Err` says what went wrong.
async fn run(seed: u64) -> Result<String, String> {
    let broker = format!("model-{seed}-{}", support::unique("r"));
    let consumer_side = Arc::new(MemoryTransport::connect(&broker));
    let publisher_side = MemoryTransport::connect(&broker);
    let faults = consumer_side.clone();
    let q = "model.q";
    publisher_side
        .declare_queue(&QueueDecl::quorum(q))
        .await
        .map_err(|e| e.to_string())?;
    let mq = Connection::with_transport(
        consumer_side.clone(),
        ConnectionOptions::default().name(format!("model-{seed}")),
    );
    let seen: Seen = Arc::default();
    let books = seen.clone();
    let consumer = mq
        .consume(
            q,
            ConsumerOptions::default()
                .prefetch(PREFETCH)
                .broker_check(Some(CHECK)),
            move |m: Message<u64>| {
                *books
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(*m.payload())
                    .or_default() += 1;
                async { Ok(()) }
            },
        )
        .await
        .map_err(|e| format!("consume: {e}"))?;

    // The publisher: a numbered message every 20 ms, confirmed, on its own connection.
    let publisher = Connection::with_transport(
        Arc::new(publisher_side),
        ConnectionOptions::default().name(format!("model-{seed}-publisher")),
    );
    let sent = Arc::new(Mutex::new(0u64));
    let stop = tokio_util::sync::CancellationToken::new();
    let pump = {
        let (sent, stop) = (sent.clone(), stop.clone());
        let p = publisher.publisher::<u64>("", q);
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                if p.send(&n).await.is_ok() {
                    n += 1;
                    *sent.lock().unwrap_or_else(|e| e.into_inner()) = n;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let mut losses = 0u64;
    let steps = schedule(seed);
    for (gap, step) in &steps {
        tokio::time::sleep(Duration::from_millis(*gap)).await;
        match *step {
            Step::Lose => faults.drop_connection("model"),
            Step::LoseTwice => {
                faults.drop_connection("model");
                tokio::time::sleep(Duration::from_millis(1)).await;
                faults.drop_connection("model again");
                losses += 1;
            }
            Step::LoseAfterConsume(ms) => {
                faults.lose_connection_after_next_consume(Duration::from_millis(ms));
                faults.drop_connection("model, before a loss right after consume-ok");
                losses += 1;
            }
            Step::Down(ms) => {
                faults.broker().set_down(true);
                faults.drop_connection("model, broker down");
                tokio::time::sleep(Duration::from_millis(ms)).await;
                faults.broker().set_down(false);
            }
            Step::Cancel => {
                faults.broker().cancel_consumers(q);
            }
            Step::Forget => {
                faults.broker().forget_consumers(q);
            }
        }
        losses += 1;
    }
    let last = tokio::time::Instant::now();
    // Exactly one consumer, within SETTLE of the last step.
    loop {
        let info = publisher
            .transport()
            .inspect_queue(q)
            .await
            .map_err(|e| e.to_string())?;
        if info.consumer_count == 1 && mq.status().connected {
            break;
        }
        if last.elapsed() > SETTLE {
            return Err(format!(
                "{} consumers of {q} {SETTLE:?} after the last step (expected 1); health {}",
                info.consumer_count,
                mq.health().to_json()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    let _ = pump.await;
    let sent = *sent.lock().unwrap_or_else(|e| e.into_inner());
    // Everything confirmed is handled.
    loop {
        let missing = {
            let s = seen.lock().unwrap_or_else(|e| e.into_inner());
            (0..sent).filter(|n| !s.contains_key(n)).count()
        };
        if missing == 0 {
            break;
        }
        if last.elapsed() > SETTLE * 3 {
            return Err(format!(
                "{missing} of {sent} confirmed messages never handled; health {}",
                mq.health().to_json()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let duplicates: u64 = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .map(|n| u64::from(n.saturating_sub(1)))
        .sum();
    let window = u64::from(PREFETCH) * losses;
    if duplicates > window {
        return Err(format!(
            "{duplicates} duplicates, above the window of {window} (prefetch {PREFETCH} × {losses} faults)"
        ));
    }
    consumer.close().await;
    match tokio::time::timeout(Duration::from_secs(30), mq.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("close: {e}")),
        Err(_) => return Err("close() did not return within 30 s".into()),
    }
    publisher.close().await.ok();
    Ok(format!(
        "{} steps, {losses} faults, {sent} confirmed, {duplicates} duplicates",
        steps.len()
    ))
}

/// One schedule on a fresh single-threaded runtime in virtual time.
fn run_seed(seed: u64) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(run(seed))
}

#[test]
fn recovery_holds_under_generated_fault_schedules() {
    let seeds: Vec<u64> = match std::env::var("ACEMQ_MODEL_SEED") {
        Ok(s) => vec![s.parse().expect("ACEMQ_MODEL_SEED is a number")],
        Err(_) => {
            let n = std::env::var("ACEMQ_MODEL_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(DEFAULT_SEEDS);
            (0..n).collect()
        }
    };
    let mut failed = Vec::new();
    let (mut faults, mut confirmed) = (0u64, 0u64);
    for seed in &seeds {
        match run_seed(*seed) {
            Ok(summary) => {
                if seeds.len() == 1 {
                    eprintln!("seed {seed}: {summary}");
                }
                let nums: Vec<u64> = summary
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|s| s.parse().ok())
                    .collect();
                faults += nums.get(1).copied().unwrap_or(0);
                confirmed += nums.get(2).copied().unwrap_or(0);
            }
            Err(why) => {
                eprintln!("seed {seed} failed (ACEMQ_MODEL_SEED={seed} replays it): {why}");
                failed.push(*seed);
            }
        }
    }
    eprintln!(
        "recovery model: {} schedules, {faults} faults, {confirmed} confirmed messages, {} failed",
        seeds.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} schedules failed; replay one with ACEMQ_MODEL_SEED=N: {failed:?}",
        failed.len(),
        seeds.len()
    );
}
