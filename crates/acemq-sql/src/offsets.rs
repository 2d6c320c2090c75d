//! Stream reader offsets in a SQL table: [`SqlOffsetStore`], the
//! [`acemq::stream::OffsetStore`] a [`StreamReader`](acemq::stream::StreamReader) resumes
//! from after a restart, on whichever instance it restarts.
//!
//! This module owns the offsets table (default [`DEFAULT_TABLE`], `acemq_stream_offsets`):
//! its DDL per dialect, the one-statement commit that keeps the highest offset, and the
//! mapping of database failures to [`StoreError`]. One row per stream and reader name:
//!
//! | column        | type                      | meaning                                   |
//! |---------------|---------------------------|-------------------------------------------|
//! | `stream`      | `VARCHAR(255)`            | the stream (queue) name                   |
//! | `reader`      | `VARCHAR(255)`            | the reader's name given to `offsets(..)`  |
//! | `last_offset` | `BIGINT`                  | the last offset the reader finished with  |
//! | `updated_at`  | `BIGINT`                  | epoch milliseconds of the last commit that raised or repeated it |
//!
//! The primary key is `(stream, reader)`. The column is `last_offset`, not `offset`, which
//! is a keyword in every dialect. On MySQL and MariaDB the table uses `utf8mb4_bin`, so
//! names compare case-sensitively, as on the other backends.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn demo(mq: acemq::Connection) -> Result<(), Box<dyn std::error::Error>> {
//! use acemq::consume::Message;
//! use acemq_sql::offsets::SqlOffsetStore;
//!
//! let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
//! let store = SqlOffsetStore::new(pool);
//! println!("{}", store.create_table_sql()); // put this in a migration
//! let reader = mq
//!     .stream::<String>("audit")
//!     .from_first()
//!     .offsets(store, "indexer")
//!     .consume(|m: Message<String>| async move { println!("{}", m.payload()); Ok(()) })
//!     .await?;
//! # reader.close().await; Ok(()) }
//! ```

use std::sync::Arc;

use acemq::idempotency::StoreError;
use acemq::stream::OffsetStore;
use acemq::transport::BoxFuture;
use sqlx::AssertSqlSafe;

use crate::pool::{Dialect, SqlPool};
use crate::{Error, TableName, now_millis};

/// The default offsets table: `acemq_stream_offsets`.
///
/// ```
/// assert_eq!(acemq_sql::offsets::DEFAULT_TABLE, "acemq_stream_offsets");
/// ```
pub const DEFAULT_TABLE: &str = "acemq_stream_offsets";

/// The widest stream or reader name: the columns' `VARCHAR(255)`.
const NAME_MAX_CHARS: usize = 255;

/// An [`OffsetStore`] in a SQL table (PostgreSQL, MySQL/MariaDB or SQLite), shared by
/// every instance that uses the table: a reader restarted on another machine resumes just
/// after the offset its predecessor committed.
///
/// * **Load** reads the row of `(stream, reader)`; no row is `None`.
/// * **Commit** is one upsert that keeps the highest offset (`GREATEST` on PostgreSQL,
///   MySQL and MariaDB, `MAX` on SQLite), so a late, lower commit never moves a reader
///   back, and two racing commits leave the higher one.
///
/// Stream and reader names are at most 255 characters, and offsets at most `i64::MAX`
/// (the column is a `BIGINT`); anything else is [`StoreError::Invalid`]. A database that
/// cannot be reached or refuses the statement is [`StoreError::Unavailable`].
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use acemq::stream::OffsetStore;
/// use acemq_sql::offsets::SqlOffsetStore;
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let store = SqlOffsetStore::new(pool);
/// store.create_table_if_absent().await?;
/// store.commit("audit", "indexer", 41).await?;
/// store.commit("audit", "indexer", 7).await?; // late and lower: ignored
/// assert_eq!(store.load("audit", "indexer").await?, Some(41));
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[derive(Clone, Debug)]
pub struct SqlOffsetStore {
    pool: SqlPool,
    table: TableName,
    sql: Statements,
}

/// The table's statements in one dialect.
#[derive(Clone, Debug)]
struct Statements {
    /// Binds: stream, reader. One column: `last_offset`.
    load: Arc<str>,
    /// Binds: stream, reader, offset, updated_at.
    commit: Arc<str>,
    ddl: Vec<String>,
}

fn statements(d: Dialect, t: &TableName) -> Statements {
    let cols = "stream, reader, last_offset, updated_at";
    let (ddl, commit) = match d {
        Dialect::Postgres => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    stream      VARCHAR(255) NOT NULL,\n    reader      VARCHAR(255) NOT NULL,\n    last_offset BIGINT       NOT NULL,\n    updated_at  BIGINT       NOT NULL,\n    PRIMARY KEY (stream, reader)\n)"
            ),
            format!(
                "INSERT INTO {t} AS o ({cols}) VALUES ($1, $2, $3, $4) ON CONFLICT (stream, reader) DO UPDATE SET updated_at = CASE WHEN EXCLUDED.last_offset >= o.last_offset THEN EXCLUDED.updated_at ELSE o.updated_at END, last_offset = GREATEST(o.last_offset, EXCLUDED.last_offset)"
            ),
        ),
        // MySQL evaluates the assignments left to right, each seeing the ones before it:
        // `updated_at` is decided while `last_offset` still holds the stored value.
        Dialect::MySql => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    stream      VARCHAR(255) NOT NULL,\n    reader      VARCHAR(255) NOT NULL,\n    last_offset BIGINT       NOT NULL,\n    updated_at  BIGINT       NOT NULL,\n    PRIMARY KEY (stream, reader)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
            ),
            format!(
                "INSERT INTO {t} ({cols}) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE updated_at = IF(VALUES(last_offset) >= last_offset, VALUES(updated_at), updated_at), last_offset = GREATEST(last_offset, VALUES(last_offset))"
            ),
        ),
        // In SQLite's upsert an unqualified column is the stored row's.
        Dialect::Sqlite => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    stream      VARCHAR(255) NOT NULL,\n    reader      VARCHAR(255) NOT NULL,\n    last_offset INTEGER      NOT NULL,\n    updated_at  INTEGER      NOT NULL,\n    PRIMARY KEY (stream, reader)\n)"
            ),
            format!(
                "INSERT INTO {t} ({cols}) VALUES (?, ?, ?, ?) ON CONFLICT (stream, reader) DO UPDATE SET updated_at = CASE WHEN excluded.last_offset >= last_offset THEN excluded.updated_at ELSE updated_at END, last_offset = MAX(last_offset, excluded.last_offset)"
            ),
        ),
    };
    let p = |n| d.placeholder(n);
    Statements {
        load: format!(
            "SELECT last_offset FROM {t} WHERE stream = {} AND reader = {}",
            p(1),
            p(2)
        )
        .into(),
        commit: commit.into(),
        ddl: vec![ddl],
    }
}

fn unavailable(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn check_names(stream: &str, reader: &str) -> Result<(), StoreError> {
    for (what, name) in [("stream", stream), ("reader", reader)] {
        let n = name.chars().count();
        if n > NAME_MAX_CHARS {
            return Err(StoreError::Invalid(format!(
                "{what} name of {n} characters; the offsets table's {what} column holds at most {NAME_MAX_CHARS}"
            )));
        }
    }
    Ok(())
}

impl SqlOffsetStore {
    /// A store in the default table [`DEFAULT_TABLE`] on `pool`.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
    /// let store = acemq_sql::offsets::SqlOffsetStore::new(pool);
    /// assert_eq!(store.table().as_str(), "acemq_stream_offsets");
    /// # Ok(()) }
    /// ```
    pub fn new(pool: impl Into<SqlPool>) -> Self {
        let pool = pool.into();
        let table = TableName::trusted(DEFAULT_TABLE);
        let sql = statements(pool.dialect(), &table);
        SqlOffsetStore { pool, table, sql }
    }

    /// A store in another table (validated, see [`TableName`]): anything but a plain
    /// identifier, optionally `schema.`-qualified, is [`Error::InvalidTableName`].
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use acemq_sql::offsets::SqlOffsetStore;
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
    /// let store = SqlOffsetStore::with_table(pool.clone(), "billing.stream_offsets")?;
    /// assert!(SqlOffsetStore::with_table(pool, "x; drop table y").is_err());
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn with_table(pool: impl Into<SqlPool>, table: &str) -> Result<Self, Error> {
        let pool = pool.into();
        let table = TableName::parse(table)?;
        let sql = statements(pool.dialect(), &table);
        Ok(SqlOffsetStore { pool, table, sql })
    }

    /// The table.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), acemq_sql::Error> {
    /// let store = acemq_sql::offsets::SqlOffsetStore::with_table(pool, "offsets")?;
    /// assert_eq!(store.table().table(), "offsets");
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
    /// let ddl = acemq_sql::offsets::SqlOffsetStore::new(pool).create_table_sql();
    /// assert!(ddl.contains("PRIMARY KEY (stream, reader)"));
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
    /// let store = acemq_sql::offsets::SqlOffsetStore::new(pool);
    /// store.create_table_if_absent().await?;
    /// store.create_table_if_absent().await?; // already there: nothing happens
    /// # Ok(()) }
    /// ```
    pub async fn create_table_if_absent(&self) -> Result<(), Error> {
        crate::pool::run_ddl(&self.pool, &self.sql.ddl).await
    }

    async fn load_now(&self, stream: &str, reader: &str) -> Result<Option<u64>, StoreError> {
        check_names(stream, reader)?;
        let sql = self.sql.load.clone();
        let found: Option<i64> = on_pool!(&self.pool, p => sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(stream)
            .bind(reader)
            .fetch_optional(p)
            .await
            .map_err(unavailable)?);
        found
            .map(|n| {
                u64::try_from(n).map_err(|_| {
                    StoreError::Unavailable(format!(
                        "the offsets table {} holds a negative offset ({n}) for stream {stream:?}, reader {reader:?}; fix or delete that row",
                        self.table
                    ))
                })
            })
            .transpose()
    }

    async fn commit_now(&self, stream: &str, reader: &str, offset: u64) -> Result<(), StoreError> {
        check_names(stream, reader)?;
        let offset = i64::try_from(offset).map_err(|_| {
            StoreError::Invalid(format!(
                "stream offset {offset} is above i64::MAX; the offsets table's last_offset column is a BIGINT"
            ))
        })?;
        let sql = self.sql.commit.clone();
        on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
            .bind(stream)
            .bind(reader)
            .bind(offset)
            .bind(now_millis())
            .execute(p)
            .await
            .map(|_| ())
            .map_err(unavailable)?);
        Ok(())
    }
}

impl OffsetStore for SqlOffsetStore {
    fn load<'a>(
        &'a self,
        stream: &'a str,
        reader: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(self.load_now(stream, reader))
    }

    fn commit<'a>(
        &'a self,
        stream: &'a str,
        reader: &'a str,
        offset: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.commit_now(stream, reader, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_keeps_the_maximum() {
        let t = TableName::trusted(DEFAULT_TABLE);
        for (d, keep) in [
            (
                Dialect::Postgres,
                "GREATEST(o.last_offset, EXCLUDED.last_offset)",
            ),
            (Dialect::MySql, "GREATEST(last_offset, VALUES(last_offset))"),
            (Dialect::Sqlite, "MAX(last_offset, excluded.last_offset)"),
        ] {
            let s = statements(d, &t);
            assert!(s.commit.contains(keep), "{d:?}: {}", s.commit);
            assert!(!s.commit.contains(" offset"), "{d:?}: {}", s.commit);
            assert!(s.ddl[0].contains("PRIMARY KEY (stream, reader)"), "{d:?}");
        }
    }

    #[test]
    fn names_and_offsets_out_of_range_are_invalid() {
        assert!(check_names("s", "r").is_ok());
        assert!(check_names(&"s".repeat(255), "r").is_ok());
        assert!(matches!(
            check_names(&"s".repeat(256), "r"),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            check_names("s", &"r".repeat(256)),
            Err(StoreError::Invalid(_))
        ));
    }
}
