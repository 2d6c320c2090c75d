use super::*;
use crate::transport::TransportStatus;
use std::sync::Arc;
use std::time::Instant;

struct Fixed(&'static str, HealthStatus);
impl HealthContributor for Fixed {
    fn name(&self) -> String {
        self.0.into()
    }
    fn report(&self) -> Result<HealthReport, String> {
        Ok(HealthReport::new(self.0, self.1).with_detail("k", "v"))
    }
}

struct Panics;
impl HealthContributor for Panics {
    fn name(&self) -> String {
        "panics".into()
    }
    fn report(&self) -> Result<HealthReport, String> {
        panic!("contributor exploded")
    }
}

struct Errs;
impl HealthContributor for Errs {
    fn name(&self) -> String {
        "errs".into()
    }
    fn report(&self) -> Result<HealthReport, String> {
        Err("nope".into())
    }
}

fn up() -> TransportStatus {
    TransportStatus {
        connected: true,
        blocked: None,
    }
}

#[test]
fn worst_report_wins() {
    let h = Health::from_reports(vec![
        HealthReport::up("a"),
        HealthReport::down("b"),
        HealthReport::degraded("c"),
    ]);
    assert_eq!(h.status, HealthStatus::Down);
    assert!(h.is_down());
    assert_eq!(Health::from_reports(vec![]).status, HealthStatus::Up);
}

#[test]
fn blocked_connection_is_up_with_reason() {
    let s = TransportStatus {
        connected: true,
        blocked: Some("low on disk".into()),
    };
    let h = HealthRegistry::new().evaluate_with([connection_report(&s, &[])]);
    assert_eq!(h.status, HealthStatus::Up);
    let c = h.report(COMPONENT).expect("acemq report");
    assert_eq!(c.details["blocked"], true);
    assert_eq!(c.detail("blockedReason"), Some("low on disk"));
    assert_eq!(
        c.detail("detail"),
        Some("the broker has blocked this connection: low on disk")
    );
}

#[test]
fn unblocked_connection_says_blocked_false_and_no_reason() {
    let r = connection_report(&up(), &[("inFlight", 4.into())]);
    assert_eq!(r.status, HealthStatus::Up);
    assert_eq!(r.details["blocked"], false);
    assert_eq!(r.details["open"], true);
    assert_eq!(r.detail_value("blockedReason"), None);
    assert_eq!(r.details["inFlight"], 4);
}

#[test]
fn closed_connection_is_down_even_when_blocked() {
    let s = TransportStatus {
        connected: false,
        blocked: Some("low on memory".into()),
    };
    assert_eq!(connection_report(&s, &[]).status, HealthStatus::Down);
}

#[test]
fn failing_and_panicking_contributors_are_down_under_their_names_only() {
    let reg = HealthRegistry::new();
    reg.register(Arc::new(Panics));
    reg.register(Arc::new(Errs));
    reg.register(Arc::new(Fixed("fine", HealthStatus::Up)));
    let h = reg.evaluate_with([connection_report(&up(), &[])]);
    assert_eq!(h.status, HealthStatus::Down);
    assert_eq!(h.reports.len(), 4);
    let p = h.report("panics").expect("panics report");
    assert_eq!(p.status, HealthStatus::Down);
    assert!(
        p.detail("error")
            .is_some_and(|e| e.contains("contributor exploded"))
    );
    assert_eq!(
        h.report("errs").and_then(|r| r.detail("error")),
        Some("nope")
    );
    assert_eq!(h.report("fine").map(|r| r.status), Some(HealthStatus::Up));
    assert_eq!(
        h.report(COMPONENT).map(|r| r.status),
        Some(HealthStatus::Up)
    );
}

#[test]
fn same_name_replaces_and_report_is_renamed_to_contributor() {
    struct Liar;
    impl HealthContributor for Liar {
        fn name(&self) -> String {
            "fine".into()
        }
        fn report(&self) -> Result<HealthReport, String> {
            Ok(HealthReport::degraded("something-else"))
        }
    }
    let reg = HealthRegistry::new();
    reg.register(Arc::new(Fixed("fine", HealthStatus::Up)));
    reg.register(Arc::new(Liar));
    assert_eq!(reg.names(), vec!["fine".to_string()]);
    let h = reg.evaluate();
    assert_eq!(
        h.report("fine").map(|r| r.status),
        Some(HealthStatus::Degraded)
    );
}

#[test]
fn json_shape_is_the_java_members() {
    let reg = HealthRegistry::new();
    reg.register(Arc::new(Fixed("orders", HealthStatus::Degraded)));
    let extra = [("transport", "rabbitmq".into()), ("inFlight", 0.into())];
    let h = reg.evaluate_with([connection_report(&up(), &extra)]);
    assert_eq!(
        serde_json::to_string(&h).unwrap(),
        concat!(
            r#"{"status":"DEGRADED","components":{"#,
            r#""acemq":{"status":"UP","details":{"blocked":false,"inFlight":0,"open":true,"transport":"rabbitmq"}},"#,
            r#""orders":{"status":"DEGRADED","details":{"k":"v"}}}}"#
        )
    );
    let blocked = TransportStatus {
        connected: true,
        blocked: Some("low on memory".into()),
    };
    let j = Health::from_reports(vec![connection_report(&blocked, &extra)]).to_json();
    assert_eq!(j["status"], "UP");
    assert_eq!(j["components"]["acemq"]["details"]["blocked"], true);
    assert_eq!(
        j["components"]["acemq"]["details"]["blockedReason"],
        "low on memory"
    );
    assert!(j.get("inFlight").is_none());
}

#[test]
fn components_follow_acemq_in_order_and_a_repeated_name_shows_once() {
    let h = Health::from_reports(vec![
        HealthReport::up("acemq"),
        HealthReport::up("zeta"),
        HealthReport::up("alpha"),
        HealthReport::degraded("zeta"),
    ]);
    let text = serde_json::to_string(&h).unwrap();
    assert_eq!(
        text,
        r#"{"status":"DEGRADED","components":{"acemq":{"status":"UP","details":{}},"zeta":{"status":"DEGRADED","details":{}},"alpha":{"status":"UP","details":{}}}}"#
    );
}

#[test]
fn evaluation_is_local_and_fast() {
    let reg = HealthRegistry::new();
    reg.register(Arc::new(Fixed("a", HealthStatus::Up)));
    reg.register(Arc::new(Fixed("b", HealthStatus::Up)));
    let s = TransportStatus {
        connected: true,
        blocked: Some("low on memory".into()),
    };
    let start = Instant::now();
    let mut downs = 0;
    for i in 0..10_000u32 {
        let h = reg.evaluate_with([connection_report(
            &s,
            &[("transport", "memory".into()), ("inFlight", i.into())],
        )]);
        downs += usize::from(h.is_down());
    }
    let elapsed = start.elapsed();
    assert_eq!(downs, 0);
    // ~1-3 µs each in a debug build; the bound only catches something pathological
    // (a network call, a lock held across a sleep).
    assert!(
        elapsed.as_millis() < 2_000,
        "10,000 evaluations took {elapsed:?}"
    );
}
