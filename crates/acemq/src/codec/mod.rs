//! Codecs: how a payload becomes a body and back.
//!
//! This module owns content types and body encoding. JSON is the default
//! (`application/json`; `text/json` and `application/*+json` are read as JSON too), text
//! (`text/plain; charset=utf-8`) and raw bytes (`application/octet-stream`) are the others.
//! Each [`Decoder`] says which delivered `content_type`s it [accepts](Decoder::accepts):
//! a body whose content type names another format is refused with [`Error::Decode`] rather
//! than misread, and the consumer parks it. With no content type, the bytes are tried as the
//! decoder's own format. The accepted aliases are listed in `docs/wire.md` ("Content types").
//!
//! | codec | writes | accepts |
//! |---|---|---|
//! | [`Json`] | `application/json` | `application/json`, `text/json`, `application/*+json`, none |
//! | [`Text`] | `text/plain; charset=utf-8` | `text/*`, none |
//! | [`RawBytes`] | `application/octet-stream` | any content type, none |
//!
//! Parameters (`; charset=utf-8`) are ignored and the comparison is case-insensitive; an
//! empty content type counts as none.
//!
//! The family's other formats are each behind their own cargo feature (`docs/codecs.md` has
//! the table and why each crate was chosen): `yaml` ([`Yaml`]), `toml` ([`Toml`]), `xml`
//! ([`Xml`]), `avro` ([`Avro`], [`RegisteredAvro`] and the [`registry`]), `schema-registry`
//! (the Confluent-compatible REST client) and `protobuf` ([`Protobuf`]). A consumer that reads
//! several formats takes a [`Composite`]; a body in a content type whose feature is off is
//! refused with a reason that names the feature.

// The module docs link every codec; in a build without some of their features those links
// have nothing to point at (docs.rs and CI document with every feature).
#![cfg_attr(
    not(all(
        feature = "yaml",
        feature = "toml",
        feature = "xml",
        feature = "avro",
        feature = "protobuf"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]

use ::bytes::Bytes;

use crate::error::Error;

mod bytes;
mod composite;
mod json;
mod known;
mod text;

pub use self::composite::Composite;
pub use self::known::feature_for;

// The family's other codecs and the wrappers (`docs/codecs.md`), each behind its own feature.
#[cfg(feature = "avro")]
pub mod avro;
#[cfg(feature = "claim-check")]
pub mod claim;
#[cfg(feature = "encryption")]
pub mod encrypt;
#[cfg(feature = "protobuf")]
pub mod protobuf;
#[cfg(feature = "avro")]
pub mod registry;
#[cfg(feature = "toml")]
mod toml;
#[cfg(feature = "xml")]
pub mod xml;
#[cfg(feature = "yaml")]
mod yaml;

#[cfg(feature = "avro")]
pub use self::avro::{Avro, RegisteredAvro};
#[cfg(feature = "protobuf")]
pub use self::protobuf::Protobuf;
#[cfg(feature = "toml")]
pub use self::toml::Toml;
#[cfg(feature = "xml")]
pub use self::xml::Xml;
#[cfg(feature = "yaml")]
pub use self::yaml::Yaml;

pub use self::bytes::RawBytes;
pub use self::json::Json;
pub use self::text::Text;

/// `application/json`
pub const JSON: &str = "application/json";
/// `text/plain; charset=utf-8`
pub const TEXT: &str = "text/plain; charset=utf-8";
/// `application/octet-stream`
pub const BYTES: &str = "application/octet-stream";
/// `application/yaml` (the YAML codec's, feature `yaml`)
pub const YAML: &str = "application/yaml";
/// `application/toml` (the TOML codec's, feature `toml`)
pub const TOML: &str = "application/toml";
/// `application/xml` (the XML codec's, feature `xml`)
pub const XML: &str = "application/xml";
/// `avro/binary` (Avro with a fixed schema, feature `avro`)
pub const AVRO: &str = "avro/binary";
/// `application/vnd.acemq.avro` (Confluent-framed registered Avro, feature `avro`)
pub const AVRO_REGISTERED: &str = "application/vnd.acemq.avro";
/// `application/x-protobuf` (feature `protobuf`)
pub const PROTOBUF: &str = "application/x-protobuf";

/// Turns a payload into body bytes.
///
/// ```
/// use acemq::codec::{Encoder, Json};
/// let body = Json.encode(&vec![1, 2]).unwrap();
/// assert_eq!(&body[..], b"[1,2]");
/// assert_eq!(Encoder::<Vec<i32>>::content_type(&Json), "application/json");
/// ```
pub trait Encoder<T: ?Sized>: Send + Sync + 'static {
    /// The content type written on the message.
    fn content_type(&self) -> &str;
    /// Encodes a payload.
    fn encode(&self, value: &T) -> Result<Bytes, Error>;
}

/// Turns body bytes back into a payload.
///
/// ```
/// use acemq::codec::{Decoder, Json};
/// let v: Vec<i32> = Json.decode(Some("application/json"), b"[1,2]").unwrap();
/// assert_eq!(v, vec![1, 2]);
/// assert!(Decoder::<Vec<i32>>::decode(&Json, Some("text/plain"), b"[1]").is_err());
/// assert!(!Decoder::<Vec<i32>>::accepts(&Json, Some("text/plain")));
/// ```
///
/// A decoder of your own says which content types it reads by overriding
/// [`accepts`](Decoder::accepts); the default accepts every one and leaves the check to
/// [`decode`](Decoder::decode):
///
/// ```
/// use acemq::codec::Decoder;
/// use acemq::Error;
///
/// struct Csv;
/// impl Decoder<Vec<String>> for Csv {
///     fn accepts(&self, content_type: Option<&str>) -> bool {
///         content_type.is_none_or(|ct| ct.is_empty() || ct.starts_with("text/csv"))
///     }
///     fn decode(&self, _: Option<&str>, body: &[u8]) -> Result<Vec<String>, Error> {
///         let text = std::str::from_utf8(body).map_err(|e| Error::Decode { reason: e.to_string() })?;
///         Ok(text.split(',').map(str::to_owned).collect())
///     }
/// }
/// assert!(Csv.accepts(Some("text/csv; charset=utf-8")));
/// assert!(!Csv.accepts(Some("application/json")));
/// assert_eq!(Csv.decode(None, b"a,b").unwrap(), ["a", "b"]);
/// ```
pub trait Decoder<T>: Send + Sync + 'static {
    /// Whether a body delivered with `content_type` is one this decoder reads (`None`: the
    /// message carried no content type). A consumer parks a refused body without calling
    /// [`decode`](Decoder::decode). The default accepts every content type.
    fn accepts(&self, content_type: Option<&str>) -> bool {
        let _ = content_type;
        true
    }
    /// What this decoder reads, as the park reason of a refused body names it: "content
    /// type "…" is not {expects}" (with the acemq feature to enable, for a family format
    /// this build lacks). Give it whenever [`accepts`](Decoder::accepts) can say no.
    fn expects(&self) -> &str {
        "a format this consumer's codec reads"
    }
    /// Decodes a body delivered with `content_type`.
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error>;
}

/// A shared codec is a codec: one value serves several publishers and consumers (an ordered
/// queue's partitions, a requester's calls) without being `Clone`.
impl<T: ?Sized, C: Encoder<T> + ?Sized> Encoder<T> for std::sync::Arc<C> {
    fn content_type(&self) -> &str {
        (**self).content_type()
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        (**self).encode(value)
    }
}

/// A shared decoder is a decoder (see the [`Encoder`] impl for `Arc`).
impl<T, C: Decoder<T> + ?Sized> Decoder<T> for std::sync::Arc<C> {
    fn accepts(&self, content_type: Option<&str>) -> bool {
        (**self).accepts(content_type)
    }
    fn expects(&self) -> &str {
        (**self).expects()
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        (**self).decode(content_type, body)
    }
}

/// Whether a content type names JSON: `application/json`, `text/json`,
/// `application/*+json` (parameters such as `; charset=utf-8` ignored, case-insensitive).
///
/// ```
/// use acemq::codec::is_json;
/// assert!(is_json("application/vnd.acme.order+json; charset=utf-8"));
/// assert!(is_json("text/json"));
/// assert!(!is_json("text/plain"));
/// ```
pub fn is_json(content_type: &str) -> bool {
    // What every JSON codec of the family writes: answered without parsing.
    if content_type == JSON {
        return true;
    }
    let mime = essence(content_type);
    mime == "application/json"
        || mime == "text/json"
        || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// Whether a content type names text: `text/*` (parameters ignored, case-insensitive).
fn is_text(content_type: &str) -> bool {
    essence(content_type).starts_with("text/")
}

/// The content type without its parameters, trimmed and lower-cased (a copy only when it
/// has upper-case letters: the usual one is read in place, once per delivery).
fn essence(content_type: &str) -> std::borrow::Cow<'_, str> {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if mime.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(mime.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(mime)
    }
}

/// The content type a decoder should judge: `None` for an absent or empty one.
fn given(content_type: Option<&str>) -> Option<&str> {
    content_type.filter(|ct| !ct.is_empty())
}

/// The error for a body whose content type a decoder does not accept: `expected` says what
/// it reads ("JSON", "text"), and the text tells the operator what to do.
pub(crate) fn refused(content_type: &str, expected: &str) -> Error {
    if let Some(feature) = feature_for(content_type) {
        return Error::Decode {
            reason: format!(
                "content type {content_type:?} is not {expected}: it needs acemq's `{feature}` feature; enable it and consume with that format's codec"
            ),
        };
    }
    Error::Decode {
        reason: format!(
            "content type {content_type:?} is not {expected}; consume it with a codec for {content_type:?}"
        ),
    }
}
