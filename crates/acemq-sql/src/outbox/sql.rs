//! The outbox table's SQL: the column lists, the statements of each dialect (DDL
//! included), and the reading of a row back into an [`OutboxRecord`](super::OutboxRecord).

use std::sync::Arc;

use crate::TableName;
use crate::pool::Dialect;

const INSERT_COLS: &str = "id, exchange, routing_key, content_type, content_encoding, delivery_mode, priority, correlation_id, reply_to, expiration, amqp_type, amqp_timestamp, user_id, app_id, cluster_id, headers, body, created_at, attempts";
const SELECT_COLS: &str = "id, exchange, routing_key, content_type, content_encoding, delivery_mode, priority, correlation_id, reply_to, expiration, amqp_type, amqp_timestamp, user_id, app_id, cluster_id, headers, body, created_at, attempts, last_error, published_at, retired_at";

macro_rules! read_record {
    ($row:expr) => {{
        let row = $row;
        let id: String = row.try_get("id")?;
        let headers_text: String = row.try_get("headers")?;
        let headers = headers_json::decode(&headers_text).map_err(|reason| Error::CorruptRow {
            id: id.clone(),
            reason: format!("headers: {reason}"),
        })?;
        let small = |v: Option<i16>, what: &str| -> Result<Option<u8>, Error> {
            v.map(|n| {
                u8::try_from(n).map_err(|_| Error::CorruptRow {
                    id: id.clone(),
                    reason: format!("{what} {n} out of range"),
                })
            })
            .transpose()
        };
        let delivery_mode = small(row.try_get("delivery_mode")?, "delivery_mode")?;
        let priority = small(row.try_get("priority")?, "priority")?;
        let timestamp: Option<i64> = row.try_get("amqp_timestamp")?;
        let attempts: i32 = row.try_get("attempts")?;
        let body: Vec<u8> = row.try_get("body")?;
        OutboxRecord {
            exchange: row.try_get("exchange")?,
            routing_key: row.try_get("routing_key")?,
            properties: Properties {
                message_id: Some(id.clone()),
                content_type: row.try_get("content_type")?,
                content_encoding: row.try_get("content_encoding")?,
                delivery_mode,
                priority,
                correlation_id: row.try_get("correlation_id")?,
                reply_to: row.try_get("reply_to")?,
                expiration: row.try_get("expiration")?,
                timestamp: timestamp.and_then(|t| u64::try_from(t).ok()),
                kind: row.try_get("amqp_type")?,
                user_id: row.try_get("user_id")?,
                app_id: row.try_get("app_id")?,
                cluster_id: row.try_get("cluster_id")?,
                headers,
            },
            body: Bytes::from(body),
            created_at_millis: row.try_get("created_at")?,
            attempts: u32::try_from(attempts).unwrap_or(0),
            last_error: row.try_get("last_error")?,
            published_at_millis: row.try_get("published_at")?,
            retired_at_millis: row.try_get("retired_at")?,
            id,
        }
    }};
}
pub(super) use read_record;

#[derive(Clone, Debug)]
pub(super) struct Statements {
    pub(super) insert: Arc<str>,
    pub(super) claim: Arc<str>,
    pub(super) fetch_claimed: Arc<str>,
    pub(super) mark_published: Arc<str>,
    pub(super) mark_failed: Arc<str>,
    pub(super) defer: Arc<str>,
    pub(super) release: Arc<str>,
    pub(super) pending_count: Arc<str>,
    pub(super) by_id: Arc<str>,
    pub(super) retired: Arc<str>,
    pub(super) purge_published: Arc<str>,
    pub(super) ddl: Vec<String>,
}

pub(super) fn insert_sql(d: Dialect, t: &TableName) -> String {
    format!(
        "INSERT INTO {t} ({INSERT_COLS}) VALUES ({}, 0)",
        d.placeholders(1, 18)
    )
}

pub(super) fn statements(d: Dialect, t: &TableName) -> Statements {
    let p = |n| d.placeholder(n);
    let pending = "published_at IS NULL AND retired_at IS NULL";
    let claim = match d {
        Dialect::Postgres => format!(
            "UPDATE {t} SET locked_by = $1, locked_until = $2 WHERE id IN (SELECT id FROM {t} WHERE {pending} AND (locked_until IS NULL OR locked_until < $3) ORDER BY created_at, id LIMIT $4 FOR UPDATE SKIP LOCKED)"
        ),
        Dialect::MySql => format!(
            "UPDATE {t} SET locked_by = ?, locked_until = ? WHERE {pending} AND (locked_until IS NULL OR locked_until < ?) ORDER BY created_at, id LIMIT ?"
        ),
        Dialect::Sqlite => format!(
            "UPDATE {t} SET locked_by = ?, locked_until = ? WHERE id IN (SELECT id FROM {t} WHERE {pending} AND (locked_until IS NULL OR locked_until < ?) ORDER BY created_at, id LIMIT ?)"
        ),
    };
    let pending_index = t.index_name("pending");
    let lock_index = t.index_name("locked_by");
    let (blob, text) = match d {
        Dialect::Postgres => ("BYTEA", "TEXT"),
        Dialect::MySql => ("LONGBLOB", "LONGTEXT"),
        Dialect::Sqlite => ("BLOB", "TEXT"),
    };
    let columns = format!(
        "  id VARCHAR(255) NOT NULL PRIMARY KEY,\n  exchange VARCHAR(255) NOT NULL,\n  routing_key VARCHAR(255) NOT NULL,\n  content_type VARCHAR(255),\n  content_encoding VARCHAR(255),\n  delivery_mode SMALLINT,\n  priority SMALLINT,\n  correlation_id VARCHAR(255),\n  reply_to VARCHAR(255),\n  expiration VARCHAR(255),\n  amqp_type VARCHAR(255),\n  amqp_timestamp BIGINT,\n  user_id VARCHAR(255),\n  app_id VARCHAR(255),\n  cluster_id VARCHAR(255),\n  headers {text} NOT NULL,\n  body {blob} NOT NULL,\n  created_at BIGINT NOT NULL,\n  attempts INTEGER NOT NULL DEFAULT 0,\n  last_error {text},\n  published_at BIGINT,\n  retired_at BIGINT,\n  locked_by VARCHAR(255),\n  locked_until BIGINT"
    );
    let ddl = match d {
        Dialect::MySql => vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n{columns},\n  INDEX {pending_index} (published_at, retired_at, created_at),\n  INDEX {lock_index} (locked_by)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )],
        Dialect::Postgres | Dialect::Sqlite => {
            let (prefix, on) = match (d, t.schema()) {
                (Dialect::Sqlite, Some(s)) => (format!("{s}."), t.table().to_owned()),
                _ => (String::new(), t.to_string()),
            };
            vec![
                format!("CREATE TABLE IF NOT EXISTS {t} (\n{columns}\n)"),
                format!(
                    "CREATE INDEX IF NOT EXISTS {prefix}{pending_index} ON {on} (published_at, retired_at, created_at)"
                ),
                format!("CREATE INDEX IF NOT EXISTS {prefix}{lock_index} ON {on} (locked_by)"),
            ]
        }
    };
    Statements {
        insert: insert_sql(d, t).into(),
        claim: claim.into(),
        fetch_claimed: format!(
            "SELECT {SELECT_COLS} FROM {t} WHERE locked_by = {} AND {pending} ORDER BY created_at, id",
            p(1)
        )
        .into(),
        mark_published: format!(
            "UPDATE {t} SET published_at = {}, locked_by = NULL, locked_until = NULL WHERE id = {}",
            p(1),
            p(2)
        )
        .into(),
        // retired_at is assigned first: MySQL evaluates SET left to right with the new
        // values, the others with the old ones; this order reads the old attempts on all.
        mark_failed: format!(
            "UPDATE {t} SET retired_at = CASE WHEN attempts + 1 >= {} THEN {} ELSE NULL END, attempts = attempts + 1, last_error = {}, locked_by = NULL, locked_until = {} WHERE id = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        )
        .into(),
        // The broker was unavailable: attempts unchanged, the lease handed back (the row
        // claimable again at `locked_until`, or at once when it is NULL).
        defer: format!(
            "UPDATE {t} SET last_error = {}, locked_by = NULL, locked_until = {} WHERE id = {}",
            p(1),
            p(2),
            p(3)
        )
        .into(),
        release: format!(
            "UPDATE {t} SET locked_by = NULL, locked_until = NULL WHERE locked_by = {} AND {pending}",
            p(1)
        )
        .into(),
        pending_count: format!("SELECT COUNT(*) FROM {t} WHERE {pending}").into(),
        by_id: format!("SELECT {SELECT_COLS} FROM {t} WHERE id = {}", p(1)).into(),
        retired: format!(
            "SELECT {SELECT_COLS} FROM {t} WHERE retired_at IS NOT NULL ORDER BY created_at, id"
        )
        .into(),
        purge_published: format!(
            "DELETE FROM {t} WHERE published_at IS NOT NULL AND published_at < {}",
            p(1)
        )
        .into(),
        ddl,
    }
}
