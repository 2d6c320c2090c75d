//! The scrape test: real traffic (publish, consume, retry, dead-letter, reject,
//! park, unroutable) on `memory://` and RabbitMQ, then `/acemq-metrics`, `/acemq-health`
//! and `/acemq-info` compared with `tests/contract/family-observability.json`, a fixture
//! written by hand from the wire contract §9: metric names (Micrometer's Prometheus names),
//! label sets, types (timers and the attempts distribution as histograms with
//! `_bucket`/`_sum`/`_count`, never summaries), the `transport` label's value, and the
//! health and info documents' shapes and JSON types.
//!
//! This binary installs the global Prometheus recorder (`install_prometheus_recorder`), once.

mod http_client;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use acemq::Connection;
use acemq::actuator::{Actuator, install_prometheus_recorder};
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::retry::RetryPolicy;
use acemq::transport::{Outbound, Properties};
use serde_json::Value;
use support::{Broker, declare_classic, eventually, on_each_target, teardown, unique};

const WAIT: Duration = Duration::from_secs(20);

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/contract/family-observability.json"
    );
    let text = std::fs::read_to_string(path).expect("the observability fixture");
    serde_json::from_str(&text).expect("the fixture is JSON")
}

/// One sample line of a Prometheus text exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the exposition: samples, and `# TYPE` lines (family name -> type).
fn parse(text: &str) -> (Vec<Sample>, BTreeMap<String, String>) {
    let mut samples = Vec::new();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            if let (Some(n), Some(t)) = (it.next(), it.next()) {
                types.insert(n.to_owned(), t.to_owned());
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let value: f64 = value.parse().unwrap_or(f64::NAN);
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => (name.to_owned(), parse_labels(rest.trim_end_matches('}'))),
        };
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    (samples, types)
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            return out;
        }
        assert_eq!(chars.next(), Some('"'), "a quoted label value in {s}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').to_owned(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

fn prom_label(key: &str) -> String {
    key.replace('.', "_")
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The recorder, installed once for this binary.
fn recorder() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        install_prometheus_recorder().expect("the only recorder of this binary");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_matches_the_family_fixture_on_each_transport() {
    recorder();
    let fx = fixture();
    on_each_target(|target: Broker| {
        let fx = fx.clone();
        async move { scrape_case(&target, &fx).await }
    })
    .await;
}

async fn scrape_case(target: &Broker, fx: &Value) {
    let transport = match target {
        Broker::Memory(_) => "memory",
        Broker::Amqp(_) => "rabbitmq",
    };
    let mq = Connection::connect(&target.url()).await.expect("connect");
    let actuator = Actuator::for_connection(&mq)
        .application("observability-contract", "9.9.9")
        .bind("127.0.0.1:0".parse().expect("address"))
        .start()
        .await
        .expect("actuator");
    let addr = actuator.local_addr();

    // Traffic: 1 acked; 2 retried once then acked; 3 retried then dead-lettered; 4 rejected
    // by the handler; a body that does not decode, parked; a publish nobody can receive.
    let q = unique("observability-contract");
    declare_classic(&mq, &q).await;
    let policy = RetryPolicy::fixed(2, Duration::from_millis(10)).expect("policy");
    let consumer = mq
        .consume(
            &q,
            ConsumerOptions::default().retry(policy),
            |m: Message<u32>| async move {
                match m.payload() {
                    1 => Ok(()),
                    2 if m.attempt() == 1 => Err(HandlerError::retry("once")),
                    2 => Ok(()),
                    4 => Err(HandlerError::fatal("four is refused")),
                    _ => Err(HandlerError::retry("always")),
                }
            },
        )
        .await
        .expect("consume");
    let orders = mq.publisher::<u32>("", &q);
    for n in [1, 2, 3, 4] {
        orders.send(&n).await.expect("publish");
    }
    let raw = Properties {
        content_type: Some("application/json".into()),
        ..Default::default()
    };
    mq.transport()
        .publish(Outbound::new("", q.clone(), raw, b"not json".to_vec()))
        .await
        .expect("raw publish")
        .await
        .expect("raw confirm");
    let nowhere = format!("{q}.nowhere");
    let unroutable = mq.publisher::<u32>("", &nowhere).send(&5).await;
    assert!(unroutable.is_err(), "a mandatory publish to no queue fails");
    eventually(WAIT, "every outcome settled", || async {
        let s = consumer.stats();
        (s.acked == 2 && s.retried == 2 && s.dead_lettered == 1 && s.rejected == 1 && s.parked == 1)
            .then_some(())
    })
    .await;

    // ---- /acemq-metrics ----
    let m = http_client::get(addr, "/acemq-metrics").await;
    assert_eq!(m.status, 200);
    let content_type = fx["actuator"]["metrics_content_type"]
        .as_str()
        .unwrap_or("");
    assert!(
        m.header("content-type")
            .is_some_and(|c| c.starts_with(content_type)),
        "{:?}",
        m.header("content-type")
    );
    let (samples, types) = parse(&m.body);
    let kinds = &fx["prometheus_types"];
    let histogram_series = strs(&fx["histogram_series"]);
    let never = strs(&fx["never_labels"]);
    let ours = |s: &Sample| s.labels.get("queue").is_some_and(|v| *v == q);
    // What this traffic must produce (the outbox, request/reply, set-aside failures and
    // missing rungs have their own tests).
    let produced = [
        "acemq.publish.duration",
        "acemq.publish.total",
        "acemq.consume.duration",
        "acemq.consume.total",
        "acemq.consume.attempts",
        "acemq.consume.in.flight",
        "acemq.messages.retried.total",
        "acemq.messages.dead.lettered.total",
    ];
    let mut checked = BTreeSet::new();
    for metric in fx["metrics"].as_array().expect("metrics") {
        let name = metric["name"].as_str().expect("name");
        let prom = metric["prometheus"].as_str().expect("prometheus name");
        let kind = metric["type"].as_str().expect("type");
        let prom_type = kinds[kind].as_str().expect("a Prometheus type");
        let labels: BTreeSet<String> = strs(&metric["labels"])
            .iter()
            .map(|l| prom_label(l))
            .collect();
        let outcomes = strs(&metric["outcomes"]);
        let series: Vec<&Sample> = samples
            .iter()
            .filter(|s| {
                s.name == prom
                    || (prom_type == "histogram"
                        && histogram_series
                            .iter()
                            .any(|suffix| s.name == format!("{prom}{suffix}")))
            })
            .collect();
        if series.is_empty() {
            assert!(
                !produced.contains(&name),
                "{name}: no {prom} series after the traffic:\n{}",
                m.body
            );
            continue;
        }
        assert_eq!(
            types.get(prom).map(String::as_str),
            Some(prom_type),
            "{name}: `# TYPE {prom}` in\n{}",
            m.body
        );
        for s in &series {
            let mut keys: BTreeSet<String> = s.labels.keys().cloned().collect();
            if s.name.ends_with("_bucket") {
                assert!(keys.remove("le"), "{s:?}: a bucket has `le`");
            }
            assert_eq!(keys, labels, "{name}: label set of {s:?}");
            for k in &never {
                assert!(!s.labels.contains_key(&prom_label(k)), "{s:?} has {k}");
            }
            if let Some(o) = s.labels.get("outcome")
                && !outcomes.is_empty()
            {
                assert!(
                    outcomes.contains(o),
                    "{name}: outcome {o} not in {outcomes:?}"
                );
            }
        }
        if prom_type == "histogram" {
            for suffix in &histogram_series {
                assert!(
                    series.iter().any(|s| s.name == format!("{prom}{suffix}")
                        && (ours(s) || !labels.contains("queue"))),
                    "{name}: no {prom}{suffix} series:\n{}",
                    m.body
                );
            }
        }
        if labels.contains("queue") && produced.contains(&name) {
            assert!(
                series
                    .iter()
                    .any(|s| ours(s)
                        && s.labels.get("transport").map(String::as_str) == Some(transport)),
                "{name}: no series for {q} with transport={transport}:\n{}",
                m.body
            );
        }
        checked.insert(name);
    }
    for name in produced {
        assert!(checked.contains(name), "{name} was compared");
    }
    // No AceMQ series at all without the transport label.
    for s in samples.iter().filter(|s| s.name.starts_with("acemq_")) {
        assert!(s.labels.contains_key("transport"), "{s:?} has no transport");
    }

    // Exact values for this run's queue.
    let sum = |name: &str, want: &[(&str, &str)]| -> f64 {
        samples
            .iter()
            .filter(|s| s.name == name && ours(s))
            .filter(|s| {
                want.iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    };
    for (outcome, want) in [
        ("acked", 2.0),
        ("retried", 2.0),
        ("dead_lettered", 1.0),
        ("rejected", 1.0),
        ("parked", 1.0),
    ] {
        assert_eq!(
            sum("acemq_consume_total", &[("outcome", outcome)]),
            want,
            "consume_total {outcome}"
        );
        assert_eq!(
            sum(
                "acemq_consume_duration_seconds_count",
                &[("outcome", outcome)]
            ),
            want,
            "consume_duration count {outcome}"
        );
    }
    assert_eq!(sum("acemq_messages_retried_total", &[]), 2.0);
    assert_eq!(
        sum(
            "acemq_messages_dead_lettered_total",
            &[("outcome", "dead_lettered")]
        ),
        2.0,
        "dead-lettered and rejected both went to the dlq"
    );
    assert_eq!(
        sum(
            "acemq_messages_dead_lettered_total",
            &[("outcome", "parked")]
        ),
        1.0
    );
    // Handled: 1 + 2 + 2 + 1 + 1 (the parked body) deliveries, on attempts 1,1,2,1,2,1,1.
    assert_eq!(sum("acemq_consume_attempts_count", &[]), 7.0);
    assert_eq!(sum("acemq_consume_attempts_sum", &[]), 9.0);
    assert_eq!(
        sum("acemq_consume_attempts_bucket", &[("le", "1")]),
        5.0,
        "{}",
        m.body
    );
    assert_eq!(sum("acemq_consume_in_flight", &[]), 0.0);
    let publish = |outcome: &str, rk: &str| -> f64 {
        samples
            .iter()
            .filter(|s| s.name == "acemq_publish_total")
            .filter(|s| {
                s.labels.get("routing_key").map(String::as_str) == Some(rk)
                    && s.labels.get("outcome").map(String::as_str) == Some(outcome)
                    && s.labels.get("transport").map(String::as_str) == Some(transport)
            })
            .map(|s| s.value)
            .sum()
    };
    assert_eq!(publish("confirmed", &q), 4.0);
    assert_eq!(publish("unroutable", &nowhere), 1.0);

    // ---- /acemq-health ----
    // A registered contributor with typed details (the shape of an ordered queue's report)
    // follows the built-in components.
    mq.register_health(Partitions);
    let h = http_client::get(addr, "/acemq-health").await;
    assert_eq!(h.status, 200, "{}", h.body);
    assert!(
        h.body
            .starts_with(r#"{"status":"UP","components":{"acemq":{"status":"UP","details":{"#),
        "the acemq component comes first: {}",
        h.body
    );
    let doc = h.json();
    let want = &fx["actuator"]["health_up"];
    assert_same_shape(want, &doc, "health");
    let details = &doc["components"]["acemq"]["details"];
    assert_eq!(details["transport"], transport);
    assert_eq!(details["open"], true);
    assert_eq!(details["blocked"], false);
    assert_eq!(details["inFlight"], 0);
    let mut component_keys = strs(&fx["actuator"]["component_keys"]);
    component_keys.sort();
    for (name, component) in doc["components"].as_object().expect("components") {
        let mut keys: Vec<String> = component
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        assert_eq!(keys, component_keys, "component {name}");
        assert!(component["details"].is_object(), "component {name}");
    }
    assert!(
        doc["components"]["consumers"]["details"]["running"].is_u64(),
        "other components' details are typed too: {doc}"
    );
    let ordered = &doc["components"]["ordered:contract"];
    assert_eq!(ordered["status"], "UP");
    assert_eq!(ordered["details"]["partitions"], 4);
    assert_eq!(ordered["details"]["halted"], serde_json::json!([]));
    let at = |name: &str| {
        h.body
            .find(&format!("\"{name}\":{{\"status\""))
            .unwrap_or(usize::MAX)
    };
    assert!(
        at("acemq") < at("consumers") && at("consumers") < at("ordered:contract"),
        "acemq, then the connection's other components, then contributors: {}",
        h.body
    );

    // A blocked connection (memory:// can be blocked without touching a shared broker; the
    // RabbitMQ alarm is the blocked_health drill): Up, with the contract's typed details.
    if let Broker::Memory(name) = target {
        let broker = acemq::transport::memory::MemoryBroker::named(name);
        broker.block("low on memory");
        eventually(WAIT, "the blocked state", || async {
            mq.status().blocked.is_some().then_some(())
        })
        .await;
        let h = http_client::get(addr, "/acemq-health").await;
        assert_eq!(h.status, 200, "{}", h.body);
        let doc = h.json();
        assert_eq!(doc["status"], "UP");
        let details = &doc["components"]["acemq"]["details"];
        for (k, v) in fx["actuator"]["health_blocked_details"]
            .as_object()
            .expect("blocked details")
        {
            assert_eq!(&details[k], v, "blocked detail {k}: {doc}");
        }
        broker.unblock();
        eventually(WAIT, "unblocked", || async {
            mq.status().blocked.is_none().then_some(())
        })
        .await;
    }

    // ---- /acemq-info ----
    let info = http_client::get(addr, "/acemq-info").await.json();
    let mut keys: Vec<String> = info
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let mut want_keys = strs(&fx["actuator"]["info_fields"]);
    keys.sort();
    want_keys.sort();
    assert_eq!(keys, want_keys, "{info}");
    assert_eq!(info["transport"], transport);
    assert_eq!(info["name"], "observability-contract");
    assert_eq!(info["version"], "9.9.9", "the application's version");
    assert_eq!(info["library"], "acemq-rust");
    assert_eq!(info["libraryVersion"], env!("CARGO_PKG_VERSION"));

    consumer.close().await;
    teardown(&mq, &q, &[]).await;

    // ---- Down: 503, `open` false (a boolean) ----
    mq.close_now().await.expect("close");
    let h = http_client::get(addr, "/acemq-health").await;
    let codes = &fx["actuator"]["health_status_codes"];
    assert_eq!(
        Some(u64::from(h.status)),
        codes["DOWN"].as_u64(),
        "{}",
        h.body
    );
    let doc = h.json();
    assert_eq!(doc["status"], "DOWN");
    assert_eq!(doc["components"]["acemq"]["details"]["open"], false);
    actuator.shutdown().await;
}

/// An ordered queue's contributor, as the `ordered` module registers it: typed details.
struct Partitions;

impl acemq::health::HealthContributor for Partitions {
    fn name(&self) -> String {
        "ordered:contract".into()
    }
    fn report(&self) -> Result<acemq::health::HealthReport, String> {
        Ok(acemq::health::HealthReport::up(self.name())
            .with_detail("partitions", 4)
            .with_detail("handled", 0u64)
            .with_detail("failed", 0u64)
            .with_detail("skipped", 0u64)
            .with_detail("halted", Vec::<u32>::new()))
    }
}

/// `got` has every key of `want`, recursively, with a value of the same JSON type (the
/// values themselves are the caller's to check).
fn assert_same_shape(want: &Value, got: &Value, at: &str) {
    match want {
        Value::Object(w) => {
            let g = got
                .as_object()
                .unwrap_or_else(|| panic!("{at}: an object, got {got}"));
            for (k, v) in w {
                let inner = g
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}: no `{k}` in {got}"));
                assert_same_shape(v, inner, &format!("{at}.{k}"));
            }
        }
        Value::Bool(_) => assert!(got.is_boolean(), "{at}: a boolean, got {got}"),
        Value::Number(_) => assert!(got.is_u64(), "{at}: a number, got {got}"),
        Value::String(_) => assert!(got.is_string(), "{at}: a string, got {got}"),
        other => assert_eq!(other, got, "{at}"),
    }
}

#[tokio::test]
async fn the_fixture_is_the_libraries_table() {
    // The contract's table and the library's agree in both directions, so a metric added
    // on one side only fails here.
    let fx = fixture();
    let from_fixture: BTreeMap<String, (String, Vec<String>, String)> = fx["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_owned(),
                (
                    m["type"].as_str().unwrap_or_default().to_owned(),
                    strs(&m["labels"]),
                    m["prometheus"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect();
    let from_library: BTreeMap<String, (String, Vec<String>, String)> =
        acemq::observe::metrics::METRICS
            .iter()
            .map(|m| {
                let kind = match m.instrument {
                    acemq::observe::metrics::Instrument::Counter => "counter",
                    acemq::observe::metrics::Instrument::Gauge => "gauge",
                    acemq::observe::metrics::Instrument::Timer => "timer",
                    _ => "distribution",
                };
                (
                    m.name.to_owned(),
                    (
                        kind.to_owned(),
                        m.labels.iter().map(|l| (*l).to_owned()).collect(),
                        m.prometheus_name(),
                    ),
                )
            })
            .collect();
    assert_eq!(from_library, from_fixture);
}
