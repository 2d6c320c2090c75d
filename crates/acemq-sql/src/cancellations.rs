//! Cancelled scheduled messages in a SQL table: [`SqlCancelStore`], the durable
//! [`acemq::schedule::CancelStore`] behind
//! [`SchedulerOptions::cancellations`](acemq::schedule::SchedulerOptions::cancellations),
//! shared by every scheduler that delivers, and kept across restarts.
//!
//! This module owns the cancellations table (default [`DEFAULT_TABLE`],
//! `acemq_schedule_cancellations`): its DDL per dialect, the statements, and the mapping of
//! database failures to [`CancelError`]. One row per cancelled message id:
//!
//! | column         | type           | meaning                                                     |
//! |----------------|----------------|-------------------------------------------------------------|
//! | `id`           | `VARCHAR(255)` | the scheduled message's id (what `Scheduler::after` returned) |
//! | `cancelled_at` | `BIGINT`       | epoch milliseconds of the (first) cancellation             |
//! | `due_at`       | `BIGINT NULL`  | when the message fell due, once a delivery asked           |
//!
//! The primary key is `id`. On MySQL and MariaDB the table uses `utf8mb4_bin`, so ids
//! compare byte for byte, as on the other backends.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn demo(mq: acemq::Connection) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use acemq::schedule::SchedulerOptions;
//! use acemq_sql::cancellations::SqlCancelStore;
//!
//! let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
//! let store = SqlCancelStore::new(pool);
//! println!("{}", store.create_table_sql()); // put this in a migration
//! let s = mq
//!     .scheduler_with(SchedulerOptions::default().cancellations(Arc::new(store)))
//!     .await?;
//! let id = s.after(Duration::from_secs(60), "", "reminders", &"call back").await?;
//! s.cancel(&id).await?; // not delivered when it falls due
//! # Ok(()) }
//! ```

use std::sync::Arc;

use acemq::schedule::{
    CANCELLED_KEPT_AFTER_DUE_MS, CANCELLED_KEPT_UNSEEN_MS, CancelError, CancelStore,
};
use acemq::transport::BoxFuture;
use sqlx::AssertSqlSafe;

use crate::pool::{Dialect, SqlPool};
use crate::{Error, TableName};

/// The default cancellations table: `acemq_schedule_cancellations`.
///
/// ```
/// assert_eq!(
///     acemq_sql::cancellations::DEFAULT_TABLE,
///     "acemq_schedule_cancellations"
/// );
/// ```
pub const DEFAULT_TABLE: &str = "acemq_schedule_cancellations";

/// The longest id, in bytes: the `id` column's `VARCHAR(255)` (message ids are ASCII).
const ID_MAX_BYTES: usize = 255;

/// A [`CancelStore`] in a SQL table (PostgreSQL, MySQL/MariaDB or SQLite), shared by every
/// scheduler that uses the table, and kept across restarts.
///
/// * **Cancel** is one insert that ignores an existing row (`ON CONFLICT DO NOTHING`,
///   `INSERT IGNORE`, `INSERT OR IGNORE`): cancelling twice, or from two places at once,
///   is one cancellation, and keeps the first `cancelled_at`.
/// * **Is cancelled** records the due time on the row if it has none (one conditional
///   `UPDATE`), then reads whether the row exists.
/// * **Purge** is one `DELETE`: rows whose message fell due more than
///   [`CANCELLED_KEPT_AFTER_DUE_MS`] ago, and rows no delivery reached that were cancelled
///   more than [`CANCELLED_KEPT_UNSEEN_MS`] ago. The same rules as
///   [`MemoryCancelStore`](acemq::schedule::MemoryCancelStore).
///
/// An id longer than 255 bytes is [`CancelError::Invalid`]. A database that cannot be
/// reached or refuses the statement is [`CancelError::Unavailable`].
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use acemq::schedule::CancelStore;
/// use acemq_sql::cancellations::SqlCancelStore;
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let store = SqlCancelStore::new(pool);
/// store.create_table_if_absent().await?;
/// store.cancel("reminder-1", 1_000).await?;
/// store.cancel("reminder-1", 2_000).await?; // again: still one cancellation
/// assert!(store.is_cancelled("reminder-1", 5_000).await?);
/// assert!(!store.is_cancelled("reminder-2", 5_000).await?);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[derive(Clone, Debug)]
pub struct SqlCancelStore {
    pool: SqlPool,
    table: TableName,
    sql: Statements,
}

/// The table's statements in one dialect.
#[derive(Clone, Debug)]
struct Statements {
    /// Binds: id, cancelled_at.
    cancel: Arc<str>,
    /// Binds: due_at, id.
    mark_due: Arc<str>,
    /// Binds: id. One column: the number of rows with the id (0 or 1), a `BIGINT`.
    exists: Arc<str>,
    /// Binds: due cutoff, unseen cutoff.
    purge: Arc<str>,
    ddl: Vec<String>,
}

fn statements(d: Dialect, t: &TableName) -> Statements {
    let (ddl, cancel) = match d {
        Dialect::Postgres => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    id           VARCHAR(255) NOT NULL PRIMARY KEY,\n    cancelled_at BIGINT       NOT NULL,\n    due_at       BIGINT       NULL\n)"
            ),
            format!(
                "INSERT INTO {t} (id, cancelled_at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING"
            ),
        ),
        Dialect::MySql => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    id           VARCHAR(255) NOT NULL PRIMARY KEY,\n    cancelled_at BIGINT       NOT NULL,\n    due_at       BIGINT       NULL\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
            ),
            format!("INSERT IGNORE INTO {t} (id, cancelled_at) VALUES (?, ?)"),
        ),
        Dialect::Sqlite => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    id           VARCHAR(255) NOT NULL PRIMARY KEY,\n    cancelled_at INTEGER      NOT NULL,\n    due_at       INTEGER      NULL\n)"
            ),
            format!("INSERT OR IGNORE INTO {t} (id, cancelled_at) VALUES (?, ?)"),
        ),
    };
    let p = |n| d.placeholder(n);
    Statements {
        cancel: cancel.into(),
        mark_due: format!(
            "UPDATE {t} SET due_at = {} WHERE id = {} AND due_at IS NULL",
            p(1),
            p(2)
        )
        .into(),
        exists: format!("SELECT COUNT(*) FROM {t} WHERE id = {}", p(1)).into(),
        purge: format!(
            "DELETE FROM {t} WHERE (due_at IS NOT NULL AND due_at < {}) OR (due_at IS NULL AND cancelled_at < {})",
            p(1),
            p(2)
        )
        .into(),
        ddl: vec![ddl],
    }
}

fn unavailable(e: sqlx::Error) -> CancelError {
    CancelError::Unavailable(e.to_string())
}

fn check_id(id: &str) -> Result<(), CancelError> {
    let n = id.len();
    if n > ID_MAX_BYTES {
        return Err(CancelError::Invalid(format!(
            "message id of {n} bytes; the cancellations table's id column holds at most {ID_MAX_BYTES}"
        )));
    }
    Ok(())
}

impl SqlCancelStore {
    /// A store in the default table [`DEFAULT_TABLE`] on `pool`.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
    /// let store = acemq_sql::cancellations::SqlCancelStore::new(pool);
    /// assert_eq!(store.table().as_str(), "acemq_schedule_cancellations");
    /// # Ok(()) }
    /// ```
    pub fn new(pool: impl Into<SqlPool>) -> Self {
        let pool = pool.into();
        let table = TableName::trusted(DEFAULT_TABLE);
        let sql = statements(pool.dialect(), &table);
        SqlCancelStore { pool, table, sql }
    }

    /// A store in another table (validated, see [`TableName`]): anything but a plain
    /// identifier, optionally `schema.`-qualified, is [`Error::InvalidTableName`].
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use acemq_sql::cancellations::SqlCancelStore;
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
    /// let store = SqlCancelStore::with_table(pool.clone(), "billing.cancellations")?;
    /// assert!(SqlCancelStore::with_table(pool, "x; drop table y").is_err());
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn with_table(pool: impl Into<SqlPool>, table: &str) -> Result<Self, Error> {
        let pool = pool.into();
        let table = TableName::parse(table)?;
        let sql = statements(pool.dialect(), &table);
        Ok(SqlCancelStore { pool, table, sql })
    }

    /// The table.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), acemq_sql::Error> {
    /// let store = acemq_sql::cancellations::SqlCancelStore::with_table(pool, "cancellations")?;
    /// assert_eq!(store.table().table(), "cancellations");
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The DDL for the table, in the pool's dialect (`CREATE TABLE IF NOT EXISTS`, ending
    /// in `;`). Put it in a migration.
    ///
    /// ```no_run
    /// # #[cfg(feature = "mysql")]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1/app").await?;
    /// let ddl = acemq_sql::cancellations::SqlCancelStore::new(pool).create_table_sql();
    /// assert!(ddl.contains("utf8mb4_bin"));
    /// # Ok(()) }
    /// ```
    pub fn create_table_sql(&self) -> String {
        crate::pool::ddl_text(&self.sql.ddl)
    }

    /// Runs [`create_table_sql`](Self::create_table_sql). For development and tests;
    /// production schemas belong in migrations.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), acemq_sql::Error> {
    /// let store = acemq_sql::cancellations::SqlCancelStore::new(pool);
    /// store.create_table_if_absent().await?;
    /// store.create_table_if_absent().await?; // already there: nothing happens
    /// # Ok(()) }
    /// ```
    pub async fn create_table_if_absent(&self) -> Result<(), Error> {
        crate::pool::run_ddl(&self.pool, &self.sql.ddl).await
    }

    async fn cancel_now(&self, id: &str, now_ms: i64) -> Result<(), CancelError> {
        check_id(id)?;
        let sql = self.sql.cancel.clone();
        on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .bind(now_ms)
            .execute(p)
            .await
            .map(|_| ())
            .map_err(unavailable)?);
        Ok(())
    }

    async fn is_cancelled_now(&self, id: &str, due_at_ms: i64) -> Result<bool, CancelError> {
        check_id(id)?;
        let mark = self.sql.mark_due.clone();
        on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(mark))
            .bind(due_at_ms)
            .bind(id)
            .execute(p)
            .await
            .map(|_| ())
            .map_err(unavailable)?);
        let exists = self.sql.exists.clone();
        let found: i64 = on_pool!(&self.pool, p => sqlx::query_scalar(AssertSqlSafe(exists))
            .bind(id)
            .fetch_one(p)
            .await
            .map_err(unavailable)?);
        Ok(found > 0)
    }

    async fn purge_now(&self, now_ms: i64) -> Result<u64, CancelError> {
        let sql = self.sql.purge.clone();
        let gone = on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
            .bind(now_ms.saturating_sub(CANCELLED_KEPT_AFTER_DUE_MS))
            .bind(now_ms.saturating_sub(CANCELLED_KEPT_UNSEEN_MS))
            .execute(p)
            .await
            .map(|r| r.rows_affected())
            .map_err(unavailable)?);
        Ok(gone)
    }
}

impl CancelStore for SqlCancelStore {
    fn cancel<'a>(&'a self, id: &'a str, now_ms: i64) -> BoxFuture<'a, Result<(), CancelError>> {
        Box::pin(self.cancel_now(id, now_ms))
    }

    fn is_cancelled<'a>(
        &'a self,
        id: &'a str,
        due_at_ms: i64,
    ) -> BoxFuture<'a, Result<bool, CancelError>> {
        Box::pin(self.is_cancelled_now(id, due_at_ms))
    }

    fn purge(&self, now_ms: i64) -> BoxFuture<'_, Result<u64, CancelError>> {
        Box::pin(self.purge_now(now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_ignores_an_existing_row() {
        let t = TableName::trusted(DEFAULT_TABLE);
        for (d, ignore) in [
            (Dialect::Postgres, "ON CONFLICT (id) DO NOTHING"),
            (Dialect::MySql, "INSERT IGNORE INTO"),
            (Dialect::Sqlite, "INSERT OR IGNORE INTO"),
        ] {
            let s = statements(d, &t);
            assert!(s.cancel.contains(ignore), "{d:?}: {}", s.cancel);
            assert!(s.ddl[0].contains("PRIMARY KEY"), "{d:?}");
            assert!(s.mark_due.contains("due_at IS NULL"), "{d:?}");
        }
        assert!(statements(Dialect::MySql, &t).ddl[0].contains("utf8mb4_bin"));
    }

    #[test]
    fn ids_over_255_bytes_are_invalid() {
        assert!(check_id(&"a".repeat(255)).is_ok());
        assert!(matches!(
            check_id(&"a".repeat(256)),
            Err(CancelError::Invalid(_))
        ));
        // 128 two-byte characters: 256 bytes.
        assert!(matches!(
            check_id(&"é".repeat(128)),
            Err(CancelError::Invalid(_))
        ));
    }
}
