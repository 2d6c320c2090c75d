//! The backends: one sqlx pool type per enabled feature.

/// The SQL dialect a statement is written in.
///
/// ```
/// use acemq_sql::Dialect;
/// assert_eq!(Dialect::Postgres.placeholder(2), "$2");
/// assert_eq!(Dialect::MySql.placeholder(2), "?");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 or MariaDB (10.6 and later).
    MySql,
    /// SQLite 3.35 or later (the bundled one is).
    Sqlite,
}

impl Dialect {
    /// The `n`th (1-based) bind placeholder: `$n` for PostgreSQL, `?` elsewhere.
    pub fn placeholder(self, n: usize) -> String {
        match self {
            Dialect::Postgres => format!("${n}"),
            Dialect::MySql | Dialect::Sqlite => "?".into(),
        }
    }

    /// Placeholders `first..first+count`, comma-separated.
    pub(crate) fn placeholders(self, first: usize, count: usize) -> String {
        (first..first + count)
            .map(|n| self.placeholder(n))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A database pool of one of the enabled backends. Build it with `From`:
/// `SqlPool::from(pg_pool)`, or pass a pool wherever `impl Into<SqlPool>` is taken.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo() -> Result<(), sqlx::Error> {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().connect("sqlite::memory:").await?;
/// let pool = acemq_sql::SqlPool::from(pool);
/// assert_eq!(pool.dialect(), acemq_sql::Dialect::Sqlite);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum SqlPool {
    /// A PostgreSQL pool.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// A MySQL or MariaDB pool.
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    /// A SQLite pool.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    /// No backend feature is enabled; never constructed.
    #[doc(hidden)]
    #[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
    _None(std::convert::Infallible),
}

impl SqlPool {
    /// Which dialect this pool speaks.
    pub fn dialect(&self) -> Dialect {
        match self {
            #[cfg(feature = "postgres")]
            SqlPool::Postgres(_) => Dialect::Postgres,
            #[cfg(feature = "mysql")]
            SqlPool::MySql(_) => Dialect::MySql,
            #[cfg(feature = "sqlite")]
            SqlPool::Sqlite(_) => Dialect::Sqlite,
            #[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
            SqlPool::_None(n) => match *n {},
        }
    }
}

#[cfg(feature = "postgres")]
impl From<sqlx::PgPool> for SqlPool {
    fn from(p: sqlx::PgPool) -> Self {
        SqlPool::Postgres(p)
    }
}

#[cfg(feature = "mysql")]
impl From<sqlx::MySqlPool> for SqlPool {
    fn from(p: sqlx::MySqlPool) -> Self {
        SqlPool::MySql(p)
    }
}

#[cfg(feature = "sqlite")]
impl From<sqlx::SqlitePool> for SqlPool {
    fn from(p: sqlx::SqlitePool) -> Self {
        SqlPool::Sqlite(p)
    }
}

/// Runs the same body against whichever pool this is (`$p` is the concrete `&Pool<DB>`);
/// each arm is type-checked for its own backend.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            #[cfg(feature = "postgres")]
            $crate::pool::SqlPool::Postgres($p) => $body,
            #[cfg(feature = "mysql")]
            $crate::pool::SqlPool::MySql($p) => $body,
            #[cfg(feature = "sqlite")]
            $crate::pool::SqlPool::Sqlite($p) => $body,
            #[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
            $crate::pool::SqlPool::_None(n) => match *n {},
        }
    };
}

/// DDL statements as one text: separated by `;` and a newline, for a migration.
pub(crate) fn ddl_text(ddl: &[String]) -> String {
    ddl.join(";\n") + ";"
}

/// Runs DDL statements (`IF NOT EXISTS` ones) in order.
pub(crate) async fn run_ddl(pool: &SqlPool, ddl: &[String]) -> Result<(), crate::Error> {
    for stmt in ddl {
        let stmt = stmt.clone();
        on_pool!(pool, p => sqlx::query(sqlx::AssertSqlSafe(stmt)).execute(p).await.map(|_| ())?);
    }
    Ok(())
}

/// Whether the database refused a statement only because a concurrent one held what it
/// needed: a deadlock or serialization failure (SQLSTATE 40001, PostgreSQL's 40P01), a
/// MySQL lock wait timeout (1205), SQLite busy or locked. Running the statement again is
/// the documented answer; nothing was changed.
pub(crate) fn is_contention(e: &crate::Error) -> bool {
    matches!(e, crate::Error::Database(e) if is_sqlx_contention(e))
}

/// [`is_contention`] for a `sqlx::Error`.
pub(crate) fn is_sqlx_contention(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(m) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(m.number(), 1205 | 1213);
    }
    matches!(
        db.code().as_deref(),
        Some("40001" | "40P01" | "5" | "6" | "517" | "262")
    )
}

/// How often a statement refused by [`is_contention`] is run again before its error is
/// returned, and the first pause (doubling): 6 tries over about 0.3 s.
const CONTENTION_TRIES: u32 = 6;
const CONTENTION_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Runs `op` again, after a short doubling pause, while the database answers with a
/// contention error ([`is_contention`]); any other outcome is returned at once. For
/// statements that are safe to repeat (each one its own transaction).
pub(crate) async fn retry_contention<T, F, Fut>(mut op: F) -> Result<T, crate::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::Error>>,
{
    let mut pause = CONTENTION_PAUSE;
    let mut tries = 1;
    loop {
        match op().await {
            Err(e) if tries < CONTENTION_TRIES && is_contention(&e) => {
                tracing::debug!(error = %e, tries, "statement refused on contention; running it again");
                tokio::time::sleep(pause).await;
                pause = pause.saturating_mul(2);
                tries += 1;
            }
            other => return other,
        }
    }
}
