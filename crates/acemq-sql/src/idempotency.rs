//! The SQL idempotency store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use std::time::Instant;

use acemq::idempotency::{
    ClaimOutcome, DEFAULT_CLAIM_TIMEOUT, DEFAULT_RETENTION, IdempotencyStore, StoreError,
};
use acemq::transport::BoxFuture;
use sqlx::{AssertSqlSafe, Row};

use crate::pool::{Dialect, SqlPool};
use crate::{Error, TableName, default_owner, millis, now_millis};

/// The default table: `acemq_idempotency`.
pub const DEFAULT_TABLE: &str = "acemq_idempotency";

const CLAIMED: &str = "CLAIMED";
const CONFIRMED: &str = "CONFIRMED";
/// How often a claim retries when its insert did not take and no row was found (the row
/// was released or purged in between).
const CLAIM_ROUNDS: usize = 3;

/// Options for [`SqlIdempotencyStore::with_options`].
///
/// ```
/// use acemq_sql::IdempotencyOptions;
/// use std::time::Duration;
/// let o = IdempotencyOptions::new()
///     .table("billing.acemq_idempotency")
///     .retention(Duration::from_secs(2 * 24 * 3600))
///     .claim_timeout(Duration::from_secs(10 * 60));
/// # let _ = o;
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyOptions {
    table: String,
    retention: Duration,
    claim_timeout: Duration,
    owner: Option<String>,
}

impl Default for IdempotencyOptions {
    fn default() -> Self {
        IdempotencyOptions {
            table: DEFAULT_TABLE.into(),
            retention: DEFAULT_RETENTION,
            claim_timeout: DEFAULT_CLAIM_TIMEOUT,
            owner: None,
        }
    }
}

impl IdempotencyOptions {
    /// The defaults: table `acemq_idempotency`, retention one day, claim timeout five
    /// minutes, owner `{hostname}:{pid}:{uuid}`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table (validated by [`SqlIdempotencyStore::with_options`], see [`TableName`]).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How long a confirmed id keeps catching duplicates, counted from its confirm. Rows
    /// stay until [`SqlIdempotencyStore::purge_expired`] removes them.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long an unconfirmed claim is honoured before another consumer may take it over.
    /// Set it comfortably above your slowest handler. Must be at least 1 ms and not above
    /// the retention.
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout;
        self
    }

    /// The `claimed_by` value written by this store (at most 255 characters); default
    /// `{hostname}:{pid}:{uuid}`, unique per store instance. Only the owner's
    /// [`release`](IdempotencyStore::release) removes its claim, and a live claim with
    /// this owner that this instance is not working on is taken for its own (a claim
    /// whose reply was lost), so **keep it unique per store instance**: two instances
    /// sharing an owner would take each other's live claims.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
}

#[derive(Debug)]
struct Statements {
    insert_claim: Arc<str>,
    select: Arc<str>,
    takeover: Arc<str>,
    reclaim: Arc<str>,
    confirm_update: Arc<str>,
    confirm_insert: Arc<str>,
    release: Arc<str>,
    purge: Arc<str>,
    ddl: Vec<String>,
}

fn statements(d: Dialect, t: &TableName) -> Statements {
    let p = |n| d.placeholder(n);
    let cols = "message_id, state, claimed_by, recorded_at, expires_at";
    let insert = |state: &str| match d {
        Dialect::Postgres | Dialect::Sqlite => format!(
            "INSERT INTO {t} ({cols}) VALUES ({}, '{state}', {}, {}, {}) ON CONFLICT (message_id) DO NOTHING",
            p(1),
            p(2),
            p(3),
            p(4)
        ),
        Dialect::MySql => {
            format!("INSERT IGNORE INTO {t} ({cols}) VALUES (?, '{state}', ?, ?, ?)")
        }
    };
    let index = t.index_name("expires_at");
    let ddl = match d {
        Dialect::Postgres | Dialect::Sqlite => {
            let (index_name, on) = match (d, t.schema()) {
                // SQLite qualifies the index, not the table it is on.
                (Dialect::Sqlite, Some(s)) => (format!("{s}.{index}"), t.table().to_owned()),
                _ => (index.clone(), t.to_string()),
            };
            vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\n  message_id VARCHAR(255) NOT NULL PRIMARY KEY,\n  state VARCHAR(16) NOT NULL,\n  claimed_by VARCHAR(255),\n  recorded_at BIGINT NOT NULL,\n  expires_at BIGINT NOT NULL\n)"
                ),
                format!("CREATE INDEX IF NOT EXISTS {index_name} ON {on} (expires_at)"),
            ]
        }
        Dialect::MySql => vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n  message_id VARCHAR(255) NOT NULL PRIMARY KEY,\n  state VARCHAR(16) NOT NULL,\n  claimed_by VARCHAR(255) NULL,\n  recorded_at BIGINT NOT NULL,\n  expires_at BIGINT NOT NULL,\n  INDEX {index} (expires_at)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )],
    };
    Statements {
        insert_claim: insert(CLAIMED).into(),
        select: format!(
            "SELECT state, expires_at, claimed_by FROM {t} WHERE message_id = {}",
            p(1)
        )
        .into(),
        takeover: format!(
            "UPDATE {t} SET claimed_by = {}, recorded_at = {}, expires_at = {} WHERE message_id = {} AND state = '{CLAIMED}' AND expires_at < {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        )
        .into(),
        reclaim: format!(
            "UPDATE {t} SET recorded_at = {}, expires_at = {} WHERE message_id = {} AND state = '{CLAIMED}' AND claimed_by = {}",
            p(1),
            p(2),
            p(3),
            p(4)
        )
        .into(),
        confirm_update: format!(
            "UPDATE {t} SET state = '{CONFIRMED}', claimed_by = {}, recorded_at = {}, expires_at = {} WHERE message_id = {}",
            p(1),
            p(2),
            p(3),
            p(4)
        )
        .into(),
        confirm_insert: insert(CONFIRMED).into(),
        release: format!(
            "DELETE FROM {t} WHERE message_id = {} AND state = '{CLAIMED}' AND claimed_by = {}",
            p(1),
            p(2)
        )
        .into(),
        purge: format!("DELETE FROM {t} WHERE expires_at < {}", p(1)).into(),
        ddl,
    }
}

/// One row as a claim reads it.
struct RowState {
    state: String,
    expires_at: i64,
    claimed_by: Option<String>,
}

/// An [`IdempotencyStore`] in a SQL table, shared by every instance that uses the table.
///
/// The table (default `acemq_idempotency`): `message_id VARCHAR(255)` primary key, `state`
/// (`CLAIMED` or `CONFIRMED`), `claimed_by`, `recorded_at` and `expires_at` (epoch
/// milliseconds, `BIGINT`), with an index on `expires_at`. `expires_at` is the lease's end
/// while claimed and the retention's end once confirmed.
///
/// * **Claim** is an `INSERT` that does nothing on conflict (`ON CONFLICT DO NOTHING` on
///   PostgreSQL and SQLite, `INSERT IGNORE` on MySQL), so the primary key does the mutual
///   exclusion and a conflict never aborts a surrounding transaction. When it did not take,
///   the row is read: a `CONFIRMED` row is a duplicate; a `CLAIMED` row whose lease has
///   run out is taken over by one conditional `UPDATE` (of two racers, the second updates
///   no row); a live claim is in progress, unless it is this store's own (same
///   `claimed_by`) and this instance is not working on the id: then it is a claim whose
///   reply was lost (or whose release failed) during a store outage, and it is taken back
///   at once (its lease renewed) instead of leaving the message "in progress" for a whole
///   lease. The instance remembers the ids it holds claims on (from a claim to its confirm
///   or release), so a second claim of an id it is working on is in progress without a
///   query, and two callers in one process never both get `Claimed`. An insert that did
///   not take with no row behind it (even after retrying) is an error, never "taken".
/// * **Confirm** sets `CONFIRMED` with `expires_at = now + retention` (re-inserting the
///   row if it vanished). A confirmed row is never retaken; it catches duplicates until
///   [`purge_expired`](Self::purge_expired) deletes it after the retention.
/// * **Release** deletes only this store's own `CLAIMED` row.
/// * Nothing on the message path deletes rows: schedule [`purge_expired`](Self::purge_expired).
///
/// Keys are at most 255 characters (longer ones are refused with
/// [`StoreError::Invalid`]). On MySQL the table uses `utf8mb4_bin`, so ids compare
/// case-sensitively, as on the other backends.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use acemq::idempotency::{ClaimOutcome, IdempotencyStore};
/// use acemq_sql::{IdempotencyOptions, SqlIdempotencyStore};
/// use std::time::Duration;
///
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
/// let store = SqlIdempotencyStore::with_options(
///     pool,
///     IdempotencyOptions::new().claim_timeout(Duration::from_secs(120)),
/// )?;
/// println!("{}", store.create_table_sql()); // put this in a migration
/// if store.try_claim("order-42").await? == ClaimOutcome::Claimed {
///     // ... handle, then:
///     store.confirm("order-42").await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SqlIdempotencyStore {
    pool: SqlPool,
    table: TableName,
    retention: i64,
    claim_timeout: i64,
    owner: String,
    sql: Statements,
    /// The ids this instance holds claims on (claimed, not yet confirmed or released), and
    /// the ids being claimed right now, with when. An entry older than the claim timeout
    /// is stale (its holder never confirmed or released: an abandoned handler) and no
    /// longer counts.
    held: Mutex<HashMap<String, Instant>>,
}

fn unavailable(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn check_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::Invalid(
            "the idempotency key (the envelope id) is empty; a message without an id cannot be deduplicated".into(),
        ));
    }
    if key.chars().count() > 255 {
        return Err(StoreError::Invalid(format!(
            "idempotency key of {} characters; the message_id column holds at most 255",
            key.chars().count()
        )));
    }
    Ok(())
}

impl SqlIdempotencyStore {
    /// A store on `pool` with the default options.
    pub fn new(pool: impl Into<SqlPool>) -> Self {
        let pool = pool.into();
        let table = TableName::trusted(DEFAULT_TABLE);
        let sql = statements(pool.dialect(), &table);
        SqlIdempotencyStore {
            pool,
            table,
            retention: millis(DEFAULT_RETENTION),
            claim_timeout: millis(DEFAULT_CLAIM_TIMEOUT),
            owner: default_owner(),
            sql,
            held: Mutex::default(),
        }
    }

    /// A store on `pool` with options. Fails on an invalid table name, a claim timeout
    /// below 1 ms or above the retention, or an owner longer than 255 characters.
    pub fn with_options(
        pool: impl Into<SqlPool>,
        options: IdempotencyOptions,
    ) -> Result<Self, Error> {
        let pool = pool.into();
        let table = TableName::parse(&options.table)?;
        if options.claim_timeout < Duration::from_millis(1) {
            return Err(Error::InvalidArgument(
                "claim_timeout must be at least 1 ms".into(),
            ));
        }
        if options.claim_timeout > options.retention {
            return Err(Error::InvalidArgument(format!(
                "claim_timeout ({:?}) must not be longer than the retention ({:?}); raise the retention or shorten the claim timeout",
                options.claim_timeout, options.retention
            )));
        }
        let owner = options.owner.unwrap_or_else(default_owner);
        if owner.is_empty() || owner.chars().count() > 255 {
            return Err(Error::InvalidArgument(
                "owner must be 1 to 255 characters".into(),
            ));
        }
        let sql = statements(pool.dialect(), &table);
        Ok(SqlIdempotencyStore {
            pool,
            table,
            retention: millis(options.retention),
            claim_timeout: millis(options.claim_timeout),
            owner,
            sql,
            held: Mutex::default(),
        })
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The `claimed_by` value this store writes.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The DDL for this store's table and index, in its dialect: statements separated by
    /// `;` and a newline. Put it in a migration.
    pub fn create_table_sql(&self) -> String {
        crate::pool::ddl_text(&self.sql.ddl)
    }

    /// Runs [`create_table_sql`](Self::create_table_sql) (`IF NOT EXISTS`). For
    /// development and tests; production schemas belong in migrations.
    pub async fn create_table_if_absent(&self) -> Result<(), Error> {
        crate::pool::run_ddl(&self.pool, &self.sql.ddl).await
    }

    /// Deletes every row whose `expires_at` has passed (confirmations past their retention,
    /// abandoned claims past their lease) and returns how many. Schedule it (hourly is
    /// plenty); nothing on the message path deletes rows.
    pub async fn purge_expired(&self) -> Result<u64, Error> {
        let now = now_millis();
        let sql = self.sql.purge.clone();
        let n = on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql)).bind(now).execute(p).await?.rows_affected());
        Ok(n)
    }

    async fn exec_claim(
        &self,
        sql: &Arc<str>,
        key: &str,
        state_ms: (i64, i64),
    ) -> Result<u64, sqlx::Error> {
        let (now, expires) = state_ms;
        let sql = sql.clone();
        Ok(on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
            .bind(key)
            .bind(self.owner.as_str())
            .bind(now)
            .bind(expires)
            .execute(p)
            .await?
            .rows_affected()))
    }

    async fn read_state(&self, key: &str) -> Result<Option<RowState>, sqlx::Error> {
        let sql = self.sql.select.clone();
        Ok(on_pool!(&self.pool, p => {
            match sqlx::query(AssertSqlSafe(sql)).bind(key).fetch_optional(p).await? {
                Some(row) => Some(RowState {
                    state: row.try_get::<String, _>(0)?,
                    expires_at: row.try_get::<i64, _>(1)?,
                    claimed_by: row.try_get::<Option<String>, _>(2)?,
                }),
                None => None,
            }
        }))
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        // The set is only ever inserted into and removed from: a poisoned lock is still
        // consistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `key`, reserving it in this instance first: only a `Claimed` answer keeps
    /// the reservation (until confirm or release).
    async fn claim_outcome(&self, key: &str) -> Result<ClaimOutcome, StoreError> {
        check_key(key)?;
        let reserved = {
            let mut held = self.held();
            let lease = Duration::from_millis(u64::try_from(self.claim_timeout).unwrap_or(0));
            match held.get(key) {
                Some(at) if at.elapsed() < lease => false,
                _ => {
                    held.insert(key.to_owned(), Instant::now());
                    true
                }
            }
        };
        if !reserved {
            // Ours, and being worked on right now in this process (unless someone took an
            // expired lease over and confirmed it meanwhile). Never an error: a caller
            // must not give back a claim a running delivery holds.
            return Ok(match self.read_state(key).await {
                Ok(Some(row)) if row.state == CONFIRMED => ClaimOutcome::Duplicate,
                _ => ClaimOutcome::InProgress,
            });
        }
        let outcome = self.claim_in_table(key).await;
        if !matches!(outcome, Ok(ClaimOutcome::Claimed)) {
            self.held().remove(key);
        }
        outcome
    }

    /// Renews this owner's live claim on `key`: `true` when it was there to renew.
    async fn reclaim(&self, key: &str, now: i64, lease_end: i64) -> Result<bool, StoreError> {
        let sql = self.sql.reclaim.clone();
        let n: u64 = on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
            .bind(now)
            .bind(lease_end)
            .bind(key)
            .bind(self.owner.as_str())
            .execute(p)
            .await
            .map_err(unavailable)?
            .rows_affected());
        Ok(n == 1)
    }

    async fn claim_in_table(&self, key: &str) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..CLAIM_ROUNDS {
            let now = now_millis();
            let lease_end = now.saturating_add(self.claim_timeout);
            let inserted = self
                .exec_claim(&self.sql.insert_claim, key, (now, lease_end))
                .await
                .map_err(unavailable)?;
            if inserted == 1 {
                return Ok(ClaimOutcome::Claimed);
            }
            let Some(row) = self.read_state(key).await.map_err(unavailable)? else {
                // Released or purged between the insert and the read: try again.
                continue;
            };
            if row.state == CONFIRMED {
                return Ok(ClaimOutcome::Duplicate);
            }
            if row.expires_at >= now {
                if row.claimed_by.as_deref() == Some(self.owner.as_str())
                    && self.reclaim(key, now, lease_end).await?
                {
                    // Ours, and nobody here works on it (this instance reserved the id):
                    // a claim whose reply was lost, or whose release failed.
                    tracing::info!(
                        message_id = key,
                        "took back this store's own live idempotency claim (its reply or release was lost earlier)"
                    );
                    return Ok(ClaimOutcome::Claimed);
                }
                return Ok(ClaimOutcome::InProgress);
            }
            let sql = self.sql.takeover.clone();
            let taken: u64 = on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
                .bind(self.owner.as_str())
                .bind(now)
                .bind(lease_end)
                .bind(key)
                .bind(now)
                .execute(p)
                .await
                .map_err(unavailable)?
                .rows_affected());
            if taken == 1 {
                tracing::warn!(
                    message_id = key,
                    "took over an expired idempotency claim: its holder did not confirm or release it within the claim timeout"
                );
                return Ok(ClaimOutcome::Claimed);
            }
            // Someone else took it over (or confirmed it) first.
            return Ok(match self.read_state(key).await.map_err(unavailable)? {
                Some(row) if row.state == CONFIRMED => ClaimOutcome::Duplicate,
                _ => ClaimOutcome::InProgress,
            });
        }
        Err(StoreError::Unavailable(format!(
            "claiming {key:?}: the insert did not take, yet no row was found, {CLAIM_ROUNDS} times; check the table's primary key and constraints"
        )))
    }

    async fn confirm_now(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        // Done with, whatever the answer: a confirm that fails leaves the row CLAIMED by
        // this owner, and a later delivery of the id takes it back.
        self.held().remove(key);
        let now = now_millis();
        let until = now.saturating_add(self.retention);
        let update = || async {
            let sql = self.sql.confirm_update.clone();
            Ok::<u64, sqlx::Error>(on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
                .bind(self.owner.as_str())
                .bind(now)
                .bind(until)
                .bind(key)
                .execute(p)
                .await?
                .rows_affected()))
        };
        if update().await.map_err(unavailable)? == 1 {
            return Ok(());
        }
        // The row vanished (purged, or our lease expired and its taker released): record
        // the confirmation anyway.
        if self
            .exec_claim(&self.sql.confirm_insert, key, (now, until))
            .await
            .map_err(unavailable)?
            == 1
        {
            return Ok(());
        }
        // Someone claimed it in between: the work is done, so it is confirmed.
        update().await.map_err(unavailable)?;
        Ok(())
    }
}

impl IdempotencyStore for SqlIdempotencyStore {
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.claim_outcome(key).await? == ClaimOutcome::Claimed) })
    }

    fn confirm<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.confirm_now(key))
    }

    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.held().remove(key);
            let sql = self.sql.release.clone();
            on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
                .bind(key)
                .bind(self.owner.as_str())
                .execute(p)
                .await
                .map(|_| ())
                .map_err(unavailable)?);
            Ok(())
        })
    }

    fn is_confirmed<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Ok(self
                .read_state(key)
                .await
                .map_err(unavailable)?
                .is_some_and(|row| row.state == CONFIRMED))
        })
    }

    fn try_claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        Box::pin(self.claim_outcome(key))
    }
}
