//! The flapping-link drill: one AceMQ connection reaches the broker through the
//! drill proxy, which drops every socket at once, again and again, at random moments — some
//! while the connection is redialling or re-subscribing, some within 100 ms of a recovery —
//! while the harness publishes and consumes.
//!
//! The cuts come in bursts of one to four. After each burst the drill waits for the
//! connection to be back and asserts that within [`CONSUMER_BOUND`] of that the broker
//! lists exactly one consumer on the queue (read through an operator connection that does
//! not go through the proxy); recovery is timed from the burst's last cut until the
//! connection is back, the broker lists the consumer, and an id confirmed since the cut has
//! been handled. At the end: lost = 0, duplicates within a prefetch window per cut,
//! recovery p50 ≤ [`P50_BOUND`] and max ≤ [`MAX_BOUND`], resources flat between the 10th cut
//! and the last, and `close()` within its budget (asserted by [`Drill::finish`]).
//!
//! The schedule comes from a seed, printed first (`ACEMQ_FLAP_SEED` replays one); the
//! number of cuts is `ACEMQ_FLAP_CUTS` (default [`DEFAULT_CUTS`]).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use acemq::transport::Transport;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::proxy::Proxy;
use super::resources::Resources;
use super::run::Drill;

/// Cuts in a run unless `ACEMQ_FLAP_CUTS` says otherwise.
pub const DEFAULT_CUTS: usize = 240;
/// How soon after the connection is back the broker must list the consumer.
pub const CONSUMER_BOUND: Duration = Duration::from_secs(2);
/// The median recovery allowed.
pub const P50_BOUND: Duration = Duration::from_millis(500);
/// The slowest recovery allowed.
pub const MAX_BOUND: Duration = Duration::from_secs(5);
/// How long a burst may take to heal at all before the drill fails.
const HEAL_BOUND: Duration = Duration::from_secs(30);
/// The share of cuts made within 100 ms of a recovery (the rest at 0–1 s after the last).
const RIGHT_AFTER_RECOVERY: f64 = 0.3;

/// What a run measured.
#[derive(Debug)]
pub struct Figures {
    pub seed: u64,
    pub cuts: usize,
    pub bursts: usize,
    pub right_after_recovery: usize,
    pub consumer_checks: usize,
    pub p50: Duration,
    pub max: Duration,
}

/// The seed from `ACEMQ_FLAP_SEED`, else from the clock.
pub fn seed() -> u64 {
    std::env::var("ACEMQ_FLAP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
}

/// Runs the cuts on a started drill `d` whose connection goes through `proxy`; `operator`
/// reaches the broker directly. `prefix` names the drill's connections on the broker.
pub async fn run(
    d: &mut Drill,
    proxy: &Proxy,
    operator: &dyn Transport,
    node: Option<String>,
    prefix: &str,
) -> Figures {
    let seed = seed();
    let cuts: usize = std::env::var("ACEMQ_FLAP_CUTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CUTS);
    eprintln!("drill flapping: seed {seed} (ACEMQ_FLAP_SEED={seed} replays it), {cuts} cuts");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut recoveries: Vec<Duration> = Vec::new();
    let (mut done, mut bursts, mut quick, mut checks) = (0usize, 0usize, 0usize, 0usize);
    let mut baseline: Option<Resources> = None;
    while done < cuts {
        let burst = rng.random_range(1..=4usize).min(cuts - done);
        let mut last_cut = Instant::now();
        for _ in 0..burst {
            if rng.random_bool(RIGHT_AFTER_RECOVERY) {
                // Right after a recovery: the moment re-subscribing and the first
                // deliveries happen.
                wait_connected(d, HEAL_BOUND).await;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
                quick += 1;
            } else {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..1000))).await;
            }
            proxy.close_all();
            d.fault();
            last_cut = Instant::now();
            done += 1;
        }
        bursts += 1;
        wait_lost(d).await;
        let back = wait_connected(d, HEAL_BOUND).await;
        consumer_listed(d, operator, back, done).await;
        checks += 1;
        let healed = healed_since(d, operator, last_cut, done).await;
        recoveries.push(healed);
        if done % 20 < burst || done == cuts {
            eprintln!(
                "drill flapping: {done} cuts, last burst of {burst} healed in {}ms",
                healed.as_millis()
            );
        }
        if baseline.is_none() && done >= 10 {
            baseline = Some(Resources::measure(node.clone(), prefix.to_owned()).await);
        }
    }
    recoveries.sort_unstable();
    let p50 = recoveries[recoveries.len() / 2];
    let max = recoveries[recoveries.len() - 1];
    let figures = Figures {
        seed,
        cuts: done,
        bursts,
        right_after_recovery: quick,
        consumer_checks: checks,
        p50,
        max,
    };
    eprintln!(
        "drill flapping: {} cuts in {} bursts ({} within 100 ms of a recovery); consumer count \
         checked {} times, exactly 1 each time within {CONSUMER_BOUND:?}; recovery p50 {}ms, \
         max {}ms (seed {seed})",
        figures.cuts,
        figures.bursts,
        figures.right_after_recovery,
        figures.consumer_checks,
        p50.as_millis(),
        max.as_millis()
    );
    if let Some(before) = baseline {
        before
            .assert_settles(node, prefix.to_owned(), "flapping")
            .await;
    }
    assert!(
        p50 <= P50_BOUND,
        "drill flapping: recovery p50 {p50:?} above {P50_BOUND:?} (seed {seed})"
    );
    assert!(
        max <= MAX_BOUND,
        "drill flapping: slowest recovery {max:?} above {MAX_BOUND:?} (seed {seed})"
    );
    figures
}

/// Waits (briefly) until the connection has noticed the last cut, so that "connected"
/// afterwards means recovered, not "not noticed yet".
async fn wait_lost(d: &Drill) {
    let end = Instant::now() + Duration::from_secs(1);
    while d.mq.status().connected && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until the drill's connection says it is connected; when it is.
async fn wait_connected(d: &Drill, within: Duration) -> Instant {
    let end = Instant::now() + within;
    loop {
        if d.mq.status().connected {
            return Instant::now();
        }
        assert!(
            Instant::now() < end,
            "drill flapping: the connection was not back within {within:?}; health {}",
            d.mq.health().to_json()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts that within [`CONSUMER_BOUND`] of `back` the broker lists exactly one consumer of
/// the drill's queue (more than one is a subscription left over from an older connection;
/// none is a detached consumer).
async fn consumer_listed(d: &Drill, operator: &dyn Transport, back: Instant, cut: usize) {
    let end = back + CONSUMER_BOUND;
    let mut seen = None;
    loop {
        match operator.inspect_queue(&d.queue).await {
            Ok(info) if info.consumer_count == 1 => return,
            Ok(info) => seen = Some(info.consumer_count),
            Err(e) => eprintln!("drill flapping: inspecting {}: {e}", d.queue),
        }
        if Instant::now() >= end {
            // The connection may have been cut again meanwhile only by us, and we are not
            // cutting now: a count other than 1 is the bug this drill is for.
            panic!(
                "drill flapping: after cut {cut} the broker lists {seen:?} consumers of {} \
                 {CONSUMER_BOUND:?} after the connection was back (expected exactly 1); \
                 connection {:?}; health {}",
                d.queue,
                d.mq.status(),
                d.mq.health().to_json()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long after `cut` the connection is back, the broker lists the consumer and an id
/// confirmed after the cut has been handled.
async fn healed_since(d: &Drill, operator: &dyn Transport, cut: Instant, n: usize) -> Duration {
    let end = cut + HEAL_BOUND;
    loop {
        if let Some(both) = d.ledger.recovered_since(cut) {
            let listed = operator
                .inspect_queue(&d.queue)
                .await
                .is_ok_and(|i| i.consumer_count == 1);
            if listed && d.mq.status().connected {
                return both;
            }
        }
        assert!(
            Instant::now() < end,
            "drill flapping: cut {n}: publishing and consuming not both back within \
             {HEAL_BOUND:?}: {}; health {}",
            d.line(),
            d.mq.health().to_json()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
