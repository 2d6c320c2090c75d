//! One conformance suite for every idempotency store: in-memory, SQLite, PostgreSQL and
//! MariaDB (the last two when their URLs are set).

mod support;

use std::sync::Arc;
use std::time::Duration;

use acemq::idempotency::{ClaimOutcome, IdempotencyStore, InMemoryIdempotencyStore};
use acemq_sql::{IdempotencyOptions, SqlIdempotencyStore, SqlPool};
use support::{drop_table, eventually, unique_table};

const LEASE: Duration = Duration::from_millis(200);

/// Builds a store with a claim timeout; every call is a new owner on the same backend
/// (the in-memory store hands back the same instance: it has one owner).
type Factory = Box<dyn Fn(Duration) -> Arc<dyn IdempotencyStore>>;

fn key(case: &str) -> String {
    format!("{case}-{}", uuid::Uuid::new_v4())
}

async fn three_states(make: &Factory) {
    let s = make(Duration::from_secs(300));
    let k = key("states");
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    assert!(!s.claim(&k).await.unwrap());
    assert!(!s.is_confirmed(&k).await.unwrap());
    s.confirm(&k).await.unwrap();
    assert!(s.is_confirmed(&k).await.unwrap());
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);
    // confirm without a claim records it too
    let k2 = key("confirm-only");
    s.confirm(&k2).await.unwrap();
    assert_eq!(s.try_claim(&k2).await.unwrap(), ClaimOutcome::Duplicate);
}

async fn release_then_claim(make: &Factory) {
    let s = make(Duration::from_secs(300));
    let k = key("release");
    assert!(s.claim(&k).await.unwrap());
    s.release(&k).await.unwrap();
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
    s.confirm(&k).await.unwrap();
    s.release(&k).await.unwrap(); // a confirmation is never released
    assert_eq!(s.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);
}

async fn release_by_another_owner_does_nothing(make: &Factory) {
    let a = make(Duration::from_secs(300));
    let b = make(Duration::from_secs(300));
    let k = key("other-owner");
    assert!(a.claim(&k).await.unwrap());
    b.release(&k).await.unwrap();
    assert_eq!(b.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    a.release(&k).await.unwrap();
    assert_eq!(b.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
}

async fn expired_lease_is_taken_over(make: &Factory, distinct_owners: bool) {
    let a = make(LEASE);
    let b = make(LEASE);
    let k = key("takeover");
    assert!(a.claim(&k).await.unwrap());
    assert_eq!(b.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    eventually(
        "the lease expires and b takes it over",
        Duration::from_secs(10),
        || async {
            match b.try_claim(&k).await.unwrap() {
                ClaimOutcome::Claimed => true,
                ClaimOutcome::InProgress => false,
                other => panic!("unexpected {other:?}"),
            }
        },
    )
    .await;
    assert_eq!(a.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    if distinct_owners {
        // a's release no longer touches b's claim
        a.release(&k).await.unwrap();
        assert_eq!(a.try_claim(&k).await.unwrap(), ClaimOutcome::InProgress);
    }
    b.confirm(&k).await.unwrap();
    assert_eq!(a.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);
}

async fn racers_on_an_expired_lease(make: &Factory) {
    let holder = make(LEASE);
    let r1 = make(LEASE);
    let r2 = make(LEASE);
    let keys: Vec<String> = (0..50).map(|i| key(&format!("race{i}"))).collect();
    for k in &keys {
        assert!(holder.claim(k).await.unwrap());
    }
    let claimed_at = tokio::time::Instant::now();
    // Wait out the lease (the one wait that cannot be a poll without taking the lease).
    tokio::time::sleep_until(claimed_at + LEASE + Duration::from_millis(100)).await;
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

async fn confirmed_never_retaken(make: &Factory) {
    let a = make(LEASE);
    let b = make(LEASE);
    let k = key("confirmed");
    assert!(a.claim(&k).await.unwrap());
    a.confirm(&k).await.unwrap();
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(b.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);
    assert!(!b.claim(&k).await.unwrap());
    assert!(b.is_confirmed(&k).await.unwrap());
}

async fn suite(name: &str, make: Factory, distinct_owners: bool) {
    eprintln!("conformance: {name}");
    three_states(&make).await;
    release_then_claim(&make).await;
    if distinct_owners {
        release_by_another_owner_does_nothing(&make).await;
    }
    expired_lease_is_taken_over(&make, distinct_owners).await;
    racers_on_an_expired_lease(&make).await;
    confirmed_never_retaken(&make).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_memory_store_conforms() {
    // One store per claim timeout: the in-memory store has a single owner, itself.
    let short: Arc<dyn IdempotencyStore> =
        Arc::new(InMemoryIdempotencyStore::for_one_day().claim_timeout(LEASE));
    let long: Arc<dyn IdempotencyStore> = Arc::new(InMemoryIdempotencyStore::for_one_day());
    let make: Factory = Box::new(move |t| {
        if t <= LEASE {
            short.clone()
        } else {
            long.clone()
        }
    });
    suite("memory", make, false).await;
}

fn sql_factory(pool: &SqlPool, table: &str) -> Factory {
    let (pool, table) = (pool.clone(), table.to_owned());
    Box::new(move |timeout| {
        Arc::new(
            SqlIdempotencyStore::with_options(
                pool.clone(),
                IdempotencyOptions::new()
                    .table(&table)
                    .claim_timeout(timeout),
            )
            .unwrap(),
        )
    })
}

async fn purge_removes_only_expired(pool: &SqlPool, table: &str) {
    let store = |t| {
        SqlIdempotencyStore::with_options(
            pool.clone(),
            IdempotencyOptions::new().table(table).claim_timeout(t),
        )
        .unwrap()
    };
    let short = store(LEASE);
    let long = store(Duration::from_secs(300));
    let (old, fresh, done) = (key("old"), key("fresh"), key("done"));
    assert!(short.claim(&old).await.unwrap());
    let t0 = tokio::time::Instant::now();
    assert!(long.claim(&fresh).await.unwrap());
    assert!(long.claim(&done).await.unwrap());
    long.confirm(&done).await.unwrap();
    tokio::time::sleep_until(t0 + LEASE + Duration::from_millis(50)).await;
    let purged = long.purge_expired().await.unwrap();
    assert_eq!(purged, 1, "only the abandoned claim had expired");
    assert_eq!(
        long.try_claim(&done).await.unwrap(),
        ClaimOutcome::Duplicate
    );
    assert_eq!(
        short.try_claim(&fresh).await.unwrap(),
        ClaimOutcome::InProgress
    );
    assert_eq!(long.try_claim(&old).await.unwrap(), ClaimOutcome::Claimed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_stores_conform() {
    for (name, pool) in support::databases().await {
        let table = unique_table("acemq_idem");
        let first = SqlIdempotencyStore::with_options(
            pool.clone(),
            IdempotencyOptions::new().table(&table),
        )
        .unwrap();
        first.create_table_if_absent().await.unwrap();
        first.create_table_if_absent().await.unwrap(); // idempotent
        suite(name, sql_factory(&pool, &table), true).await;
        drop_table(&pool, &table).await;
        // purge on a table of its own, so the suite's expired leases do not count
        let table = unique_table("acemq_idem");
        sql_factory(&pool, &table)(LEASE);
        SqlIdempotencyStore::with_options(pool.clone(), IdempotencyOptions::new().table(&table))
            .unwrap()
            .create_table_if_absent()
            .await
            .unwrap();
        purge_removes_only_expired(&pool, &table).await;
        drop_table(&pool, &table).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_store_refuses_bad_input() {
    let pool = support::sqlite().await;
    for bad in ["x; drop table", "a b", "1x", "s.t.u", ""] {
        let r =
            SqlIdempotencyStore::with_options(pool.clone(), IdempotencyOptions::new().table(bad));
        assert!(
            matches!(r, Err(acemq_sql::Error::InvalidTableName { .. })),
            "{bad:?} accepted"
        );
    }
    let r = SqlIdempotencyStore::with_options(
        pool.clone(),
        IdempotencyOptions::new()
            .retention(Duration::from_secs(60))
            .claim_timeout(Duration::from_secs(120)),
    );
    assert!(matches!(r, Err(acemq_sql::Error::InvalidArgument(_))));
    let table = unique_table("acemq_idem");
    let s =
        SqlIdempotencyStore::with_options(pool.clone(), IdempotencyOptions::new().table(&table))
            .unwrap();
    s.create_table_if_absent().await.unwrap();
    assert!(s.try_claim("").await.is_err());
    assert!(s.try_claim(&"k".repeat(256)).await.is_err());
    assert!(s.try_claim(&"k".repeat(255)).await.is_ok());
    let ddl = s.create_table_sql();
    assert!(
        ddl.contains("message_id VARCHAR(255) NOT NULL PRIMARY KEY"),
        "{ddl}"
    );
    assert!(ddl.contains("expires_at"), "{ddl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_case_sensitive_everywhere() {
    for (_name, pool) in support::databases().await {
        let table = unique_table("acemq_idem");
        let s = SqlIdempotencyStore::with_options(
            pool.clone(),
            IdempotencyOptions::new().table(&table),
        )
        .unwrap();
        s.create_table_if_absent().await.unwrap();
        assert!(s.claim("Order-1").await.unwrap());
        assert!(s.claim("order-1").await.unwrap());
        drop_table(&pool, &table).await;
    }
}
