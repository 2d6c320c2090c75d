//! A reminder scheduled two seconds ahead and received on time, with the id it was
//! scheduled under: `mq.scheduler()` declares the family's ladder (`acemq.schedule` and its
//! rungs) and delivers what falls due; `after` returns the message's id.
//!
//! ```text
//! cargo run -p acemq-examples --example scheduled_reminder
//! ACEMQ_URL=amqp://guest:guest@127.0.0.1:5672/%2f cargo run -p acemq-examples --example scheduled_reminder
//! ```

use std::time::{Duration, Instant};

use acemq::consume::{ConsumerOptions, Message};
use acemq::topology::Topology;
use acemq::{Connection, Error};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize)]
struct Reminder {
    who: String,
    what: String,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mq = Connection::connect(&acemq_examples::broker_url("scheduled-reminder")).await?;
    mq.declare(&Topology::define().queue("reminders").build()?)
        .await?;

    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = mq
        .consume(
            "reminders",
            ConsumerOptions::default(),
            move |m: Message<Reminder>| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send((m.envelope().id().to_owned(), m.into_payload()));
                    Ok(())
                }
            },
        )
        .await?;

    let scheduler = mq.scheduler().await?;
    let reminder = Reminder {
        who: "Ada".into(),
        what: "review the ledger".into(),
    };
    let started = Instant::now();
    let id = scheduler
        .after(Duration::from_secs(2), "", "reminders", &reminder)
        .await?;
    println!("scheduled {id} for 2 s from now");

    let (got_id, got) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .map_err(|_| Error::InvalidArgument("the reminder did not arrive within 30 s".into()))?
        .ok_or(Error::Closed)?;
    let after = started.elapsed();
    println!(
        "received {got_id} after {:.2} s: remind {} to {}",
        after.as_secs_f64(),
        got.who,
        got.what
    );
    assert_eq!(got_id, id, "the delivered message keeps the scheduled id");
    assert!(after >= Duration::from_secs(2), "never early");

    consumer.close().await;
    scheduler.close().await;
    mq.close().await
}
