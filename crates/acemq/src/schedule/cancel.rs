//! Cancelling a scheduled message: a store of cancelled ids ([`CancelStore`]) that a
//! scheduler asks when a message it carries falls due. `acemq-sql` has the durable one
//! (`SqlCancelStore`); [`MemoryCancelStore`] is for tests and single-process use.
//!
//! Honest limits: a cancellation works only where a Rust scheduler with the same store
//! delivers the message (another member's scheduler knows nothing of it), and only for
//! messages whose own id travels with them (scheduled by a Rust process).

use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::BoxFuture;

/// How long a cancellation is kept after the message it cancelled fell due: a copy of the
/// message the broker redelivers (a scheduler crashed between delivering and acking) is
/// still recognised within it.
pub const CANCELLED_KEPT_AFTER_DUE_MS: i64 = 3_600_000;

/// How long a cancellation no delivery ever reached is kept (the id was never scheduled,
/// or another member's scheduler delivered it).
pub const CANCELLED_KEPT_UNSEEN_MS: i64 = 400 * 86_400_000;

pub use crate::error::CancelError;

/// Remembers which scheduled messages must not be delivered, by message id.
///
/// Times are epoch milliseconds from the scheduler's clock (which follows tokio's paused
/// clock in tests).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::schedule::CancelError> {
/// use acemq::schedule::{CancelStore, MemoryCancelStore};
/// let store = MemoryCancelStore::default();
/// store.cancel("reminder-1", 1_000).await?;
/// assert!(store.is_cancelled("reminder-1", 5_000).await?);
/// assert!(!store.is_cancelled("reminder-2", 5_000).await?);
/// # Ok(()) }
/// ```
pub trait CancelStore: Send + Sync + 'static {
    /// Records that `id` must not be delivered (cancelling twice is one cancellation).
    fn cancel<'a>(&'a self, id: &'a str, now_ms: i64) -> BoxFuture<'a, Result<(), CancelError>>;

    /// Whether `id` was cancelled; asked when the message falls due (`due_at_ms`), which
    /// the store remembers to know when it may forget the cancellation.
    fn is_cancelled<'a>(
        &'a self,
        id: &'a str,
        due_at_ms: i64,
    ) -> BoxFuture<'a, Result<bool, CancelError>>;

    /// Forgets what is no longer needed: cancellations whose message fell due more than
    /// [`CANCELLED_KEPT_AFTER_DUE_MS`] ago, and those no delivery reached within
    /// [`CANCELLED_KEPT_UNSEEN_MS`]. Returns how many went.
    fn purge(&self, now_ms: i64) -> BoxFuture<'_, Result<u64, CancelError>>;
}

impl<S: CancelStore + ?Sized> CancelStore for std::sync::Arc<S> {
    fn cancel<'a>(&'a self, id: &'a str, now_ms: i64) -> BoxFuture<'a, Result<(), CancelError>> {
        (**self).cancel(id, now_ms)
    }
    fn is_cancelled<'a>(
        &'a self,
        id: &'a str,
        due_at_ms: i64,
    ) -> BoxFuture<'a, Result<bool, CancelError>> {
        (**self).is_cancelled(id, due_at_ms)
    }
    fn purge(&self, now_ms: i64) -> BoxFuture<'_, Result<u64, CancelError>> {
        (**self).purge(now_ms)
    }
}

/// Cancellations in this process's memory: lost on restart, seen by this process's
/// schedulers only.
#[derive(Debug, Default)]
pub struct MemoryCancelStore {
    /// id → (cancelled at, due at once a delivery asked).
    entries: Mutex<HashMap<String, (i64, Option<i64>)>>,
}

impl MemoryCancelStore {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, Option<i64>)>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Cancellations held now.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CancelStore for MemoryCancelStore {
    fn cancel<'a>(&'a self, id: &'a str, now_ms: i64) -> BoxFuture<'a, Result<(), CancelError>> {
        Box::pin(async move {
            self.entries()
                .entry(id.to_owned())
                .or_insert((now_ms, None));
            Ok(())
        })
    }

    fn is_cancelled<'a>(
        &'a self,
        id: &'a str,
        due_at_ms: i64,
    ) -> BoxFuture<'a, Result<bool, CancelError>> {
        Box::pin(async move {
            Ok(match self.entries().get_mut(id) {
                Some((_, due)) => {
                    due.get_or_insert(due_at_ms);
                    true
                }
                None => false,
            })
        })
    }

    fn purge(&self, now_ms: i64) -> BoxFuture<'_, Result<u64, CancelError>> {
        Box::pin(async move {
            let mut entries = self.entries();
            let before = entries.len();
            entries.retain(|_, (cancelled, due)| match due {
                Some(due) => now_ms - *due <= CANCELLED_KEPT_AFTER_DUE_MS,
                None => now_ms - *cancelled <= CANCELLED_KEPT_UNSEEN_MS,
            });
            Ok(u64::try_from(before - entries.len()).unwrap_or(u64::MAX))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cancellation_is_forgotten_an_hour_after_its_due_time() {
        let store = MemoryCancelStore::default();
        store.cancel("a", 0).await.unwrap();
        store.cancel("never-seen", 0).await.unwrap();
        assert!(store.is_cancelled("a", 10_000).await.unwrap());
        assert_eq!(
            store
                .purge(10_000 + CANCELLED_KEPT_AFTER_DUE_MS)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            store
                .purge(10_001 + CANCELLED_KEPT_AFTER_DUE_MS)
                .await
                .unwrap(),
            1
        );
        assert!(!store.is_cancelled("a", 10_000).await.unwrap());
        assert_eq!(store.len(), 1);
        assert_eq!(store.purge(CANCELLED_KEPT_UNSEEN_MS + 1).await.unwrap(), 1);
        assert!(store.is_empty());
    }
}
