//! The [`OutboxRelay`]: a background task that claims pending outbox rows, publishes them
//! and records each outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use acemq::Connection;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{
    DEFAULT_BATCH_SIZE, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS, DEFAULT_POLL_INTERVAL,
    DEFAULT_RETRY_DELAY, Outbox,
};
use crate::{Error, default_owner};

#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    failed: AtomicU64,
    retired: AtomicU64,
}

#[derive(Clone, Debug)]
struct Worker {
    connection: Connection,
    outbox: Outbox,
    batch_size: u32,
    poll_interval: Duration,
    lease: Duration,
    max_attempts: u32,
    retry_delay: Duration,
    owner: String,
    counters: Arc<Counters>,
}

impl Worker {
    async fn drain_batch(&self) -> Result<usize, Error> {
        let token = format!("{}:{}", self.owner, uuid::Uuid::new_v4().simple());
        let rows = self
            .outbox
            .claim_batch(&token, self.batch_size, self.lease)
            .await?;
        let n = rows.len();
        for row in rows {
            let (id, attempts, result) = match row {
                Ok(record) => {
                    let r = self.connection.publish_prepared(record.to_outbound()).await;
                    (record.id, record.attempts, r.map_err(|e| e.to_string()))
                }
                Err((id, e)) => (id, 0, Err(e.to_string())),
            };
            let marked = match result {
                Ok(_) => {
                    let m = self.outbox.mark_published(&id).await;
                    if m.is_ok() {
                        self.counters.published.fetch_add(1, Ordering::Relaxed);
                    }
                    m
                }
                Err(reason) => {
                    tracing::warn!(message_id = %id, attempts = attempts + 1, error = %reason, "outbox publish failed");
                    let m = self
                        .outbox
                        .mark_failed(&id, &reason, self.max_attempts, self.retry_delay)
                        .await;
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    if m.is_ok() && attempts + 1 >= self.max_attempts {
                        tracing::warn!(message_id = %id, "outbox row retired after {} failed publishes; it is kept in the table", attempts + 1);
                        self.counters.retired.fetch_add(1, Ordering::Relaxed);
                    }
                    m
                }
            };
            if let Err(e) = marked {
                // The row stays leased until its lease ends, then is published again
                // (at least once).
                tracing::warn!(message_id = %id, error = %e, "could not record the outbox row's outcome; it will be retried after its lease");
            }
        }
        Ok(n)
    }

    async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                break;
            }
            let n = match self.drain_batch().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay could not claim a batch; trying again after the poll interval");
                    0
                }
            };
            if *stop.borrow() {
                break;
            }
            if n > 0 && n >= self.batch_size as usize {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.poll_interval) => {}
                _ = stop.changed() => {}
            }
        }
    }
}

#[derive(Debug)]
struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Publishes what the outbox holds: claims pending rows under a lease, publishes each with
/// [`Connection::publish_prepared`] (mandatory, confirmed, the stored bytes and message id
/// verbatim), and marks it published, or records the failure.
///
/// Defaults: batch [`DEFAULT_BATCH_SIZE`], poll [`DEFAULT_POLL_INTERVAL`], lease
/// [`DEFAULT_LEASE`] (keep it well above the time a batch takes to publish), max attempts
/// [`DEFAULT_MAX_ATTEMPTS`], retry delay [`DEFAULT_RETRY_DELAY`].
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use acemq_sql::outbox::{Outbox, OutboxRelay};
/// use std::time::Duration;
/// let pool = sqlx::SqlitePool::connect("sqlite://app.db").await?;
/// let mq = acemq::Connection::connect("amqp://127.0.0.1").await?;
/// let relay = OutboxRelay::new(mq, Outbox::new(pool))
///     .batch_size(500)
///     .poll_interval(Duration::from_millis(200))
///     .max_attempts(5);
/// relay.start()?;
/// // ...
/// relay.stop().await; // finishes the batch in hand
/// println!("published {}, failed {}", relay.published(), relay.failed());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct OutboxRelay {
    worker: Arc<Worker>,
    running: std::sync::Mutex<Option<Running>>,
}

impl OutboxRelay {
    /// A relay publishing `outbox`'s rows on `connection`.
    pub fn new(connection: Connection, outbox: Outbox) -> Self {
        OutboxRelay {
            worker: Arc::new(Worker {
                connection,
                outbox,
                batch_size: DEFAULT_BATCH_SIZE,
                poll_interval: DEFAULT_POLL_INTERVAL,
                lease: DEFAULT_LEASE,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                retry_delay: DEFAULT_RETRY_DELAY,
                owner: default_owner(),
                counters: Arc::default(),
            }),
            running: std::sync::Mutex::new(None),
        }
    }

    fn set(mut self, f: impl FnOnce(&mut Worker)) -> Self {
        f(Arc::make_mut(&mut self.worker));
        self
    }

    /// Rows claimed per batch (at least 1).
    pub fn batch_size(self, n: u32) -> Self {
        self.set(|w| w.batch_size = n.max(1))
    }

    /// The pause between polls when there was less than a full batch.
    pub fn poll_interval(self, d: Duration) -> Self {
        self.set(|w| w.poll_interval = d)
    }

    /// How long claimed rows are reserved for this relay; after it, another relay may
    /// claim (and publish) them again. Keep it well above the time a batch takes.
    pub fn lease(self, d: Duration) -> Self {
        self.set(|w| w.lease = d.max(Duration::from_millis(1)))
    }

    /// Failed publishes after which a row is retired (at least 1).
    pub fn max_attempts(self, n: u32) -> Self {
        self.set(|w| w.max_attempts = n.max(1))
    }

    /// The wait before a failed row is tried again.
    pub fn retry_delay(self, d: Duration) -> Self {
        self.set(|w| w.retry_delay = d)
    }

    /// Starts polling in a Tokio task. Must be called within a Tokio runtime.
    pub fn start(&self) -> Result<(), Error> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidArgument(
                "OutboxRelay::start must be called within a Tokio runtime".into(),
            )
        })?;
        let mut running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if running.as_ref().is_some_and(|r| !r.task.is_finished()) {
            return Err(Error::AlreadyRunning);
        }
        let (stop, rx) = watch::channel(false);
        let task = handle.spawn(self.worker.clone().run(rx));
        *running = Some(Running { stop, task });
        Ok(())
    }

    /// Stops polling: the batch in hand is finished (published and marked) first.
    pub async fn stop(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(r) = running {
            let _ = r.stop.send(true);
            let _ = r.task.await;
        }
    }

    /// Whether the polling task is running.
    pub fn is_running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(|r| !r.task.is_finished())
    }

    /// Claims and publishes one batch now; returns how many rows it handled (published or
    /// failed). Usable without [`start`](Self::start).
    pub async fn drain_once(&self) -> Result<usize, Error> {
        self.worker.drain_batch().await
    }

    /// Rows published and marked so far.
    pub fn published(&self) -> u64 {
        self.worker.counters.published.load(Ordering::Relaxed)
    }

    /// Failed publishes so far.
    pub fn failed(&self) -> u64 {
        self.worker.counters.failed.load(Ordering::Relaxed)
    }

    /// Rows retired so far.
    pub fn retired(&self) -> u64 {
        self.worker.counters.retired.load(Ordering::Relaxed)
    }
}

impl Drop for OutboxRelay {
    /// Asks the polling task to stop after its current batch (without waiting).
    fn drop(&mut self) {
        if let Ok(mut r) = self.running.lock()
            && let Some(r) = r.take()
        {
            let _ = r.stop.send(true);
        }
    }
}
