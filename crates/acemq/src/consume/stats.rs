//! Recording what settlement did: the consumer's outcome counters, the family's consume
//! metrics (one series set per message type) and the processing span's outcome; and what
//! health reads about the consumer's progress ([`Stats`] implements the lifecycle's
//! [`ReportsProgress`]): when it last got a delivery and last settled one, how many it holds
//! and in which state, whether it is stalled, and its idempotency store's outage.
//!
//! The counters come from ONE table (the `counters!` rows below): each row names the counter,
//! the [`ConsumerStats`] field it fills and the family's consume outcome it reports (if
//! any). Adding a fate is one row here plus the settlement that counts it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::moves::MoveState;
use crate::lifecycle::{ConsumerProgress, ReportsProgress, StoreOutage};
use crate::observe::metrics::{ConsumeMetrics, ConsumeOutcome};
use crate::util::lock;

/// Declares the counters: the public snapshot, the private counter enum, its outcome
/// mapping, and the snapshot taken from the atomic array, all from one list of rows.
macro_rules! counters {
    ($(
        $(#[$doc:meta])*
        $counter:ident => $field:ident, $outcome:expr;
    )*) => {
        /// A consumer's outcome counts since it started.
        ///
        /// ```
        /// let s = acemq::consume::ConsumerStats::default();
        /// assert_eq!(s.acked + s.retried + s.dead_lettered + s.parked + s.rejected, 0);
        /// ```
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct ConsumerStats {
            $( $(#[$doc])* pub $field: u64, )*
        }

        impl std::ops::Add for ConsumerStats {
            type Output = ConsumerStats;
            /// Counts of two consumers together (a consumer group's members).
            fn add(self, other: ConsumerStats) -> ConsumerStats {
                ConsumerStats { $( $field: self.$field.saturating_add(other.$field), )* }
            }
        }

        /// One counter of [`ConsumerStats`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Counter {
            $( $counter, )*
        }

        impl Counter {
            /// Every counter, in table order.
            const ALL: &'static [Counter] = &[$( Counter::$counter, )*];

            /// The family's outcome value, for the counters that are consume outcomes.
            pub(crate) fn outcome(self) -> Option<ConsumeOutcome> {
                match self {
                    $( Counter::$counter => $outcome, )*
                }
            }
        }

        impl Stats {
            pub(crate) fn snapshot(&self) -> ConsumerStats {
                ConsumerStats {
                    $( $field: self.get(Counter::$counter), )*
                }
            }
        }
    };
}

counters! {
    /// Handled and acked (`acked`).
    Acked => acked, Some(ConsumeOutcome::Acked);
    /// Republished for another attempt (`retried`).
    Retried => retried, Some(ConsumeOutcome::Retried);
    /// Moved to `{q}.dlq` after the policy gave up, or on the handler's request
    /// (`dead_lettered`).
    DeadLettered => dead_lettered, Some(ConsumeOutcome::DeadLettered);
    /// Moved to `{q}.dlq` as unprocessable (`rejected`).
    Rejected => rejected, Some(ConsumeOutcome::Rejected);
    /// Moved to `{q}.parked` (`parked`).
    Parked => parked, Some(ConsumeOutcome::Parked);
    /// Acked without being handled, on the consumer's rule (a stream reader that skips
    /// failures).
    Skipped => skipped, None;
    /// Handed back with requeue on the handler's request, spending no attempt.
    Released => released, None;
    /// A try of a move whose copy was not confirmed and routed (the delivery keeps its
    /// decision and the move is tried again with backoff): counted per try.
    SetAsideFailed => set_aside_failed, None;
    /// A broker wait whose rung queue did not exist (waited in the consumer instead).
    RungMissing => rung_missing, None;
    /// A settlement that did not reach the broker (the message will be redelivered).
    SettleFailed => settle_failed, None;
    /// Handed back with requeue because the consumer was closing.
    RequeuedOnClose => requeued_on_close, None;
    /// Acked without running the handler: the id was already handled (idempotency).
    Duplicate => duplicates, Some(ConsumeOutcome::Acked);
    /// Republished unchanged because another consumer holds a live claim (`in_progress`).
    InProgress => in_progress, Some(ConsumeOutcome::InProgress);
    /// Republished unchanged, after a backoff, because the idempotency store could not be
    /// asked: no attempt spent (reported as `in_progress` in the family's metrics).
    StoreUnavailable => store_unavailable, Some(ConsumeOutcome::InProgress);
}

impl Counter {
    /// Whether the counter ends a delivery in the broker (an ack, a nack, a confirmed move):
    /// progress, as the stall detection sees it. A failed move, a missing rung or a
    /// settlement that did not reach the broker is not.
    fn settles(self) -> bool {
        !matches!(
            self,
            Counter::SetAsideFailed | Counter::RungMissing | Counter::SettleFailed
        )
    }
}

/// The default of [`ConsumerOptions::stall_after`](super::ConsumerOptions::stall_after).
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(5 * 60);

/// The counters of one consumer, one atomic per [`Counter`], and its progress.
#[derive(Debug)]
pub(crate) struct Stats {
    counts: [AtomicU64; Counter::ALL.len()],
    progress: Mutex<Progress>,
    stall_after: Duration,
    /// Whether the consumer uses an idempotency store (health then reports it).
    uses_store: bool,
    /// What the consumer's deliveries outside their handlers are doing (waits, failing
    /// moves), shared with its settler.
    pub(crate) moves: Arc<MoveState>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new(DEFAULT_STALL_AFTER, false)
    }
}

/// What the consumer holds and when it last moved.
#[derive(Debug, Default)]
struct Progress {
    last_delivery: Option<SystemTime>,
    last_settlement: Option<SystemTime>,
    /// The later of the last settlement and the moment the consumer last went from holding
    /// nothing to holding something: a stall is measured from here.
    moved_at: Option<tokio::time::Instant>,
    in_hand: usize,
    running: usize,
    held: usize,
    store_failures: u32,
    store_outage: Option<StoreOutage>,
}

impl Stats {
    /// A consumer's stats: stalled when deliveries wait and nothing settled for
    /// `stall_after`; `uses_store` when it deduplicates through an idempotency store.
    pub(crate) fn new(stall_after: Duration, uses_store: bool) -> Stats {
        Stats {
            counts: Default::default(),
            progress: Mutex::new(Progress::default()),
            stall_after,
            uses_store,
            moves: Arc::default(),
        }
    }

    /// Counts one counter; a settling one is also the consumer's latest progress.
    pub(crate) fn add(&self, c: Counter) {
        self.counts[c as usize].fetch_add(1, Ordering::Relaxed);
        if c.settles() {
            let mut p = lock(&self.progress);
            p.last_settlement = Some(SystemTime::now());
            p.moved_at = Some(tokio::time::Instant::now());
        }
    }

    fn get(&self, c: Counter) -> u64 {
        self.counts[c as usize].load(Ordering::Relaxed)
    }

    /// A delivery was admitted (past the pause gate): held until [`Stats::delivery_done`].
    pub(crate) fn delivery_started(&self) {
        let mut p = lock(&self.progress);
        p.last_delivery = Some(SystemTime::now());
        if p.in_hand == 0 {
            p.moved_at = Some(tokio::time::Instant::now());
        }
        p.in_hand += 1;
    }

    /// An admitted delivery is finished with (settled, or handed on).
    pub(crate) fn delivery_done(&self) {
        let mut p = lock(&self.progress);
        p.in_hand = p.in_hand.saturating_sub(1);
    }

    /// A handler started (`true`) or finished (`false`) running.
    pub(crate) fn handler_running(&self, running: bool) {
        let mut p = lock(&self.progress);
        if running {
            p.running += 1;
        } else {
            p.running = p.running.saturating_sub(1);
        }
    }

    /// A delivery started (`true`) or stopped (`false`) waiting at the pause gate.
    pub(crate) fn held_at_gate(&self, held: bool) {
        let mut p = lock(&self.progress);
        if held {
            p.held += 1;
        } else {
            p.held = p.held.saturating_sub(1);
        }
    }

    /// An idempotency store call answered: the store is up again.
    pub(crate) fn store_answered(&self) {
        let mut p = lock(&self.progress);
        if let Some(outage) = p.store_outage.take() {
            tracing::info!(error = %outage.error, failures = p.store_failures, "the idempotency store answers again");
        }
        p.store_failures = 0;
    }

    /// An idempotency store call failed; returns the consecutive failures, this one
    /// included (the backoff of the delivery put back for it).
    pub(crate) fn store_failed(&self, error: &str) -> u32 {
        let mut p = lock(&self.progress);
        p.store_failures = p.store_failures.saturating_add(1);
        let failures = p.store_failures;
        match &mut p.store_outage {
            Some(outage) => {
                outage.error = error.to_owned();
                outage.failures = failures;
            }
            None => {
                p.store_outage = Some(StoreOutage {
                    error: error.to_owned(),
                    since: SystemTime::now(),
                    failures,
                });
            }
        }
        failures
    }
}

impl ReportsProgress for Stats {
    fn progress(&self) -> ConsumerProgress {
        let p = lock(&self.progress);
        let quiet = p
            .moved_at
            .map(|at| tokio::time::Instant::now().saturating_duration_since(at));
        // Held: in a handler's hands, or waiting / retrying a move outside it.
        let waiting = self.moves.waiting.load(Ordering::SeqCst);
        let stalled = match quiet {
            Some(quiet) if p.in_hand + waiting > 0 && quiet >= self.stall_after => Some(quiet),
            _ => None,
        };
        ConsumerProgress {
            last_delivery: p.last_delivery,
            last_settlement: p.last_settlement,
            in_hand: p.in_hand,
            running: p.running.min(p.in_hand),
            held: p.held,
            moves_failing: self.moves.moves_failing.load(Ordering::SeqCst),
            set_aside_failed: self.get(Counter::SetAsideFailed),
            stalled,
            stall_after: self.stall_after,
            store: self.uses_store.then(|| p.store_outage.clone()),
        }
    }
}

/// How one delivery is being observed: when its handling started, its processing span and
/// its metric series (looked up once per delivery).
#[derive(Debug)]
pub(crate) struct Observed {
    pub(crate) started: Instant,
    pub(crate) span: tracing::Span,
    pub(crate) series: Arc<ConsumeMetrics>,
}

/// The family's consume metrics of one consumer, one series set per message type.
#[derive(Debug)]
pub(crate) struct ConsumerMetrics {
    /// The family's transport name (`rabbitmq`, `memory`).
    transport: &'static str,
    queue: Arc<str>,
    by_type: std::sync::Mutex<HashMap<String, Arc<ConsumeMetrics>>>,
}

impl ConsumerMetrics {
    pub(crate) fn new(transport: &'static str, queue: Arc<str>) -> Self {
        ConsumerMetrics {
            transport,
            queue,
            by_type: std::sync::Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn for_type(&self, message_type: &str) -> Arc<ConsumeMetrics> {
        let mut map = lock(&self.by_type);
        if let Some(m) = map.get(message_type) {
            return m.clone();
        }
        let m = Arc::new(ConsumeMetrics::new(
            self.transport,
            &*self.queue,
            message_type,
        ));
        map.insert(message_type.to_owned(), m.clone());
        m
    }

    /// Series for events not tied to one message type (set-aside failures, missing rungs).
    pub(crate) fn any(&self) -> Arc<ConsumeMetrics> {
        self.for_type("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_counter_fills_its_own_field() {
        let stats = Stats::default();
        for (i, c) in Counter::ALL.iter().enumerate() {
            for _ in 0..=i {
                stats.add(*c);
            }
        }
        let s = stats.snapshot();
        let fields = [
            s.acked,
            s.retried,
            s.dead_lettered,
            s.rejected,
            s.parked,
            s.skipped,
            s.released,
            s.set_aside_failed,
            s.rung_missing,
            s.settle_failed,
            s.requeued_on_close,
            s.duplicates,
            s.in_progress,
            s.store_unavailable,
        ];
        assert_eq!(fields.len(), Counter::ALL.len());
        for (i, f) in fields.iter().enumerate() {
            assert_eq!(*f, i as u64 + 1, "{:?}", Counter::ALL[i]);
        }
    }

    #[test]
    fn only_consume_outcomes_reach_the_metrics() {
        assert_eq!(Counter::Duplicate.outcome(), Some(ConsumeOutcome::Acked));
        assert_eq!(Counter::Rejected.outcome(), Some(ConsumeOutcome::Rejected));
        assert_eq!(Counter::RungMissing.outcome(), None);
        assert_eq!(Counter::SettleFailed.outcome(), None);
        assert_eq!(
            Counter::StoreUnavailable.outcome(),
            Some(ConsumeOutcome::InProgress)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_consumer_holding_deliveries_without_settling_is_stalled() {
        let stats = Stats::new(Duration::from_secs(60), false);
        assert_eq!(stats.progress().stalled, None, "idle is not stalled");
        tokio::time::advance(Duration::from_secs(600)).await;
        stats.delivery_started();
        assert_eq!(stats.progress().stalled, None, "busy since just now");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(stats.progress().stalled, None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(stats.progress().stalled, Some(Duration::from_secs(60)));
        stats.add(Counter::SetAsideFailed);
        assert!(
            stats.progress().stalled.is_some(),
            "a failed move is no progress"
        );
        stats.add(Counter::Acked);
        assert_eq!(stats.progress().stalled, None, "a settlement is");
        stats.delivery_done();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(stats.progress().stalled, None, "holding nothing");
    }

    #[test]
    fn the_store_outage_is_reported_until_a_call_answers() {
        let stats = Stats::new(DEFAULT_STALL_AFTER, true);
        assert_eq!(stats.progress().store, Some(None));
        assert_eq!(stats.store_failed("refused"), 1);
        assert_eq!(stats.store_failed("timed out"), 2);
        let outage = stats.progress().store.flatten().unwrap();
        assert_eq!((outage.error.as_str(), outage.failures), ("timed out", 2));
        stats.store_answered();
        assert_eq!(stats.progress().store, Some(None));
        assert_eq!(
            stats.store_failed("again"),
            1,
            "consecutive failures restart"
        );
        assert_eq!(
            Stats::default().progress().store,
            None,
            "no store, no report"
        );
    }
}
