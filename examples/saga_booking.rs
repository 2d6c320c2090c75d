//! A booking saga: take the payment, reserve the stock, book a courier, then publish
//! `booking.confirmed`. Run three times: one that completes, one whose courier refuses (the
//! stock is released and the payment refunded, in that order, the release retried through a
//! flaky inventory), and one whose caller gives up mid-step (the future is dropped; the
//! compensations still run, on a task of their own). Needs no services.
//!
//! ```text
//! cargo run -p acemq-examples --example saga_booking
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::saga::{Saga, SagaOptions, SagaResult};
use acemq::topology::Topology;
use serde::Serialize;

#[derive(Debug, Serialize)]
struct Booking {
    id: String,
    amount_cents: u64,
    courier_accepts: bool,
    courier_delay: Duration,
}

/// The services the steps talk to, in memory: who has paid, what is reserved.
#[derive(Default)]
struct World {
    charged: Mutex<BTreeMap<String, u64>>,
    reserved: Mutex<Vec<String>>,
    /// The inventory refuses this many releases before it accepts one.
    flaky_releases: AtomicU32,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn booking_saga(
    world: Arc<World>,
    mq: Connection,
) -> Result<Saga<Booking>, acemq::saga::SagaError> {
    let (w1, w2, w3, w4) = (world.clone(), world.clone(), world.clone(), world);
    Saga::<Booking>::named("booking")
        .options(
            SagaOptions::default()
                .compensation_retry(4, Duration::from_millis(50))
                .compensation_deadline(Duration::from_secs(10))
                .on_detached(|r: &SagaResult| println!("  (detached) {r}")),
        )
        .step("take-payment", move |b: Arc<Booking>| {
            let w = w1.clone();
            async move {
                lock(&w.charged).insert(b.id.clone(), b.amount_cents);
                Ok(())
            }
        })
        .compensate_with(move |b: Arc<Booking>| {
            let w = w2.clone();
            async move {
                // Idempotent: refunding twice refunds once.
                lock(&w.charged).remove(&b.id);
                Ok(())
            }
        })
        .step("reserve-stock", move |b: Arc<Booking>| {
            let w = w3.clone();
            async move {
                lock(&w.reserved).push(b.id.clone());
                Ok(())
            }
        })
        .compensate_with(move |b: Arc<Booking>| {
            let w = w4.clone();
            async move {
                let refusals_left = w.flaky_releases.load(Ordering::SeqCst);
                if refusals_left > 0 {
                    w.flaky_releases.store(refusals_left - 1, Ordering::SeqCst);
                    return Err("inventory service unavailable".into());
                }
                lock(&w.reserved).retain(|id| id != &b.id);
                Ok(())
            }
        })
        .step("book-courier", |b: Arc<Booking>| async move {
            tokio::time::sleep(b.courier_delay).await;
            if b.courier_accepts {
                Ok(())
            } else {
                Err(format!("no courier for booking {}", b.id).into())
            }
        })
        .step("announce", move |b: Arc<Booking>| {
            let mq = mq.clone();
            async move {
                // Last: an announcement cannot be taken back, so nothing may fail after it.
                mq.publisher::<Booking>("", "bookings.confirmed")
                    .send(&b)
                    .await?;
                Ok(())
            }
        })
        .build()
}

fn booking(id: &str, courier_accepts: bool, courier_delay: Duration) -> Booking {
    Booking {
        id: id.to_owned(),
        amount_cents: 4_200,
        courier_accepts,
        courier_delay,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mq = Connection::connect("memory://saga-booking").await?;
    mq.declare(&Topology::define().queue("bookings.confirmed").build()?)
        .await?;
    let world = Arc::new(World::default());
    let saga = booking_saga(world.clone(), mq.clone())?;

    println!("1. everything works:");
    let r = saga
        .run(booking("b-1", true, Duration::from_millis(10)))
        .await;
    println!("  {r}");
    assert!(r.is_complete());

    println!("2. the courier refuses; the inventory fails two releases first:");
    world.flaky_releases.store(2, Ordering::SeqCst);
    let r = saga
        .run(booking("b-2", false, Duration::from_millis(10)))
        .await;
    println!("  {r}");
    assert_eq!(r.failed_at(), Some("book-courier"));
    assert!(
        !r.has_unresolved(),
        "the release succeeded on its third try"
    );

    println!("3. the caller gives up while the courier is being booked:");
    let slow = booking("b-3", true, Duration::from_secs(60));
    let gave_up = tokio::time::timeout(Duration::from_millis(100), saga.run(slow)).await;
    assert!(gave_up.is_err());
    // The compensations finish on their own task; wait for them (with a deadline).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while lock(&world.charged).contains_key("b-3")
        || lock(&world.reserved).contains(&"b-3".to_owned())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "compensated in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let charged: Vec<String> = lock(&world.charged).keys().cloned().collect();
    let reserved = lock(&world.reserved).clone();
    println!("charged: {charged:?}, reserved: {reserved:?}");
    assert_eq!(charged, ["b-1"]);
    assert_eq!(reserved, ["b-1"]);
    mq.close().await?;
    Ok(())
}
