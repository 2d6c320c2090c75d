//! Health: what this process can say about its messaging without asking the broker.
//!
//! A [`Health`] is the worst of a set of [`HealthReport`]s. The connection contributes one
//! ([`connection_report`], built from the transport's locally held [`TransportStatus`]);
//! anything else (an ordered queue's partitions, a user policy) registers a
//! [`HealthContributor`] with a [`HealthRegistry`]. Evaluation is local state only and
//! takes microseconds, so an orchestrator may poll it as often as it likes.
//!
//! The rules, shared with the rest of the AceMQ family:
//!
//! - **Down** only when the connection is not open. A process reporting itself down gets
//!   restarted, which loses whatever it was holding and fixes nothing else.
//! - A **blocked** connection (a RabbitMQ memory or disk alarm) is **Up**, with `blocked` =
//!   `"true"`, `blockedReason` and `detail` among its details. Back pressure is the broker
//!   protecting itself; failing health for it restarts a fleet into the same blocked broker.
//!   A caller who wants the old "blocked is Degraded" reading registers that as its own
//!   contributor (see [`HealthContributor`]).
//! - A contributor that fails (returns `Err`) or panics yields a Down report under its own
//!   name with the text under `error`; it never stops the other reports being evaluated.
//!
//! # Wiring (for the connection)
//!
//! The connection owns one [`HealthRegistry`] and answers `Connection::health()` with
//!
//! ```
//! # use acemq::health::{connection_report, HealthRegistry};
//! # use acemq::transport::TransportStatus;
//! # let registry = HealthRegistry::new();
//! # let status = TransportStatus { connected: true, blocked: None };
//! # let (kind, in_flight, held, consuming_paused) = ("memory", 0usize, 0usize, false);
//! let mut extra = vec![
//!     ("transport", kind.to_string()),      // mq.transport_kind()
//!     ("inFlight", in_flight.to_string()),  // mq.in_flight()
//!     ("held", held.to_string()),           // mq.held()
//! ];
//! if consuming_paused {                     // mq.is_consuming_paused()
//!     extra.push(("consuming", "paused".to_string()));
//! }
//! let health = registry.evaluate_with([connection_report(
//!     &status, // transport.status(): local, never a broker round trip
//!     &extra,
//! )]);
//! assert!(health.is_up());
//! ```
//!
//! and `Connection::register_health(contributor)` forwards to
//! [`HealthRegistry::register`].

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, RwLock};

use crate::transport::TransportStatus;
pub(crate) use crate::util::panic_text;
use crate::util::{read, write};

/// The name of the connection's built-in report.
pub const CONNECTION: &str = "connection";

/// How healthy one component, or the whole, is. Ordered so that the worst wins:
/// `Up < Degraded < Down`.
///
/// ```
/// use acemq::health::HealthStatus;
/// assert!(HealthStatus::Down > HealthStatus::Degraded);
/// assert_eq!(HealthStatus::Up.max(HealthStatus::Degraded), HealthStatus::Degraded);
/// assert_eq!(HealthStatus::Degraded.as_str(), "DEGRADED");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HealthStatus {
    /// Working.
    #[default]
    Up,
    /// Partly working (a halted partition, a user policy's opinion). The actuator still
    /// answers 200: restarting would not help.
    Degraded,
    /// Not working: the connection is closed. The actuator answers 503.
    Down,
}

impl HealthStatus {
    /// The actuator's spelling, uppercase like Spring Boot's: `UP`, `DEGRADED`, `DOWN`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Up => "UP",
            HealthStatus::Degraded => "DEGRADED",
            HealthStatus::Down => "DOWN",
        }
    }
}

impl fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One component's report: a name, a status and string details.
///
/// ```
/// use acemq::health::{HealthReport, HealthStatus};
/// let r = HealthReport::degraded("orders.partitions").with_detail("halted", "2");
/// assert_eq!(r.status, HealthStatus::Degraded);
/// assert_eq!(r.details["halted"], "2");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    /// The component's name (`connection`, a contributor's name).
    pub name: String,
    /// Its status.
    pub status: HealthStatus,
    /// Details, all strings (the family's convention), sorted by key.
    pub details: BTreeMap<String, String>,
}

impl HealthReport {
    /// A report with a status and no details.
    pub fn new(name: impl Into<String>, status: HealthStatus) -> Self {
        HealthReport {
            name: name.into(),
            status,
            details: BTreeMap::new(),
        }
    }

    /// An Up report.
    ///
    /// ```
    /// let r = acemq::health::HealthReport::up("cache");
    /// assert!(r.details.is_empty());
    /// ```
    pub fn up(name: impl Into<String>) -> Self {
        Self::new(name, HealthStatus::Up)
    }

    /// A Degraded report.
    pub fn degraded(name: impl Into<String>) -> Self {
        Self::new(name, HealthStatus::Degraded)
    }

    /// A Down report.
    ///
    /// ```
    /// use acemq::health::{HealthReport, HealthStatus};
    /// assert_eq!(HealthReport::down("db").status, HealthStatus::Down);
    /// ```
    pub fn down(name: impl Into<String>) -> Self {
        Self::new(name, HealthStatus::Down)
    }

    /// Adds (or replaces) one detail.
    ///
    /// ```
    /// let r = acemq::health::HealthReport::up("x").with_detail("k", "v");
    /// assert_eq!(r.details.get("k").map(String::as_str), Some("v"));
    /// ```
    pub fn with_detail(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.details.insert(key.into(), value.into());
        self
    }

    /// One detail, if present.
    pub fn detail(&self, key: &str) -> Option<&str> {
        self.details.get(key).map(String::as_str)
    }
}

/// The aggregate: the worst report's status, and every report.
///
/// ```
/// use acemq::health::{Health, HealthReport, HealthStatus};
/// let h = Health::from_reports(vec![HealthReport::up("connection"), HealthReport::degraded("orders")]);
/// assert_eq!(h.status, HealthStatus::Degraded);
/// assert_eq!(h.report("orders").map(|r| r.status), Some(HealthStatus::Degraded));
/// assert!(Health::from_reports(vec![]).is_up());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// The worst status among the reports (Up when there are none).
    pub status: HealthStatus,
    /// Every report, in evaluation order (built-in ones first).
    pub reports: Vec<HealthReport>,
}

impl Health {
    /// Aggregates reports: the status is the worst of them.
    pub fn from_reports(reports: Vec<HealthReport>) -> Self {
        let status = reports
            .iter()
            .map(|r| r.status)
            .max()
            .unwrap_or(HealthStatus::Up);
        Health { status, reports }
    }

    /// The first report with this name.
    pub fn report(&self, name: &str) -> Option<&HealthReport> {
        self.reports.iter().find(|r| r.name == name)
    }

    /// Whether the aggregate is Up.
    pub fn is_up(&self) -> bool {
        self.status == HealthStatus::Up
    }

    /// Whether the aggregate is Down (the only status the actuator answers 503 for).
    pub fn is_down(&self) -> bool {
        self.status == HealthStatus::Down
    }

    /// The actuator's JSON document:
    ///
    /// ```json
    /// {"status":"UP","inFlight":3,"components":{"connection":{"status":"UP","details":{"blocked":"false"}}}}
    /// ```
    ///
    /// Statuses are uppercase (`UP`, `DEGRADED`, `DOWN`) like Spring Boot's actuator and the
    /// other AceMQ libraries. `components` is keyed by report name (sorted); when two reports
    /// share a name the later one wins there (both stay in [`Health::reports`]). `inFlight`
    /// is omitted when `None`.
    ///
    /// ```
    /// use acemq::health::{Health, HealthReport};
    /// let h = Health::from_reports(vec![HealthReport::up("connection").with_detail("blocked", "false")]);
    /// let json = h.to_json(Some(3));
    /// assert_eq!(json["status"], "UP");
    /// assert_eq!(json["inFlight"], 3);
    /// assert_eq!(json["components"]["connection"]["details"]["blocked"], "false");
    /// ```
    pub fn to_json(&self, in_flight: Option<u64>) -> serde_json::Value {
        use serde_json::{Map, Value};
        let mut components = Map::new();
        for r in &self.reports {
            let details: Map<String, Value> = r
                .details
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            let mut c = Map::new();
            c.insert("status".into(), Value::String(r.status.as_str().into()));
            c.insert("details".into(), Value::Object(details));
            components.insert(r.name.clone(), Value::Object(c));
        }
        let mut doc = Map::new();
        doc.insert("status".into(), Value::String(self.status.as_str().into()));
        if let Some(n) = in_flight {
            doc.insert("inFlight".into(), Value::from(n));
        }
        doc.insert("components".into(), Value::Object(components));
        Value::Object(doc)
    }
}

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
/// let h = registry.evaluate_with([HealthReport::up("connection")]);
/// assert_eq!(h.status, HealthStatus::Down);
/// assert_eq!(h.report("broken").and_then(|r| r.detail("error")), Some("cache unreachable"));
/// assert_eq!(h.report("connection").map(|r| r.status), Some(HealthStatus::Up));
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

/// The prefix of a blocked connection's `detail` text (wire contract §9).
pub const BLOCKED_DETAIL_PREFIX: &str = "the broker has blocked this connection: ";

/// The connection's report, from the transport's local status.
///
/// Down only when not connected. Connected is Up, blocked or not: `open` = `"true"`,
/// `blocked` = `"true"`/`"false"`, and while blocked `blockedReason` = the broker's reason
/// and `detail` = `the broker has blocked this connection: {reason}`. `extra` details
/// (`transport`, `inFlight`, `held`, `consuming` = `"paused"`, ...) are added as given.
///
/// ```
/// use acemq::health::{connection_report, HealthStatus};
/// use acemq::transport::TransportStatus;
/// let s = TransportStatus { connected: true, blocked: Some("low on memory".into()) };
/// let r = connection_report(&s, &[("transport", "amqp".to_string())]);
/// assert_eq!(r.name, "connection");
/// assert_eq!(r.status, HealthStatus::Up);
/// assert_eq!(r.detail("blocked"), Some("true"));
/// assert_eq!(r.detail("blockedReason"), Some("low on memory"));
/// assert_eq!(r.detail("detail"), Some("the broker has blocked this connection: low on memory"));
/// assert_eq!(r.detail("transport"), Some("amqp"));
///
/// let closed = connection_report(&TransportStatus::default(), &[]);
/// assert_eq!(closed.status, HealthStatus::Down);
/// ```
pub fn connection_report(status: &TransportStatus, extra: &[(&str, String)]) -> HealthReport {
    let mut report = if status.connected {
        HealthReport::up(CONNECTION)
    } else {
        HealthReport::down(CONNECTION)
    };
    report = report.with_detail("open", if status.connected { "true" } else { "false" });
    match &status.blocked {
        Some(reason) => {
            report = report
                .with_detail("blocked", "true")
                .with_detail("blockedReason", reason.clone())
                .with_detail("detail", format!("{BLOCKED_DETAIL_PREFIX}{reason}"));
        }
        None => report = report.with_detail("blocked", "false"),
    }
    for (k, v) in extra {
        report.details.insert((*k).to_owned(), v.clone());
    }
    report
}

#[cfg(test)]
mod tests;

pub(crate) mod progress;
