//! Confirming a claim inside the handler's own transaction.

use std::sync::Arc;

use acemq::transport::BoxFuture;
use sqlx::AssertSqlSafe;
use time::OffsetDateTime;

use super::sql::{At, confirm_held_sql};
use super::{SqlIdempotencyStore, check_key};
use crate::Error;
use crate::pool::Dialect;

mod sealed {
    pub trait Sealed {}
}

/// A sqlx database whose transactions [`SqlIdempotencyStore::confirm_in`] can write to:
/// `sqlx::Postgres`, `sqlx::MySql` or `sqlx::Sqlite`, as enabled by the crate's features.
/// Sealed.
pub trait IdempotencyDatabase: sqlx::Database + sealed::Sealed {
    /// The dialect of this database.
    const DIALECT: Dialect;
    #[doc(hidden)]
    fn confirm_row<'c>(
        conn: &'c mut Self::Connection,
        sql: Arc<str>,
        stamps: (OffsetDateTime, OffsetDateTime),
        key: &'c str,
        owner: &'c str,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;
}

macro_rules! idempotency_database {
    ($feature:literal, $db:ty, $dialect:expr) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for $db {}
        #[cfg(feature = $feature)]
        impl IdempotencyDatabase for $db {
            const DIALECT: Dialect = $dialect;
            fn confirm_row<'c>(
                conn: &'c mut Self::Connection,
                sql: Arc<str>,
                (now, until): (OffsetDateTime, OffsetDateTime),
                key: &'c str,
                owner: &'c str,
            ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
                Box::pin(async move {
                    Ok(sqlx::query(AssertSqlSafe(sql))
                        .bind(At(now))
                        .bind(At(until))
                        .bind(key)
                        .bind(owner)
                        .execute(&mut *conn)
                        .await?
                        .rows_affected())
                })
            }
        }
    };
}
idempotency_database!("postgres", sqlx::Postgres, Dialect::Postgres);
idempotency_database!("mysql", sqlx::MySql, Dialect::MySql);
idempotency_database!("sqlite", sqlx::Sqlite, Dialect::Sqlite);

impl SqlIdempotencyStore {
    /// Confirms this store's claim on `key` inside the caller's transaction, which it
    /// neither commits nor closes: the handler's own writes and the confirmation commit or
    /// roll back together.
    ///
    /// Call it on the same store instance the consumer claims with (share it as an
    /// `Arc<SqlIdempotencyStore>`): it updates only a `CLAIMED` row this store holds
    /// (`claimed_by` = its owner). If the claim was taken over after its lease ran out (or
    /// was already confirmed or released), it changes nothing and answers
    /// [`Error::ClaimLost`]: roll back, so the business write is not made twice.
    ///
    /// With a consumer
    /// ([`ConsumerOptions::idempotent`](acemq::consume::ConsumerOptions::idempotent)):
    /// * committed, handler `Ok`: the consumer's own confirm is harmless (the row is
    ///   confirmed already; only its retention restarts);
    /// * committed, handler fails: the consumer's release leaves the confirmed row alone,
    ///   and the retry is acknowledged as a duplicate without running;
    /// * rolled back, handler fails: the consumer releases the claim and the message is
    ///   retried.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(pool: sqlx::PgPool, store: std::sync::Arc<acemq_sql::SqlIdempotencyStore>,
    /// #   m: acemq::consume::Message<u32>) -> Result<(), acemq_sql::Error> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(*m.payload() as i64).execute(&mut *tx).await?;
    /// store.confirm_in(&mut tx, m.envelope().id()).await?; // Err: drop tx (rolls back)
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn confirm_in<DB>(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        key: &str,
    ) -> Result<(), Error>
    where
        DB: IdempotencyDatabase,
    {
        check_key(key).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let sql = if DB::DIALECT == self.pool.dialect() {
            self.sql.confirm_held.clone()
        } else {
            confirm_held_sql(DB::DIALECT, &self.table).into()
        };
        let now = At::now();
        let until = now.plus(self.retention);
        let n = DB::confirm_row(&mut **tx, sql, (now.0, until.0), key, &self.owner).await?;
        if n == 1 {
            Ok(())
        } else {
            Err(Error::ClaimLost {
                key: key.to_owned(),
            })
        }
    }
}
