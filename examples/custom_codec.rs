//! A codec of your own: sensor readings as one CSV line (`text/csv`), published with
//! `publisher_with` and consumed with `consume_with`. A body in another format is parked
//! (`{q}.parked`, with the reason) without running the handler.
//!
//! ```text
//! cargo run -p acemq-examples --example custom_codec
//! ```

use std::time::Duration;

use acemq::codec::{Decoder, Encoder};
use acemq::consume::{ConsumerOptions, Message};
use acemq::reexports::bytes::Bytes;
use acemq::topology::Topology;
use acemq::{Connection, Error};

#[derive(Debug, Clone, PartialEq)]
struct Reading {
    sensor: String,
    celsius: f64,
}

/// `sensor,celsius` on one line.
struct Csv;

impl Encoder<Reading> for Csv {
    fn content_type(&self) -> &str {
        "text/csv; charset=utf-8"
    }
    fn encode(&self, r: &Reading) -> Result<Bytes, Error> {
        if r.sensor.contains([',', '\n']) {
            return Err(Error::InvalidArgument(format!(
                "sensor name {:?} cannot hold a comma or a newline in CSV",
                r.sensor
            )));
        }
        Ok(format!("{},{}", r.sensor, r.celsius).into())
    }
}

impl Decoder<Reading> for Csv {
    fn accepts(&self, content_type: Option<&str>) -> bool {
        content_type.is_none_or(|ct| ct.to_ascii_lowercase().starts_with("text/csv"))
    }
    fn decode(&self, _: Option<&str>, body: &[u8]) -> Result<Reading, Error> {
        let bad = |why: &str| Error::Decode {
            reason: format!("not a sensor,celsius CSV line: {why}"),
        };
        let line = std::str::from_utf8(body).map_err(|_| bad("not UTF-8"))?;
        let (sensor, celsius) = line.trim().split_once(',').ok_or_else(|| bad("no comma"))?;
        let celsius = celsius
            .parse()
            .map_err(|_| bad("celsius is not a number"))?;
        Ok(Reading {
            sensor: sensor.to_owned(),
            celsius,
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mq = Connection::connect(&acemq_examples::broker_url("custom-codec")).await?;
    let q = "example.readings";
    mq.declare(&Topology::define().queue_with_dead_letter(q).build()?)
        .await?;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let consumer = mq
        .consume_with(
            q,
            Csv,
            ConsumerOptions::default(),
            move |m: Message<Reading>| {
                let tx = tx.clone();
                async move {
                    tx.send(m.payload().clone()).ok();
                    Ok(())
                }
            },
        )
        .await?;

    let readings = mq.publisher_with::<Reading, _>("", q, Csv);
    readings
        .send(&Reading {
            sensor: "boiler-1".into(),
            celsius: 71.5,
        })
        .await?;
    let got = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await?;
    println!("handled {got:?}");

    // A JSON body on the same queue is not read as CSV: it is parked with the reason.
    mq.publisher::<serde_json::Value>("", q)
        .send(&serde_json::json!({"sensor": "boiler-2"}))
        .await?;
    let parked = acemq::topology::parked_queue(q);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while mq.transport().inspect_queue(&parked).await?.message_count == 0 {
        assert!(tokio::time::Instant::now() < deadline, "nothing was parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "the JSON body went to {parked}; handled {}, parked {}",
        consumer.stats().acked,
        consumer.stats().parked
    );
    consumer.close().await;

    for q in [q.to_owned(), acemq::topology::dead_letter_queue(q), parked] {
        mq.transport().delete_queue(&q).await?;
    }
    mq.close().await?;
    Ok(())
}
