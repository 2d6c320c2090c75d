//! Makes dead letters to try `acemq dlq ...` on: declares `orders.new` (with its `.dlq`
//! and `.parked`), publishes 300 orders, and runs a consumer that fails some of them for
//! good (zero amounts, a bank timeout for tenant `eu`) and cannot decode one.
//!
//! ```sh
//! ACEMQ_URL=amqp://guest:guest@127.0.0.1:5672/%2f cargo run -p acemq-cli --example dead_letters
//! acemq dlq list
//! ```

use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::publish::SendOptions;
use acemq::topology::Topology;
use acemq::transport::{Outbound, Properties};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    id: String,
    amount_cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("ACEMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let mq = Connection::connect(&url).await?;
    mq.declare(
        &Topology::define()
            .queue_with_dead_letter("orders.new")
            .build()?,
    )
    .await?;

    let orders = mq.publisher::<OrderPlaced>("", "orders.new");
    for i in 0..300u64 {
        let tenant = if i.is_multiple_of(3) { "eu" } else { "us" };
        let order = OrderPlaced {
            id: format!("o-{i}"),
            amount_cents: if i % 100 == 7 { 0 } else { 1250 + i },
        };
        orders
            .send_with(
                &order,
                SendOptions::new()
                    .message_type("order.placed")
                    .header("tenant", tenant),
            )
            .await?;
    }
    // A body that does not decode as an OrderPlaced: parked, never handled.
    let props = Properties {
        content_type: Some("application/json".into()),
        ..Properties::default()
    };
    let out = Outbound::new("", "orders.new", props, b"{\"id\": 42}".to_vec());
    mq.transport().publish(out).await?.await?;

    let consumer = mq
        .consume(
            "orders.new",
            ConsumerOptions::default(),
            |m: Message<OrderPlaced>| async move {
                if m.payload().amount_cents == 0 {
                    return Err(HandlerError::fatal(
                        "an order of zero cents cannot be charged",
                    ));
                }
                let tenant = m.headers().get("tenant").and_then(|v| v.as_str());
                if tenant == Some("eu") && m.payload().amount_cents.is_multiple_of(2) {
                    return Err(HandlerError::fatal(
                        "timeout talking to the bank (eu-payments: 30 s)",
                    ));
                }
                Ok(())
            },
        )
        .await?;
    // 3 zero amounts + 50 bank timeouts dead-lettered, 1 parked: wait until they are there.
    let replay = mq.replay("orders.new");
    let parked = mq.replay("orders.new").parked();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while (replay.pending().await? < 53 || parked.pending().await? < 1)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.close().await;
    println!(
        "{} dead letters in {}, {} parked in {}",
        replay.pending().await?,
        replay.from_queue(),
        parked.pending().await?,
        parked.from_queue()
    );
    mq.close().await?;
    Ok(())
}
