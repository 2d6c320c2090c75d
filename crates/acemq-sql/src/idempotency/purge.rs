//! The optional background purge of expired rows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::SqlIdempotencyStore;
use crate::Error;

/// A running [`SqlIdempotencyStore::spawn_purge`] task. Dropping it stops the task, as
/// does [`cancel`](Self::cancel) or [`stop`](Self::stop); so does dropping the store.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo(store: std::sync::Arc<acemq_sql::SqlIdempotencyStore>) -> Result<(), acemq_sql::Error> {
/// let purge = store.spawn_purge(std::time::Duration::from_secs(3600))?;
/// // ... run the service ...
/// purge.stop().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PurgeTask {
    token: CancellationToken,
    task: Option<JoinHandle<()>>,
    purged: Arc<AtomicU64>,
}

impl PurgeTask {
    /// Asks the task to stop (it ends after the purge in progress, if any).
    pub fn cancel(&self) {
        self.token.cancel();
    }

    /// Stops the task and waits until it has ended.
    pub async fn stop(mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            // A purge that panicked has nothing left to stop.
            let _ = task.await;
        }
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Rows deleted by this task so far.
    pub fn purged(&self) -> u64 {
        self.purged.load(Ordering::Relaxed)
    }
}

impl Drop for PurgeTask {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

impl SqlIdempotencyStore {
    /// Runs [`purge_expired`](Self::purge_expired) now and then every `interval` on the
    /// current tokio runtime, until the returned [`PurgeTask`] is dropped, cancelled or
    /// stopped, or the store is dropped. A failed purge is logged (`warn`) and tried again
    /// at the next tick; it never touches the message path. Hourly is plenty: expired rows
    /// do no harm, they only take space.
    ///
    /// Fails with [`Error::InvalidArgument`] for a zero interval or outside a tokio
    /// runtime.
    pub fn spawn_purge(self: &Arc<Self>, interval: Duration) -> Result<PurgeTask, Error> {
        if interval.is_zero() {
            return Err(Error::InvalidArgument(
                "the purge interval must be above zero".into(),
            ));
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidArgument("spawn_purge must be called inside a tokio runtime".into())
        })?;
        let token = CancellationToken::new();
        let purged = Arc::new(AtomicU64::new(0));
        let task = runtime.spawn(purge_loop(
            Arc::downgrade(self),
            interval,
            token.clone(),
            purged.clone(),
        ));
        Ok(PurgeTask {
            token,
            task: Some(task),
            purged,
        })
    }
}

async fn purge_loop(
    store: Weak<SqlIdempotencyStore>,
    interval: Duration,
    token: CancellationToken,
    purged: Arc<AtomicU64>,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while token.run_until_cancelled(ticks.tick()).await.is_some() {
        let Some(store) = store.upgrade() else { return };
        match token.run_until_cancelled(store.purge_expired()).await {
            None => return,
            Some(Ok(n)) => {
                purged.fetch_add(n, Ordering::Relaxed);
                if n > 0 {
                    tracing::debug!(table = %store.table, rows = n, "purged expired idempotency rows");
                }
            }
            Some(Err(e)) => {
                tracing::warn!(table = %store.table, error = %e, "could not purge expired idempotency rows; trying again at the next interval");
            }
        }
    }
}
