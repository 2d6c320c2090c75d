//! The idempotency store conformance suite (`acemq::idempotency::conformance`) on every SQL
//! store: SQLite, PostgreSQL and MariaDB (the last two when their URLs are set), on a table
//! the store created, on one created with the Java member's DDL, and on one migrated from
//! the old BIGINT schema; and what only the SQL stores do (purge, table names, DDL).

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use acemq::idempotency::conformance::{self, Owners};
use acemq::idempotency::{ClaimOutcome, IdempotencyStore};
use acemq_sql::{IdempotencyOptions, SqlIdempotencyStore, SqlPool};
use support::{drop_table, unique_table};

/// The Java member's DDL, copied verbatim from wire.md §8 (only the table name is
/// substituted, so each run has a table of its own).
const JAVA_DDL: &str = r#"CREATE TABLE IF NOT EXISTS acemq_idempotency (
    message_id  VARCHAR(255)             NOT NULL PRIMARY KEY,
    state       VARCHAR(16)              NOT NULL,   -- CLAIMED | CONFIRMED
    claimed_by  VARCHAR(64),                         -- the claiming instance; NULL once confirmed
    recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
    expires_at  TIMESTAMP WITH TIME ZONE NOT NULL    -- lease expiry while CLAIMED, retention expiry once CONFIRMED
);
CREATE INDEX IF NOT EXISTS acemq_idempotency_expiry ON acemq_idempotency (expires_at);"#;

/// SQL without `--` comments, with runs of whitespace as one space.
fn squeeze(sql: &str) -> String {
    sql.lines()
        .map(|l| l.split("--").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The lease of the purge case (the suite's own lease).
const LEASE: Duration = conformance::LEASE;

/// Builds a store with a claim timeout; every call is a new owner on the same backend.
type Factory = Box<dyn Fn(Duration) -> Arc<dyn IdempotencyStore>>;

fn key(case: &str) -> String {
    format!("{case}-{}", uuid::Uuid::new_v4())
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
        conformance::run_all(name, sql_factory(&pool, &table), Owners::Distinct).await;
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
    let ddl = squeeze(&s.create_table_sql());
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

/// The PostgreSQL pool, when configured.
async fn postgres_only() -> Option<SqlPool> {
    let pool = support::databases()
        .await
        .into_iter()
        .find_map(|(name, pool)| (name == "postgres").then_some(pool));
    assert!(
        pool.is_some() || std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
        "ACEMQ_TEST_REQUIRE_BROKER=1 but no PostgreSQL to run Java's DDL on: set ACEMQ_TEST_POSTGRES_URL"
    );
    pool
}

async fn exec_all(pool: &SqlPool, script: &str) {
    // Statements end with `;` at the end of a line (a comment may hold a `;`).
    for stmt in script
        .split(";\n")
        .map(|s| s.trim().trim_end_matches(';'))
        .filter(|s| !s.is_empty())
    {
        let sql = sqlx::AssertSqlSafe(stmt.to_owned());
        let r = match pool {
            SqlPool::Postgres(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
            SqlPool::MySql(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
            SqlPool::Sqlite(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
            _ => Ok(()),
        };
        r.unwrap_or_else(|e| panic!("{stmt}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_store_conforms_on_a_table_created_with_javas_ddl() {
    let Some(pool) = postgres_only().await else {
        return;
    };
    let SqlPool::Postgres(pg) = &pool else {
        unreachable!()
    };
    let table = unique_table("acemq_idem_java");
    let java_ddl = JAVA_DDL.replace("acemq_idempotency", &table);
    exec_all(&pool, &java_ddl).await;
    let store =
        SqlIdempotencyStore::with_options(pool.clone(), IdempotencyOptions::new().table(&table))
            .unwrap();
    assert_eq!(
        squeeze(&store.create_table_sql()),
        squeeze(&java_ddl),
        "the store's DDL is Java's"
    );
    store.verify_schema().await.unwrap();
    store.create_table_if_absent().await.unwrap(); // a no-op on Java's table

    conformance::run_all(
        "postgres, Java's DDL",
        sql_factory(&pool, &table),
        Owners::Distinct,
    )
    .await;

    // The lease is written as a timestamp the database reads right: now + 5 min.
    let k = key("lease");
    assert_eq!(store.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
    let (in_window, by): (bool, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT expires_at - now() BETWEEN interval '4 minutes 50 seconds' AND interval '5 minutes 10 seconds', claimed_by FROM {table} WHERE message_id = $1"
    )))
    .bind(&k)
    .fetch_one(pg)
    .await
    .unwrap();
    assert!(in_window, "expires_at is now + claim timeout");
    assert_eq!(by.as_deref(), Some(store.owner()));
    // Confirm empties claimed_by, as Java's does.
    store.confirm(&k).await.unwrap();
    let (state, by): (String, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT state, claimed_by FROM {table} WHERE message_id = $1"
    )))
    .bind(&k)
    .fetch_one(pg)
    .await
    .unwrap();
    assert_eq!((state.as_str(), by), ("CONFIRMED", None));

    // Owners fit claimed_by VARCHAR(64), however long the configured one.
    let long = SqlIdempotencyStore::with_options(
        pool.clone(),
        IdempotencyOptions::new()
            .table(&table)
            .owner("o".repeat(300)),
    )
    .unwrap();
    assert_eq!(long.owner().chars().count(), 64);
    let k = key("long-owner");
    assert_eq!(long.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
    long.release(&k).await.unwrap();
    assert_eq!(store.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);

    // Rows a Java node wrote (database clock, timestamptz): a live claim, an expired one, a
    // confirmation.
    let (live, expired, done) = (key("java-live"), key("java-expired"), key("java-done"));
    for (k, state, expires) in [
        (&live, "CLAIMED", "now() + interval '5 minutes'"),
        (&expired, "CLAIMED", "now() - interval '1 second'"),
        (&done, "CONFIRMED", "now() + interval '1 day'"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (message_id, state, claimed_by, recorded_at, expires_at) VALUES ($1, $2, 'java-node-1', now(), {expires})"
        )))
        .bind(k)
        .bind(state)
        .execute(pg)
        .await
        .unwrap();
    }
    assert_eq!(
        store.try_claim(&live).await.unwrap(),
        ClaimOutcome::InProgress
    );
    assert_eq!(
        store.try_claim(&expired).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store.try_claim(&done).await.unwrap(),
        ClaimOutcome::Duplicate
    );
    drop_table(&pool, &table).await;

    let table = unique_table("acemq_idem_java");
    exec_all(&pool, &JAVA_DDL.replace("acemq_idempotency", &table)).await;
    purge_removes_only_expired(&pool, &table).await;
    drop_table(&pool, &table).await;
}

/// The table acemq-sql created before it took Java's DDL (PostgreSQL's; MySQL's differs
/// only in its engine clause).
fn old_bigint_ddl(table: &str, mysql: bool) -> String {
    let tail = if mysql {
        format!(
            ",\n  INDEX {table}_expires_at (expires_at)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
    } else {
        format!("\n);\nCREATE INDEX IF NOT EXISTS {table}_expires_at ON {table} (expires_at)")
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n  message_id VARCHAR(255) NOT NULL PRIMARY KEY,\n  state VARCHAR(16) NOT NULL,\n  claimed_by VARCHAR(255),\n  recorded_at BIGINT NOT NULL,\n  expires_at BIGINT NOT NULL{tail}"
    )
}

/// The migrations in docs/idempotency.md, "Migrating a table from the BIGINT schema".
fn migration(table: &str, mysql: bool) -> String {
    let docs = include_str!("../../../acemq/docs/idempotency.md");
    let marker = if mysql {
        "```sql mysql-migration"
    } else {
        "```sql postgres-migration"
    };
    let start = docs.find(marker).expect("the migration is in the docs") + marker.len();
    let end = start + docs[start..].find("```").expect("closed");
    docs[start..end].replace("acemq_idempotency", table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_the_old_bigint_schema_is_refused_until_migrated() {
    for (name, pool) in support::databases().await {
        if name == "sqlite" {
            continue; // SQLite keeps epoch milliseconds: nothing to migrate
        }
        let mysql = name == "mysql";
        let table = unique_table("acemq_idem_old");
        exec_all(&pool, &old_bigint_ddl(&table, mysql)).await;
        // A confirmation and a claim written by the old store.
        let now_ms = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
        let long_owner = "h".repeat(100);
        exec_all(
            &pool,
            &format!(
                "INSERT INTO {table} (message_id, state, claimed_by, recorded_at, expires_at) VALUES ('old-done', 'CONFIRMED', '{long_owner}', {now_ms}, {});\nINSERT INTO {table} (message_id, state, claimed_by, recorded_at, expires_at) VALUES ('old-claim', 'CLAIMED', '{long_owner}', {now_ms}, {})",
                now_ms + 86_400_000,
                now_ms - 1000
            ),
        )
        .await;
        let store = SqlIdempotencyStore::with_options(
            pool.clone(),
            IdempotencyOptions::new().table(&table),
        )
        .unwrap();
        let e = store.verify_schema().await.unwrap_err();
        assert!(
            matches!(e, acemq_sql::Error::IncompatibleSchema { .. }),
            "{name}: {e}"
        );
        assert!(e.to_string().contains("docs/idempotency.md"), "{e}");
        assert!(store.create_table_if_absent().await.is_err(), "{name}");
        // On the message path: the store is unavailable (the delivery waits), with the fix.
        match store.try_claim("m-1").await {
            Err(acemq::idempotency::StoreError::Unavailable(m)) => {
                assert!(m.contains("old acemq-sql schema"), "{m}")
            }
            other => panic!("{name}: {other:?}"),
        }

        exec_all(&pool, &migration(&table, mysql)).await;
        store.verify_schema().await.unwrap();
        assert_eq!(
            store.try_claim("old-done").await.unwrap(),
            ClaimOutcome::Duplicate,
            "{name}: confirmations survive the migration"
        );
        assert_eq!(
            store.try_claim("old-claim").await.unwrap(),
            ClaimOutcome::Claimed,
            "{name}: an expired claim is still expired"
        );
        conformance::run_all(name, sql_factory(&pool, &table), Owners::Distinct).await;
        drop_table(&pool, &table).await;
    }
}
