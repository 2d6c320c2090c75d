//! A worker as it runs in production: a retry policy with broker rungs, PostgreSQL
//! idempotency whose "done" mark commits in the handler's own transaction, the actuator
//! mounted in the service's axum router, and SIGTERM (or Ctrl-C) → stop taking work →
//! drain running handlers → close.
//!
//! ```text
//! ACEMQ_URL=amqp://guest:guest@127.0.0.1:5672/%2f \
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run -p acemq-examples --example worker
//! curl localhost:9464/acemq-health ; curl localhost:9464/acemq-metrics ; curl localhost:9464/
//! kill -TERM <pid>     # drains (up to 20 s), then exits
//! ```
//!
//! It needs RabbitMQ and PostgreSQL, so CI builds it without running it.

use std::sync::Arc;
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::retry::RetryPolicy;
use acemq::topology::{ExchangeKind, Topology};
use acemq_sql::SqlIdempotencyStore;
use acemq_sql::sqlx::{self, PgPool};
use axum::routing::get;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct ShipOrder {
    order_id: String,
    address: String,
}

/// The business write and the idempotency mark in one transaction: both or neither.
async fn ship(
    m: Message<ShipOrder>,
    db: PgPool,
    store: Arc<SqlIdempotencyStore>,
) -> Result<(), HandlerError> {
    let order = m.payload();
    let mut tx = db.begin().await?; // a database outage is retried under the policy
    sqlx::query("INSERT INTO shipments (order_id, address) VALUES ($1, $2)")
        .bind(&order.order_id)
        .bind(&order.address)
        .execute(&mut *tx)
        .await?;
    // Err (the claim was taken over meanwhile): `tx` is dropped, nothing is written.
    store
        .confirm_in(&mut tx, m.envelope().id())
        .await
        .map_err(HandlerError::retry)?;
    tx.commit().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("ACEMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let db_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());

    let db = PgPool::connect(&db_url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS shipments (order_id TEXT PRIMARY KEY, address TEXT NOT NULL)",
    )
    .execute(&db)
    .await?;
    let store = Arc::new(SqlIdempotencyStore::new(db.clone()));
    store.create_table_if_absent().await?; // development only; use a migration
    let purge = store.spawn_purge(Duration::from_secs(3600))?; // expired claims, hourly

    let mq = Connection::connect(&url).await?;
    // Five attempts: 10 s and 20 s in the consumer, 40 s and 80 s on rung queues.
    let policy = RetryPolicy::exponential(5, Duration::from_secs(10), Duration::from_secs(300))?;
    mq.declare(
        &Topology::define()
            .exchange("example.shipping", ExchangeKind::Topic)
            .queue_with_dead_letter("example.shipping.orders")
            .queue_with_retry("example.shipping.orders", &policy)
            .bind("example.shipping.orders", "example.shipping", "order.ship")
            .build()?,
    )
    .await?;
    let (db2, store2) = (db.clone(), store.clone());
    let consumer = mq
        .consume(
            "example.shipping.orders",
            ConsumerOptions::default()
                .retry(policy)
                .idempotent(store.clone()),
            move |m: Message<ShipOrder>| ship(m, db2.clone(), store2.clone()),
        )
        .await?;

    // The service's own router, with the actuator's three endpoints mounted beside its routes.
    let app = axum::Router::new()
        .route("/", get(|| async { "shipping worker" }))
        .merge(acemq::actuator::router(&mq));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
    println!("worker running; health on http://127.0.0.1:9464/acemq-health");
    let http = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
    });

    shutdown_signal().await;
    println!("stopping: no new deliveries, draining running handlers");
    mq.pause_consuming();
    let drained = mq.drain_consumers(Duration::from_secs(20)).await;
    println!("drained: {drained}; handled {}", consumer.stats().acked);
    mq.close().await?; // unfinished deliveries go back to the queue for another instance
    purge.stop().await;
    http.await??;
    Ok(())
}

/// SIGTERM (what an orchestrator sends) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        tokio::signal::ctrl_c().await.ok();
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
