//! `SqlCancelStore` on every database: cancel and ask, idempotent and concurrent cancels,
//! purge exactly as `MemoryCancelStore`, over-long ids; and a scheduler on the memory
//! transport that does not deliver a message cancelled in SQLite.

use std::sync::Arc;
use std::time::Duration;

use acemq::schedule::{
    CANCELLED_KEPT_AFTER_DUE_MS, CANCELLED_KEPT_UNSEEN_MS, CancelError, CancelStore,
    MemoryCancelStore, SchedulerOptions,
};
use acemq_sql::cancellations::SqlCancelStore;

use crate::support::{databases, drop_table, sqlite, unique_table};

async fn store_on(pool: &acemq_sql::SqlPool) -> (SqlCancelStore, String) {
    let table = unique_table("acemq_cancel");
    let store = SqlCancelStore::with_table(pool.clone(), &table).unwrap();
    store.create_table_if_absent().await.unwrap();
    (store, table)
}

#[tokio::test]
async fn cancel_is_remembered_idempotent_and_unknown_ids_are_not_cancelled() {
    for (db, pool) in databases().await {
        let (store, table) = store_on(&pool).await;
        assert!(!store.is_cancelled("m-1", 10).await.unwrap(), "{db}");
        store.cancel("m-1", 1).await.unwrap();
        store.cancel("m-1", 2).await.unwrap();
        assert!(store.is_cancelled("m-1", 10).await.unwrap(), "{db}");
        assert!(store.is_cancelled("m-1", 20).await.unwrap(), "{db}");
        assert!(
            !store.is_cancelled("M-1", 10).await.unwrap(),
            "{db}: ids are case-sensitive"
        );
        assert!(!store.is_cancelled("m-2", 10).await.unwrap(), "{db}");
        drop_table(&pool, &table).await;
    }
}

/// The cases of `MemoryCancelStore`'s unit test, on both stores, which must agree at
/// every step.
#[tokio::test]
async fn purge_forgets_exactly_what_the_memory_store_forgets() {
    for (db, pool) in databases().await {
        let (sql, table) = store_on(&pool).await;
        let mem = MemoryCancelStore::default();
        let stores: [&dyn CancelStore; 2] = [&sql, &mem];
        for s in stores {
            s.cancel("a", 0).await.unwrap();
            s.cancel("never-seen", 0).await.unwrap();
            assert!(s.is_cancelled("a", 10_000).await.unwrap(), "{db}");
            assert_eq!(
                s.purge(10_000 + CANCELLED_KEPT_AFTER_DUE_MS).await.unwrap(),
                0,
                "{db}"
            );
            assert_eq!(
                s.purge(10_001 + CANCELLED_KEPT_AFTER_DUE_MS).await.unwrap(),
                1,
                "{db}"
            );
            assert!(!s.is_cancelled("a", 10_000).await.unwrap(), "{db}");
            assert_eq!(s.purge(CANCELLED_KEPT_UNSEEN_MS).await.unwrap(), 0, "{db}");
            assert_eq!(
                s.purge(CANCELLED_KEPT_UNSEEN_MS + 1).await.unwrap(),
                1,
                "{db}"
            );
            assert!(!s.is_cancelled("never-seen", 0).await.unwrap(), "{db}");
            // The first due time is kept: a later ask does not extend the cancellation.
            s.cancel("b", 0).await.unwrap();
            assert!(s.is_cancelled("b", 100).await.unwrap());
            assert!(s.is_cancelled("b", 5_000).await.unwrap());
            assert_eq!(
                s.purge(101 + CANCELLED_KEPT_AFTER_DUE_MS).await.unwrap(),
                1,
                "{db}"
            );
        }
        assert!(mem.is_empty());
        drop_table(&pool, &table).await;
    }
}

#[tokio::test]
async fn an_id_over_255_bytes_is_refused() {
    for (db, pool) in databases().await {
        let (store, table) = store_on(&pool).await;
        let long = "x".repeat(256);
        let e = store.cancel(&long, 0).await.unwrap_err();
        assert!(matches!(e, CancelError::Invalid(_)), "{db}: {e}");
        assert!(e.to_string().contains("256 bytes"), "{db}: {e}");
        let e = store.is_cancelled(&long, 0).await.unwrap_err();
        assert!(matches!(e, CancelError::Invalid(_)), "{db}: {e}");
        let max = "x".repeat(255);
        store.cancel(&max, 0).await.unwrap();
        assert!(store.is_cancelled(&max, 0).await.unwrap(), "{db}");
        drop_table(&pool, &table).await;
    }
}

#[tokio::test]
async fn two_concurrent_cancels_of_one_id_both_succeed() {
    for (db, pool) in databases().await {
        let (store, table) = store_on(&pool).await;
        let store = Arc::new(store);
        for round in 0..5 {
            let id = format!("race-{round}");
            let (a, b) = (store.clone(), store.clone());
            let (ia, ib) = (id.clone(), id.clone());
            let ta = tokio::spawn(async move { a.cancel(&ia, 1).await });
            let tb = tokio::spawn(async move { b.cancel(&ib, 2).await });
            ta.await.unwrap().unwrap_or_else(|e| panic!("{db}: {e}"));
            tb.await.unwrap().unwrap_or_else(|e| panic!("{db}: {e}"));
            assert!(store.is_cancelled(&id, 5).await.unwrap(), "{db}");
        }
        drop_table(&pool, &table).await;
    }
}

#[tokio::test]
async fn a_scheduler_with_the_sqlite_store_does_not_deliver_a_cancelled_message() {
    let pool = sqlite().await;
    let (store, _table) = store_on(&pool).await;
    let mq = acemq::Connection::connect(&format!(
        "memory://{}",
        crate::amqp_support::unique("sql-cancel")
    ))
    .await
    .unwrap();
    let q = crate::amqp_support::unique("dest");
    crate::amqp_support::declare_classic(&mq, &q).await;
    let s = mq
        .scheduler_with(SchedulerOptions::default().cancellations(Arc::new(store)))
        .await
        .unwrap();
    let dropped = s
        .after(Duration::from_secs(2), "", &q, &"dropped")
        .await
        .unwrap();
    let kept = s
        .after(Duration::from_secs(2), "", &q, &"kept")
        .await
        .unwrap();
    s.cancel(&dropped).await.unwrap();
    let t = mq.transport().clone();
    let mut arrived = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    // Until the kept one arrived and the scheduler has dealt with the cancelled one.
    while !(arrived.contains(&kept) && s.stats().cancelled == 1) {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out: arrived {arrived:?}, stats {:?}",
            s.stats()
        );
        match t.get(&q).await.unwrap() {
            Some(d) => {
                arrived.push(d.properties.message_id.clone().unwrap_or_default());
                d.acker.ack().await.unwrap();
            }
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    while let Some(d) = t.get(&q).await.unwrap() {
        arrived.push(d.properties.message_id.clone().unwrap_or_default());
        d.acker.ack().await.unwrap();
    }
    assert_eq!(arrived, vec![kept]);
    assert_eq!(s.stats().cancelled, 1);
    s.close().await;
}
