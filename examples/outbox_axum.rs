//! The transactional outbox in an axum + sqlx handler: `POST /orders` writes the order row
//! and its `order.placed` event in ONE database transaction, answers `201`, and an
//! [`OutboxRelay`] publishes the event afterwards. Had the transaction rolled back (the
//! order id already taken, say), neither the row nor the event would exist.
//!
//! Runs on SQLite in memory and `memory://` with no services at all; point `ACEMQ_URL` at
//! RabbitMQ and swap the pool for `PgPool` or `MySqlPool` in a real service.
//!
//! ```text
//! cargo run -p acemq-examples --example outbox_axum
//! ```

use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};
use acemq::topology::{ExchangeKind, Topology};
use acemq_sql::outbox::{Outbox, OutboxRelay};
use acemq_sql::sqlx::{self, SqlitePool};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

#[derive(Debug, Serialize, Deserialize)]
struct PlaceOrder {
    id: String,
    amount_cents: i64,
}

#[derive(Clone)]
struct App {
    db: SqlitePool,
    outbox: Outbox,
}

async fn place_order(
    State(app): State<App>,
    Json(order): Json<PlaceOrder>,
) -> Result<StatusCode, (StatusCode, String)> {
    let fail = |e: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let mut tx = app.db.begin().await.map_err(|e| fail(&e))?;
    let inserted = sqlx::query("INSERT INTO orders (id, amount_cents) VALUES (?, ?)")
        .bind(&order.id)
        .bind(order.amount_cents)
        .execute(&mut *tx)
        .await;
    if inserted.is_err() {
        // Dropping `tx` rolls back: no row, no event.
        return Err((StatusCode::CONFLICT, format!("order {} exists", order.id)));
    }
    app.outbox
        .enqueue(&mut tx, "example.shop", "order.placed", &order)
        .await
        .map_err(|e| fail(&e))?;
    tx.commit().await.map_err(|e| fail(&e))?;
    Ok(StatusCode::CREATED)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One connection: an in-memory SQLite database lives as long as its connection.
    let db = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL)")
        .execute(&db)
        .await?;
    let outbox = Outbox::new(db.clone());
    outbox.create_table_if_absent().await?; // development only; use a migration

    let mq = Connection::connect(&acemq_examples::broker_url("outbox-axum")).await?;
    mq.declare(
        &Topology::define()
            .exchange("example.shop", ExchangeKind::Topic)
            .queue_with_dead_letter("example.shop.orders")
            .bind("example.shop.orders", "example.shop", "order.*")
            .build()?,
    )
    .await?;
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let consumer = mq
        .consume(
            "example.shop.orders",
            ConsumerOptions::default(),
            move |m: Message<PlaceOrder>| {
                let seen = seen_tx.clone();
                async move {
                    seen.send(m.payload().id.clone()).ok();
                    Ok(())
                }
            },
        )
        .await?;
    let relay =
        OutboxRelay::new(mq.clone(), outbox.clone()).poll_interval(Duration::from_millis(50));
    relay.start()?;

    let app = axum::Router::new()
        .route("/orders", post(place_order))
        .with_state(App {
            db,
            outbox: outbox.clone(),
        });
    for body in [
        r#"{"id":"o-1","amount_cents":1250}"#,
        r#"{"id":"o-1","amount_cents":999}"#, // a conflict: rolled back, no event
        r#"{"id":"o-2","amount_cents":300}"#,
    ] {
        let request = axum::http::Request::post("/orders")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))?;
        let status = app.clone().oneshot(request).await?.status();
        println!("POST /orders {body} -> {status}");
    }
    for _ in 0..2 {
        let id = tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await?
            .ok_or("consumer stopped")?;
        println!("consumer saw order.placed for {id}");
    }
    // The relay marks a row published just after its confirm: wait for the marks.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while outbox.pending_count().await? > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "relay published {}, outbox pending {}",
        relay.published(),
        outbox.pending_count().await?
    );
    relay.stop().await;
    consumer.close().await;
    for q in [
        "example.shop.orders",
        "example.shop.orders.dlq",
        "example.shop.orders.parked",
    ] {
        mq.transport().delete_queue(q).await?;
    }
    mq.transport().delete_exchange("example.shop").await?;
    mq.close().await?;
    Ok(())
}
