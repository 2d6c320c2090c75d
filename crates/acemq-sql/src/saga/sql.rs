//! The saga table's SQL: the DDL and statements of each dialect, the sealed
//! [`SagaDatabase`] trait that runs them on a connection of its backend (a pool's or the
//! caller's transaction), and the reading of a row back into a [`SagaRow`].
//!
//! Every statement that moves a saga is *guarded*: it names the row's id, the owner, the
//! state and the number of applied steps it expects, so a process that lost its lease (or
//! a second copy of the same run) changes nothing and learns it from the row count.

use std::sync::Arc;

use acemq::transport::BoxFuture;

use crate::TableName;
use crate::pool::{Dialect, SqlPool};

mod sealed {
    pub trait Sealed {}
}

/// A value bound to a statement (internal).
#[doc(hidden)]
#[derive(Debug)]
pub enum Arg {
    /// A text value.
    Text(String),
    /// A `BIGINT`.
    Int(i64),
    /// A `NULL` text value.
    NoText,
}

/// One saga row, as stored (internal).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct SagaRow {
    pub(crate) id: String,
    pub(crate) saga: String,
    pub(crate) steps: String,
    pub(crate) subject: String,
    pub(crate) state: String,
    pub(crate) applied: i64,
    pub(crate) failed_step: Option<String>,
    pub(crate) last_error: Option<String>,
    pub(crate) owner: Option<String>,
    pub(crate) lease_until: i64,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
}

/// A sqlx database a [`DurableSaga`](super::DurableSaga) keeps its log in and runs its
/// steps' transactions on: `sqlx::Postgres`, `sqlx::MySql` or `sqlx::Sqlite`, as enabled by
/// the crate's features. Sealed.
pub trait SagaDatabase: sqlx::Database + sealed::Sealed {
    /// The dialect of this database.
    const DIALECT: Dialect;
    #[doc(hidden)]
    fn execute<'c>(
        conn: &'c mut Self::Connection,
        sql: Arc<str>,
        args: Vec<Arg>,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;
    #[doc(hidden)]
    fn fetch<'c>(
        conn: &'c mut Self::Connection,
        sql: Arc<str>,
        args: Vec<Arg>,
    ) -> BoxFuture<'c, Result<Vec<SagaRow>, sqlx::Error>>;
    #[doc(hidden)]
    fn sql_pool(pool: &sqlx::Pool<Self>) -> SqlPool;
}

macro_rules! saga_database {
    ($feature:literal, $db:ty, $dialect:expr, $variant:ident) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for $db {}
        #[cfg(feature = $feature)]
        impl SagaDatabase for $db {
            const DIALECT: Dialect = $dialect;
            fn execute<'c>(
                conn: &'c mut Self::Connection,
                sql: Arc<str>,
                args: Vec<Arg>,
            ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
                Box::pin(async move {
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for a in args {
                        q = match a {
                            Arg::Text(s) => q.bind(s),
                            Arg::Int(n) => q.bind(n),
                            Arg::NoText => q.bind(None::<String>),
                        };
                    }
                    Ok(q.execute(&mut *conn).await?.rows_affected())
                })
            }
            fn fetch<'c>(
                conn: &'c mut Self::Connection,
                sql: Arc<str>,
                args: Vec<Arg>,
            ) -> BoxFuture<'c, Result<Vec<SagaRow>, sqlx::Error>> {
                Box::pin(async move {
                    use sqlx::Row;
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for a in args {
                        q = match a {
                            Arg::Text(s) => q.bind(s),
                            Arg::Int(n) => q.bind(n),
                            Arg::NoText => q.bind(None::<String>),
                        };
                    }
                    let mut out = Vec::new();
                    for row in q.fetch_all(&mut *conn).await? {
                        out.push(SagaRow {
                            id: row.try_get("id")?,
                            saga: row.try_get("saga")?,
                            steps: row.try_get("steps")?,
                            subject: row.try_get("subject")?,
                            state: row.try_get("state")?,
                            applied: row.try_get("applied")?,
                            failed_step: row.try_get("failed_step")?,
                            last_error: row.try_get("last_error")?,
                            owner: row.try_get("owner")?,
                            lease_until: row.try_get("lease_until")?,
                            created_at: row.try_get("created_at")?,
                            updated_at: row.try_get("updated_at")?,
                        });
                    }
                    Ok(out)
                })
            }
            fn sql_pool(pool: &sqlx::Pool<Self>) -> SqlPool {
                SqlPool::$variant(pool.clone())
            }
        }
    };
}
saga_database!("postgres", sqlx::Postgres, Dialect::Postgres, Postgres);
saga_database!("mysql", sqlx::MySql, Dialect::MySql, MySql);
saga_database!("sqlite", sqlx::Sqlite, Dialect::Sqlite, Sqlite);

const COLS: &str = "id, saga, steps, subject, state, applied, failed_step, last_error, owner, lease_until, created_at, updated_at";

/// The table's statements in one dialect; each names its binds in order.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    /// id, saga, steps, subject, state, owner (NULL when begun in a caller's transaction),
    /// lease_until, created_at, updated_at; `applied` starts at 0.
    pub(crate) insert: Arc<str>,
    /// A forward step's log entry, in the step's transaction. state (`running`, or
    /// `completed` after the last step), lease_until, updated_at; guard: id, owner,
    /// applied.
    pub(crate) advance: Arc<str>,
    /// A step failed: state (`compensating`, or `compensated` when nothing was applied),
    /// failed_step, last_error, lease_until, updated_at; guard: id, owner, applied.
    pub(crate) fail: Arc<str>,
    /// A compensation's log entry, in its transaction. state (`compensating`, or
    /// `compensated` after the first step's), lease_until, updated_at; guard: id, owner,
    /// applied.
    pub(crate) undo: Arc<str>,
    /// A compensation gave up: last_error, updated_at; guard: id, owner, applied.
    pub(crate) unresolved: Arc<str>,
    /// Takes a saga over: owner, lease_until, updated_at; guard: id, saga, now (the lease
    /// must have run out; `running` or `compensating`).
    pub(crate) claim: Arc<str>,
    /// Takes an unresolved saga back to compensating: owner, lease_until, updated_at;
    /// guard: id, saga.
    pub(crate) reopen: Arc<str>,
    /// Renews the lease while a step runs: lease_until, updated_at; guard: id, owner,
    /// applied.
    pub(crate) renew: Arc<str>,
    /// Sagas of one name whose lease ran out: saga, now; at most `limit` (bound last).
    pub(crate) due: Arc<str>,
    /// One row: id.
    pub(crate) by_id: Arc<str>,
    pub(crate) ddl: Vec<String>,
}

pub(crate) fn statements(d: Dialect, t: &TableName) -> Statements {
    let p = |n| d.placeholder(n);
    let text = match d {
        Dialect::MySql => "LONGTEXT",
        Dialect::Postgres | Dialect::Sqlite => "TEXT",
    };
    let columns = format!(
        "  id VARCHAR(64) NOT NULL PRIMARY KEY,\n  saga VARCHAR(255) NOT NULL,\n  steps {text} NOT NULL,\n  subject {text} NOT NULL,\n  state VARCHAR(16) NOT NULL,\n  applied BIGINT NOT NULL,\n  failed_step VARCHAR(255),\n  last_error {text},\n  owner VARCHAR(64),\n  lease_until BIGINT NOT NULL,\n  created_at BIGINT NOT NULL,\n  updated_at BIGINT NOT NULL"
    );
    let due_index = t.index_name("due");
    let ddl = match d {
        Dialect::MySql => vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n{columns},\n  INDEX {due_index} (saga, state, lease_until)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )],
        Dialect::Postgres | Dialect::Sqlite => {
            let (prefix, on) = match (d, t.schema()) {
                (Dialect::Sqlite, Some(s)) => (format!("{s}."), t.table().to_owned()),
                _ => (String::new(), t.to_string()),
            };
            vec![
                format!("CREATE TABLE IF NOT EXISTS {t} (\n{columns}\n)"),
                format!(
                    "CREATE INDEX IF NOT EXISTS {prefix}{due_index} ON {on} (saga, state, lease_until)"
                ),
            ]
        }
    };
    let live = "state IN ('running', 'compensating')";
    let limit = match d {
        Dialect::Postgres => format!("LIMIT {}", p(3)),
        Dialect::MySql | Dialect::Sqlite => "LIMIT ?".into(),
    };
    Statements {
        insert: format!(
            "INSERT INTO {t} (id, saga, steps, subject, state, owner, lease_until, created_at, updated_at, applied) VALUES ({}, 0)",
            d.placeholders(1, 9)
        )
        .into(),
        advance: format!(
            "UPDATE {t} SET applied = applied + 1, state = {}, lease_until = {}, updated_at = {} WHERE id = {} AND owner = {} AND state = 'running' AND applied = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6)
        )
        .into(),
        fail: format!(
            "UPDATE {t} SET state = {}, failed_step = {}, last_error = {}, lease_until = {}, updated_at = {} WHERE id = {} AND owner = {} AND state = 'running' AND applied = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6),
            p(7),
            p(8)
        )
        .into(),
        undo: format!(
            "UPDATE {t} SET applied = applied - 1, state = {}, lease_until = {}, updated_at = {} WHERE id = {} AND owner = {} AND state = 'compensating' AND applied = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6)
        )
        .into(),
        unresolved: format!(
            "UPDATE {t} SET state = 'unresolved', last_error = {}, owner = NULL, lease_until = 0, updated_at = {} WHERE id = {} AND owner = {} AND state = 'compensating' AND applied = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        )
        .into(),
        claim: format!(
            "UPDATE {t} SET owner = {}, lease_until = {}, updated_at = {} WHERE id = {} AND saga = {} AND {live} AND lease_until < {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6)
        )
        .into(),
        reopen: format!(
            "UPDATE {t} SET state = 'compensating', owner = {}, lease_until = {}, updated_at = {} WHERE id = {} AND saga = {} AND state = 'unresolved'",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        )
        .into(),
        renew: format!(
            "UPDATE {t} SET lease_until = {}, updated_at = {} WHERE id = {} AND owner = {} AND {live} AND applied = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        )
        .into(),
        due: format!(
            "SELECT {COLS} FROM {t} WHERE saga = {} AND {live} AND lease_until < {} ORDER BY lease_until, id {limit}",
            p(1),
            p(2)
        )
        .into(),
        by_id: format!("SELECT {COLS} FROM {t} WHERE id = {}", p(1)).into(),
        ddl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_binds_what_its_docs_say() {
        let t = TableName::parse("app.sagas").unwrap();
        let s = statements(Dialect::Postgres, &t);
        assert!(
            s.insert
                .ends_with("($1, $2, $3, $4, $5, $6, $7, $8, $9, 0)")
        );
        assert!(s.advance.contains("applied = $6"));
        assert!(s.fail.contains("applied = $8"));
        assert!(s.undo.contains("applied = $6"));
        assert!(s.unresolved.contains("applied = $5"));
        assert!(s.claim.contains("lease_until < $6"));
        assert!(s.due.ends_with("LIMIT $3"));
        assert_eq!(s.ddl.len(), 2);
        assert!(s.ddl[1].contains("sagas_due ON app.sagas"));
        let m = statements(Dialect::MySql, &t);
        assert_eq!(m.ddl.len(), 1);
        assert!(m.ddl[0].contains("utf8mb4_bin") && m.ddl[0].contains("INDEX sagas_due"));
        assert_eq!(m.advance.matches('?').count(), 6);
        let l = statements(Dialect::Sqlite, &t);
        assert!(l.ddl[1].contains("app.sagas_due ON sagas"));
    }
}
