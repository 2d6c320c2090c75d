//! A durable saga on SQLite: each step writes its outbox message in a transaction that
//! commits with the saga's log entry. Three runs: one that completes, one whose payment is
//! declined (the reservation is released, in the same kind of transaction), and one whose
//! process "dies" in the middle of a step (the task is aborted while the step holds its
//! transaction): a second instance, as after a restart, recovers it once its lease ran out
//! and finishes it. The outbox then holds exactly one message per applied step and undo.
//! Needs no services.
//!
//! ```text
//! cargo run -p acemq-examples --example durable_saga
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use acemq_sql::outbox::Outbox;
use acemq_sql::saga::{DurableSaga, SagaState, SagaTx};
use acemq_sql::sqlx::{self, Sqlite};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: String,
    card_ok: bool,
}

/// The booking saga; `hang` makes the payment step wait forever (the "crash" happens then).
fn booking(
    pool: sqlx::SqlitePool,
    outbox: &Outbox,
    hang: Arc<AtomicBool>,
) -> Result<DurableSaga<Sqlite, Order>, acemq_sql::Error> {
    let (o1, o2, o3) = (outbox.clone(), outbox.clone(), outbox.clone());
    DurableSaga::<Sqlite, Order>::named("booking", pool)
        .lease(Duration::from_secs(1))
        .step("reserve", move |o: Arc<Order>, mut tx: SagaTx<Sqlite>| {
            let outbox = o1.clone();
            async move {
                outbox
                    .enqueue(&mut tx, "", "stock", &format!("reserve {}", o.id))
                    .await?;
                Ok(tx)
            }
        })
        .compensate_with(move |o: Arc<Order>, mut tx: SagaTx<Sqlite>| {
            let outbox = o2.clone();
            async move {
                outbox
                    .enqueue(&mut tx, "", "stock", &format!("release {}", o.id))
                    .await?;
                Ok(tx)
            }
        })
        .step("charge", move |o: Arc<Order>, mut tx: SagaTx<Sqlite>| {
            let (outbox, hang) = (o3.clone(), hang.clone());
            async move {
                if hang.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                if !o.card_ok {
                    return Err(format!("card declined for {}", o.id).into());
                }
                outbox
                    .enqueue(&mut tx, "", "payments", &format!("charge {}", o.id))
                    .await?;
                Ok(tx)
            }
        })
        .build()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("acemq-durable-saga-{}.db", std::process::id()));
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
    let pool = sqlx::SqlitePool::connect_with(options).await?;
    let outbox = Outbox::new(pool.clone());
    outbox.create_table_if_absent().await?;
    let hang = Arc::new(AtomicBool::new(false));
    let first = booking(pool.clone(), &outbox, hang.clone())?;
    first.create_table_if_absent().await?;

    let done = first
        .run(Order {
            id: "o-1".into(),
            card_ok: true,
        })
        .await?;
    println!("o-1: {} (applied {:?})", done.state(), done.applied());
    assert_eq!(done.state(), SagaState::Completed);

    let declined = first
        .run(Order {
            id: "o-2".into(),
            card_ok: false,
        })
        .await?;
    println!(
        "o-2: {} at {:?}: {:?}",
        declined.state(),
        declined.failed_step(),
        declined.last_error()
    );
    assert_eq!(declined.state(), SagaState::Compensated);

    // The "crash": the process running o-3 goes away while the payment step is in hand.
    hang.store(true, Ordering::SeqCst);
    let running = tokio::spawn({
        let first = first.clone();
        async move {
            first
                .run(Order {
                    id: "o-3".into(),
                    card_ok: true,
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    running.abort();
    println!("o-3: its process died in the payment step");

    // The restart: another instance of the same definition recovers it after the lease.
    let second = booking(pool.clone(), &outbox, Arc::new(AtomicBool::new(false)))?;
    let recovered = loop {
        let done = second.recover().await?;
        if !done.is_empty() {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for s in &recovered {
        println!(
            "recovered {}: {} (applied {:?})",
            s.id(),
            s.state(),
            s.applied()
        );
    }
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0].state(), SagaState::Completed);

    // o-1: reserve, charge; o-2: reserve, release; o-3: reserve, charge.
    assert_eq!(outbox.pending_count().await?, 6);
    println!("outbox: 6 messages waiting for the relay, one per applied step and undo");
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    Ok(())
}
