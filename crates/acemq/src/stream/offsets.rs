//! Stream offsets that survive a restart: an [`OffsetStore`] keeps, per stream and reader
//! name, the offset of the last entry the reader finished with (handled, skipped, or
//! acked as a duplicate), and a reader given one ([`StreamReader::offsets`]) resumes just
//! after it. [`MemoryOffsetStore`] is the in-process one; `acemq-sql` has the SQL one.
//!
//! A commit is made after an entry is finished, never before, so a crash between the
//! handler and the commit reads that entry again on restart (at least once): pair the
//! reader with an idempotency store when that matters.
//!
//! [`StreamReader::offsets`]: super::StreamReader::offsets

use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::BoxFuture;

use crate::idempotency::StoreError;
use crate::util::lock;

/// Keeps the last finished offset of each named stream reader.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::idempotency::StoreError> {
/// use acemq::stream::{MemoryOffsetStore, OffsetStore};
/// let store = MemoryOffsetStore::new();
/// assert_eq!(store.load("audit", "indexer").await?, None);
/// store.commit("audit", "indexer", 41).await?;
/// assert_eq!(store.load("audit", "indexer").await?, Some(41));
/// # Ok(()) }
/// ```
pub trait OffsetStore: Send + Sync + 'static {
    /// The last offset `reader` finished with on `stream`, if it committed one.
    fn load<'a>(
        &'a self,
        stream: &'a str,
        reader: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>>;

    /// Records that `reader` finished with `offset` on `stream`. A commit lower than the
    /// one stored is ignored (entries are finished in order; an older commit can only be a
    /// late one).
    fn commit<'a>(
        &'a self,
        stream: &'a str,
        reader: &'a str,
        offset: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// A shared store is a store (one store for several readers, or one kept by the test that
/// started them).
impl<S: OffsetStore> OffsetStore for std::sync::Arc<S> {
    fn load<'a>(
        &'a self,
        stream: &'a str,
        reader: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        (**self).load(stream, reader)
    }

    fn commit<'a>(
        &'a self,
        stream: &'a str,
        reader: &'a str,
        offset: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).commit(stream, reader, offset)
    }
}

/// An [`OffsetStore`] in this process's memory (tests, and readers that only need to
/// survive a reconnect, which they do without a store).
#[derive(Debug, Default)]
pub struct MemoryOffsetStore {
    offsets: Mutex<HashMap<(String, String), u64>>,
}

impl MemoryOffsetStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl OffsetStore for MemoryOffsetStore {
    fn load<'a>(
        &'a self,
        stream: &'a str,
        reader: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        let found = lock(&self.offsets)
            .get(&(stream.to_owned(), reader.to_owned()))
            .copied();
        Box::pin(async move { Ok(found) })
    }

    fn commit<'a>(
        &'a self,
        stream: &'a str,
        reader: &'a str,
        offset: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut all = lock(&self.offsets);
        let slot = all
            .entry((stream.to_owned(), reader.to_owned()))
            .or_insert(offset);
        *slot = (*slot).max(offset);
        Box::pin(async { Ok(()) })
    }
}
