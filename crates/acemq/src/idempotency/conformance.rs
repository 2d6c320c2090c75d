//! The idempotency store conformance suite (feature `testing`): the rules every
//! [`IdempotencyStore`] must keep, as public async functions, so a store of your own runs
//! the very cases the built-in ones pass (the in-memory store, and the SQL stores of
//! `acemq-sql` on SQLite, PostgreSQL and MariaDB).
//!
//! A case is handed a factory: `Fn(Duration) -> Arc<dyn IdempotencyStore>`, where the
//! duration is the claim timeout (the lease). Every store one factory makes must use the
//! same backend, so what one store claims the next one sees. A case panics when the store
//! does not conform, exactly like a failed assertion in a test; this module is test
//! support, not a runtime API. Keys are fresh in every case, so the cases can share a
//! backend and run in parallel.
//!
//! What the factory's stores are decides which cases apply ([`Owners`]):
//! * [`Owners::Distinct`]: each call is a new owner (another consumer process, say) on the
//!   backend, as with the SQL stores: one owner's release must not touch another's claim.
//! * [`Owners::One`]: the backend is a single owner, itself (the in-memory store): a
//!   factory hands back the same store for the same claim timeout, which is what
//!   [`one_store_per_timeout`] builds.
//!
//! Two cases wait out a real lease (a few hundred milliseconds, and 1.5 s for the racers),
//! so the suite takes a few seconds.
//!
//! In a test of your own, with `acemq = { ..., features = ["testing"] }` among the
//! dev-dependencies:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use acemq::idempotency::conformance::{Owners, one_store_per_timeout, run_all};
//! use acemq::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
//!
//! #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
//! async fn my_store_conforms() {
//!     // A store of your own goes here: a new owner on one shared backend per call, with
//!     // `Owners::Distinct`. The in-memory store is its own single owner.
//!     let make = one_store_per_timeout(|lease| {
//!         Arc::new(InMemoryIdempotencyStore::for_one_day().claim_timeout(lease))
//!             as Arc<dyn IdempotencyStore>
//!     });
//!     run_all("memory", make, Owners::One).await;
//! }
//! # fn main() {}
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{ClaimOutcome, IdempotencyStore};
use crate::transport::conformance::eventually;

/// The lease of the cases that wait for one to expire.
pub const LEASE: Duration = Duration::from_millis(200);

/// The racers' lease: both racers of a key must try within it for "exactly one wins" to
/// hold, and 100 concurrent claims on a pool of a few database connections can queue
/// longer than [`LEASE`] on a loaded machine.
pub const RACE_LEASE: Duration = Duration::from_millis(1500);

/// A lease no case outlives.
const LONG: Duration = Duration::from_secs(300);

/// How the stores one factory makes relate; see the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owners {
    /// Every store is an owner of its own on the shared backend.
    Distinct,
    /// The backend has one owner: the factory hands back the same store per claim timeout.
    One,
}

/// A factory for a store that is its own single owner ([`Owners::One`]): calls `make` once
/// per claim timeout and hands back that store for every later call with the same timeout.
pub fn one_store_per_timeout<F>(make: F) -> impl Fn(Duration) -> Arc<dyn IdempotencyStore>
where
    F: Fn(Duration) -> Arc<dyn IdempotencyStore>,
{
    let stores: Mutex<HashMap<Duration, Arc<dyn IdempotencyStore>>> = Mutex::default();
    move |lease| {
        stores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(lease)
            .or_insert_with(|| make(lease))
            .clone()
    }
}

/// A key no other case or run uses.
fn key(case: &str) -> String {
    format!("{case}-{}", uuid::Uuid::new_v4())
}

/// Runs every case that applies to `owners`, in turn; `name` is for the report.
///
/// # Panics
/// At the first case the store fails.
pub async fn run_all<F>(name: &str, make: F, owners: Owners)
where
    F: Fn(Duration) -> Arc<dyn IdempotencyStore>,
{
    let make: &dyn Fn(Duration) -> Arc<dyn IdempotencyStore> = &make;
    eprintln!("idempotency store conformance: {name}");
    three_states(make).await;
    release_then_claim(make).await;
    if owners == Owners::Distinct {
        release_by_another_owner_does_nothing(make).await;
    }
    expired_lease_is_taken_over(make, owners).await;
    racers_on_an_expired_lease(make).await;
    confirmed_is_never_retaken(make).await;
}

/// A key is free, then claimed (`InProgress` to a second claim), then confirmed (a
/// `Duplicate` from then on); a confirm without a claim records it too.
pub async fn three_states(make: &dyn Fn(Duration) -> Arc<dyn IdempotencyStore>) {
    let s = make(LONG);
    let k = key("states");
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    assert!(!s.claim(&k).await.unwrap());
    assert!(!s.is_confirmed(&k).await.unwrap());
    s.confirm(&k).await.unwrap();
    assert!(s.is_confirmed(&k).await.unwrap());
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);
    let k2 = key("confirm-only");
    s.confirm(&k2).await.unwrap();
    assert_eq!(s.try_claim(&k2).await.unwrap(), ClaimOutcome::Duplicate);
}

/// A released claim can be claimed again; a confirmation is never released.
pub async fn release_then_claim(make: &dyn Fn(Duration) -> Arc<dyn IdempotencyStore>) {
    let s = make(LONG);
    let k = key("release");
    assert!(s.claim(&k).await.unwrap());
    s.release(&k).await.unwrap();
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
    s.confirm(&k).await.unwrap();
    s.release(&k).await.unwrap();
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);
}

/// One owner's release leaves another owner's claim alone ([`Owners::Distinct`] only).
pub async fn release_by_another_owner_does_nothing(
    make: &dyn Fn(Duration) -> Arc<dyn IdempotencyStore>,
) {
    let a = make(LONG);
    let b = make(LONG);
    let k = key("other-owner");
    assert!(a.claim(&k).await.unwrap());
    b.release(&k).await.unwrap();
    assert_eq!(b.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    a.release(&k).await.unwrap();
    assert_eq!(b.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
}

/// A claim whose lease ran out is taken over by the next claim; with distinct owners, the
/// first owner's release no longer touches it; the new owner's confirm makes it a duplicate.
pub async fn expired_lease_is_taken_over(
    make: &dyn Fn(Duration) -> Arc<dyn IdempotencyStore>,
    owners: Owners,
) {
    let a = make(LEASE);
    // With distinct owners the taker's own lease is long, so its claim is still live when
    // `a` looks again, however slow the backend. One owner has one lease per store.
    let b = match owners {
        Owners::Distinct => make(LONG),
        Owners::One => make(LEASE),
    };
    let k = key("takeover");
    assert!(a.claim(&k).await.unwrap());
    assert_eq!(b.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    eventually(
        Duration::from_secs(10),
        "the lease to expire and the claim to be taken over",
        || async {
            match b.try_claim(&k).await.unwrap() {
                ClaimOutcome::Claimed => Some(()),
                ClaimOutcome::InProgress => None,
                other => panic!("a claim taken over, or still in progress; got {other:?}"),
            }
        },
    )
    .await;
    assert_eq!(a.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    if owners == Owners::Distinct {
        a.release(&k).await.unwrap();
        assert_eq!(a.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    }
    b.confirm(&k).await.unwrap();
    assert_eq!(a.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);
}

/// Two owners racing for each of 50 expired claims: exactly one wins each key, the other
/// sees it in progress.
pub async fn racers_on_an_expired_lease(make: &dyn Fn(Duration) -> Arc<dyn IdempotencyStore>) {
    let holder = make(RACE_LEASE);
    let r1 = make(RACE_LEASE);
    let r2 = make(RACE_LEASE);
    let keys: Vec<String> = (0..50).map(|i| key(&format!("race{i}"))).collect();
    for k in &keys {
        assert!(holder.claim(k).await.unwrap());
    }
    let claimed_at = tokio::time::Instant::now();
    // Wait out the lease: polling would take the lease, which is what is being raced for.
    tokio::time::sleep_until(claimed_at + RACE_LEASE + Duration::from_millis(100)).await;
    let rounds = keys.iter().map(|k| {
        let (r1, r2) = (r1.clone(), r2.clone());
        async move {
            let (a, b) = tokio::join!(r1.try_claim(k), r2.try_claim(k));
            (a.unwrap(), b.unwrap())
        }
    });
    for (a, b) in futures::future::join_all(rounds).await {
        let winners = [a, b]
            .iter()
            .filter(|o| **o == ClaimOutcome::Claimed)
            .count();
        assert_eq!(winners, 1, "exactly one racer wins: {a:?} {b:?}");
        assert!(a == ClaimOutcome::InProgress || b == ClaimOutcome::InProgress);
    }
}

/// A confirmation outlives the claim's lease: never claimed again, still confirmed.
pub async fn confirmed_is_never_retaken(make: &dyn Fn(Duration) -> Arc<dyn IdempotencyStore>) {
    let a = make(LEASE);
    let b = make(LEASE);
    let k = key("confirmed");
    assert!(a.claim(&k).await.unwrap());
    a.confirm(&k).await.unwrap();
    // A negative check: nothing to wait for but the lease running out.
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(b.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);
    assert!(!b.claim(&k).await.unwrap());
    assert!(b.is_confirmed(&k).await.unwrap());
}
