//! The stores that come with the claim-check codec: in memory (tests, one process) and a
//! directory (shared by every process that mounts it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ::bytes::Bytes;

use super::{ClaimCheckError, ClaimCheckStore};
use crate::transport::BoxFuture;

/// Payloads in a map, keyed by fresh UUIDs. For tests and single-process use.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use acemq::codec::claim::{ClaimCheckStore, InMemoryClaimCheckStore};
/// let s = InMemoryClaimCheckStore::new();
/// let k = s.put(bytes::Bytes::from_static(b"x")).await.unwrap();
/// assert_eq!(s.len(), 1);
/// s.delete(&k).await.unwrap();
/// assert!(s.get(&k).await.unwrap().is_none());
/// # }
/// ```
#[derive(Debug, Default)]
pub struct InMemoryClaimCheckStore {
    entries: Mutex<HashMap<String, Bytes>>,
}

impl InMemoryClaimCheckStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many payloads it holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bytes>> {
        // A panic elsewhere while holding the lock leaves a map that is still consistent.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ClaimCheckStore for InMemoryClaimCheckStore {
    fn put(&self, content: Bytes) -> BoxFuture<'_, Result<String, ClaimCheckError>> {
        let key = uuid::Uuid::new_v4().to_string();
        self.lock().insert(key.clone(), content);
        Box::pin(async move { Ok(key) })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, ClaimCheckError>> {
        let found = self.lock().get(key).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), ClaimCheckError>> {
        self.lock().remove(key);
        Box::pin(async { Ok(()) })
    }
}

/// Payloads as files in a directory, one per key: written to a temporary file and renamed,
/// so a reader never sees half a payload. Keys are UUIDs and nothing else is accepted, so a
/// key from a body cannot reach outside the directory. File I/O runs on the calling thread.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use acemq::codec::claim::{ClaimCheckStore, FilesystemClaimCheckStore};
/// let dir = std::env::temp_dir().join(format!("acemq-doc-claims-{}", std::process::id()));
/// let s = FilesystemClaimCheckStore::new(&dir).unwrap();
/// let k = s.put(bytes::Bytes::from_static(b"x")).await.unwrap();
/// assert_eq!(s.get(&k).await.unwrap().as_deref(), Some(&b"x"[..]));
/// assert!(s.get("../etc/passwd").await.is_err());
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FilesystemClaimCheckStore {
    dir: PathBuf,
}

impl FilesystemClaimCheckStore {
    /// A store in `dir`, created if missing.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self, ClaimCheckError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
        Ok(FilesystemClaimCheckStore { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> Result<PathBuf, ClaimCheckError> {
        let id = uuid::Uuid::parse_str(key).map_err(|e| ClaimCheckError::InvalidKey {
            key: key.to_owned(),
            why: format!("the filesystem store's keys are UUIDs: {e}"),
        })?;
        Ok(self.dir.join(id.hyphenated().to_string()))
    }

    fn write(&self, content: &[u8]) -> Result<String, ClaimCheckError> {
        let key = uuid::Uuid::new_v4().to_string();
        let path = self.path(&key)?;
        let tmp = self.dir.join(format!(".{key}.tmp"));
        std::fs::write(&tmp, content).map_err(|e| io("write", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("rename", &path, e))?;
        Ok(key)
    }

    fn read(&self, key: &str) -> Result<Option<Bytes>, ClaimCheckError> {
        let path = self.path(key)?;
        match std::fs::read(&path) {
            Ok(b) => Ok(Some(Bytes::from(b))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", &path, e)),
        }
    }

    fn remove(&self, key: &str) -> Result<(), ClaimCheckError> {
        let path = self.path(key)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("delete", &path, e)),
            _ => Ok(()),
        }
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> ClaimCheckError {
    ClaimCheckError::Store(format!("could not {what} {}: {e}", path.display()))
}

impl ClaimCheckStore for FilesystemClaimCheckStore {
    fn put(&self, content: Bytes) -> BoxFuture<'_, Result<String, ClaimCheckError>> {
        let r = self.write(&content);
        Box::pin(async move { r })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, ClaimCheckError>> {
        let r = self.read(key);
        Box::pin(async move { r })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), ClaimCheckError>> {
        let r = self.remove(key);
        Box::pin(async move { r })
    }
}
