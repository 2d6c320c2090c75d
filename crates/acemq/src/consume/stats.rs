//! Recording what settlement did: the consumer's outcome counters, the family's consume
//! metrics (one series set per message type) and the processing span's outcome.
//!
//! The counters come from ONE table (the `counters!` rows below): each row names the counter,
//! the [`ConsumerStats`] field it fills and the family's consume outcome it reports (if
//! any). Adding a fate is one row here plus the settlement that counts it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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
    /// Handed back with requeue on the handler's request, spending no attempt.
    Released => released, None;
    /// A move whose copy was not confirmed and routed: the original was requeued.
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
}

/// The counters of one consumer, one atomic per [`Counter`].
#[derive(Debug, Default)]
pub(crate) struct Stats([AtomicU64; Counter::ALL.len()]);

impl Stats {
    pub(crate) fn add(&self, c: Counter) {
        self.0[c as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, c: Counter) -> u64 {
        self.0[c as usize].load(Ordering::Relaxed)
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
    queue: Arc<str>,
    by_type: std::sync::Mutex<HashMap<String, Arc<ConsumeMetrics>>>,
}

impl ConsumerMetrics {
    pub(crate) fn new(queue: Arc<str>) -> Self {
        ConsumerMetrics {
            queue,
            by_type: std::sync::Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn for_type(&self, message_type: &str) -> Arc<ConsumeMetrics> {
        let mut map = lock(&self.by_type);
        if let Some(m) = map.get(message_type) {
            return m.clone();
        }
        let m = Arc::new(ConsumeMetrics::new(&*self.queue, message_type));
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
            s.released,
            s.set_aside_failed,
            s.rung_missing,
            s.settle_failed,
            s.requeued_on_close,
            s.duplicates,
            s.in_progress,
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
    }
}
