//! Replaying dead letters from code: a handler sends two kinds of failures to `{q}.dlq`;
//! after "deploying the fix" for one of them, only the dead letters that failed for that
//! reason are replayed. Each replayed copy carries its provenance
//! (`acemq-replayed-from`, `acemq-replay-count`).
//!
//! ```text
//! cargo run -p acemq-examples --example replay_dead_letters
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::topology::Topology;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Invoice {
    id: String,
    currency: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mq = Connection::connect(&acemq_examples::broker_url("replay-example")).await?;
    let q = "example.invoices";
    mq.declare(&Topology::define().queue_with_dead_letter(q).build()?)
        .await?;

    // Until the fix is deployed, CHF invoices fail for good; invoices without an id always do.
    let chf_supported = Arc::new(AtomicBool::new(false));
    let (tx, mut handled) = tokio::sync::mpsc::unbounded_channel();
    let supported = chf_supported.clone();
    let consumer = mq
        .consume(q, ConsumerOptions::default(), move |m: Message<Invoice>| {
            let (tx, supported) = (tx.clone(), supported.clone());
            async move {
                let invoice = m.payload();
                if invoice.id.is_empty() {
                    return Err(HandlerError::fatal("invoice without an id"));
                }
                if invoice.currency == "CHF" && !supported.load(Ordering::SeqCst) {
                    return Err(HandlerError::fatal("unsupported currency CHF"));
                }
                let from = m.envelope().replayed_from().map(str::to_owned);
                tx.send((invoice.id.clone(), from)).ok();
                Ok(())
            }
        })
        .await?;

    let invoices = mq.publisher::<Invoice>("", q);
    for (id, currency) in [("i-1", "EUR"), ("i-2", "CHF"), ("", "EUR"), ("i-3", "CHF")] {
        invoices
            .send(&Invoice {
                id: id.into(),
                currency: currency.into(),
            })
            .await?;
    }
    let replay = mq.replay(q);
    wait_until(|| async { Ok(replay.pending().await? == 3) }).await?;
    println!(
        "{} dead letters in {}",
        replay.pending().await?,
        replay.from_queue()
    );

    // The fix is out: replay only what failed on CHF; the invoice without an id stays.
    chf_supported.store(true, Ordering::SeqCst);
    let report = replay
        .replay_matching(100, |dead| {
            dead.envelope
                .error()
                .is_some_and(|e| e.contains("unsupported currency"))
        })
        .await?;
    println!("replay: {report:?}");
    for _ in 0..3 {
        let (id, from) = tokio::time::timeout(Duration::from_secs(10), handled.recv())
            .await?
            .ok_or("consumer stopped")?;
        println!(
            "handled {id} (replayed from {})",
            from.as_deref().unwrap_or("-")
        );
    }
    println!("{} dead letter(s) left", replay.pending().await?);
    consumer.close().await;

    for q in [
        q.to_owned(),
        acemq::topology::dead_letter_queue(q),
        acemq::topology::parked_queue(q),
    ] {
        mq.transport().delete_queue(&q).await?;
    }
    mq.close().await?;
    Ok(())
}

/// Polls `check` every 20 ms for up to 10 s.
async fn wait_until<F, Fut>(mut check: F) -> Result<(), Box<dyn std::error::Error>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, acemq::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await? {
        if tokio::time::Instant::now() > deadline {
            return Err("timed out".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
