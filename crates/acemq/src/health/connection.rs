//! The connection's own report, `acemq`: open, blocked, transport and in-flight, from the
//! transport's local status only.

use super::{DetailValue, HealthReport};
use crate::transport::TransportStatus;

/// The name of the connection's built-in report: `acemq`, as the Java member names its
/// health component.
pub const COMPONENT: &str = "acemq";

/// The same as [`COMPONENT`]; the report was called `connection` before the family's name
/// was adopted.
pub const CONNECTION: &str = COMPONENT;

/// The prefix of a blocked connection's `detail` text (wire contract §9).
pub const BLOCKED_DETAIL_PREFIX: &str = "the broker has blocked this connection: ";

/// The connection's report (`acemq`), from the transport's local status.
///
/// Down only when not connected. Connected is Up, blocked or not: `open` and `blocked` are
/// booleans, and while blocked `blockedReason` = the broker's reason and `detail` =
/// `the broker has blocked this connection: {reason}`. `extra` details (`transport`,
/// `inFlight`, `held`, `consuming` = `"paused"`, ...) are added as given, with their types.
///
/// ```
/// use acemq::health::{connection_report, HealthStatus};
/// use acemq::transport::TransportStatus;
/// let s = TransportStatus { connected: true, blocked: Some("low on memory".into()) };
/// let r = connection_report(&s, &[("transport", "rabbitmq".into()), ("inFlight", 0.into())]);
/// assert_eq!(r.name, "acemq");
/// assert_eq!(r.status, HealthStatus::Up);
/// assert_eq!(r.details["blocked"], true);
/// assert_eq!(r.details["inFlight"], 0);
/// assert_eq!(r.detail("blockedReason"), Some("low on memory"));
/// assert_eq!(r.detail("detail"), Some("the broker has blocked this connection: low on memory"));
/// assert_eq!(r.detail("transport"), Some("rabbitmq"));
///
/// let closed = connection_report(&TransportStatus::default(), &[]);
/// assert_eq!(closed.status, HealthStatus::Down);
/// assert_eq!(closed.details["open"], false);
/// ```
pub fn connection_report(status: &TransportStatus, extra: &[(&str, DetailValue)]) -> HealthReport {
    let mut report = if status.connected {
        HealthReport::up(COMPONENT)
    } else {
        HealthReport::down(COMPONENT)
    };
    report = report.with_detail("open", status.connected);
    match &status.blocked {
        Some(reason) => {
            report = report
                .with_detail("blocked", true)
                .with_detail("blockedReason", reason.clone())
                .with_detail("detail", format!("{BLOCKED_DETAIL_PREFIX}{reason}"));
        }
        None => report = report.with_detail("blocked", false),
    }
    for (k, v) in extra {
        report.details.insert((*k).to_owned(), v.clone());
    }
    report
}
