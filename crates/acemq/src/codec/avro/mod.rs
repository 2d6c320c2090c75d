//! Avro (feature `avro`) on the Apache project's own Rust implementation, `apache-avro`
//! (built with no default features: no compression codecs, which single-datum messages do
//! not use). [`Avro`] reads and writes unframed bodies against one fixed schema
//! (`avro/binary`); [`RegisteredAvro`] reads and writes Confluent-framed bodies whose
//! schema lives in a [`SchemaRegistry`](super::registry::SchemaRegistry)
//! (`application/vnd.acemq.avro`).
//!
//! Payloads go through serde: a struct's fields map to the record's fields by name, and
//! decoding into `serde_json::Value` gives the record as a JSON object.

use ::bytes::Bytes;
use apache_avro::Schema;
use apache_avro::types::Value;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::known::Format;
use super::{AVRO, Decoder, Encoder, given, refused};
use crate::error::Error;

mod registered;

pub use self::registered::{RegisteredAvro, frame, unframe};

/// Avro with one fixed schema, unframed: writes `avro/binary`; accepts `avro/*`,
/// `application/avro`, `application/*+avro` or no content type (not the registered
/// `application/vnd.acemq.avro`, which is framed).
///
/// ```
/// use acemq::codec::{Avro, Decoder, Encoder};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Order { #[serde(rename = "orderId")] order_id: String, total: i64 }
/// let avro = Avro::new(r#"{"type":"record","name":"Order","fields":[
///     {"name":"orderId","type":"string"},{"name":"total","type":"long"}]}"#).unwrap();
/// let body = avro.encode(&Order { order_id: "o-1".into(), total: 5 }).unwrap();
/// assert_eq!(&body[..], b"\x06o-1\x0a");
/// let back: Order = avro.decode(Some("avro/binary"), &body).unwrap();
/// assert_eq!(back.total, 5);
/// ```
#[derive(Clone, Debug)]
pub struct Avro {
    schema: Schema,
}

impl Avro {
    /// A codec for `schema` (Avro's JSON schema text).
    ///
    /// ```
    /// use acemq::codec::Avro;
    /// assert!(Avro::new(r#""long""#).is_ok());
    /// assert!(Avro::new("{not a schema").is_err());
    /// ```
    pub fn new(schema: &str) -> Result<Self, Error> {
        Ok(Self {
            schema: parse(schema)?,
        })
    }

    /// The schema this codec writes and reads.
    ///
    /// ```
    /// let avro = acemq::codec::Avro::new(r#""long""#).unwrap();
    /// assert_eq!(avro.schema().canonical_form(), r#""long""#);
    /// ```
    pub fn schema(&self) -> &Schema {
        &self.schema
    }
}

impl<T: Serialize + ?Sized> Encoder<T> for Avro {
    fn content_type(&self) -> &str {
        AVRO
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        write_datum(&self.schema, value, AVRO).map(Bytes::from)
    }
}

impl<T: DeserializeOwned> Decoder<T> for Avro {
    fn expects(&self) -> &str {
        "Avro with a fixed schema (avro/binary)"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        given(content_type).is_none_or(|ct| Format::Avro.names(ct))
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if let Some(ct) = given(content_type).filter(|ct| !Format::Avro.names(ct)) {
            return Err(refused(ct, "Avro with a fixed schema (avro/binary)"));
        }
        read_datum(&self.schema, None, body)
    }
}

/// Parses a schema, the error saying what to fix.
pub(crate) fn parse(schema: &str) -> Result<Schema, Error> {
    Schema::parse_str(schema).map_err(|e| Error::Config(format!("invalid Avro schema: {e}")))
}

/// Serializes `value` with `schema` (ints widened to the schema's longs and so on).
fn write_datum<T: Serialize + ?Sized>(
    schema: &Schema,
    value: &T,
    content_type: &str,
) -> Result<Vec<u8>, Error> {
    let fail = |e: apache_avro::Error| Error::Encode {
        content_type: content_type.into(),
        reason: format!("does not fit the Avro schema: {e}"),
    };
    let value = apache_avro::to_value(value)
        .and_then(|v| v.resolve(schema))
        .map_err(fail)?;
    apache_avro::to_avro_datum(schema, value).map_err(fail)
}

/// Reads one datum written with `writer`, resolved onto `reader` when given, into `T`.
fn read_datum<T: DeserializeOwned>(
    writer: &Schema,
    reader: Option<&Schema>,
    body: &[u8],
) -> Result<T, Error> {
    let mut rest = body;
    let value: Value =
        apache_avro::from_avro_datum(writer, &mut rest, reader).map_err(|e| Error::Decode {
            reason: format!("invalid Avro body for its schema: {e}"),
        })?;
    if !rest.is_empty() {
        return Err(Error::Decode {
            reason: format!(
                "Avro body has {} bytes after the datum: written with another schema?",
                rest.len()
            ),
        });
    }
    apache_avro::from_value(&value).map_err(|e| Error::Decode {
        reason: format!(
            "Avro record does not fit {}: {e}",
            std::any::type_name::<T>()
        ),
    })
}
