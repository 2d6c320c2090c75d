//! The transactional outbox: messages written in the caller's transaction, published by a
//! relay afterwards.
//!
#![doc = include_str!("../../docs/outbox.md")]

mod relay;
mod sql;
mod verdict;

pub use relay::OutboxRelay;

use std::sync::Arc;
use std::time::Duration;

use acemq::codec::Json;
use acemq::publish::{SendOptions, prepare};
use acemq::transport::{BoxFuture, Outbound, Properties};
use bytes::Bytes;
use sqlx::{AssertSqlSafe, Row};

use crate::headers_json;
use crate::pool::{Dialect, SqlPool, retry_contention};
use crate::{Error, TableName, millis, now_millis};
use sql::{Statements, insert_sql, read_record, statements};

/// The default outbox table: `acemq_outbox`.
pub const DEFAULT_TABLE: &str = "acemq_outbox";
/// The default number of failed publishes after which a row is retired: 10.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// The default relay batch: 100 rows.
pub const DEFAULT_BATCH_SIZE: u32 = 100;
/// The default pause between polls when the outbox is empty: 1 s.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The default lease a relay holds on the rows it claimed: 60 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default wait before a failed row is tried again: 5 s.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(5);
/// The default cap on the relay's pause after the broker was unavailable: 30 s.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(30);

const LAST_ERROR_MAX_CHARS: usize = 1000;

mod sealed {
    pub trait Sealed {}
}

/// A sqlx database whose transactions [`Outbox::enqueue`] can write to: `sqlx::Postgres`,
/// `sqlx::MySql` or `sqlx::Sqlite`, as enabled by the crate's features. Sealed.
pub trait OutboxDatabase: sqlx::Database + sealed::Sealed {
    /// The dialect of this database.
    const DIALECT: Dialect;
    #[doc(hidden)]
    fn insert_row<'c>(
        conn: &'c mut Self::Connection,
        sql: Arc<str>,
        row: &'c hidden::NewRow,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;
}

#[doc(hidden)]
pub mod hidden {
    /// A row to insert (internal).
    #[derive(Debug)]
    pub struct NewRow {
        pub(crate) id: String,
        pub(crate) exchange: String,
        pub(crate) routing_key: String,
        pub(crate) p: acemq::transport::Properties,
        pub(crate) delivery_mode: Option<i16>,
        pub(crate) priority: Option<i16>,
        pub(crate) timestamp: Option<i64>,
        pub(crate) headers: String,
        pub(crate) body: Vec<u8>,
        pub(crate) created_at: i64,
    }
}
use hidden::NewRow;

macro_rules! outbox_database {
    ($feature:literal, $db:ty, $dialect:expr) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for $db {}
        #[cfg(feature = $feature)]
        impl OutboxDatabase for $db {
            const DIALECT: Dialect = $dialect;
            fn insert_row<'c>(
                conn: &'c mut Self::Connection,
                sql: Arc<str>,
                r: &'c NewRow,
            ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
                Box::pin(async move {
                    Ok(sqlx::query(AssertSqlSafe(sql))
                        .bind(r.id.as_str())
                        .bind(r.exchange.as_str())
                        .bind(r.routing_key.as_str())
                        .bind(r.p.content_type.as_deref())
                        .bind(r.p.content_encoding.as_deref())
                        .bind(r.delivery_mode)
                        .bind(r.priority)
                        .bind(r.p.correlation_id.as_deref())
                        .bind(r.p.reply_to.as_deref())
                        .bind(r.p.expiration.as_deref())
                        .bind(r.p.kind.as_deref())
                        .bind(r.timestamp)
                        .bind(r.p.user_id.as_deref())
                        .bind(r.p.app_id.as_deref())
                        .bind(r.p.cluster_id.as_deref())
                        .bind(r.headers.as_str())
                        .bind(r.body.as_slice())
                        .bind(r.created_at)
                        .execute(&mut *conn)
                        .await?
                        .rows_affected())
                })
            }
        }
    };
}
outbox_database!("postgres", sqlx::Postgres, Dialect::Postgres);
outbox_database!("mysql", sqlx::MySql, Dialect::MySql);
outbox_database!("sqlite", sqlx::Sqlite, Dialect::Sqlite);

/// One outbox row, read back.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OutboxRecord {
    /// The message id (the envelope id and AMQP `message_id`); the primary key.
    pub id: String,
    /// The exchange to publish to.
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The AMQP properties and headers, as stored (`message_id` is [`OutboxRecord::id`]).
    pub properties: Properties,
    /// The body bytes, verbatim.
    pub body: Bytes,
    /// When it was enqueued (epoch ms).
    pub created_at_millis: i64,
    /// Failed publishes so far.
    pub attempts: u32,
    /// The last failure, if any (at most 1000 characters).
    pub last_error: Option<String>,
    /// When it was published (epoch ms).
    pub published_at_millis: Option<i64>,
    /// When it was retired after `max_attempts` failures (epoch ms).
    pub retired_at_millis: Option<i64>,
}

impl OutboxRecord {
    /// The message to publish: exchange, routing key, properties and body exactly as
    /// stored, mandatory.
    pub fn to_outbound(&self) -> Outbound {
        let mut properties = self.properties.clone();
        properties.message_id = Some(self.id.clone());
        Outbound::new(
            self.exchange.clone(),
            self.routing_key.clone(),
            properties,
            self.body.clone(),
        )
    }
}

/// The outbox table: enqueue in your transaction, inspect, purge.
///
/// The table (default `acemq_outbox`): `id` (the message id, primary key), `exchange`,
/// `routing_key`, the AMQP properties needed to republish verbatim (`content_type`,
/// `content_encoding`, `delivery_mode`, `priority`, `correlation_id`, `reply_to`,
/// `expiration`, `amqp_type`, `amqp_timestamp`, `user_id`, `app_id`, `cluster_id`),
/// `headers` (JSON that keeps every AMQP type, see [`crate::headers_json`]), `body` (the
/// bytes verbatim), `created_at`, `attempts`, `last_error`, `published_at`, `retired_at`
/// and the lease `locked_by` / `locked_until`. Times are epoch milliseconds.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::SqlitePool::connect("sqlite://app.db").await?;
/// let outbox = acemq_sql::outbox::Outbox::new(pool.clone());
/// println!("{}", outbox.create_table_sql());
/// let mut tx = pool.begin().await?;
/// let id = outbox.enqueue(&mut tx, "", "orders", &serde_json::json!({"id": 1})).await?;
/// tx.commit().await?;
/// # let _ = id; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Outbox {
    pool: SqlPool,
    table: TableName,
    origin: String,
    sql: Statements,
}

impl Outbox {
    /// An outbox in the default table `acemq_outbox` on `pool` (the pool the relay uses;
    /// enqueues use the caller's transaction).
    pub fn new(pool: impl Into<SqlPool>) -> Self {
        let pool = pool.into();
        let table = TableName::trusted(DEFAULT_TABLE);
        let sql = statements(pool.dialect(), &table);
        Outbox {
            pool,
            table,
            origin: acemq::envelope::origin_for(acemq::envelope::DEFAULT_CLIENT_NAME),
            sql,
        }
    }

    /// An outbox in another table (validated, see [`TableName`]).
    pub fn with_table(pool: impl Into<SqlPool>, table: &str) -> Result<Self, Error> {
        let mut o = Self::new(pool);
        o.table = TableName::parse(table)?;
        o.sql = statements(o.pool.dialect(), &o.table);
        Ok(o)
    }

    /// The `x-acemq-origin` stamped on enqueued messages (default `acemq@{hostname}`, as a
    /// connection would stamp it).
    pub fn origin(mut self, origin: impl Into<String>) -> Self {
        self.origin = origin.into();
        self
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The DDL for the table and its indexes, in the pool's dialect: statements separated
    /// by `;` and a newline. Put it in a migration.
    pub fn create_table_sql(&self) -> String {
        crate::pool::ddl_text(&self.sql.ddl)
    }

    /// Runs [`create_table_sql`](Self::create_table_sql) (`IF NOT EXISTS`). For
    /// development and tests.
    pub async fn create_table_if_absent(&self) -> Result<(), Error> {
        crate::pool::run_ddl(&self.pool, &self.sql.ddl).await
    }

    /// Encodes `payload` as JSON with a fresh envelope (as [`acemq::publish::prepare`]
    /// builds it) and writes it in the caller's transaction, which it neither commits nor
    /// closes. Returns the message id.
    pub async fn enqueue<DB, T>(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        exchange: &str,
        routing_key: &str,
        payload: &T,
    ) -> Result<String, Error>
    where
        DB: OutboxDatabase,
        T: serde::Serialize + ?Sized,
    {
        self.enqueue_with(tx, exchange, routing_key, payload, SendOptions::new())
            .await
    }

    /// [`enqueue`](Self::enqueue) with envelope fields and options (message id,
    /// correlation id, headers, ...).
    pub async fn enqueue_with<DB, T>(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        exchange: &str,
        routing_key: &str,
        payload: &T,
        options: SendOptions,
    ) -> Result<String, Error>
    where
        DB: OutboxDatabase,
        T: serde::Serialize + ?Sized,
    {
        let outbound = prepare(&Json, exchange, routing_key, payload, options, &self.origin)?;
        self.enqueue_outbound(tx, &outbound).await
    }

    /// Writes an already built message (for example one [`acemq::publish::prepare`]d with
    /// another codec) in the caller's transaction. It must have a `message_id`.
    pub async fn enqueue_outbound<DB>(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        outbound: &Outbound,
    ) -> Result<String, Error>
    where
        DB: OutboxDatabase,
    {
        let p = &outbound.properties;
        let id = p
            .message_id
            .clone()
            .filter(|id| !id.is_empty() && id.chars().count() <= 255)
            .ok_or_else(|| {
                Error::InvalidArgument(
                    "an outbox message needs a message_id of 1 to 255 characters".into(),
                )
            })?;
        let timestamp = p
            .timestamp
            .map(|t| {
                i64::try_from(t)
                    .map_err(|_| Error::InvalidArgument(format!("timestamp {t} out of range")))
            })
            .transpose()?;
        let row = NewRow {
            id: id.clone(),
            exchange: outbound.exchange.clone(),
            routing_key: outbound.routing_key.clone(),
            p: p.clone(),
            delivery_mode: p.delivery_mode.map(i16::from),
            priority: p.priority.map(i16::from),
            timestamp,
            headers: headers_json::encode(&p.headers),
            body: outbound.body.to_vec(),
            created_at: now_millis(),
        };
        let sql = if DB::DIALECT == self.pool.dialect() {
            self.sql.insert.clone()
        } else {
            insert_sql(DB::DIALECT, &self.table).into()
        };
        DB::insert_row(&mut **tx, sql, &row).await?;
        Ok(id)
    }

    /// Rows waiting to be published (not published, not retired).
    pub async fn pending_count(&self) -> Result<u64, Error> {
        let sql = self.sql.pending_count.clone();
        let n: i64 = on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql)).fetch_one(p).await?.try_get(0)?);
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// One row by message id.
    pub async fn record(&self, id: &str) -> Result<Option<OutboxRecord>, Error> {
        let sql = self.sql.by_id.clone();
        Ok(on_pool!(&self.pool, p => {
            match sqlx::query(AssertSqlSafe(sql)).bind(id).fetch_optional(p).await? {
                Some(row) => Some(read_record!(&row)),
                None => None,
            }
        }))
    }

    /// The retired rows (failed `max_attempts` times), oldest first.
    pub async fn retired(&self) -> Result<Vec<OutboxRecord>, Error> {
        let sql = self.sql.retired.clone();
        Ok(on_pool!(&self.pool, p => {
            let mut out = Vec::new();
            for row in sqlx::query(AssertSqlSafe(sql)).fetch_all(p).await? {
                out.push(read_record!(&row));
            }
            out
        }))
    }

    /// Deletes rows published more than `older_than` ago; returns how many. Schedule it if
    /// you do not want to keep published rows.
    pub async fn purge_published(&self, older_than: Duration) -> Result<u64, Error> {
        let before = now_millis().saturating_sub(millis(older_than));
        let sql = self.sql.purge_published.clone();
        Ok(
            on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql)).bind(before).execute(p).await?.rows_affected()),
        )
    }

    /// Leases up to `limit` pending rows to `token` until `now + lease` and reads them.
    /// Rows that cannot be read are returned as errors with their id.
    async fn claim_batch(
        &self,
        token: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<Result<OutboxRecord, (String, Error)>>, Error> {
        let now = now_millis();
        let until = now.saturating_add(millis(lease));
        let limit = i64::from(limit);
        // A claim refused on contention (two relays) changed nothing: it is run again.
        retry_contention(|| async {
            let claim = self.sql.claim.clone();
            let fetch = self.sql.fetch_claimed.clone();
            Ok(on_pool!(&self.pool, p => {
                sqlx::query(AssertSqlSafe(claim))
                    .bind(token)
                    .bind(until)
                    .bind(now)
                    .bind(limit)
                    .execute(p)
                    .await?;
                let rows = sqlx::query(AssertSqlSafe(fetch)).bind(token).fetch_all(p).await?;
                let mut out = Vec::with_capacity(rows.len());
                for row in &rows {
                    let read = (|| -> Result<OutboxRecord, Error> { Ok(read_record!(row)) })();
                    out.push(read.map_err(|e| (row.try_get::<String, _>("id").unwrap_or_default(), e)));
                }
                out
            }))
        })
        .await
    }

    async fn mark_published(&self, id: &str) -> Result<(), Error> {
        let now = now_millis();
        retry_contention(|| async {
            let sql = self.sql.mark_published.clone();
            on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql)).bind(now).bind(id).execute(p).await.map(|_| ())?);
            Ok(())
        })
        .await
    }

    /// Records a publish the broker was unavailable for: `last_error` set, `attempts`
    /// unchanged, the lease given back; the row can be claimed again `after` from now (at
    /// once with `None`).
    async fn defer(&self, id: &str, error: &str, after: Option<Duration>) -> Result<(), Error> {
        let error: String = error.chars().take(LAST_ERROR_MAX_CHARS).collect();
        let until = after.map(|d| now_millis().saturating_add(millis(d)));
        retry_contention(|| async {
            let sql = self.sql.defer.clone();
            on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
                .bind(error.as_str())
                .bind(until)
                .bind(id)
                .execute(p)
                .await
                .map(|_| ())?);
            Ok(())
        })
        .await
    }

    /// Gives back the lease on every row `token` still holds (claimable again at once).
    async fn release(&self, token: &str) -> Result<u64, Error> {
        retry_contention(|| async {
            let sql = self.sql.release.clone();
            Ok(
                on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql)).bind(token).execute(p).await?.rows_affected()),
            )
        })
        .await
    }

    async fn mark_failed(
        &self,
        id: &str,
        error: &str,
        max_attempts: u32,
        retry_delay: Duration,
    ) -> Result<(), Error> {
        let now = now_millis();
        let error: String = error.chars().take(LAST_ERROR_MAX_CHARS).collect();
        let max = i32::try_from(max_attempts).unwrap_or(i32::MAX);
        let retry_at = now.saturating_add(millis(retry_delay));
        // A refused statement changed nothing (its attempt not spent): it is run again.
        retry_contention(|| async {
            let sql = self.sql.mark_failed.clone();
            on_pool!(&self.pool, p => sqlx::query(AssertSqlSafe(sql))
                .bind(max)
                .bind(now)
                .bind(error.as_str())
                .bind(retry_at)
                .bind(id)
                .execute(p)
                .await
                .map(|_| ())?);
            Ok(())
        })
        .await
    }
}
