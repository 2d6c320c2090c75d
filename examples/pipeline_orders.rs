//! An order pipeline of three steps, each its own queue and consumer (`orders-demo.validate`,
//! `.reserve`, `.ship`): validate turns a request into an order, reserve fails once (a
//! flaky stock service) and is retried on its own without validate running again, ship
//! completes the run. The run id (`x-acemq-route-id`) is the same at every step.
//!
//! ```text
//! cargo run -p acemq-examples --example pipeline_orders
//! ACEMQ_URL=amqp://guest:guest@127.0.0.1:5672/%2f cargo run -p acemq-examples --example pipeline_orders
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq::consume::{HandlerError, Message};
use acemq::retry::RetryPolicy;
use acemq::{Connection, Error};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    sku: String,
    quantity: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    sku: String,
    quantity: u32,
    reserved: bool,
}

fn run_id<T>(m: &Message<T>) -> String {
    m.envelope()
        .route()
        .map(|r| r.id().to_owned())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mq = Connection::connect(&acemq_examples::broker_url("pipeline-orders")).await?;
    let stock_calls = Arc::new(AtomicU32::new(0));
    let calls = stock_calls.clone();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let pipeline = mq
        .pipeline::<Request>("orders-demo")
        .step("validate", |m: Message<Request>| async move {
            let r = m.payload();
            println!("validate  run {}: {} x {}", run_id(&m), r.sku, r.quantity);
            if r.quantity == 0 {
                return Err(HandlerError::fatal("an order of nothing"));
            }
            Ok(Some(Order {
                sku: r.sku.clone(),
                quantity: r.quantity,
                reserved: false,
            }))
        })
        .step("reserve", move |m: Message<Order>| {
            let calls = calls.clone();
            async move {
                let attempt = m.attempt();
                println!("reserve   run {}: attempt {attempt}", run_id(&m));
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(HandlerError::retry("the stock service timed out"));
                }
                let mut order = m.into_payload();
                order.reserved = true;
                Ok(Some(order))
            }
        })
        .retry(RetryPolicy::fixed(3, Duration::from_millis(200))?)
        .step("ship", move |m: Message<Order>| {
            let done = done_tx.clone();
            async move {
                println!("ship      run {}: {:?}", run_id(&m), m.payload());
                let _ = done.send(run_id(&m));
                Ok(None::<()>)
            }
        })
        .build()
        .await?;

    let run = pipeline
        .send(&Request {
            sku: "tea-42".into(),
            quantity: 3,
        })
        .await?;
    println!("sent      run {run}");
    let finished = tokio::time::timeout(Duration::from_secs(30), done_rx.recv())
        .await
        .map_err(|_| Error::InvalidArgument("the run did not finish within 30 s".into()))?;
    assert_eq!(finished.as_deref(), Some(run.as_str()));
    println!(
        "completed: {} run(s); the stock service was called {} times",
        pipeline.stats().completed,
        stock_calls.load(Ordering::SeqCst)
    );
    pipeline.close().await;
    mq.close().await
}
