//! `acemq health` against the library's own actuator: exit 0 UP, 1 DEGRADED, 2 DOWN,
//! 2 unreachable; the summary names each component; --json parses.

use crate::support;

use std::sync::{Arc, Mutex};

use acemq::actuator::Actuator;
use acemq::health::{Health, HealthReport};
use support::{json, run, stdout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_follow_the_service_status() {
    let current: Arc<Mutex<Vec<HealthReport>>> = Arc::new(Mutex::new(Vec::new()));
    let source = current.clone();
    let actuator = Actuator::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .health(move || Health::from_reports(source.lock().unwrap().clone()))
        .in_flight(|| 2)
        .start()
        .await
        .unwrap();
    let url = format!("http://{}", actuator.local_addr());

    let set = |reports: Vec<HealthReport>| *current.lock().unwrap() = reports;
    let health = |extra: &[&str]| {
        let mut args = vec!["health", url.as_str()];
        args.extend_from_slice(extra);
        run(None, &args)
    };

    set(vec![
        HealthReport::up("connection").with_detail("blocked", "false"),
    ]);
    let o = health(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(text.starts_with("UP "), "{text}");
    assert!(
        text.contains("connection") && text.contains("blocked=false"),
        "{text}"
    );

    set(vec![
        HealthReport::up("connection"),
        HealthReport::degraded("consumer:orders.new").with_detail("reason", "stalled"),
    ]);
    let o = health(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("reason=stalled"));

    set(vec![
        HealthReport::down("connection").with_detail("error", "refused"),
    ]);
    let o = health(&["--json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let j = json(&o);
    assert_eq!(j["health"]["status"], "DOWN");
    assert_eq!(j["http_status"], 503);

    actuator.shutdown().await;
    let o = health(&["--timeout", "2s"]);
    assert_eq!(o.status.code(), Some(2), "unreachable is 2: {}", stdout(&o));
    assert!(stdout(&o).contains("UNREACHABLE"));
}
