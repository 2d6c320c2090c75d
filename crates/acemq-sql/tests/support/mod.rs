//! Shared test support: database targets from the environment, unique table names, a
//! recording broker, polling with deadlines.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::topology::{BindingDecl, ExchangeDecl, QueueDecl};
use acemq::transport::{
    BoxFuture, Confirmation, ConsumeSpec, Delivery, Outbound, PendingConfirm, QueueInfo,
    Subscription, Transport, TransportError, TransportStatus,
};
use acemq_sql::SqlPool;
use tokio::sync::watch;

/// A table name unique to this process and call.
pub fn unique_table(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn env_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            if std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() == Ok("1") {
                panic!("ACEMQ_TEST_REQUIRE_BROKER=1 but {var} is not set: database tests must run");
            }
            eprintln!("note: {var} unset; this backend did not run");
            None
        }
    }
}

/// The databases to run on: SQLite always, PostgreSQL and MariaDB when configured.
pub async fn databases() -> Vec<(&'static str, SqlPool)> {
    let mut out = vec![("sqlite", sqlite().await)];
    if let Some(url) = env_url("ACEMQ_TEST_POSTGRES_URL") {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e}"));
        out.push(("postgres", pool.into()));
    }
    if let Some(url) = env_url("ACEMQ_TEST_MYSQL_URL") {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to MySQL/MariaDB at {url}: {e}"));
        out.push(("mysql", pool.into()));
    }
    out
}

/// A SQLite database in a fresh temporary file (WAL, a few connections).
pub async fn sqlite() -> SqlPool {
    let path = std::env::temp_dir().join(format!("{}.db", unique_table("acemq_sql_test")));
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(opts)
        .await
        .expect("sqlite")
        .into()
}

/// Drops a table (test cleanup).
pub async fn drop_table(pool: &SqlPool, table: &str) {
    let sql = sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}"));
    let r = match pool {
        SqlPool::Postgres(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
        SqlPool::MySql(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
        SqlPool::Sqlite(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
        _ => Ok(()),
    };
    r.expect("drop table");
}

/// The outbox rows of `table` not yet published, as `id locked_by locked_until attempts
/// last_error` lines: what a timed-out test prints to say why.
pub async fn unpublished_rows(pool: &SqlPool, table: &str) -> Vec<String> {
    let sql = format!(
        "SELECT id, locked_by, locked_until, attempts, last_error FROM {table} WHERE published_at IS NULL ORDER BY created_at, id"
    );
    macro_rules! read {
        ($p:expr) => {{
            let rows: Vec<(String, Option<String>, Option<i64>, i32, Option<String>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .fetch_all($p)
                    .await
                    .expect("read outbox rows");
            rows.into_iter()
                .map(|(id, by, until, attempts, err)| {
                    format!("{id} by={by:?} until={until:?} attempts={attempts} error={err:?}")
                })
                .collect()
        }};
    }
    match pool {
        SqlPool::Postgres(p) => read!(p),
        SqlPool::MySql(p) => read!(p),
        SqlPool::Sqlite(p) => read!(p),
        _ => Vec::new(),
    }
}

/// Polls `f` every 20 ms until it is true; panics after `deadline`.
pub async fn eventually<F, Fut>(what: &str, deadline: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if f().await {
            return;
        }
        if tokio::time::Instant::now() > end {
            panic!("timed out after {deadline:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A broker double: the default exchange routes to declared queues, everything else is
/// unroutable. With `hold` set, a publish is recorded (it "arrived") but its confirm never
/// comes, to simulate a relay dying between publish and mark.
#[derive(Default)]
pub struct RecordingBroker {
    queues: Mutex<HashMap<String, Vec<Outbound>>>,
    pub hold: AtomicBool,
    status: Mutex<Option<watch::Sender<TransportStatus>>>,
}

impl RecordingBroker {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn declare(&self, queue: &str) {
        self.queues
            .lock()
            .unwrap()
            .entry(queue.to_owned())
            .or_default();
    }

    pub fn messages(&self, queue: &str) -> Vec<Outbound> {
        self.queues
            .lock()
            .unwrap()
            .get(queue)
            .cloned()
            .unwrap_or_default()
    }

    pub fn count(&self, queue: &str) -> usize {
        self.queues.lock().unwrap().get(queue).map_or(0, Vec::len)
    }
}

fn unsupported<T: Send + 'static>() -> BoxFuture<'static, Result<T, TransportError>> {
    Box::pin(async { Err(TransportError::Unsupported("test broker".into())) })
}

impl Transport for RecordingBroker {
    fn kind(&self) -> &'static str {
        "memory"
    }
    fn publish(&self, m: Outbound) -> BoxFuture<'_, Result<PendingConfirm, TransportError>> {
        let routed = m.exchange.is_empty() && {
            let mut q = self.queues.lock().unwrap();
            match q.get_mut(&m.routing_key) {
                Some(v) => {
                    v.push(m.clone());
                    true
                }
                None => false,
            }
        };
        let hold = self.hold.load(Ordering::SeqCst);
        Box::pin(async move {
            let confirm: PendingConfirm = if hold {
                Box::pin(std::future::pending())
            } else if routed {
                Box::pin(async { Ok(Confirmation::Routed) })
            } else {
                Box::pin(async {
                    Ok(Confirmation::Unroutable {
                        reply_code: 312,
                        reply_text: "NO_ROUTE".into(),
                    })
                })
            };
            Ok(confirm)
        })
    }
    fn consume(
        &self,
        _s: ConsumeSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Subscription>, TransportError>> {
        unsupported()
    }
    fn get(&self, _q: &str) -> BoxFuture<'_, Result<Option<Delivery>, TransportError>> {
        unsupported()
    }
    fn declare_exchange(&self, _d: &ExchangeDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        unsupported()
    }
    fn declare_queue(&self, d: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        let name = d.name.clone();
        self.declare(&name);
        Box::pin(async move {
            Ok(QueueInfo {
                name,
                message_count: 0,
                consumer_count: 0,
            })
        })
    }
    fn bind_queue(&self, _d: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        unsupported()
    }
    fn unbind_queue(&self, _d: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        unsupported()
    }
    fn inspect_queue(&self, _n: &str) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        unsupported()
    }
    fn inspect_exchange(&self, _n: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        unsupported()
    }
    fn delete_queue(&self, _n: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        unsupported()
    }
    fn delete_exchange(&self, _n: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        unsupported()
    }
    fn purge_queue(&self, _n: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        unsupported()
    }
    fn status(&self) -> TransportStatus {
        TransportStatus {
            connected: true,
            blocked: None,
        }
    }
    fn watch_status(&self) -> watch::Receiver<TransportStatus> {
        let mut s = self.status.lock().unwrap();
        s.get_or_insert_with(|| watch::channel(self.status()).0)
            .subscribe()
    }
    fn close(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Every outbox row id of `table`, sorted: what a test compares with the exact set it
/// expects.
pub async fn outbox_ids(pool: &SqlPool, table: &str) -> Vec<String> {
    let sql = format!("SELECT id FROM {table} ORDER BY id");
    macro_rules! read {
        ($p:expr) => {{
            let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .fetch_all($p)
                .await
                .expect("read outbox ids");
            rows.into_iter().map(|(id,)| id).collect()
        }};
    }
    let mut ids: Vec<String> = match pool {
        SqlPool::Postgres(p) => read!(p),
        SqlPool::MySql(p) => read!(p),
        SqlPool::Sqlite(p) => read!(p),
        _ => Vec::new(),
    };
    ids.sort();
    ids
}
