//! The drill ledger: what was sent, what the broker confirmed, what the handler ran, and the
//! accounting line every drill prints.
//!
//! * `sent`: publish attempts (a retried id counts once per attempt);
//! * `confirmed`: distinct ids the broker confirmed as routed;
//! * `handled_distinct` / `total_runs`: distinct ids the handler ran / every handler run;
//! * `lost`: confirmed ids never handled (must be 0);
//! * `duplicates`: `total_runs - handled_distinct`.
//!
//! Shared by `crates/acemq/tests/drills.rs` and `crates/acemq-sql/tests/drills.rs` (the
//! latter includes this file by path): std only.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Books {
    attempted: HashSet<u64>,
    /// id -> when its confirm arrived.
    confirmed: HashMap<u64, Instant>,
    /// id -> (runs, last run).
    handled: HashMap<u64, (u32, Instant)>,
}

/// The drill's books; see the module docs.
#[derive(Default)]
pub struct Ledger {
    sent: AtomicU64,
    publish_errors: AtomicU64,
    total_runs: AtomicU64,
    books: Mutex<Books>,
}

/// A snapshot of the counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub sent: u64,
    pub publish_errors: u64,
    pub confirmed: u64,
    pub handled_distinct: u64,
    pub total_runs: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// Handled ids that were never published (must be 0).
    pub phantom: u64,
}

impl Ledger {
    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A publish attempt of `id` is about to be made.
    pub fn attempt(&self, id: u64) {
        self.sent.fetch_add(1, Ordering::SeqCst);
        self.books().attempted.insert(id);
    }

    /// A publish attempt failed (it will be retried; it may still have arrived).
    pub fn publish_failed(&self) {
        self.publish_errors.fetch_add(1, Ordering::SeqCst);
    }

    /// The broker confirmed `id` as routed.
    pub fn confirmed(&self, id: u64) {
        self.books()
            .confirmed
            .entry(id)
            .or_insert_with(Instant::now);
    }

    /// The handler ran for `id`.
    pub fn handled(&self, id: u64) {
        self.total_runs.fetch_add(1, Ordering::SeqCst);
        let now = Instant::now();
        let mut b = self.books();
        let e = b.handled.entry(id).or_insert((0, now));
        e.0 += 1;
        e.1 = now;
    }

    /// Handler runs so far.
    pub fn total_runs(&self) -> u64 {
        self.total_runs.load(Ordering::SeqCst)
    }

    /// Distinct confirmed ids so far.
    pub fn confirmed_count(&self) -> u64 {
        self.books().confirmed.len() as u64
    }

    /// Confirmed ids the handler has not run (yet), in order.
    pub fn unhandled_confirmed(&self) -> Vec<u64> {
        let b = self.books();
        let mut v: Vec<u64> = b
            .confirmed
            .keys()
            .filter(|id| !b.handled.contains_key(id))
            .copied()
            .collect();
        v.sort_unstable();
        v
    }

    /// When both directions work again after `t0`: the earliest moment an id whose confirm
    /// arrived after `t0` had also been handled after `t0`, as a duration since `t0`.
    pub fn recovered_since(&self, t0: Instant) -> Option<Duration> {
        let b = self.books();
        b.confirmed
            .iter()
            .filter(|(_, at)| **at >= t0)
            .filter_map(|(id, at)| {
                let (_, last) = b.handled.get(id)?;
                (*last >= t0).then(|| (*at).max(*last) - t0)
            })
            .min()
    }

    /// The counts now.
    pub fn counts(&self) -> Counts {
        let b = self.books();
        let handled_distinct = b.handled.len() as u64;
        let total_runs = self.total_runs.load(Ordering::SeqCst);
        Counts {
            sent: self.sent.load(Ordering::SeqCst),
            publish_errors: self.publish_errors.load(Ordering::SeqCst),
            confirmed: b.confirmed.len() as u64,
            handled_distinct,
            total_runs,
            lost: b
                .confirmed
                .keys()
                .filter(|id| !b.handled.contains_key(id))
                .count() as u64,
            duplicates: total_runs.saturating_sub(handled_distinct),
            phantom: b
                .handled
                .keys()
                .filter(|id| !b.attempted.contains(id))
                .count() as u64,
        }
    }
}

impl Counts {
    /// The accounting line: `drill <name>: sent=.. confirmed=.. handled_distinct=..
    /// total_runs=.. lost=.. duplicates=.. recovered_in=..ms` (the slowest recovery of the
    /// drill; `none` when it never recovered).
    pub fn line(&self, drill: &str, recovered_in: Option<Duration>) -> String {
        format!(
            "drill {drill}: sent={} confirmed={} handled_distinct={} total_runs={} lost={} duplicates={} recovered_in={}",
            self.sent,
            self.confirmed,
            self.handled_distinct,
            self.total_runs,
            self.lost,
            self.duplicates,
            recovered_in.map_or_else(|| "none".to_owned(), |d| format!("{}ms", d.as_millis())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lost_duplicates_phantoms_and_recovery() {
        let l = Ledger::default();
        for id in 0..3 {
            l.attempt(id);
        }
        l.attempt(2); // a retry
        l.publish_failed();
        l.confirmed(0);
        l.confirmed(1);
        l.confirmed(2);
        l.handled(0);
        l.handled(0);
        l.handled(1);
        l.handled(99);
        let c = l.counts();
        assert_eq!(
            (c.sent, c.confirmed, c.handled_distinct, c.total_runs),
            (4, 3, 3, 4)
        );
        assert_eq!((c.lost, c.duplicates, c.phantom), (1, 1, 1));
        assert_eq!(l.unhandled_confirmed(), vec![2]);
        let t0 = Instant::now();
        assert_eq!(l.recovered_since(t0), None, "nothing after t0 yet");
        l.attempt(3);
        l.confirmed(3);
        assert_eq!(l.recovered_since(t0), None, "confirmed but not handled");
        l.handled(3);
        assert!(l.recovered_since(t0).is_some());
        assert!(
            c.line("x", Some(Duration::from_millis(1500)))
                .ends_with("lost=1 duplicates=1 recovered_in=1500ms")
        );
    }
}
