//! Quickstart: declare a queue with its dead-letter queue and retry rungs, publish typed
//! messages with confirms, consume them with a retry policy, and look at what happened.
//!
//! ```text
//! cargo run -p acemq --example quickstart                       # in-process memory:// broker
//! ACEMQ_URL=amqp://guest:guest@127.0.0.1:5672/%2f cargo run -p acemq --example quickstart
//! ```

use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::retry::RetryPolicy;
use acemq::topology::{ExchangeKind, Topology};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    id: String,
    amount_cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("ACEMQ_URL").unwrap_or_else(|_| "memory://quickstart".into());
    let mq = Connection::connect(&url).await?;
    println!("connected to {} ({})", redacted(&url), mq.transport_kind());

    // Two quick retries in the consumer, then the dead-letter queue.
    let policy = RetryPolicy::exponential(3, Duration::from_millis(100), Duration::from_secs(1))?;
    let topology = Topology::define()
        .exchange("quickstart.orders", ExchangeKind::Topic)
        .queue_with_dead_letter("quickstart.orders.placed")
        .queue_with_retry("quickstart.orders.placed", &policy)
        .bind(
            "quickstart.orders.placed",
            "quickstart.orders",
            "order.placed",
        )
        .build()?;
    mq.declare(&topology).await?;

    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let consumer = mq
        .consume(
            "quickstart.orders.placed",
            ConsumerOptions::default().retry(policy),
            move |m: Message<OrderPlaced>| {
                let done = done_tx.clone();
                async move {
                    let order = m.payload();
                    println!("  handling {} (attempt {})", order.id, m.attempt());
                    let result = if order.amount_cents == 0 {
                        Err(HandlerError::fatal(
                            "an order of zero cents is not an order",
                        ))
                    } else if order.id == "o-2" && m.attempt() < 2 {
                        Err(HandlerError::retry("the payment service timed out"))
                    } else {
                        Ok(())
                    };
                    if result.is_ok() || !result.as_ref().is_err_and(HandlerError::is_retry) {
                        done.send(()).ok();
                    }
                    result
                }
            },
        )
        .await?;

    let orders = mq.publisher::<OrderPlaced>("quickstart.orders", "order.placed");
    for (id, amount_cents) in [("o-1", 1250), ("o-2", 990), ("o-3", 0)] {
        let r = orders
            .send(&OrderPlaced {
                id: id.into(),
                amount_cents,
            })
            .await?;
        println!("published {id}: confirmed, message id {}", r.message_id);
    }
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(10), done_rx.recv()).await?;
    }
    consumer.close().await;

    let s = consumer.stats();
    println!(
        "acked {}, retried {}, rejected to .dlq {}",
        s.acked, s.retried, s.rejected
    );
    let replay = mq.replay("quickstart.orders.placed");
    println!(
        "dead letters waiting for replay: {}",
        replay.pending().await?
    );

    // Tidy up so the example can run again.
    for q in [
        "quickstart.orders.placed",
        "quickstart.orders.placed.dlq",
        "quickstart.orders.placed.parked",
    ] {
        mq.transport().delete_queue(q).await?;
    }
    mq.transport().delete_exchange("quickstart.orders").await?;
    mq.close().await?;
    Ok(())
}

fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
        _ => url.to_owned(),
    }
}
