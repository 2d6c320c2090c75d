//! The health registry: contributors registered with a connection, evaluated on demand, a
//! failing or panicking one turned into a Down report under its own name.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, RwLock};

use super::{Health, HealthReport, panic_text};
use crate::util::{read, write};

/// Something that reports on one component. Implement it for a policy of your own and
/// register it with [`HealthRegistry::register`] (or `Connection::register_health`).
///
/// `report` must answer from local state only, quickly: it runs on every health poll.
/// An `Err` (or a panic) becomes a Down report under [`HealthContributor::name`] with the
/// text under `error`.
///
/// The family's "blocked is Degraded" policy, for a caller who wants it back:
///
/// ```
/// use std::sync::Arc;
/// use acemq::health::{HealthContributor, HealthRegistry, HealthReport, HealthStatus};
/// use acemq::transport::TransportStatus;
///
/// struct BlockedIsDegraded(Arc<dyn Fn() -> TransportStatus + Send + Sync>);
///
/// impl HealthContributor for BlockedIsDegraded {
///     fn name(&self) -> String { "broker-pressure".into() }
///     fn report(&self) -> Result<HealthReport, String> {
///         Ok(match (self.0)().blocked {
///             Some(reason) => HealthReport::degraded(self.name()).with_detail("reason", reason),
///             None => HealthReport::up(self.name()),
///         })
///     }
/// }
///
/// let registry = HealthRegistry::new();
/// let status = || TransportStatus { connected: true, blocked: Some("low on memory".into()) };
/// registry.register(Arc::new(BlockedIsDegraded(Arc::new(status))));
/// assert_eq!(registry.evaluate().status, HealthStatus::Degraded);
/// ```
///
/// Details keep their JSON types, so a contributor reports numbers and lists as such (this
/// is the shape of an ordered queue's `ordered:{name}` report):
///
/// ```
/// use std::sync::Arc;
/// use acemq::health::{HealthContributor, HealthRegistry, HealthReport};
///
/// struct Partitions;
/// impl HealthContributor for Partitions {
///     fn name(&self) -> String { "ordered:orders".into() }
///     fn report(&self) -> Result<HealthReport, String> {
///         let halted: Vec<u32> = vec![2];
///         let report = if halted.is_empty() { HealthReport::up(self.name()) }
///                      else { HealthReport::degraded(self.name()) };
///         Ok(report
///             .with_detail("partitions", 4)
///             .with_detail("handled", 120u64)
///             .with_detail("failed", 1u64)
///             .with_detail("skipped", 0u64)
///             .with_detail("halted", halted))
///     }
/// }
///
/// let registry = HealthRegistry::new();
/// registry.register(Arc::new(Partitions));
/// let doc = registry.evaluate().to_json();
/// assert_eq!(doc["status"], "DEGRADED");
/// assert_eq!(doc["components"]["ordered:orders"]["details"]["halted"], serde_json::json!([2]));
/// assert_eq!(doc["components"]["ordered:orders"]["details"]["partitions"], 4);
/// ```
pub trait HealthContributor: Send + Sync {
    /// The component's name; the report appears under it.
    fn name(&self) -> String;
    /// The component's report, from local state only.
    fn report(&self) -> Result<HealthReport, String>;
}

/// Contributors registered with a connection, evaluated on demand.
///
/// Registering a contributor whose name is already registered replaces the earlier one.
/// Evaluation never fails: a contributor that errs or panics is reported Down under its
/// name and the others are still evaluated.
///
/// ```
/// use std::sync::Arc;
/// use acemq::health::{HealthContributor, HealthRegistry, HealthReport, HealthStatus};
///
/// struct Broken;
/// impl HealthContributor for Broken {
///     fn name(&self) -> String { "broken".into() }
///     fn report(&self) -> Result<HealthReport, String> { Err("cache unreachable".into()) }
/// }
///
/// let registry = HealthRegistry::new();
/// registry.register(Arc::new(Broken));
/// let h = registry.evaluate_with([HealthReport::up("acemq")]);
/// assert_eq!(h.status, HealthStatus::Down);
/// assert_eq!(h.report("broken").and_then(|r| r.detail("error")), Some("cache unreachable"));
/// assert_eq!(h.report("acemq").map(|r| r.status), Some(HealthStatus::Up));
/// ```
#[derive(Default)]
pub struct HealthRegistry {
    contributors: RwLock<Vec<(String, Arc<dyn HealthContributor>)>>,
}

impl fmt::Debug for HealthRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthRegistry")
            .field("contributors", &self.names())
            .finish()
    }
}

impl HealthRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a contributor (replacing one registered under the same name).
    /// A contributor whose `name()` panics is registered as `contributor-{n}`.
    pub fn register(&self, contributor: Arc<dyn HealthContributor>) {
        let name = catch_unwind(AssertUnwindSafe(|| contributor.name()));
        let mut list = write(&self.contributors);
        let name = name.unwrap_or_else(|_| format!("contributor-{}", list.len() + 1));
        list.retain(|(n, _)| *n != name);
        list.push((name, contributor));
    }

    /// Removes the contributor registered under `name`; returns whether there was one.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use acemq::health::*;
    /// # struct Ok_; impl HealthContributor for Ok_ {
    /// #   fn name(&self) -> String { "x".into() }
    /// #   fn report(&self) -> Result<HealthReport, String> { Ok(HealthReport::up("x")) } }
    /// let registry = HealthRegistry::new();
    /// registry.register(Arc::new(Ok_));
    /// assert!(registry.unregister("x"));
    /// assert!(registry.names().is_empty());
    /// ```
    pub fn unregister(&self, name: &str) -> bool {
        let mut list = write(&self.contributors);
        let before = list.len();
        list.retain(|(n, _)| n != name);
        list.len() != before
    }

    /// The registered names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.snapshot().into_iter().map(|(n, _)| n).collect()
    }

    /// Evaluates every contributor.
    pub fn evaluate(&self) -> Health {
        self.evaluate_with(std::iter::empty())
    }

    /// Evaluates every contributor after the given built-in reports (the connection's),
    /// and aggregates them all.
    pub fn evaluate_with(&self, builtin: impl IntoIterator<Item = HealthReport>) -> Health {
        let mut reports: Vec<HealthReport> = builtin.into_iter().collect();
        for (name, contributor) in self.snapshot() {
            reports.push(evaluate_one(&name, contributor.as_ref()));
        }
        Health::from_reports(reports)
    }

    fn snapshot(&self) -> Vec<(String, Arc<dyn HealthContributor>)> {
        read(&self.contributors).clone()
    }
}

/// Runs one contributor, turning an `Err` or a panic into a Down report under `name`.
fn evaluate_one(name: &str, contributor: &dyn HealthContributor) -> HealthReport {
    match catch_unwind(AssertUnwindSafe(|| contributor.report())) {
        Ok(Ok(mut report)) => {
            if report.name != name {
                report.name = name.to_owned();
            }
            report
        }
        Ok(Err(error)) => HealthReport::down(name).with_detail("error", error),
        Err(panic) => HealthReport::down(name).with_detail(
            "error",
            format!(
                "health contributor panicked: {}",
                panic_text(panic.as_ref())
            ),
        ),
    }
}
