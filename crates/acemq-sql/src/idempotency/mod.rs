//! The SQL idempotency store: claims, confirms and releases on the message path; the
//! schema check; confirming in the handler's own transaction ([`tx`]); the purge task
//! ([`purge`]).

mod purge;
mod sql;
mod tx;

pub use purge::PurgeTask;
pub use tx::IdempotencyDatabase;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use std::time::Instant;

use acemq::idempotency::{
    ClaimOutcome, DEFAULT_CLAIM_TIMEOUT, DEFAULT_RETENTION, IdempotencyStore, StoreError,
};
use acemq::transport::BoxFuture;
use sqlx::{AssertSqlSafe, Row};

use crate::pool::SqlPool;
use crate::{Error, TableName, default_owner};
use sql::{At, CONFIRMED, Statements, statements};

/// The default table: `acemq_idempotency`.
pub const DEFAULT_TABLE: &str = "acemq_idempotency";

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

    /// The `claimed_by` value written by this store; default `{hostname}:{pid}:{uuid}`
    /// (the host name shortened so the whole fits), unique per store instance. The column
    /// is Java's `VARCHAR(64)`: a longer owner is stored as its first 27 characters, `~`
    /// and a UUID v5 of the whole (64 characters, still distinct per owner and stable). Only the owner's
    /// [`release`](IdempotencyStore::release) removes its claim, and a live claim with
    /// this owner that this instance is not working on is taken for its own (a claim
    /// whose reply was lost), so **keep it unique per store instance**: two instances
    /// sharing an owner would take each other's live claims.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
}

/// One row as a claim reads it.
struct RowState {
    state: String,
    claimed_by: Option<String>,
    /// `expires_at >= now`.
    live: bool,
}

/// An [`IdempotencyStore`] in a SQL table, shared by every instance that uses the table.
///
/// The table (default `acemq_idempotency`): `message_id VARCHAR(255)` primary key, `state`
/// (`CLAIMED` or `CONFIRMED`), `claimed_by VARCHAR(64)`, `recorded_at` and `expires_at`,
/// with the index `{table}_expiry` on `expires_at`: the Java member's DDL, so Java and Rust
/// consumers of one queue share one table. The timestamps are `TIMESTAMP WITH TIME ZONE`
/// on PostgreSQL, `DATETIME(3)` in UTC on MySQL and MariaDB, and epoch milliseconds
/// (`INTEGER`) on SQLite. `expires_at` is the lease's end while claimed and the
/// retention's end once confirmed. A table of the old Rust schema (`BIGINT` timestamps on
/// PostgreSQL or MySQL) is refused with a message naming the migration (see
/// [`verify_schema`](Self::verify_schema)).
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
/// * **Confirm** sets `CONFIRMED`, `claimed_by = NULL` and `expires_at = now + retention`
///   (re-inserting the row if it vanished). A confirmed row is never retaken; it catches
///   duplicates until [`purge_expired`](Self::purge_expired) deletes it after the
///   retention. A handler can confirm inside its own transaction with
///   [`confirm_in`](Self::confirm_in), so its writes and the confirm commit together.
/// * **Release** deletes only this store's own `CLAIMED` row.
/// * Nothing on the message path deletes rows: schedule
///   [`purge_expired`](Self::purge_expired), or let [`spawn_purge`](Self::spawn_purge) do it.
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
    retention: Duration,
    claim_timeout: Duration,
    owner: String,
    sql: Statements,
    /// The table was seen with the current schema (checked once, before the first claim).
    schema_ok: AtomicBool,
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
            retention: DEFAULT_RETENTION,
            claim_timeout: DEFAULT_CLAIM_TIMEOUT,
            owner: sql::fit_owner(&default_owner()),
            sql,
            schema_ok: AtomicBool::new(false),
            held: Mutex::default(),
        }
    }

    /// A store on `pool` with options. Fails on an invalid table name, a claim timeout
    /// below 1 ms or above the retention, or an empty owner. An owner longer than
    /// `claimed_by`'s 64 characters is shortened to fit (see [`IdempotencyOptions::owner`]).
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
        if owner.is_empty() {
            return Err(Error::InvalidArgument(
                "owner must not be empty; leave it unset for a unique `{hostname}:{pid}:{uuid}`"
                    .into(),
            ));
        }
        let sql = statements(pool.dialect(), &table);
        Ok(SqlIdempotencyStore {
            pool,
            table,
            retention: options.retention,
            claim_timeout: options.claim_timeout,
            owner: sql::fit_owner(&owner),
            sql,
            schema_ok: AtomicBool::new(false),
            held: Mutex::default(),
        })
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The `claimed_by` value this store writes (at most 64 characters).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The DDL for this store's table and index, in its dialect: statements separated by
    /// `;` and a newline. Put it in a migration. On PostgreSQL it is the Java member's DDL.
    pub fn create_table_sql(&self) -> String {
        crate::pool::ddl_text(&self.sql.ddl)
    }

    /// Runs [`create_table_sql`](Self::create_table_sql) (`IF NOT EXISTS`), then
    /// [`verify_schema`](Self::verify_schema): a table already there with the old schema
    /// is an error, not silently kept. For development and tests; production schemas
    /// belong in migrations.
    pub async fn create_table_if_absent(&self) -> Result<(), Error> {
        crate::pool::run_ddl(&self.pool, &self.sql.ddl).await?;
        self.verify_schema().await
    }

    /// Checks that the table's timestamps are timestamps, not the `BIGINT` epoch
    /// milliseconds of acemq-sql before 0.2 (on PostgreSQL, MySQL and MariaDB; SQLite
    /// keeps epoch milliseconds). A table of the old schema is
    /// [`Error::IncompatibleSchema`], whose message names the migration in
    /// `docs/idempotency.md`. A table that does not exist yet passes (its statements fail
    /// on their own). The store runs this check itself before its first claim; call it at
    /// startup to fail fast.
    pub async fn verify_schema(&self) -> Result<(), Error> {
        if self.schema_ok.load(Ordering::Relaxed) {
            return Ok(());
        }
        let Some(sql) = self.sql.column_type.clone() else {
            self.schema_ok.store(true, Ordering::Relaxed);
            return Ok(());
        };
        let (schema, table) = (self.table.schema(), self.table.table());
        let found: Option<String> = on_pool!(&self.pool, p => sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(schema)
            .bind(table)
            .fetch_optional(p)
            .await?);
        match found {
            Some(t) if sql::is_epoch_millis_type(&t) => Err(Error::IncompatibleSchema {
                table: self.table.to_string(),
                found: t,
            }),
            Some(_) => {
                self.schema_ok.store(true, Ordering::Relaxed);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// [`verify_schema`](Self::verify_schema) for the message path: an old table is the
    /// store being unavailable (the delivery waits, health shows the message), not the
    /// message's fault.
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        if self.schema_ok.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.verify_schema().await.map_err(|e| {
            if matches!(e, Error::IncompatibleSchema { .. }) {
                tracing::error!(table = %self.table, error = %e, "the idempotency table has the old schema");
            }
            StoreError::Unavailable(e.to_string())
        })
    }

    /// Deletes every row whose `expires_at` has passed (confirmations past their retention,
    /// abandoned claims past their lease) and returns how many. Schedule it (hourly is
    /// plenty), or let [`spawn_purge`](Self::spawn_purge) do it; nothing on the message
    /// path deletes rows.
    pub async fn purge_expired(&self) -> Result<u64, Error> {
        self.verify_schema().await?;
        let now = At::now();
        let sql = self.sql.purge.clone();
        let n = on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql)).bind(now).execute(p).await?.rows_affected());
        Ok(n)
    }

    /// Inserts (`insert_claim` or `confirm_insert`) a row for `key`.
    async fn exec_insert(
        &self,
        sql: &Arc<str>,
        key: &str,
        owner: Option<&str>,
        (now, expires): (At, At),
    ) -> Result<u64, sqlx::Error> {
        let sql = sql.clone();
        Ok(on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
            .bind(key)
            .bind(owner)
            .bind(now)
            .bind(expires)
            .execute(p)
            .await?
            .rows_affected()))
    }

    async fn read_state(&self, key: &str) -> Result<Option<RowState>, sqlx::Error> {
        let sql = self.sql.select.clone();
        let now = At::now();
        Ok(on_pool!(&self.pool, p => {
            match sqlx::query(AssertSqlSafe(sql)).bind(now).bind(key).fetch_optional(p).await? {
                Some(row) => Some(RowState {
                    state: row.try_get::<String, _>(0)?,
                    claimed_by: row.try_get::<Option<String>, _>(1)?,
                    live: row.try_get::<bool, _>(2)?,
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
        self.ensure_schema().await?;
        let reserved = {
            let mut held = self.held();
            match held.get(key) {
                Some(at) if at.elapsed() < self.claim_timeout => false,
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
    async fn reclaim(&self, key: &str, now: At, lease_end: At) -> Result<bool, StoreError> {
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
            let now = At::now();
            let lease_end = now.plus(self.claim_timeout);
            let inserted = self
                .exec_insert(
                    &self.sql.insert_claim,
                    key,
                    Some(&self.owner),
                    (now, lease_end),
                )
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
            if row.live {
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
        let now = At::now();
        let until = now.plus(self.retention);
        let update = || async {
            let sql = self.sql.confirm_update.clone();
            Ok::<u64, sqlx::Error>(on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
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
            .exec_insert(&self.sql.confirm_insert, key, None, (now, until))
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

    /// Confirms `key`. Harmless after [`SqlIdempotencyStore::confirm_in`] committed: the
    /// row is confirmed already and only its retention restarts.
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
