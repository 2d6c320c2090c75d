//! The codec scenarios (`--codecs`): each family codec encodes then decodes the same order
//! `n` times in memory, no broker, and reports messages per second for each direction and
//! for the round trip, with JSON as the baseline. One row per codec: JSON, YAML, TOML, XML,
//! Avro (fixed schema), Avro (Confluent-framed, in-memory registry), Protobuf (prost).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use acemq::codec::registry::InMemorySchemaRegistry;
use acemq::codec::{Avro, Decoder, Encoder, Json, Protobuf, RegisteredAvro, Toml, Xml, Yaml};
use serde::{Deserialize, Serialize};

use crate::Result;

/// The benchmarked payload: an order with a list, as the family's codec samples carry.
#[derive(Clone, PartialEq, Serialize, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    /// Order id.
    #[prost(string, tag = "1")]
    pub order_id: String,
    /// Customer.
    #[prost(string, tag = "2")]
    pub customer: String,
    /// Total in cents.
    #[prost(int64, tag = "3")]
    pub total_cents: i64,
    /// ISO currency.
    #[prost(string, tag = "4")]
    pub currency: String,
    /// Paid yet.
    #[prost(bool, tag = "5")]
    pub paid: bool,
    /// Line items.
    #[prost(string, repeated, tag = "6")]
    pub lines: Vec<String>,
}

/// The Avro schema of [`Order`].
pub const ORDER_SCHEMA: &str = r#"{"type":"record","name":"Order","namespace":"org.acemq.bench","fields":[{"name":"orderId","type":"string"},{"name":"customer","type":"string"},{"name":"totalCents","type":"long"},{"name":"currency","type":"string"},{"name":"paid","type":"boolean"},{"name":"lines","type":{"type":"array","items":"string"}}]}"#;

/// One codec's numbers.
#[derive(Clone, Debug)]
pub struct CodecRow {
    /// The codec.
    pub codec: &'static str,
    /// The content type it writes.
    pub content_type: String,
    /// Body size of one order.
    pub bytes: usize,
    /// Encodes per second.
    pub encode_rate: f64,
    /// Decodes per second.
    pub decode_rate: f64,
    /// Encode + decode per second.
    pub round_trip_rate: f64,
}

fn order() -> Order {
    Order {
        order_id: "A-1".into(),
        customer: "Ana Söderström".into(),
        total_cents: 4250,
        currency: "GBP".into(),
        paid: true,
        lines: vec!["widget".into(), "gasket".into(), "sprocket".into()],
    }
}

/// Runs one codec `n` times each way.
fn measure<C>(codec_name: &'static str, codec: &C, n: u64) -> Result<CodecRow>
where
    C: Encoder<Order> + Decoder<Order>,
{
    let order = order();
    let content_type = Encoder::<Order>::content_type(codec).to_owned();
    let body = codec.encode(&order)?;
    let back: Order = codec.decode(Some(&content_type), &body)?;
    if back != order {
        return Err(format!("{codec_name} does not round-trip: {back:?}").into());
    }
    let started = Instant::now();
    for _ in 0..n {
        black_box(codec.encode(black_box(&order))?);
    }
    let encode = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for _ in 0..n {
        let o: Order = codec.decode(Some(&content_type), black_box(&body))?;
        black_box(o);
    }
    let decode = started.elapsed().as_secs_f64();
    let n = n as f64;
    Ok(CodecRow {
        codec: codec_name,
        content_type,
        bytes: body.len(),
        encode_rate: n / encode,
        decode_rate: n / decode,
        round_trip_rate: n / (encode + decode),
    })
}

/// Every codec's row, JSON first (the baseline).
///
/// ```no_run
/// # #[tokio::main] async fn main() -> acemq_bench::Result<()> {
/// for row in acemq_bench::codecs::run(10_000).await? {
///     println!("{} {:.0}/s", row.codec, row.round_trip_rate);
/// }
/// # Ok(()) }
/// ```
pub async fn run(n: u64) -> Result<Vec<CodecRow>> {
    let registry = Arc::new(InMemorySchemaRegistry::new());
    let registered = RegisteredAvro::new(registry, "order-value", ORDER_SCHEMA).await?;
    Ok(vec![
        measure("json", &Json, n)?,
        measure("yaml", &Yaml, n)?,
        measure("toml", &Toml, n)?,
        measure("xml", &Xml::default(), n)?,
        measure("avro (fixed)", &Avro::new(ORDER_SCHEMA)?, n)?,
        measure("avro (registered)", &registered, n)?,
        measure("protobuf", &Protobuf, n)?,
    ])
}

/// The rows as a table, each codec's round trip also as a share of JSON's.
pub fn table(rows: &[CodecRow]) -> String {
    let baseline = rows.first().map_or(f64::NAN, |r| r.round_trip_rate);
    let mut out = format!(
        "{:<18} {:<28} {:>6} {:>12} {:>12} {:>12} {:>8}\n",
        "codec", "content type", "bytes", "encode/s", "decode/s", "both/s", "vs json"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<18} {:<28} {:>6} {:>12.0} {:>12.0} {:>12.0} {:>7.2}x\n",
            r.codec,
            r.content_type,
            r.bytes,
            r.encode_rate,
            r.decode_rate,
            r.round_trip_rate,
            r.round_trip_rate / baseline
        ));
    }
    out
}
