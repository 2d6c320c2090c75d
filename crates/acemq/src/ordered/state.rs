//! What an ordered consumer knows about its partitions, from local state only: each
//! partition's role (active, on standby, waiting for the connection), its halt (the held
//! message's id and the reason), the counters, and the three views of them: the
//! [`OrderedConsumer`](super::OrderedConsumer) handle, the `ordered:{name}` health report
//! and the `acemq.ordered.*` metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use tokio::sync::watch;

use crate::consume::Stats;
use crate::health::{HealthContributor, HealthReport};
use crate::lifecycle::{ConsumerProgress, ReportsProgress};
use crate::util::lock;

pub use crate::observe::metrics::{ORDERED_HALTED, ORDERED_TOTAL};

/// Where one partition stands in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionRole {
    /// Not subscribed yet, or subscribing again (the connection was lost or the broker
    /// ended the subscription); the text says why.
    Connecting(String),
    /// This process holds the partition's exclusive consumer.
    Active,
    /// Another consumer holds the partition (the broker refused the exclusive consume);
    /// this one tries again every second or two and takes over when the holder goes.
    Standby,
}

/// A halted partition: the message it holds, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Halt {
    /// The held message's id (`x-acemq-id`); remembered across a reconnect so that its
    /// redelivery is held again instead of run.
    pub message_id: String,
    /// The handler's last error.
    pub reason: String,
    /// When the partition halted.
    pub since: SystemTime,
}

/// An ordered consumer's counts since it started.
///
/// ```
/// let s = acemq::ordered::OrderedStats::default();
/// assert_eq!(s.handled + s.failed + s.skipped + s.parked + s.held_again, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrderedStats {
    /// Handled and acked.
    pub handled: u64,
    /// Failed for good: halted the partition, or skipped.
    pub failed: u64,
    /// Dead-lettered to `{name}.p{i}.dlq` by [`OnFailure::Skip`](super::OnFailure::Skip).
    pub skipped: u64,
    /// Did not decode: moved to `{name}.p{i}.parked`.
    pub parked: u64,
    /// Redeliveries of a halted partition's held message (after a reconnect) held again
    /// without running the handler.
    pub held_again: u64,
}

/// One partition's shared state.
#[derive(Debug)]
pub(crate) struct Partition {
    pub(crate) index: u32,
    pub(crate) queue: String,
    pub(crate) role: Mutex<PartitionRole>,
    /// `Some` while halted; cleared by `resume`.
    pub(crate) halt: watch::Sender<Option<Halt>>,
}

/// Everything an ordered consumer's tasks and its handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) transport: &'static str,
    pub(crate) partitions: Vec<Partition>,
    handled: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    parked: AtomicU64,
    held_again: AtomicU64,
    /// Each partition's consumer counters and progress (the one delivery path's), once
    /// consuming started.
    pub(crate) partition_stats: OnceLock<Vec<Arc<Stats>>>,
}

/// What happened to one delivery, for the counters and the metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    Handled,
    Skipped,
    Parked,
    Halted,
}

impl Fate {
    fn as_str(self) -> &'static str {
        match self {
            Fate::Handled => "handled",
            Fate::Skipped => "skipped",
            Fate::Parked => "parked",
            Fate::Halted => "halted",
        }
    }
}

impl Shared {
    pub(crate) fn new(name: &str, transport: &'static str, partitions: u32) -> Shared {
        Shared {
            name: name.to_owned(),
            transport,
            partitions: (0..partitions)
                .map(|i| Partition {
                    index: i,
                    queue: super::partition_queue(name, i),
                    role: Mutex::new(PartitionRole::Connecting("starting".into())),
                    halt: watch::Sender::new(None),
                })
                .collect(),
            handled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            held_again: AtomicU64::new(0),
            partition_stats: OnceLock::new(),
        }
    }

    pub(crate) fn stats(&self) -> OrderedStats {
        let get = |c: &AtomicU64| c.load(Ordering::SeqCst);
        OrderedStats {
            handled: get(&self.handled),
            failed: get(&self.failed),
            skipped: get(&self.skipped),
            parked: get(&self.parked),
            held_again: get(&self.held_again),
        }
    }

    /// Partitions halted now, ascending.
    pub(crate) fn halted(&self) -> Vec<u32> {
        self.partitions
            .iter()
            .filter(|p| p.halt.borrow().is_some())
            .map(|p| p.index)
            .collect()
    }

    pub(crate) fn set_role(&self, p: &Partition, role: PartitionRole) {
        *lock(&p.role) = role;
    }

    pub(crate) fn held_again(&self) {
        self.held_again.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a delivery's fate (and its settlement), in the counters and the metric.
    pub(crate) fn record(&self, p: &Partition, fate: Fate) {
        let counter = match fate {
            Fate::Handled => &self.handled,
            Fate::Skipped => {
                self.failed.fetch_add(1, Ordering::SeqCst);
                &self.skipped
            }
            Fate::Parked => &self.parked,
            Fate::Halted => &self.failed,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(
            ORDERED_TOTAL,
            "queue" => p.queue.clone(),
            "transport" => self.transport,
            "outcome" => fate.as_str(),
        )
        .increment(1);
    }

    /// Halts `p` on `halt`.
    pub(crate) fn halt(&self, p: &Partition, halt: Halt) {
        p.halt.send_replace(Some(halt));
        self.halted_gauge();
    }

    /// Lifts `p`'s halt; `true` when it was halted.
    pub(crate) fn resume(&self, p: &Partition) -> bool {
        let lifted = p.halt.send_if_modified(|h| h.take().is_some());
        if lifted {
            self.halted_gauge();
        }
        lifted
    }

    fn halted_gauge(&self) {
        let n = self.halted().len();
        metrics::gauge!(ORDERED_HALTED, "queue" => self.name.clone(), "transport" => self.transport)
            .set(n as f64);
    }

    /// The details of the `ordered:{name}` report, typed ([`Detail`]): numbers, the list
    /// of halted partitions, a text per halted partition.
    pub(crate) fn details(&self) -> Vec<(String, Detail)> {
        let s = self.stats();
        let halted = self.halted();
        let mut out = vec![
            (
                "partitions".to_owned(),
                Detail::Number(self.partitions.len() as u64),
            ),
            ("handled".to_owned(), Detail::Number(s.handled)),
            ("failed".to_owned(), Detail::Number(s.failed)),
            ("skipped".to_owned(), Detail::Number(s.skipped)),
            ("parked".to_owned(), Detail::Number(s.parked)),
            ("halted".to_owned(), Detail::List(halted)),
        ];
        let roles: Vec<PartitionRole> = self
            .partitions
            .iter()
            .map(|p| lock(&p.role).clone())
            .collect();
        let active = roles
            .iter()
            .filter(|r| **r == PartitionRole::Active)
            .count();
        let standby = roles
            .iter()
            .filter(|r| **r == PartitionRole::Standby)
            .count();
        out.push(("active".to_owned(), Detail::Number(active as u64)));
        out.push(("standby".to_owned(), Detail::Number(standby as u64)));
        for p in &self.partitions {
            if let Some(h) = p.halt.borrow().as_ref() {
                out.push((
                    format!("p{}.halted", p.index),
                    Detail::Text(format!("message {} held: {}", h.message_id, h.reason)),
                ));
            }
        }
        out
    }
}

/// One detail of the `ordered:{name}` report: a JSON number, array or string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Detail {
    Number(u64),
    /// The halted partitions, as a JSON array (`[]` when none).
    List(Vec<u32>),
    Text(String),
}

impl From<Detail> for serde_json::Value {
    fn from(d: Detail) -> Self {
        match d {
            Detail::Number(n) => n.into(),
            Detail::List(l) => l.into(),
            Detail::Text(t) => t.into(),
        }
    }
}

/// The `ordered:{name}` health contributor: Degraded while any partition is halted (never
/// Down: the other partitions work, and a restart would lose the held message).
#[derive(Debug)]
pub(crate) struct OrderedHealth(pub(crate) Arc<Shared>);

/// The health component's name for the ordered queue `name`.
pub(crate) fn health_name(name: &str) -> String {
    format!("ordered:{name}")
}

impl HealthContributor for OrderedHealth {
    fn name(&self) -> String {
        health_name(&self.0.name)
    }

    fn report(&self) -> Result<HealthReport, String> {
        let mut report = if self.0.halted().is_empty() {
            HealthReport::up(self.name())
        } else {
            HealthReport::degraded(self.name())
        };
        for (k, v) in self.0.details() {
            report = report.with_detail(k, v);
        }
        Ok(report)
    }
}

impl ReportsProgress for Shared {
    fn progress(&self) -> ConsumerProgress {
        let mut all = ConsumerProgress {
            last_delivery: None,
            last_settlement: None,
            in_hand: 0,
            running: 0,
            held: 0,
            moves_failing: 0,
            set_aside_failed: 0,
            // A halted partition is reported by `ordered:{name}`, not as a stall.
            stalled: None,
            stall_after: std::time::Duration::ZERO,
            store: None,
        };
        for p in self.partition_stats.get().into_iter().flatten() {
            let one = p.progress();
            all.last_delivery = all.last_delivery.max(one.last_delivery);
            all.last_settlement = all.last_settlement.max(one.last_settlement);
            all.in_hand += one.in_hand;
            all.running += one.running;
            all.held += one.held;
            all.moves_failing += one.moves_failing;
            all.set_aside_failed += one.set_aside_failed;
            // An outage any partition saw wins over a store that answers.
            all.store = match (all.store.take(), one.store) {
                (Some(Some(o)), _) | (_, Some(Some(o))) => Some(Some(o)),
                (a, b) => a.or(b),
            };
        }
        all
    }
}
