//! The family's codecs against the family's own bytes: every body in `codec-samples.json`
//! and `codec-interop-fixtures.json` decodes to its expected value, Rust's encodings decode
//! back and, where a fixture pins bytes (Avro, fixed and Confluent-framed), match them byte
//! for byte; both columns of `avro-resolution-fixtures.json` are reachable. Then one
//! end-to-end case on `memory://` and RabbitMQ: a consumer reading YAML and registered Avro
//! by content type, parking a body in a format it was not given.
//!
//! Fixtures come from `ACEMQ_FAMILY_FIXTURES` (see `support::fixture`).
//!
//! Run: `ACEMQ_FAMILY_FIXTURES=../shared/fixtures cargo test -p acemq --all-features --test codecs`

use crate::support;

use std::sync::Arc;

use acemq::codec::registry::InMemorySchemaRegistry;
use acemq::codec::{Avro, Composite, Decoder, Encoder, Protobuf, RegisteredAvro, Toml, Xml, Yaml};
use acemq::consume::{ConsumerOptions, Message};
use acemq::envelope;
use acemq::transport::Properties;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use support::settle::{WAIT, header_str};
use support::{
    Broker, connect_with_classic_queue, on_each_target, publish_raw, take_one, teardown,
};

fn b64(s: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s.as_str().expect("base64 text"))
        .expect("valid base64")
}

/// An object without its `what` commentary.
fn without_what(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("what");
    }
    v
}

/// codec-samples.json's `document` (YAML, TOML, XML): typed, so XML's text is parsed.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Document {
    order_id: String,
    customer: String,
    total_cents: u64,
    currency: String,
    paid: bool,
    #[serde(deserialize_with = "acemq::codec::xml::list")]
    lines: Vec<String>,
}

/// codec-samples.json's `record` (Avro, Protobuf Struct).
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Record {
    order_id: String,
    customer: String,
    total_cents: i64,
    currency: String,
    paid: bool,
}

/// codec-interop-fixtures.json's YAML/TOML value.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Placed {
    order_id: String,
    customer: String,
    total_cents: u64,
    currency: String,
    items: Vec<String>,
}

/// codec-interop-fixtures.json's XML value: XML has no types, the fixture keeps text.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct PlacedXml {
    order_id: String,
    customer: String,
    total_cents: String,
    currency: String,
    #[serde(deserialize_with = "acemq::codec::xml::list")]
    items: Vec<String>,
}

/// The .NET/Python protobuf tests' `acemq.test.OrderPlaced`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
struct OrderPlaced {
    #[prost(string, tag = "1")]
    order_id: String,
    #[prost(int64, tag = "2")]
    total_cents: i64,
    #[prost(string, tag = "3")]
    tenant: String,
}

fn decode_as<T, D>(codec: &D, ct: &str, body: &[u8]) -> Value
where
    T: Serialize,
    D: Decoder<T>,
{
    assert!(codec.accepts(Some(ct)), "codec accepts {ct}");
    let v: T = codec
        .decode(Some(ct), body)
        .unwrap_or_else(|e| panic!("{ct}: {e}"));
    serde_json::to_value(v).unwrap()
}

#[tokio::test]
async fn codec_samples_decode_to_the_document_and_avro_bytes_match() {
    let Some(f) = support::fixture("codec-samples.json") else {
        return;
    };
    let document = without_what(&f["document"]);
    let record = without_what(&f["record"]);
    let schema = f["avroSchema"].to_string();
    let avro = Avro::new(&schema).unwrap();
    let registry = Arc::new(InMemorySchemaRegistry::new().with_schema(1, &schema));
    let registered = RegisteredAvro::new(registry.clone(), "order-value", &schema)
        .await
        .unwrap();
    assert_eq!(registered.schema_id(), Some(1), "same schema, same id");
    let typed_record: Record = serde_json::from_value(record.clone()).unwrap();
    let mut seen = 0;
    for s in f["samples"].as_array().unwrap() {
        let (format, producer) = (
            s["format"].as_str().unwrap(),
            s["producer"].as_str().unwrap(),
        );
        let ct = s["contentType"].as_str().unwrap();
        let body = b64(&s["bodyBase64"]);
        let what = format!("{producer} {format}");
        let (got, want) = match format {
            "yaml" => (decode_as::<Document, _>(&Yaml, ct, &body), &document),
            "toml" => (decode_as::<Document, _>(&Toml, ct, &body), &document),
            "xml" => (
                decode_as::<Document, _>(&Xml::default(), ct, &body),
                &document,
            ),
            "protobuf" => {
                let s: prost_types::Struct = Protobuf.decode(Some(ct), &body).unwrap();
                (acemq::codec::protobuf::struct_to_json(&s), &record)
            }
            "avro-fixed" => {
                assert_eq!(
                    &avro.encode(&typed_record).unwrap()[..],
                    &body[..],
                    "{what} bytes"
                );
                (decode_as::<Value, _>(&avro, ct, &body), &record)
            }
            "avro-registered" => {
                assert_eq!(
                    &registered.encode(&typed_record).unwrap()[..],
                    &body[..],
                    "{what} bytes"
                );
                let reader = RegisteredAvro::reader(registry.clone());
                (decode_as::<Value, _>(&reader, ct, &body), &record)
            }
            other => panic!("unknown format {other} in the fixture"),
        };
        assert_eq!(&got, want, "{what}");
        seen += 1;
    }
    assert_eq!(seen, 12, "every sample was read");
}

#[tokio::test]
async fn interop_fixtures_decode_to_their_expected_values() {
    let Some(f) = support::fixture("codec-interop-fixtures.json") else {
        return;
    };
    let schema = f["avro_schema"].as_str().unwrap();
    let avro = Avro::new(schema).unwrap();
    let registry = Arc::new(InMemorySchemaRegistry::new().with_schema(7, schema));
    let registered = RegisteredAvro::new(registry.clone(), "placed-value", schema)
        .await
        .unwrap();
    let mut seen = 0;
    for s in f["samples"].as_array().unwrap() {
        let (format, producer) = (
            s["format"].as_str().unwrap(),
            s["producer"].as_str().unwrap(),
        );
        let ct = s["content_type"].as_str().unwrap();
        let body = b64(&s["body_base64"]);
        let expected = &s["expected"];
        let what = format!("{producer} {format}");
        let got = match format {
            "yaml" => decode_as::<Placed, _>(&Yaml, ct, &body),
            "toml" => decode_as::<Placed, _>(&Toml, ct, &body),
            "xml" => decode_as::<PlacedXml, _>(&Xml::default(), ct, &body),
            "protobuf" => {
                let m: OrderPlaced = Protobuf.decode(Some(ct), &body).unwrap();
                assert_eq!(&Protobuf.encode(&m).unwrap()[..], &body[..], "{what} bytes");
                serde_json::to_value(m).unwrap()
            }
            "avro" => {
                assert_eq!(
                    &avro.encode(expected).unwrap()[..],
                    &body[..],
                    "{what} bytes"
                );
                decode_as::<Value, _>(&avro, ct, &body)
            }
            "avro-registered" => {
                assert_eq!(
                    &registered.encode(expected).unwrap()[..],
                    &body[..],
                    "{what} bytes"
                );
                decode_as::<Value, _>(&RegisteredAvro::reader(registry.clone()), ct, &body)
            }
            other => panic!("unknown format {other} in the fixture"),
        };
        assert_eq!(&got, expected, "{what}");
        seen += 1;
    }
    assert_eq!(seen, 11, "every sample was read");
}

#[tokio::test]
async fn avro_resolution_reaches_both_columns() {
    let Some(f) = support::fixture("avro-resolution-fixtures.json") else {
        return;
    };
    for c in f["cases"].as_array().unwrap() {
        let name = c["case"].as_str().unwrap();
        let id = u32::try_from(c["schemaId"].as_u64().unwrap()).unwrap();
        let writer = c["writerSchema"].as_str().unwrap();
        let reader_schema = c["readerSchema"].as_str().unwrap();
        let body = b64(&c["bodyBase64"]);
        let registry = Arc::new(InMemorySchemaRegistry::new().with_schema(id, writer));
        let ct = Some(acemq::codec::AVRO_REGISTERED);

        // Column `resolved`: the library holds a reader schema.
        let resolving = RegisteredAvro::reader(registry.clone())
            .with_reader_schema(reader_schema)
            .unwrap();
        let got: Value = resolving.decode(ct, &body).unwrap();
        assert_eq!(got, c["resolved"], "{name}: resolved");

        // The same column when the reader's schema is the codec's own (registered too).
        let own = RegisteredAvro::new(registry.clone(), "resolution-value", reader_schema)
            .await
            .unwrap();
        let got: Value = own.decode(ct, &body).unwrap();
        assert_eq!(
            got, c["resolved"],
            "{name}: resolved onto the codec's schema"
        );

        // Column `writerShape`: no reader schema.
        let got: Value = own
            .clone()
            .without_reader_schema()
            .decode(ct, &body)
            .unwrap();
        assert_eq!(got, c["writerShape"], "{name}: writer's shape");
        let got: Value = RegisteredAvro::reader(registry).decode(ct, &body).unwrap();
        assert_eq!(got, c["writerShape"], "{name}: reader without schema");
    }
}

#[tokio::test]
async fn rust_encodings_decode_back() {
    let doc = Document {
        order_id: "A-1".into(),
        customer: "Ana Söderström".into(),
        total_cents: 4250,
        currency: "GBP".into(),
        paid: true,
        lines: vec!["widget".into(), "gasket".into()],
    };
    for body in [Yaml.encode(&doc).unwrap(), Toml.encode(&doc).unwrap()] {
        let back: Document = Composite::new()
            .with(Yaml)
            .decode(None, &body)
            .unwrap_or_else(|_| Toml.decode(None, &body).unwrap());
        assert_eq!(back, doc);
    }
    let xml = Xml::default().encode(&doc).unwrap();
    assert!(
        xml.starts_with(b"<Document><orderId>A-1</orderId>"),
        "{xml:?}"
    );
    let back: Document = Xml::default().decode(Some("text/xml"), &xml).unwrap();
    assert_eq!(back, doc);
    let m = OrderPlaced {
        order_id: "o-1".into(),
        total_cents: -1,
        tenant: "t".into(),
    };
    let back: OrderPlaced = Protobuf
        .decode(None, &Protobuf.encode(&m).unwrap())
        .unwrap();
    assert_eq!(back, m);
    // A body framed for another schema id is refused with a reason, not misread.
    let registry = Arc::new(InMemorySchemaRegistry::new());
    let avro = RegisteredAvro::new(registry, "n", r#""long""#)
        .await
        .unwrap();
    let e = Decoder::<i64>::decode(&avro, None, b"\x00\x00\x00\x00\x09\x02").unwrap_err();
    assert!(e.to_string().contains("schema 9"), "{e}");
    let e = Decoder::<i64>::decode(&avro, None, b"\x02").unwrap_err();
    assert!(e.to_string().contains("not a Confluent-framed"), "{e}");
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
#[serde(rename_all = "camelCase")]
struct Order {
    order_id: String,
    total_cents: i64,
}

const ORDER_SCHEMA: &str = r#"{"type":"record","name":"Order","namespace":"org.acemq.test","fields":[{"name":"orderId","type":"string"},{"name":"totalCents","type":"long"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_reads_each_format_it_was_given_by_content_type() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "codecs").await;
        let registry = Arc::new(InMemorySchemaRegistry::new());
        let avro = RegisteredAvro::new(registry.clone(), "order-value", ORDER_SCHEMA)
            .await
            .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Order>();
        let reads = Composite::new()
            .with(Yaml)
            .with(RegisteredAvro::reader(registry.clone()));
        let consumer = mq
            .consume_with(
                &q,
                reads,
                ConsumerOptions::default(),
                move |m: Message<Order>| {
                    let tx = tx.clone();
                    async move {
                        tx.send(m.into_payload()).ok();
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();

        let yaml_order = Order {
            order_id: "y-1".into(),
            total_cents: 1,
        };
        let avro_order = Order {
            order_id: "a-1".into(),
            total_cents: 2,
        };
        mq.publisher_with::<Order, _>("", &q, Yaml)
            .send(&yaml_order)
            .await
            .unwrap();
        mq.publisher_with::<Order, _>("", &q, avro)
            .send(&avro_order)
            .await
            .unwrap();
        // A format this consumer was not given (TOML) is parked with its reason.
        let props = Properties {
            message_id: Some("toml-1".into()),
            content_type: Some("application/toml".into()),
            ..Default::default()
        };
        publish_raw(
            &**mq.transport(),
            &q,
            props,
            b"orderId = 't-1'\ntotalCents = 3\n",
        )
        .await;

        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(
                tokio::time::timeout(WAIT, rx.recv())
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        got.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        assert_eq!(got, [avro_order, yaml_order]);
        let parked = take_one(&**mq.transport(), &format!("{q}.parked"), WAIT).await;
        let reason = header_str(&parked, envelope::ERROR);
        assert!(
            reason.contains("\"application/toml\" is not one of this consumer's formats"),
            "{reason}"
        );
        support::eventually(WAIT, "two acked, one parked", || async {
            let s = consumer.stats();
            (s.acked == 2 && s.parked == 1).then_some(())
        })
        .await;
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[test]
fn json_is_untouched_by_the_family_types() {
    // The JSON codec never claims a family format (java.md §2.14).
    for ct in [
        "application/yaml",
        "application/vnd.acemq.avro",
        "application/x-protobuf",
    ] {
        assert!(!Decoder::<Value>::accepts(&acemq::codec::Json, Some(ct)));
    }
    let _ = json!(null);
}
