//! Health: what this process can say about its messaging without asking the broker.
//!
//! A [`Health`] is the worst of a set of [`HealthReport`]s. The connection contributes the
//! `acemq` one ([`connection_report`], built from the transport's locally held
//! [`TransportStatus`](crate::transport::TransportStatus)); anything else (an ordered queue's
//! partitions, a user policy) registers a [`HealthContributor`] with a [`HealthRegistry`].
//! Evaluation is local state only and takes microseconds, so an orchestrator may poll it as
//! often as it likes.
//!
//! The rules, shared with the rest of the AceMQ family (wire contract §9):
//!
//! - **Down** only when the connection is not open. A process reporting itself down gets
//!   restarted, which loses whatever it was holding and fixes nothing else.
//! - A **blocked** connection (a RabbitMQ memory or disk alarm) is **Up**, with `blocked` =
//!   `true`, `blockedReason` and `detail` among its details. Back pressure is the broker
//!   protecting itself; failing health for it restarts a fleet into the same blocked broker.
//!   A caller who wants the old "blocked is Degraded" reading registers that as its own
//!   contributor (see [`HealthContributor`]).
//! - A contributor that fails (returns `Err`) or panics yields a Down report under its own
//!   name with the text under `error`; it never stops the other reports being evaluated.
//! - Details are **typed JSON values** ([`serde_json::Value`]): booleans, numbers, strings,
//!   lists. The actuator's document is the Java member's, value for value:
//!   `{"status":"UP","components":{"acemq":{"status":"UP","details":{"transport":"rabbitmq",
//!   "open":true,"blocked":false,"inFlight":0}}}}` ([`Health::to_json`]).
//!
//! # Wiring (for the connection)
//!
//! The connection owns one [`HealthRegistry`] and answers `Connection::health()` with
//!
//! ```
//! # use acemq::health::{connection_report, HealthRegistry, COMPONENT};
//! # use acemq::transport::TransportStatus;
//! # let registry = HealthRegistry::new();
//! # let status = TransportStatus { connected: true, blocked: None };
//! # let (in_flight, held) = (0usize, 0usize);
//! let extra = [
//!     ("transport", "memory".into()), // acemq::observe::transport_name(mq.transport_kind())
//!     ("inFlight", in_flight.into()), // mq.in_flight()
//!     ("held", held.into()),          // mq.held()
//! ];
//! let health = registry.evaluate_with([connection_report(
//!     &status, // transport.status(): local, never a broker round trip
//!     &extra,
//! )]);
//! assert!(health.is_up());
//! assert_eq!(health.to_json()["components"][COMPONENT]["details"]["open"], true);
//! ```
//!
//! and `Connection::register_health(contributor)` forwards to
//! [`HealthRegistry::register`].

use std::collections::BTreeMap;
use std::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};
pub use serde_json::Value as DetailValue;

pub use connection::{BLOCKED_DETAIL_PREFIX, COMPONENT, CONNECTION, connection_report};
pub use registry::{HealthContributor, HealthRegistry};

pub(crate) use crate::util::panic_text;

mod connection;
pub(crate) mod progress;
mod registry;

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

impl Serialize for HealthStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One component's report: a name, a status and typed details.
///
/// Details are JSON values: anything that converts into a [`serde_json::Value`] (`bool`,
/// integers, `f64`, `&str`, `String`, `Vec<_>`, `serde_json::json!(..)`) goes into
/// [`HealthReport::with_detail`], and comes out of the actuator with its type.
///
/// ```
/// use acemq::health::{HealthReport, HealthStatus};
/// let r = HealthReport::degraded("ordered:orders")
///     .with_detail("partitions", 4)
///     .with_detail("halted", vec![1, 3])
///     .with_detail("reason", "partition 1 halted");
/// assert_eq!(r.status, HealthStatus::Degraded);
/// assert_eq!(r.details["partitions"], 4);
/// assert_eq!(r.details["halted"], serde_json::json!([1, 3]));
/// assert_eq!(r.detail("reason"), Some("partition 1 halted"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthReport {
    /// The component's name (`acemq`, `consumers`, a contributor's name).
    pub name: String,
    /// Its status.
    pub status: HealthStatus,
    /// Details, typed JSON values, sorted by key.
    pub details: BTreeMap<String, DetailValue>,
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

    /// Adds (or replaces) one detail, keeping its JSON type.
    ///
    /// ```
    /// let r = acemq::health::HealthReport::up("x").with_detail("k", "v").with_detail("n", 2u64);
    /// assert_eq!(r.detail("k"), Some("v"));
    /// assert_eq!(r.detail_value("n").and_then(|v| v.as_u64()), Some(2));
    /// ```
    pub fn with_detail(mut self, key: impl Into<String>, value: impl Into<DetailValue>) -> Self {
        self.details.insert(key.into(), value.into());
        self
    }

    /// One detail, when it is a string (`None` for an absent or non-string one; see
    /// [`HealthReport::detail_value`] for booleans, numbers and lists).
    ///
    /// ```
    /// let r = acemq::health::HealthReport::up("x").with_detail("error", "refused").with_detail("open", true);
    /// assert_eq!(r.detail("error"), Some("refused"));
    /// assert_eq!(r.detail("open"), None);
    /// ```
    pub fn detail(&self, key: &str) -> Option<&str> {
        self.details.get(key).and_then(DetailValue::as_str)
    }

    /// One detail, whatever its type.
    ///
    /// ```
    /// let r = acemq::health::HealthReport::up("x").with_detail("open", true);
    /// assert_eq!(r.detail_value("open"), Some(&serde_json::Value::Bool(true)));
    /// ```
    pub fn detail_value(&self, key: &str) -> Option<&DetailValue> {
        self.details.get(key)
    }
}

/// The aggregate: the worst report's status, and every report.
///
/// ```
/// use acemq::health::{Health, HealthReport, HealthStatus};
/// let h = Health::from_reports(vec![HealthReport::up("acemq"), HealthReport::degraded("orders")]);
/// assert_eq!(h.status, HealthStatus::Degraded);
/// assert_eq!(h.report("orders").map(|r| r.status), Some(HealthStatus::Degraded));
/// assert!(Health::from_reports(vec![]).is_up());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The worst status among the reports (Up when there are none).
    pub status: HealthStatus,
    /// Every report, in evaluation order (built-in ones first: `acemq`, `consumers`, ...).
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

    /// Whether the service should get traffic now (a Kubernetes readiness probe): every
    /// component `Up`, and neither paused nor draining. So not ready while a connection is
    /// recovering, a consumer is detached, stalled or subscribing again, an idempotency
    /// store does not answer, or consuming is paused or draining (`details.consuming`
    /// `"paused"` / `details.draining` `true` of the `acemq` component). Liveness is
    /// [`Health::is_down`]: a restart helps only then.
    ///
    /// ```
    /// use acemq::health::{Health, HealthReport};
    /// let up = Health::from_reports(vec![HealthReport::up("acemq")]);
    /// assert!(up.is_ready());
    /// let paused = Health::from_reports(vec![HealthReport::up("acemq").with_detail("consuming", "paused")]);
    /// assert!(!paused.is_ready());
    /// let recovering = Health::from_reports(vec![HealthReport::degraded("acemq")]);
    /// assert!(!recovering.is_ready() && !recovering.is_down());
    /// ```
    pub fn is_ready(&self) -> bool {
        self.reports.iter().all(|r| {
            r.status == HealthStatus::Up
                && r.detail("consuming") != Some("paused")
                && !matches!(r.detail_value("draining"), Some(DetailValue::Bool(true)))
        })
    }

    /// The actuator's JSON document (wire contract §9, the Java member's shape):
    ///
    /// ```json
    /// {"status":"UP",
    ///  "components":{"acemq":{"status":"UP",
    ///    "details":{"transport":"rabbitmq","open":true,"blocked":false,"inFlight":0}},
    ///   "consumers":{"status":"UP","details":{"running":0}}}}
    /// ```
    ///
    /// Statuses are uppercase (`UP`, `DEGRADED`, `DOWN`). `components` is keyed by report
    /// name; when two reports share a name the later one wins there (both stay in
    /// [`Health::reports`]). Serializing the [`Health`] itself (it implements
    /// [`Serialize`]) writes the same document with the components in evaluation order
    /// (`acemq` first), as the actuator answers; this `Value` sorts them by name.
    ///
    /// ```
    /// use acemq::health::{Health, HealthReport};
    /// let h = Health::from_reports(vec![HealthReport::up("acemq").with_detail("blocked", false)]);
    /// let json = h.to_json();
    /// assert_eq!(json["status"], "UP");
    /// assert_eq!(json["components"]["acemq"]["details"]["blocked"], false);
    /// assert_eq!(serde_json::to_string(&h).unwrap(),
    ///     r#"{"status":"UP","components":{"acemq":{"status":"UP","details":{"blocked":false}}}}"#);
    /// ```
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(
            |e| serde_json::json!({"status": self.status.as_str(), "error": e.to_string()}),
        )
    }

    /// The reports the document shows: one per name, the later winning, at the place of the
    /// first.
    fn components(&self) -> Vec<&HealthReport> {
        let mut out: Vec<&HealthReport> = Vec::with_capacity(self.reports.len());
        for r in &self.reports {
            match out.iter_mut().find(|o| o.name == r.name) {
                Some(slot) => *slot = r,
                None => out.push(r),
            }
        }
        out
    }
}

/// `{"status":..,"details":{..}}`, one component.
struct Component<'a>(&'a HealthReport);

impl Serialize for Component<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("status", &self.0.status)?;
        m.serialize_entry("details", &self.0.details)?;
        m.end()
    }
}

/// The components in evaluation order.
struct Components<'a>(Vec<&'a HealthReport>);

impl Serialize for Components<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for r in &self.0 {
            m.serialize_entry(&r.name, &Component(r))?;
        }
        m.end()
    }
}

impl Serialize for Health {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("status", &self.status)?;
        m.serialize_entry("components", &Components(self.components()))?;
        m.end()
    }
}

#[cfg(test)]
mod tests;
