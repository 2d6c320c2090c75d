//! [`RegisteredAvro`]: Confluent-framed Avro (`00`, a 4-byte big-endian schema id, the
//! datum) whose schemas live in a schema registry, with the framing helpers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ::bytes::{BufMut, Bytes, BytesMut};
use apache_avro::Schema;
use futures::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{parse, read_datum, write_datum};
use crate::codec::known::Format;
use crate::codec::registry::{RegistryError, SchemaRegistry};
use crate::codec::{AVRO_REGISTERED, Decoder, Encoder, given, refused};
use crate::error::Error;

/// The Confluent framing's magic byte.
const MAGIC: u8 = 0;

/// Avro with its schema in a registry: writes `application/vnd.acemq.avro` bodies framed
/// `00 {schema id, 4 bytes big-endian} {datum}` (Confluent's framing, byte for byte what
/// the Java, Go, .NET, Python and Ruby members write); accepts that content type or none.
///
/// Reading takes the writer's schema from the registry by the body's id, then:
/// - with a reader schema (the codec's own schema when built with
///   [`new`](RegisteredAvro::new), or one given to
///   [`with_reader_schema`](RegisteredAvro::with_reader_schema)) the record is **resolved**
///   onto it: fields the writer lacks take the reader's defaults, fields the reader lacks
///   are dropped (the fixture column `resolved`);
/// - without one ([`reader`](RegisteredAvro::reader),
///   [`without_reader_schema`](RegisteredAvro::without_reader_schema)) it arrives in the
///   **writer's shape** (the column `writerShape`).
///
/// Schemas fetched by id are cached for the codec's life. Decoding is synchronous: an id
/// not yet cached is fetched at once from a registry that answers without waiting (the
/// in-memory one, a REST client's cache), otherwise by blocking the worker thread on a
/// multi-thread tokio runtime; on a current-thread runtime call
/// [`preload`](RegisteredAvro::preload) with the ids you expect.
///
/// ```
/// use std::sync::Arc;
/// use acemq::codec::{Decoder, Encoder, RegisteredAvro};
/// use acemq::codec::registry::InMemorySchemaRegistry;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let registry = Arc::new(InMemorySchemaRegistry::new());
/// let avro = RegisteredAvro::new(registry, "n-value", r#""long""#).await.unwrap();
/// let body = avro.encode(&7_i64).unwrap();
/// assert_eq!(&body[..], b"\x00\x00\x00\x00\x01\x0e");
/// let n: i64 = avro.decode(Some("application/vnd.acemq.avro"), &body).unwrap();
/// assert_eq!(n, 7);
/// # }
/// ```
#[derive(Clone)]
pub struct RegisteredAvro {
    registry: Arc<dyn SchemaRegistry>,
    writer: Option<(u32, Arc<Schema>)>,
    reader: Option<Arc<Schema>>,
    cache: Arc<Mutex<HashMap<u32, Arc<Schema>>>>,
}

impl std::fmt::Debug for RegisteredAvro {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredAvro")
            .field("schema_id", &self.schema_id())
            .field("resolves", &self.reader.is_some())
            .finish_non_exhaustive()
    }
}

fn invalid(e: Error) -> RegistryError {
    RegistryError::InvalidSchema {
        reason: e.to_string(),
    }
}

impl RegisteredAvro {
    /// Registers `schema` under `subject` (idempotent: the same text gets the same id) and
    /// returns a codec that writes with it and resolves what it reads onto it.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use acemq::codec::{RegisteredAvro, registry::InMemorySchemaRegistry};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let r = Arc::new(InMemorySchemaRegistry::new().with_schema(7, r#""string""#));
    /// let avro = RegisteredAvro::new(r, "s", r#""string""#).await.unwrap();
    /// assert_eq!(avro.schema_id(), Some(7));
    /// # }
    /// ```
    pub async fn new(
        registry: Arc<dyn SchemaRegistry>,
        subject: &str,
        schema: &str,
    ) -> Result<Self, RegistryError> {
        let parsed = Arc::new(parse(schema).map_err(invalid)?);
        let id = registry.register(subject, schema).await?;
        let codec = Self::reader(registry);
        codec.remember(id, parsed.clone());
        Ok(Self {
            writer: Some((id, parsed.clone())),
            reader: Some(parsed),
            ..codec
        })
    }

    /// A codec that only reads, each record in its writer's shape (no reader schema).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use acemq::codec::{RegisteredAvro, registry::InMemorySchemaRegistry};
    /// let avro = RegisteredAvro::reader(Arc::new(InMemorySchemaRegistry::new()));
    /// assert_eq!(avro.schema_id(), None);
    /// ```
    pub fn reader(registry: Arc<dyn SchemaRegistry>) -> Self {
        Self {
            registry,
            writer: None,
            reader: None,
            cache: Arc::default(),
        }
    }

    /// Resolves what this codec reads onto `schema` (column `resolved`).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use acemq::codec::{RegisteredAvro, registry::InMemorySchemaRegistry};
    /// let avro = RegisteredAvro::reader(Arc::new(InMemorySchemaRegistry::new()))
    ///     .with_reader_schema(r#""long""#)
    ///     .unwrap();
    /// # let _ = avro;
    /// ```
    pub fn with_reader_schema(self, schema: &str) -> Result<Self, RegistryError> {
        Ok(Self {
            reader: Some(Arc::new(parse(schema).map_err(invalid)?)),
            ..self
        })
    }

    /// Reads each record in its writer's shape (column `writerShape`), even when this codec
    /// writes with a schema of its own.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use acemq::codec::{RegisteredAvro, registry::InMemorySchemaRegistry};
    /// let avro = RegisteredAvro::reader(Arc::new(InMemorySchemaRegistry::new()))
    ///     .without_reader_schema();
    /// # let _ = avro;
    /// ```
    #[must_use]
    pub fn without_reader_schema(self) -> Self {
        Self {
            reader: None,
            ..self
        }
    }

    /// The id this codec writes, if it writes.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use acemq::codec::{RegisteredAvro, registry::InMemorySchemaRegistry};
    /// assert_eq!(RegisteredAvro::reader(Arc::new(InMemorySchemaRegistry::new())).schema_id(), None);
    /// ```
    pub fn schema_id(&self) -> Option<u32> {
        self.writer.as_ref().map(|(id, _)| *id)
    }

    /// Fetches and caches the schemas with these ids now, so decoding never waits for the
    /// registry (needed on a current-thread runtime with a remote registry).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use acemq::codec::{RegisteredAvro, registry::InMemorySchemaRegistry};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let r = Arc::new(InMemorySchemaRegistry::new().with_schema(7, r#""long""#));
    /// RegisteredAvro::reader(r).preload(&[7]).await.unwrap();
    /// # }
    /// ```
    pub async fn preload(&self, ids: &[u32]) -> Result<(), RegistryError> {
        for &id in ids {
            let text = self.registry.schema(id).await?;
            self.remember(id, Arc::new(parse(&text).map_err(invalid)?));
        }
        Ok(())
    }

    fn remember(&self, id: u32, schema: Arc<Schema>) {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, schema);
    }

    /// The writer's schema for `id`: cached, or fetched (see the type's docs).
    fn writer_schema(&self, id: u32) -> Result<Arc<Schema>, Error> {
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned();
        if let Some(schema) = cached {
            return Ok(schema);
        }
        let fetch = self.registry.schema(id);
        let text = match fetch.now_or_never() {
            Some(answer) => answer,
            None => block_on_registry(self.registry.schema(id), id)?,
        }
        .map_err(|e| Error::Decode {
            reason: format!("cannot get the writer's schema {id}: {e}"),
        })?;
        let schema = Arc::new(parse(&text).map_err(|e| Error::Decode {
            reason: format!("the registry's schema {id} is not valid Avro: {e}"),
        })?);
        self.remember(id, schema.clone());
        Ok(schema)
    }
}

/// Waits for a registry answer from synchronous code: only on a multi-thread runtime.
fn block_on_registry<T>(fetch: futures::future::BoxFuture<'_, T>, id: u32) -> Result<T, Error> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            Ok(tokio::task::block_in_place(|| h.block_on(fetch)))
        }
        _ => Err(Error::Decode {
            reason: format!(
                "schema id {id} is not cached and the registry cannot be asked from this thread; call RegisteredAvro::preload(&[{id}]) first or consume on a multi-thread runtime"
            ),
        }),
    }
}

/// Frames an Avro datum the Confluent way: `00`, `schema_id` big-endian, `datum`.
///
/// ```
/// use acemq::codec::avro::{frame, unframe};
/// let body = frame(7, b"\x06o-1");
/// assert_eq!(&body[..], b"\x00\x00\x00\x00\x07\x06o-1");
/// assert_eq!(unframe(&body).unwrap(), (7, &b"\x06o-1"[..]));
/// ```
pub fn frame(schema_id: u32, datum: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + datum.len());
    out.put_u8(MAGIC);
    out.put_u32(schema_id);
    out.put_slice(datum);
    out.freeze()
}

/// Splits a Confluent-framed body into its schema id and datum (an operator can read the
/// id of a body without any schema); an error when the body is not framed.
///
/// ```
/// use acemq::codec::avro::unframe;
/// assert!(unframe(b"\x06o-1").is_err());
/// ```
pub fn unframe(body: &[u8]) -> Result<(u32, &[u8]), Error> {
    match body {
        [MAGIC, a, b, c, d, datum @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), datum)),
        _ => Err(Error::Decode {
            reason: "not a Confluent-framed Avro body (00, 4-byte schema id, datum); was it written as avro/binary?".into(),
        }),
    }
}

impl<T: Serialize + ?Sized> Encoder<T> for RegisteredAvro {
    fn content_type(&self) -> &str {
        AVRO_REGISTERED
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        let Some((id, schema)) = &self.writer else {
            return Err(Error::Encode {
                content_type: AVRO_REGISTERED.into(),
                reason: "this RegisteredAvro only reads; build it with RegisteredAvro::new(registry, subject, schema) to write".into(),
            });
        };
        let datum = write_datum(schema, value, AVRO_REGISTERED)?;
        Ok(frame(*id, &datum))
    }
}

impl<T: DeserializeOwned> Decoder<T> for RegisteredAvro {
    fn expects(&self) -> &str {
        "registered Avro (application/vnd.acemq.avro)"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        given(content_type).is_none_or(|ct| Format::AvroRegistered.names(ct))
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if let Some(ct) = given(content_type).filter(|ct| !Format::AvroRegistered.names(ct)) {
            return Err(refused(ct, "registered Avro (application/vnd.acemq.avro)"));
        }
        let (id, datum) = unframe(body)?;
        let writer = self.writer_schema(id)?;
        // A body written with this codec's own schema needs no resolution onto it.
        let reader = match (&self.writer, &self.reader) {
            (Some((own, schema)), Some(reader)) if *own == id && Arc::ptr_eq(schema, reader) => {
                None
            }
            _ => self.reader.as_deref(),
        };
        read_datum(&writer, reader, datum)
    }
}
