//! The consumers' part of the connection's health: their progress under `consumers` (a
//! stalled consumer makes it Degraded) and their idempotency stores under `idempotency`.
//! Built by the engine from the lifecycle's [`ConsumerProgress`] snapshots; never Down.
//! The two component names are defined here, with the reports that use them; the
//! connection's own component (`acemq`) is in `health::connection`.

use std::time::SystemTime;

use super::{HealthReport, HealthStatus};
use crate::envelope::format_instant;
use crate::lifecycle::{ConsumerProgress, StoreOutage};

/// The health component listing this connection's consumers (re-exported as
/// `acemq::connection::CONSUMERS`).
pub const CONSUMERS: &str = "consumers";

/// The name of the health component that reports the idempotency stores of a
/// connection's consumers: `Degraded` while a store does not answer (with the error, since
/// when, and the consumers it affects), `Up` again after its next successful call
/// (re-exported as `acemq::idempotency::HEALTH_COMPONENT`).
pub const IDEMPOTENCY: &str = "idempotency";

/// The `consumers` report: Degraded when a consumer stopped on its own (`stopped.{queue}`)
/// or is stalled (`stalled.{queue}`); `running`, and each running consumer's progress.
pub(crate) fn consumers_report(
    stopped: Vec<(String, String)>,
    running: usize,
    progress: &[(String, ConsumerProgress)],
) -> HealthReport {
    let stalled = progress.iter().any(|(_, p)| p.stalled.is_some());
    let mut consumers = if stopped.is_empty() && !stalled {
        HealthReport::up(CONSUMERS)
    } else {
        HealthReport::degraded(CONSUMERS)
    };
    consumers = consumers.with_detail("running", running as u64);
    for (queue, reason) in stopped {
        consumers = consumers.with_detail(format!("stopped.{queue}"), reason);
    }
    for (key, p) in progress {
        consumers = progress_details(consumers, key, p);
    }
    consumers
}

/// Consumers' progress keyed by queue; a second consumer of one queue is `{queue}#2`.
pub(crate) fn keyed_by_queue(
    progress: Vec<(String, ConsumerProgress)>,
) -> Vec<(String, ConsumerProgress)> {
    let mut seen: Vec<String> = Vec::new();
    progress
        .into_iter()
        .map(|(queue, p)| {
            let n = seen.iter().filter(|q| **q == queue).count();
            seen.push(queue.clone());
            let key = if n == 0 {
                queue
            } else {
                format!("{queue}#{}", n + 1)
            };
            (key, p)
        })
        .collect()
}

/// A wall-clock time as the health details write it: RFC 3339 in UTC, milliseconds.
fn rfc3339(at: SystemTime) -> String {
    format_instant(time::OffsetDateTime::from(at))
}

/// One consumer's progress under `consumers`, and the stall that degrades it.
fn progress_details(mut report: HealthReport, key: &str, p: &ConsumerProgress) -> HealthReport {
    let never = || "never".to_owned();
    let numbers = [
        ("inFlight", p.in_hand as u64),
        ("running", p.running as u64),
        ("waiting", p.in_hand.saturating_sub(p.running) as u64),
        ("held", p.held as u64),
        ("movesFailing", p.moves_failing as u64),
        ("setAsideFailed", p.set_aside_failed),
    ];
    for (name, n) in numbers {
        report = report.with_detail(format!("{key}.{name}"), n);
    }
    report = report
        .with_detail(
            format!("{key}.lastDelivery"),
            p.last_delivery.map(rfc3339).unwrap_or_else(never),
        )
        .with_detail(
            format!("{key}.lastSettlement"),
            p.last_settlement.map(rfc3339).unwrap_or_else(never),
        );
    if let Some(quiet) = p.stalled {
        report = report.with_detail(
            format!("stalled.{key}"),
            format!(
                "stalled: {} deliveries held, no settlement for {} s (stall_after {} s); a handler may be stuck, or its moves failing",
                p.in_hand,
                quiet.as_secs(),
                p.stall_after.as_secs_f64()
            ),
        );
    }
    report
}

/// The `idempotency` report: absent when no running consumer uses a store; Degraded while
/// a store does not answer, with the latest `error`, `since` (RFC 3339 of the outage's
/// first failure), consecutive `failures` (a number) and the affected `queues` (a list).
pub(crate) fn store_report(progress: &[(String, ConsumerProgress)]) -> Option<HealthReport> {
    let stores: Vec<(&String, &Option<StoreOutage>)> = progress
        .iter()
        .filter_map(|(key, p)| p.store.as_ref().map(|s| (key, s)))
        .collect();
    if stores.is_empty() {
        return None;
    }
    let out: Vec<(&String, &StoreOutage)> = stores
        .iter()
        .filter_map(|(key, o)| o.as_ref().map(|o| (*key, o)))
        .collect();
    let report = HealthReport::up(IDEMPOTENCY).with_detail("consumers", stores.len() as u64);
    let Some(latest) = out.iter().map(|(_, o)| *o).max_by_key(|o| o.failures) else {
        return Some(report);
    };
    let since = out
        .iter()
        .map(|(_, o)| o.since)
        .min()
        .unwrap_or(latest.since);
    let queues: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
    let mut report = report
        .with_detail("error", latest.error.clone())
        .with_detail("since", rfc3339(since))
        .with_detail("failures", latest.failures)
        .with_detail("queues", queues);
    report.status = HealthStatus::Degraded;
    Some(report)
}
