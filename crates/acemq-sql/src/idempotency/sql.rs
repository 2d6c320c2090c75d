//! The idempotency table's SQL per dialect, and how a timestamp is bound on each backend.
//!
//! PostgreSQL uses the Java member's DDL verbatim (`TIMESTAMP WITH TIME ZONE`), MySQL and
//! MariaDB `DATETIME(3)` holding UTC, SQLite (which has no date type) `INTEGER` epoch
//! milliseconds. [`At`] binds one instant as each of those.

use std::sync::Arc;

use time::OffsetDateTime;

use crate::TableName;
use crate::pool::Dialect;

pub(super) const CLAIMED: &str = "CLAIMED";
pub(super) const CONFIRMED: &str = "CONFIRMED";

/// The widest `claimed_by` value: Java's `VARCHAR(64)`.
pub(crate) const OWNER_MAX_CHARS: usize = 64;

/// One instant, bound as `TIMESTAMP WITH TIME ZONE` (PostgreSQL), a UTC `DATETIME`
/// (MySQL, MariaDB) or epoch milliseconds (SQLite).
#[derive(Clone, Copy, Debug)]
pub(crate) struct At(pub(crate) OffsetDateTime);

impl At {
    /// Now, to the millisecond (the finest step every backend keeps).
    pub(crate) fn now() -> At {
        let now = OffsetDateTime::now_utc();
        At(now.replace_millisecond(now.millisecond()).unwrap_or(now))
    }

    /// `self + d`, saturating at the year 9999 (a retention of "forever").
    pub(crate) fn plus(self, d: std::time::Duration) -> At {
        let max = time::macros::datetime!(9999-12-31 23:59:59.999 UTC);
        At(time::Duration::try_from(d)
            .ok()
            .and_then(|d| self.0.checked_add(d))
            .map_or(max, |t| t.min(max)))
    }

    /// Epoch milliseconds: how SQLite keeps an instant (the other backends bind the time).
    #[cfg(feature = "sqlite")]
    fn millis(self) -> i64 {
        i64::try_from(self.0.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
    }
}

macro_rules! bind_as_time {
    ($feature:literal, $db:ty) => {
        #[cfg(feature = $feature)]
        impl sqlx::Type<$db> for At {
            fn type_info() -> <$db as sqlx::Database>::TypeInfo {
                <OffsetDateTime as sqlx::Type<$db>>::type_info()
            }
            fn compatible(ty: &<$db as sqlx::Database>::TypeInfo) -> bool {
                <OffsetDateTime as sqlx::Type<$db>>::compatible(ty)
            }
        }
        #[cfg(feature = $feature)]
        impl sqlx::Encode<'_, $db> for At {
            fn encode_by_ref(
                &self,
                buf: &mut <$db as sqlx::Database>::ArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <OffsetDateTime as sqlx::Encode<'_, $db>>::encode_by_ref(&self.0, buf)
            }
        }
    };
}
bind_as_time!("postgres", sqlx::Postgres);
bind_as_time!("mysql", sqlx::MySql);

#[cfg(feature = "sqlite")]
impl sqlx::Type<sqlx::Sqlite> for At {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <i64 as sqlx::Type<sqlx::Sqlite>>::type_info()
    }
}

#[cfg(feature = "sqlite")]
impl sqlx::Encode<'_, sqlx::Sqlite> for At {
    fn encode_by_ref(
        &self,
        buf: &mut <sqlx::Sqlite as sqlx::Database>::ArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <i64 as sqlx::Encode<'_, sqlx::Sqlite>>::encode(self.millis(), buf)
    }
}

#[derive(Debug)]
pub(super) struct Statements {
    /// Binds: key, owner, recorded_at, expires_at.
    pub(super) insert_claim: Arc<str>,
    /// Binds: now, key. Columns: state, claimed_by, live (`expires_at >= now`).
    pub(super) select: Arc<str>,
    /// Binds: owner, recorded_at, expires_at, key, now.
    pub(super) takeover: Arc<str>,
    /// Binds: recorded_at, expires_at, key, owner.
    pub(super) reclaim: Arc<str>,
    /// Binds: recorded_at, expires_at, key.
    pub(super) confirm_update: Arc<str>,
    /// Binds: key, owner (NULL), recorded_at, expires_at.
    pub(super) confirm_insert: Arc<str>,
    /// Binds: recorded_at, expires_at, key, owner.
    pub(super) confirm_held: Arc<str>,
    /// Binds: key, owner.
    pub(super) release: Arc<str>,
    /// Binds: now.
    pub(super) purge: Arc<str>,
    /// Binds: schema (or NULL), table. One row: the `expires_at` column's type.
    pub(super) column_type: Option<Arc<str>>,
    pub(super) ddl: Vec<String>,
}

/// The DDL for a table in a dialect.
fn ddl(d: Dialect, t: &TableName) -> Vec<String> {
    let index = t.index_name("expiry");
    match d {
        Dialect::Postgres => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    message_id  VARCHAR(255)             NOT NULL PRIMARY KEY,\n    state       VARCHAR(16)              NOT NULL,\n    claimed_by  VARCHAR(64),\n    recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,\n    expires_at  TIMESTAMP WITH TIME ZONE NOT NULL\n)"
            ),
            format!("CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at)"),
        ],
        Dialect::Sqlite => {
            // SQLite qualifies the index, not the table it is on.
            let (index_name, on) = match t.schema() {
                Some(s) => (format!("{s}.{index}"), t.table().to_owned()),
                None => (index, t.to_string()),
            };
            vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\n    message_id  VARCHAR(255) NOT NULL PRIMARY KEY,\n    state       VARCHAR(16)  NOT NULL,\n    claimed_by  VARCHAR(64),\n    recorded_at INTEGER      NOT NULL,\n    expires_at  INTEGER      NOT NULL\n)"
                ),
                format!("CREATE INDEX IF NOT EXISTS {index_name} ON {on} (expires_at)"),
            ]
        }
        Dialect::MySql => vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n    message_id  VARCHAR(255) NOT NULL PRIMARY KEY,\n    state       VARCHAR(16)  NOT NULL,\n    claimed_by  VARCHAR(64)  NULL,\n    recorded_at DATETIME(3)  NOT NULL,\n    expires_at  DATETIME(3)  NOT NULL,\n    INDEX {index} (expires_at)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )],
    }
}

pub(super) fn statements(d: Dialect, t: &TableName) -> Statements {
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
    let column_type = match d {
        Dialect::Postgres => Some(
            "SELECT data_type::text FROM information_schema.columns WHERE table_schema = COALESCE($1, current_schema()) AND table_name = lower($2) AND column_name = 'expires_at'",
        ),
        Dialect::MySql => Some(
            "SELECT CAST(data_type AS CHAR) FROM information_schema.columns WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND column_name = 'expires_at'",
        ),
        // SQLite keeps epoch milliseconds: its table did not change.
        Dialect::Sqlite => None,
    };
    Statements {
        insert_claim: insert(CLAIMED).into(),
        select: format!(
            "SELECT state, claimed_by, expires_at >= {} AS live FROM {t} WHERE message_id = {}",
            p(1),
            p(2)
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
            "UPDATE {t} SET state = '{CONFIRMED}', claimed_by = NULL, recorded_at = {}, expires_at = {} WHERE message_id = {}",
            p(1),
            p(2),
            p(3)
        )
        .into(),
        confirm_insert: insert(CONFIRMED).into(),
        confirm_held: confirm_held_sql(d, t).into(),
        release: format!(
            "DELETE FROM {t} WHERE message_id = {} AND state = '{CLAIMED}' AND claimed_by = {}",
            p(1),
            p(2)
        )
        .into(),
        purge: format!("DELETE FROM {t} WHERE expires_at <= {}", p(1)).into(),
        column_type: column_type.map(Arc::from),
        ddl: ddl(d, t),
    }
}

/// Confirms a claim this owner still holds, and nothing else. Binds: recorded_at,
/// expires_at, key, owner.
pub(super) fn confirm_held_sql(d: Dialect, t: &TableName) -> String {
    let p = |n| d.placeholder(n);
    format!(
        "UPDATE {t} SET state = '{CONFIRMED}', claimed_by = NULL, recorded_at = {}, expires_at = {} WHERE message_id = {} AND state = '{CLAIMED}' AND claimed_by = {}",
        p(1),
        p(2),
        p(3),
        p(4)
    )
}

/// Whether a column type is the old Rust schema's epoch milliseconds.
pub(super) fn is_epoch_millis_type(data_type: &str) -> bool {
    matches!(
        data_type.trim().to_ascii_lowercase().as_str(),
        "bigint" | "integer" | "int" | "int8" | "numeric" | "decimal"
    )
}

/// `owner` cut to fit `claimed_by` (64 characters): kept as is when it fits, else its
/// first 27 characters, `~` and a UUID v5 of the whole, so distinct owners stay distinct.
pub(crate) fn fit_owner(owner: &str) -> String {
    if owner.chars().count() <= OWNER_MAX_CHARS {
        return owner.to_owned();
    }
    let hash = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, owner.as_bytes());
    let head: String = owner.chars().take(OWNER_MAX_CHARS - 37).collect();
    format!("{head}~{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_fit_and_stay_distinct() {
        assert_eq!(fit_owner("short"), "short");
        let a = fit_owner(&"x".repeat(200));
        let b = fit_owner(&format!("{}y", "x".repeat(199)));
        assert_eq!(a.chars().count(), OWNER_MAX_CHARS);
        assert_eq!(b.chars().count(), OWNER_MAX_CHARS);
        assert_ne!(a, b);
        assert_eq!(a, fit_owner(&"x".repeat(200)), "stable");
        let d = crate::default_owner();
        assert!(d.chars().count() <= OWNER_MAX_CHARS, "{d}");
    }

    #[test]
    fn instants_saturate() {
        let far = At::now().plus(std::time::Duration::from_secs(u64::MAX));
        assert_eq!(far.0.year(), 9999);
        assert_eq!(At::now().0.nanosecond() % 1_000_000, 0);
    }

    #[test]
    fn postgres_ddl_is_javas() {
        let t = TableName::trusted("acemq_idempotency");
        let d = ddl(Dialect::Postgres, &t);
        assert!(d[0].contains("recorded_at TIMESTAMP WITH TIME ZONE NOT NULL"));
        assert!(d[0].contains("claimed_by  VARCHAR(64),"));
        assert_eq!(
            d[1],
            "CREATE INDEX IF NOT EXISTS acemq_idempotency_expiry ON acemq_idempotency (expires_at)"
        );
    }
}
