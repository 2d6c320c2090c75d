//! What a scheduler reports: its counters ([`SchedulerStats`]), the metrics (Rust only,
//! described with the others), and the control queue's backlog, looked at every
//! [`DEFAULT_BACKLOG_CHECK`] by a task of its own, behind the `scheduler` health component:
//! `Degraded` while due messages wait in `acemq.schedule.due` and nothing consumes it
//! (no scheduler runs anywhere: everything scheduled is late until one starts).
//!
//! The same task purges the cancellation store, when there is one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{CONTROL_QUEUE, Inner, SchedulerOptions};
use crate::health::{HealthContributor, HealthReport};

pub use crate::observe::metrics::{
    SCHEDULE_BACKLOG, SCHEDULE_CANCELLED_TOTAL, SCHEDULE_DELIVERED_TOTAL, SCHEDULE_HOPS_TOTAL,
    SCHEDULE_LATENESS, SCHEDULE_SCHEDULED_TOTAL,
};

/// How often a scheduler looks at the control queue's backlog.
pub const DEFAULT_BACKLOG_CHECK: Duration = Duration::from_secs(10);

/// The health component a scheduler registers.
pub const HEALTH_COMPONENT: &str = "scheduler";

/// How often the cancellation store is purged.
const PURGE_EVERY: Duration = Duration::from_secs(600);

/// A scheduler's counts so far.
///
/// ```
/// let s = acemq::schedule::SchedulerStats::default();
/// assert_eq!(s.scheduled + s.delivered + s.hops + s.cancelled, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerStats {
    /// Messages handed to this scheduler (`after`, `at`).
    pub scheduled: u64,
    /// Messages this scheduler published to their destination.
    pub delivered: u64,
    /// Messages this scheduler put on a rung (a long delay is several hops).
    pub hops: u64,
    /// Due messages not delivered because they were cancelled.
    pub cancelled: u64,
    /// Ready messages in `acemq.schedule.due` at the last check (`None`: not looked at).
    pub backlog: Option<u32>,
    /// Consumers of `acemq.schedule.due` at the last check, any member's.
    pub schedulers: Option<u32>,
}

/// The counters, each also a metric.
pub(crate) struct Counters {
    transport: &'static str,
    scheduled: AtomicU64,
    delivered: AtomicU64,
    hops: AtomicU64,
    cancelled: AtomicU64,
    /// (ready, consumers) at the last check.
    backlog: Mutex<Option<(u32, u32)>>,
}

impl Counters {
    pub(crate) fn new(transport: &'static str) -> Counters {
        Counters {
            transport,
            scheduled: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            hops: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            backlog: Mutex::new(None),
        }
    }

    pub(crate) fn scheduled(&self) {
        self.scheduled.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(SCHEDULE_SCHEDULED_TOTAL, "transport" => self.transport).increment(1);
    }

    pub(crate) fn hopped(&self) {
        self.hops.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(SCHEDULE_HOPS_TOTAL, "transport" => self.transport).increment(1);
    }

    /// A delivery, `late` after its due time.
    pub(crate) fn delivered(&self, late: Duration) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(SCHEDULE_DELIVERED_TOTAL, "transport" => self.transport).increment(1);
        metrics::histogram!(SCHEDULE_LATENESS, "transport" => self.transport)
            .record(late.as_secs_f64());
    }

    pub(crate) fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(SCHEDULE_CANCELLED_TOTAL, "transport" => self.transport).increment(1);
    }

    fn backlog(&self) -> Option<(u32, u32)> {
        *self
            .backlog
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_backlog(&self, seen: (u32, u32)) {
        *self
            .backlog
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(seen);
        metrics::gauge!(SCHEDULE_BACKLOG, "transport" => self.transport).set(f64::from(seen.0));
    }

    pub(crate) fn snapshot(&self) -> SchedulerStats {
        let backlog = self.backlog();
        SchedulerStats {
            scheduled: self.scheduled.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
            hops: self.hops.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
            backlog: backlog.map(|b| b.0),
            schedulers: backlog.map(|b| b.1),
        }
    }
}

/// The `scheduler` health component.
struct SchedulerHealth(Arc<Inner>);

impl HealthContributor for SchedulerHealth {
    fn name(&self) -> String {
        HEALTH_COMPONENT.to_owned()
    }

    fn report(&self) -> Result<HealthReport, String> {
        let s = self.0.counters.snapshot();
        let mut report = match (s.backlog, s.schedulers) {
            (Some(ready), Some(0)) if ready > 0 => HealthReport::degraded(HEALTH_COMPONENT)
                .with_detail(
                    "reason",
                    format!("{ready} scheduled messages wait in {CONTROL_QUEUE} and no scheduler consumes it: they are late until one starts (Connection::scheduler, or another member's)"),
                ),
            _ => HealthReport::up(HEALTH_COMPONENT),
        };
        report = report
            .with_detail("scheduled", s.scheduled)
            .with_detail("delivered", s.delivered)
            .with_detail("hops", s.hops)
            .with_detail("cancelled", s.cancelled);
        if let (Some(backlog), Some(schedulers)) = (s.backlog, s.schedulers) {
            report = report
                .with_detail("backlog", backlog)
                .with_detail("schedulers", schedulers);
        }
        Ok(report)
    }
}

/// Registers the health component and starts the backlog check (and the cancellation
/// store's purge) until `stop`.
pub(crate) fn start(inner: &Arc<Inner>, options: &SchedulerOptions, stop: CancellationToken) {
    inner
        .engine
        .register_health(Arc::new(SchedulerHealth(inner.clone())));
    let every = options.backlog_check;
    let purges = inner.cancellations.is_some();
    if every.is_none() && !purges {
        return;
    }
    let inner = inner.clone();
    tokio::spawn(async move {
        let mut next_purge = tokio::time::Instant::now();
        while !inner.engine.lifecycle.is_closed() {
            if every.is_some() {
                look(&inner).await;
            }
            if let Some(store) = &inner.cancellations
                && tokio::time::Instant::now() >= next_purge
            {
                next_purge = tokio::time::Instant::now() + PURGE_EVERY;
                match store.purge(inner.clock.now_ms()).await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::debug!(purged = n, "cancellations past their due time purged")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not purge the cancellation store; tried again later")
                    }
                }
            }
            let wait = every.map_or(PURGE_EVERY, |e| e.min(PURGE_EVERY));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    });
}

/// Looks at the control queue once (passively: never declares it).
async fn look(inner: &Inner) {
    match inner.engine.transport.inspect_queue(CONTROL_QUEUE).await {
        Ok(info) => inner
            .counters
            .set_backlog((info.message_count, info.consumer_count)),
        Err(e) => {
            tracing::debug!(error = %e, "could not look at {CONTROL_QUEUE}; its backlog is reported again at the next check");
        }
    }
}
