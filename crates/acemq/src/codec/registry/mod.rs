//! Schema registries (feature `avro`): where a registered Avro message's schema id comes
//! from and goes back to.
//!
//! This module owns the [`SchemaRegistry`] trait (register a schema under a subject, fetch a
//! schema by id), its error type, and [`InMemorySchemaRegistry`] for tests and single-process
//! use. The Confluent-compatible REST client, `ConfluentRegistry`, is behind the
//! `schema-registry` feature.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;

#[cfg(feature = "schema-registry")]
mod rest;
#[cfg(feature = "schema-registry")]
pub use self::rest::ConfluentRegistry;

/// Why a registry could not register or find a schema.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No schema has this id.
    #[error(
        "schema id {id} is not in the registry; was the message written against another registry?"
    )]
    UnknownId {
        /// The id asked for.
        id: u32,
    },
    /// The registry could not be reached or answered with something that is not the REST
    /// API's shape.
    #[error("schema registry at {url} failed: {reason}; check the URL and that the registry is up")]
    Unreachable {
        /// The request's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The registry answered with an error status.
    #[error("schema registry refused {url}: HTTP {status}: {body}")]
    Refused {
        /// The request's URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The answer's body (Confluent's `{"error_code":…,"message":…}`).
        body: String,
    },
    /// A schema is not valid Avro.
    #[error("invalid Avro schema: {reason}; fix the schema text")]
    InvalidSchema {
        /// The parser's message.
        reason: String,
    },
}

/// A schema registry: schemas registered under a subject get a numeric id, and an id gives
/// the schema text back. Registering the same schema text again returns the same id.
///
/// Both methods return boxed futures so the trait can be used as `Arc<dyn SchemaRegistry>`.
///
/// ```
/// use acemq::codec::registry::{InMemorySchemaRegistry, SchemaRegistry};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let r = InMemorySchemaRegistry::new();
/// let id = r.register("orders-value", r#""string""#).await.unwrap();
/// assert_eq!(r.register("orders-value", r#""string""#).await.unwrap(), id);
/// assert_eq!(&*r.schema(id).await.unwrap(), r#""string""#);
/// # }
/// ```
pub trait SchemaRegistry: Send + Sync + 'static {
    /// Registers `schema` under `subject` and returns its id; idempotent by content.
    fn register<'a>(
        &'a self,
        subject: &'a str,
        schema: &'a str,
    ) -> BoxFuture<'a, Result<u32, RegistryError>>;

    /// The schema text with this id.
    fn schema(&self, id: u32) -> BoxFuture<'_, Result<Arc<str>, RegistryError>>;
}

/// A registry in memory, for tests and single-process use: ids count up from 1, the same
/// schema text always gets the same id (whatever the subject, as Confluent's ids are
/// global), and [`with_schema`](InMemorySchemaRegistry::with_schema) pins a schema at a
/// given id (to read bodies another member wrote with id 7).
///
/// ```
/// use acemq::codec::registry::{InMemorySchemaRegistry, SchemaRegistry};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let r = InMemorySchemaRegistry::new().with_schema(7, r#""long""#);
/// assert_eq!(&*r.schema(7).await.unwrap(), r#""long""#);
/// assert!(r.schema(8).await.is_err());
/// # }
/// ```
#[derive(Debug, Default)]
pub struct InMemorySchemaRegistry {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    by_id: HashMap<u32, Arc<str>>,
    by_text: HashMap<Arc<str>, u32>,
    next: u32,
}

impl InMemorySchemaRegistry {
    /// An empty registry.
    ///
    /// ```
    /// let r = acemq::codec::registry::InMemorySchemaRegistry::new();
    /// # let _ = r;
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `schema` at `id` (replacing what was there); later registrations get ids above
    /// every pinned one.
    ///
    /// ```
    /// let r = acemq::codec::registry::InMemorySchemaRegistry::new().with_schema(101, r#""int""#);
    /// # let _ = r;
    /// ```
    #[must_use]
    pub fn with_schema(self, id: u32, schema: &str) -> Self {
        {
            let mut s = self.lock();
            let text: Arc<str> = Arc::from(schema);
            s.by_id.insert(id, text.clone());
            s.by_text.insert(text, id);
            s.next = s.next.max(id);
        }
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-written.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SchemaRegistry for InMemorySchemaRegistry {
    fn register<'a>(
        &'a self,
        _subject: &'a str,
        schema: &'a str,
    ) -> BoxFuture<'a, Result<u32, RegistryError>> {
        let mut s = self.lock();
        let id = match s.by_text.get(schema) {
            Some(id) => *id,
            None => {
                s.next += 1;
                let id = s.next;
                let text: Arc<str> = Arc::from(schema);
                s.by_id.insert(id, text.clone());
                s.by_text.insert(text, id);
                id
            }
        };
        Box::pin(std::future::ready(Ok(id)))
    }

    fn schema(&self, id: u32) -> BoxFuture<'_, Result<Arc<str>, RegistryError>> {
        let found = self.lock().by_id.get(&id).cloned();
        Box::pin(std::future::ready(
            found.ok_or(RegistryError::UnknownId { id }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn in_memory_ids_are_by_content_and_above_pinned_ones() {
        let r = InMemorySchemaRegistry::new().with_schema(7, "\"a\"");
        let reg = |s: &str| r.register("s", s).now_or_never().unwrap().unwrap();
        assert_eq!(reg("\"a\""), 7);
        assert_eq!(reg("\"b\""), 8);
        assert_eq!(reg("\"b\""), 8);
        assert!(matches!(
            r.schema(9).now_or_never().unwrap(),
            Err(RegistryError::UnknownId { id: 9 })
        ));
    }
}
