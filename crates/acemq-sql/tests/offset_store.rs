//! `SqlOffsetStore` on every database (SQLite always, PostgreSQL and MySQL/MariaDB when
//! their URLs are set; under `ACEMQ_TEST_REQUIRE_BROKER=1` a missing URL fails): nothing
//! before the first commit, a commit is read back, a lower commit is ignored, readers and
//! streams are independent, concurrent commits keep the highest, out-of-range input and
//! invalid table names are refused. End to end on PostgreSQL and RabbitMQ: a reader
//! closed and restarted under the same name handles exactly the entries published since.

mod support;

#[path = "../../acemq/tests/support/mod.rs"]
mod amqp_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{HandlerError, Message};
use acemq::idempotency::StoreError;
use acemq::stream::{OffsetStore, StreamConsumer, StreamRetention};
use acemq_sql::offsets::{DEFAULT_TABLE, SqlOffsetStore};
use acemq_sql::{Error, SqlPool};
use support::{databases, drop_table, unique_table};

/// A store in a table of its own, created.
async fn fresh_store(pool: &SqlPool) -> (SqlOffsetStore, String) {
    let table = unique_table("acemq_offsets");
    let store = SqlOffsetStore::with_table(pool.clone(), &table).expect("a valid table name");
    store.create_table_if_absent().await.expect("create table");
    (store, table)
}

async fn load_commit_and_keep_the_highest(db: &str, s: &SqlOffsetStore) {
    assert_eq!(
        s.load("audit", "r1").await.unwrap(),
        None,
        "{db}: nothing yet"
    );
    s.commit("audit", "r1", 5).await.unwrap();
    assert_eq!(s.load("audit", "r1").await.unwrap(), Some(5), "{db}");
    s.commit("audit", "r1", 3).await.unwrap();
    assert_eq!(
        s.load("audit", "r1").await.unwrap(),
        Some(5),
        "{db}: lower ignored"
    );
    s.commit("audit", "r1", 5).await.unwrap();
    assert_eq!(
        s.load("audit", "r1").await.unwrap(),
        Some(5),
        "{db}: same kept"
    );
    s.commit("audit", "r1", 9).await.unwrap();
    assert_eq!(
        s.load("audit", "r1").await.unwrap(),
        Some(9),
        "{db}: raised"
    );
    // Offset 0 (the first entry of a stream) is an offset like any other.
    s.commit("zero", "r1", 0).await.unwrap();
    assert_eq!(s.load("zero", "r1").await.unwrap(), Some(0), "{db}");
    // The largest offset a BIGINT holds.
    let top = i64::MAX as u64;
    s.commit("top", "r1", top).await.unwrap();
    assert_eq!(s.load("top", "r1").await.unwrap(), Some(top), "{db}");
}

async fn readers_and_streams_are_independent(db: &str, s: &SqlOffsetStore) {
    s.commit("orders", "a", 10).await.unwrap();
    s.commit("orders", "b", 20).await.unwrap();
    s.commit("payments", "a", 30).await.unwrap();
    assert_eq!(s.load("orders", "a").await.unwrap(), Some(10), "{db}");
    assert_eq!(s.load("orders", "b").await.unwrap(), Some(20), "{db}");
    assert_eq!(s.load("payments", "a").await.unwrap(), Some(30), "{db}");
    assert_eq!(s.load("payments", "b").await.unwrap(), None, "{db}");
    s.commit("orders", "b", 25).await.unwrap();
    assert_eq!(s.load("orders", "a").await.unwrap(), Some(10), "{db}");
    assert_eq!(s.load("payments", "a").await.unwrap(), Some(30), "{db}");
    // Names compare exactly (MySQL's default collation would fold case).
    assert_eq!(s.load("Orders", "a").await.unwrap(), None, "{db}: case");
    assert_eq!(s.load("orders", "A").await.unwrap(), None, "{db}: case");
}

async fn concurrent_commits_keep_the_highest(db: &str, s: &Arc<SqlOffsetStore>) {
    // Out of order, all at once: whatever order they land in, the highest stays.
    let offsets: Vec<u64> = (0..40u64).map(|i| (i * 17) % 40).collect();
    let tasks: Vec<_> = offsets
        .iter()
        .map(|&n| {
            let s = s.clone();
            tokio::spawn(async move { s.commit("race", "r", n).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(s.load("race", "r").await.unwrap(), Some(39), "{db}");
}

async fn out_of_range_input_is_invalid(db: &str, s: &SqlOffsetStore) {
    for offset in [i64::MAX as u64 + 1, u64::MAX] {
        match s.commit("big", "r1", offset).await {
            Err(StoreError::Invalid(m)) => assert!(m.contains("i64::MAX"), "{db}: {m}"),
            other => panic!("{db}: offset {offset} gave {other:?}"),
        }
    }
    assert_eq!(
        s.load("big", "r1").await.unwrap(),
        None,
        "{db}: nothing written"
    );
    let long = "n".repeat(256);
    assert!(
        matches!(s.commit(&long, "r1", 1).await, Err(StoreError::Invalid(_))),
        "{db}"
    );
    assert!(
        matches!(s.commit("s", &long, 1).await, Err(StoreError::Invalid(_))),
        "{db}"
    );
    assert!(
        matches!(s.load(&long, "r1").await, Err(StoreError::Invalid(_))),
        "{db}"
    );
    let widest = "n".repeat(255);
    s.commit(&widest, &widest, 1).await.unwrap();
    assert_eq!(s.load(&widest, &widest).await.unwrap(), Some(1), "{db}");
}

fn invalid_table_names_are_refused(db: &str, pool: &SqlPool) {
    for bad in ["x; drop table y", "1abc", "a.b.c", "", "\"q\"", "off set"] {
        match SqlOffsetStore::with_table(pool.clone(), bad) {
            Err(Error::InvalidTableName { name }) => assert_eq!(name, bad, "{db}"),
            other => panic!("{db}: {bad:?} gave {other:?}"),
        }
    }
    let default = SqlOffsetStore::new(pool.clone());
    assert_eq!(default.table().as_str(), DEFAULT_TABLE, "{db}");
    let ddl = default.create_table_sql();
    assert!(
        ddl.contains("CREATE TABLE IF NOT EXISTS acemq_stream_offsets"),
        "{db}: {ddl}"
    );
    assert!(ddl.contains("PRIMARY KEY (stream, reader)"), "{db}: {ddl}");
}

/// The database's default schema, to qualify a table with.
async fn default_schema(pool: &SqlPool) -> String {
    match pool {
        SqlPool::Postgres(p) => sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(p)
            .await
            .unwrap(),
        SqlPool::MySql(p) => sqlx::query_scalar("SELECT DATABASE()")
            .fetch_one(p)
            .await
            .unwrap(),
        _ => "main".into(),
    }
}

async fn a_schema_qualified_table(db: &str, pool: &SqlPool) {
    let table = unique_table("acemq_offsets_q");
    let qualified = format!("{}.{table}", default_schema(pool).await);
    let s = SqlOffsetStore::with_table(pool.clone(), &qualified).unwrap();
    s.create_table_if_absent().await.unwrap();
    s.commit("s", "r", 5).await.unwrap();
    s.commit("s", "r", 3).await.unwrap();
    assert_eq!(
        s.load("s", "r").await.unwrap(),
        Some(5),
        "{db}: {qualified}"
    );
    drop_table(pool, &qualified).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_store_conformance_on_each_database() {
    for (db, pool) in databases().await {
        eprintln!("-- on {db}");
        invalid_table_names_are_refused(db, &pool);
        let (store, table) = fresh_store(&pool).await;
        // Creating it twice is harmless.
        store.create_table_if_absent().await.unwrap();
        load_commit_and_keep_the_highest(db, &store).await;
        readers_and_streams_are_independent(db, &store).await;
        out_of_range_input_is_invalid(db, &store).await;
        let store = Arc::new(store);
        concurrent_commits_keep_the_highest(db, &store).await;
        drop_table(&pool, &table).await;
        a_schema_qualified_table(db, &pool).await;
    }
}

#[tokio::test]
async fn an_unreachable_table_is_unavailable() {
    let pool = support::sqlite().await;
    // Never created.
    let store = SqlOffsetStore::with_table(pool, &unique_table("acemq_offsets_absent")).unwrap();
    assert!(matches!(
        store.load("s", "r").await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.commit("s", "r", 1).await,
        Err(StoreError::Unavailable(_))
    ));
}

#[tokio::test]
async fn the_default_table_on_sqlite_in_memory() {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    let store = SqlOffsetStore::new(pool);
    store.create_table_if_absent().await.unwrap();
    assert_eq!(store.load("s", "r").await.unwrap(), None);
    store.commit("s", "r", 5).await.unwrap();
    store.commit("s", "r", 3).await.unwrap();
    assert_eq!(store.load("s", "r").await.unwrap(), Some(5));
}

type Seen = Arc<Mutex<Vec<(u64, i64)>>>;

async fn start_reader(
    mq: &Connection,
    stream: &str,
    store: Arc<SqlOffsetStore>,
) -> (StreamConsumer, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let reader = mq
        .stream::<i64>(stream)
        .from_first()
        .offsets(store, "r1")
        .consume(move |m: Message<i64>| {
            let s = s.clone();
            async move {
                let offset = m.stream_offset().expect("a stream entry has an offset");
                s.lock().unwrap().push((offset, *m.payload()));
                Ok::<(), HandlerError>(())
            }
        })
        .await
        .expect("the reader starts");
    (reader, seen)
}

async fn wait_for(seen: &Seen, n: usize, what: &str) -> Vec<(u64, i64)> {
    amqp_support::eventually(Duration::from_secs(20), what, || async {
        let s = seen.lock().unwrap().clone();
        (s.len() >= n).then_some(s)
    })
    .await
}

async fn publish(mq: &Connection, stream: &str, values: std::ops::Range<i64>) {
    let p = mq.publisher::<i64>("", stream);
    for v in values {
        p.send(&v).await.expect("confirmed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_reader_resumes_from_postgres() {
    let Some(url) = amqp_support::amqp_url() else {
        eprintln!("note: ACEMQ_TEST_AMQP_URL unset; the end-to-end case did not run");
        return;
    };
    let Some(pool) = databases()
        .await
        .into_iter()
        .find_map(|(db, pool)| (db == "postgres").then_some(pool))
    else {
        // databases() has already failed the test under ACEMQ_TEST_REQUIRE_BROKER=1; this
        // says so where the case would otherwise end.
        assert_ne!(
            std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref(),
            Ok("1"),
            "ACEMQ_TEST_REQUIRE_BROKER=1 but no PostgreSQL pool: the end-to-end case must run"
        );
        eprintln!("note: ACEMQ_TEST_POSTGRES_URL unset; the end-to-end case did not run");
        return;
    };
    let (store, table) = fresh_store(&pool).await;
    let store = Arc::new(store);
    let mq = Connection::connect(&url).await.unwrap();
    let stream = amqp_support::unique("offsets.sql");
    mq.declare_stream(
        &stream,
        StreamRetention::new().max_age(Duration::from_secs(3600)),
    )
    .await
    .unwrap();

    publish(&mq, &stream, 0..3).await;
    let (first, seen) = start_reader(&mq, &stream, store.clone()).await;
    let before = wait_for(&seen, 3, "the first reader handles 3 entries").await;
    first.close().await;
    assert_eq!(
        before.iter().map(|e| e.1).collect::<Vec<_>>(),
        [0, 1, 2],
        "{before:?}"
    );
    let last = before[2].0;
    assert_eq!(
        store.load(&stream, "r1").await.unwrap(),
        Some(last),
        "closing commits the last handled offset"
    );

    publish(&mq, &stream, 3..5).await;
    let (second, seen) = start_reader(&mq, &stream, store.clone()).await;
    wait_for(&seen, 2, "the restarted reader handles the 2 new entries").await;
    // Give anything already handled a chance to arrive again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    second.close().await;
    let after = seen.lock().unwrap().clone();
    assert_eq!(
        after.iter().map(|e| e.1).collect::<Vec<_>>(),
        [3, 4],
        "exactly the new entries: {after:?}"
    );
    assert!(after.iter().all(|e| e.0 > last), "{after:?} after {last}");
    assert_eq!(store.load(&stream, "r1").await.unwrap(), Some(after[1].0));

    mq.transport().delete_queue(&stream).await.unwrap();
    mq.close().await.unwrap();
    drop_table(&pool, &table).await;
}
