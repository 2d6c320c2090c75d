//! Wire contract (`docs/wire.md` §2–§3): what AceMQ writes, read back by a plain AMQP client, and
//! what the Java reference wrote (`envelope-fixtures.json`), read by an AceMQ consumer.

use crate::support;

use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};
use acemq::headers::{HeaderValue, Headers};
use acemq::publish::SendOptions;
use acemq::topology::QueueDecl;
use acemq::transport::{Outbound, Properties};
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::AMQPValue;
use support::{Broker, on_each_target, unique};
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_headers_have_the_contract_names_and_amqp_types() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    let mq = Connection::connect(&url).await.unwrap();
    let q = unique("wire");
    mq.transport()
        .declare_queue(&QueueDecl::classic(&q))
        .await
        .unwrap();
    mq.publisher::<serde_json::Value>("", &q)
        .send_with(
            &serde_json::json!({"id": "o-1"}),
            SendOptions::new()
                .causation_id("cause-1")
                .claim("s3://bucket/o-1")
                .header("x-tenant", "acme"),
        )
        .await
        .unwrap();

    // Read it back with a plain lapin client: nothing of ours in between.
    let raw = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = raw.create_channel().await.unwrap();
    let msg = ch
        .basic_get(q.as_str().into(), BasicGetOptions::default())
        .await
        .unwrap()
        .expect("a message");
    let props = &msg.delivery.properties;
    let headers = props.headers().clone().unwrap();
    let h = headers.inner();
    let get = |k: &str| {
        h.get(k)
            .unwrap_or_else(|| panic!("missing header {k}: {h:?}"))
            .clone()
    };
    let id = match get("x-acemq-id") {
        AMQPValue::LongString(s) => s.to_string(),
        other => panic!("x-acemq-id must be a long string, got {other:?}"),
    };
    assert_eq!(
        props.message_id().as_ref().map(|s| s.to_string()),
        Some(id.clone())
    );
    assert!(matches!(get("x-acemq-attempt"), AMQPValue::LongInt(1)));
    assert!(matches!(get("x-acemq-version"), AMQPValue::LongInt(1)));
    assert!(
        matches!(get("x-acemq-first-seen"), AMQPValue::LongLongInt(ms) if ms > 1_700_000_000_000)
    );
    for k in [
        "x-acemq-type",
        "x-acemq-correlation",
        "x-acemq-origin",
        "x-acemq-causation",
        "x-acemq-claim",
        "x-tenant",
    ] {
        assert!(
            matches!(get(k), AMQPValue::LongString(_)),
            "{k} must be a long string"
        );
    }
    assert!(matches!(get("x-acemq-correlation"), AMQPValue::LongString(s) if s.to_string() == id));
    assert!(
        !h.contains_key("x-acemq-error"),
        "optional fields are absent, not empty"
    );
    assert_eq!(
        props
            .content_type()
            .as_ref()
            .map(|s| s.to_string())
            .as_deref(),
        Some("application/json")
    );
    assert_eq!(*props.delivery_mode(), Some(2));
    assert!(
        props.correlation_id().is_none() && props.kind().is_none(),
        "correlation travels in the header only"
    );
    msg.delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .unwrap();
    raw.close(200, "OK".into()).await.ok();
    mq.transport().delete_queue(&q).await.unwrap();
    mq.close().await.ok();
}

fn fixture_headers(json: &serde_json::Map<String, serde_json::Value>) -> Headers {
    json.iter()
        .map(|(k, v)| {
            let value = match v {
                serde_json::Value::String(s) => HeaderValue::Str(s.clone()),
                serde_json::Value::Number(n) => {
                    let n = n.as_i64().unwrap();
                    // As Java writes them: int32 when it fits, int64 (first-seen, epoch ms) otherwise.
                    match i32::try_from(n) {
                        Ok(small) => HeaderValue::I32(small),
                        Err(_) => HeaderValue::I64(n),
                    }
                }
                other => panic!("unexpected fixture value {other:?}"),
            };
            (k.into(), value)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_envelope_fixtures_read_back_into_the_expected_envelope() {
    let Some(fixtures) = support::fixture("envelope-fixtures.json") else {
        return;
    };
    on_each_target(|target: Broker| {
        let fixtures = fixtures.clone();
        async move {
            let mq = Connection::connect(&target.url()).await.unwrap();
            let q = unique("fixtures");
            mq.transport()
                .declare_queue(&QueueDecl::classic(&q))
                .await
                .unwrap();
            let (tx, mut rx) = mpsc::unbounded_channel();
            let consumer = mq
                .consume(
                    &q,
                    ConsumerOptions::default(),
                    move |m: Message<serde_json::Value>| {
                        let tx = tx.clone();
                        async move {
                            tx.send((m.envelope().clone(), m.headers().clone(), m.into_payload()))
                                .ok();
                            Ok(())
                        }
                    },
                )
                .await
                .unwrap();
            for case in fixtures["cases"].as_array().unwrap() {
                let name = case["case"].as_str().unwrap();
                let wire = case["headers"].as_object().unwrap();
                let body = case["body"].as_str().unwrap().as_bytes().to_vec();
                let props = Properties {
                    message_id: Some(case["messageId"].as_str().unwrap().into()),
                    content_type: Some(case["contentType"].as_str().unwrap().into()),
                    delivery_mode: Some(2),
                    headers: fixture_headers(wire),
                    ..Default::default()
                };
                // Published by routing key to our queue; the envelope's type comes from its header.
                mq.transport()
                    .publish(Outbound::new("", q.clone(), props, body.clone()))
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                let (env, headers, payload) =
                    tokio::time::timeout(Duration::from_secs(10), rx.recv())
                        .await
                        .unwrap()
                        .unwrap();
                assert_eq!(
                    payload,
                    serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
                    "{name}"
                );
                assert_eq!(env.id(), wire["x-acemq-id"].as_str().unwrap(), "{name}");
                assert_eq!(
                    env.correlation_id(),
                    wire["x-acemq-correlation"].as_str().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    env.message_type(),
                    wire["x-acemq-type"].as_str().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    i64::from(env.version()),
                    wire["x-acemq-version"].as_i64().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    i64::from(env.attempt()),
                    wire["x-acemq-attempt"].as_i64().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    env.first_seen_millis(),
                    wire["x-acemq-first-seen"].as_i64(),
                    "{name}"
                );
                assert_eq!(env.origin(), wire["x-acemq-origin"].as_str(), "{name}");
                assert_eq!(
                    env.causation_id(),
                    wire.get("x-acemq-causation").and_then(|v| v.as_str()),
                    "{name}"
                );
                assert!(
                    headers.keys().all(|k| !k.starts_with("x-acemq-")),
                    "{name}: {headers:?}"
                );
                let expected_app: Vec<&str> = wire
                    .keys()
                    .filter(|k| !k.starts_with("x-acemq-"))
                    .map(String::as_str)
                    .collect();
                let app: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
                assert_eq!(app, expected_app, "{name}");
                if name == "replayed" {
                    assert_eq!(env.replayed_from(), Some("orders.new.dlq"));
                    assert_eq!(env.replay_count(), 2);
                    let at = env
                        .replayed_at()
                        .expect("replayed-at read from epoch millis");
                    assert_eq!(
                        acemq::envelope::format_instant(at),
                        "2026-02-03T04:05:06.789Z"
                    );
                }
            }
            consumer.close().await;
            for suffix in ["", ".dlq", ".parked"] {
                let _ = mq.transport().delete_queue(&format!("{q}{suffix}")).await;
            }
            mq.close().await.ok();
        }
    })
    .await;
}
