//! `acemq topology plan|apply|diff` end to end, and the command line's own help and exit
//! codes.

use crate::support;

use acemq::Connection;
use acemq::headers::HeaderValue;
use acemq::topology::QueueDecl;
use support::{TempFile, amqp_url, json, run, stdout, unique};

fn topology_file(q: &str, exchange: &str) -> TempFile {
    let text = format!(
        r#"
[[exchange]]
name = "{exchange}"
type = "topic"

[[queue]]
name = "{q}"
dead_letter = true

[[binding]]
queue = "{q}"
exchange = "{exchange}"
routing_key = "order.*"
"#
    );
    TempFile::toml(&text)
}

#[test]
fn help_reads_well_and_bad_usage_exits_64() {
    let o = run(None, &["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = stdout(&o);
    for word in ["dlq", "topology", "health", "Exit codes", "64", "ACEMQ_URL"] {
        assert!(help.contains(word), "--help lacks {word}:\n{help}");
    }
    assert!(
        !help.contains("guest:guest"),
        "the default password is shown:\n{help}"
    );
    for sub in [
        &["dlq", "replay", "--help"][..],
        &["dlq", "peek", "--help"],
        &["topology", "diff", "--help"],
        &["health", "--help"],
    ] {
        assert_eq!(run(None, sub).status.code(), Some(0), "{sub:?}");
    }
    assert_eq!(run(None, &["dlq", "replay"]).status.code(), Some(64));
    assert_eq!(run(None, &["nonsense"]).status.code(), Some(64));
    assert_eq!(
        run(None, &["dlq", "purge", "q", "--older-than", "soon"])
            .status
            .code(),
        Some(64)
    );
}

#[test]
fn the_plan_shows_what_the_builder_declares() {
    let f = topology_file("orders.new", "orders");
    // No broker: the declarations themselves.
    let offline = Some("amqp://guest:guest@127.0.0.1:1/%2f");
    let o = run(offline, &["topology", "plan", "-f", f.arg()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let plan = stdout(&o);
    for line in [
        "declare exchange orders (topic, durable)",
        "declare exchange acemq.dlx (direct, durable)",
        "declare queue orders.new (quorum, durable) x-dead-letter-exchange=acemq.dlx x-dead-letter-routing-key=orders.new.dlq",
        "declare queue orders.new.dlq (classic, durable)",
        "bind orders.new.dlq to acemq.dlx on \"orders.new.dlq\"",
        "bind orders.new to orders on \"order.*\"",
    ] {
        assert!(
            plan.lines().any(|l| l == line),
            "missing {line:?} in:\n{plan}"
        );
    }
    let j = json(&run(
        offline,
        &["topology", "plan", "-f", f.arg(), "--json"],
    ));
    assert_eq!(j["items"].as_array().map(Vec::len), Some(8)); // 2 exchanges, 3 queues, 3 bindings
    let bad = TempFile::toml("[[queue]]\nname = \"q\"\ntype = \"stream\"\n");
    let o = run(None, &["topology", "plan", "-f", bad.arg()]);
    assert_eq!(o.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&o.stderr).contains("quorum or classic"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_then_diff_is_clean_and_drift_is_reported_per_item() {
    let Some(url) = amqp_url() else { return };
    let mq = Connection::connect(&url).await.unwrap();
    let (q, ex) = (unique("topo"), unique("topo-ex"));
    let _guard = support::Cleanup::new(&url, &q);
    let f = topology_file(&q, &ex);

    // Before apply: everything of ours is missing, nothing fails half-way.
    let j = json(&run(
        Some(&url),
        &["topology", "diff", "-f", f.arg(), "--json"],
    ));
    let state = |j: &serde_json::Value, name: &str| -> String {
        j["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .unwrap_or_else(|| panic!("no item {name} in {j}"))["state"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(state(&j, &q), "missing");
    assert_eq!(state(&j, &format!("{q}.dlq")), "missing");

    // The plan says what apply would change: everything of ours is to be created.
    let plan = stdout(&run(Some(&url), &["topology", "plan", "-f", f.arg()]));
    assert!(
        plan.lines()
            .any(|l| l.starts_with("+ declare queue ") && l.contains(&format!("{q} "))),
        "{plan}"
    );

    let o = run(Some(&url), &["topology", "apply", "-f", f.arg()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let j = json(&run(
        Some(&url),
        &["topology", "plan", "-f", f.arg(), "--json"],
    ));
    let planned = j["items"].as_array().unwrap();
    assert!(
        planned.iter().all(|i| i["change"] == "unchanged"),
        "after apply nothing changes: {j}"
    );
    let o = run(Some(&url), &["topology", "diff", "-f", f.arg(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let j = json(&o);
    assert_eq!(j["summary"]["drift"], 0, "{j}");
    assert_eq!(j["summary"]["missing"], 0, "{j}");
    assert_eq!(
        j["management"], true,
        "the management API answers (scripts/services.sh)"
    );

    // Drift: the source queue exists as a classic queue with other arguments. Its probe
    // gets a 406 (which closes that channel), and every later item is still probed.
    mq.transport().delete_queue(&q).await.unwrap();
    mq.transport()
        .declare_queue(&QueueDecl::classic(&q).argument("x-message-ttl", HeaderValue::I32(60_000)))
        .await
        .unwrap();
    let o = run(Some(&url), &["topology", "diff", "-f", f.arg(), "--json"]);
    assert_eq!(o.status.code(), Some(1), "drift exits 1: {}", stdout(&o));
    let j = json(&o);
    assert_eq!(state(&j, &q), "drift", "{j}");
    let detail = j["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == q.as_str())
        .unwrap()["detail"]
        .to_string();
    assert!(
        detail.contains("x-queue-type") || detail.contains("PRECONDITION"),
        "{detail}"
    );
    assert_eq!(
        state(&j, &format!("{q}.dlq")),
        "ok",
        "items after the 406 are probed: {j}"
    );
    assert_eq!(state(&j, &format!("{q}.parked")), "ok");
    // The binding went with the deleted queue.
    assert_eq!(
        state(&j, &format!("{q} <- {ex} on \"order.*\"")),
        "missing",
        "{j}"
    );
    assert_eq!(
        state(&j, &format!("{q}.dlq <- acemq.dlx on \"{q}.dlq\"")),
        "ok"
    );

    let text = stdout(&run(Some(&url), &["topology", "diff", "-f", f.arg()]));
    assert!(text.contains("drift"), "{text}");
    assert!(!text.contains("guest:guest"));

    for name in [q.clone(), format!("{q}.dlq"), format!("{q}.parked")] {
        let _ = mq.transport().delete_queue(&name).await;
    }
    let _ = mq.transport().delete_exchange(&ex).await;
    mq.close().await.ok();
}

#[test]
fn an_unreachable_broker_exits_2_without_showing_the_password() {
    let o = run(
        Some("amqp://ops:hunter2@127.0.0.1:1/%2f"),
        &["topology", "diff", "-f", topology_file("q", "e").arg()],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}
