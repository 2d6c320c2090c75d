//! Recording what settlement did: the consumer's outcome counters, the family's consume
//! metrics (one series set per message type) and the processing span's outcome.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::observe::metrics::{ConsumeMetrics, ConsumeOutcome};

/// A consumer's outcome counts since it started.
///
/// ```
/// let s = acemq::consume::ConsumerStats::default();
/// assert_eq!(s.acked + s.retried + s.dead_lettered + s.parked + s.rejected, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Handled and acked (`acked`).
    pub acked: u64,
    /// Republished for another attempt (`retried`).
    pub retried: u64,
    /// Moved to `{q}.dlq` after the policy gave up, or on the handler's request
    /// (`dead_lettered`).
    pub dead_lettered: u64,
    /// Moved to `{q}.dlq` as unprocessable (`rejected`).
    pub rejected: u64,
    /// Moved to `{q}.parked` (`parked`).
    pub parked: u64,
    /// Handed back with requeue on the handler's request, spending no attempt.
    pub released: u64,
    /// A move whose copy was not confirmed and routed: the original was requeued.
    pub set_aside_failed: u64,
    /// A broker wait whose rung queue did not exist (waited in the consumer instead).
    pub rung_missing: u64,
    /// A settlement that did not reach the broker (the message will be redelivered).
    pub settle_failed: u64,
    /// Handed back with requeue because the consumer was closing.
    pub requeued_on_close: u64,
    /// Acked without running the handler: the id was already handled (idempotency).
    pub duplicates: u64,
    /// Republished unchanged because another consumer holds a live claim (`in_progress`).
    pub in_progress: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    Acked,
    Retried,
    DeadLettered,
    Rejected,
    Parked,
    Released,
    SetAsideFailed,
    RungMissing,
    SettleFailed,
    RequeuedOnClose,
    Duplicate,
    InProgress,
}

impl Counter {
    /// The family's outcome value, for the counters that are consume outcomes.
    pub(crate) fn outcome(self) -> Option<ConsumeOutcome> {
        match self {
            Counter::Acked => Some(ConsumeOutcome::Acked),
            Counter::Retried => Some(ConsumeOutcome::Retried),
            Counter::DeadLettered => Some(ConsumeOutcome::DeadLettered),
            Counter::Rejected => Some(ConsumeOutcome::Rejected),
            Counter::Parked => Some(ConsumeOutcome::Parked),
            Counter::Duplicate => Some(ConsumeOutcome::Acked),
            Counter::InProgress => Some(ConsumeOutcome::InProgress),
            _ => None,
        }
    }
}

const COUNTERS: usize = 12;

#[derive(Debug, Default)]
pub(crate) struct Stats([AtomicU64; COUNTERS]);

impl Stats {
    pub(crate) fn add(&self, c: Counter) {
        self.0[c as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ConsumerStats {
        let g = |c: Counter| self.0[c as usize].load(Ordering::Relaxed);
        ConsumerStats {
            acked: g(Counter::Acked),
            retried: g(Counter::Retried),
            dead_lettered: g(Counter::DeadLettered),
            rejected: g(Counter::Rejected),
            parked: g(Counter::Parked),
            released: g(Counter::Released),
            set_aside_failed: g(Counter::SetAsideFailed),
            rung_missing: g(Counter::RungMissing),
            settle_failed: g(Counter::SettleFailed),
            requeued_on_close: g(Counter::RequeuedOnClose),
            duplicates: g(Counter::Duplicate),
            in_progress: g(Counter::InProgress),
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
        let mut map = self.by_type.lock().unwrap_or_else(|e| e.into_inner());
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
