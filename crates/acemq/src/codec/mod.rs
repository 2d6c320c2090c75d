//! Codecs: how a payload becomes a body and back.
//!
//! This module owns content types and body encoding. JSON is the default
//! (`application/json`; `text/json` and `application/*+json` are read as JSON too), text
//! (`text/plain; charset=utf-8`) and raw bytes (`application/octet-stream`) are the others.
//! A decoder looks at the delivered `content_type` first: a body whose content type names
//! another format is refused with [`Error::Decode`] rather than misread, and the consumer
//! parks it. With no content type, the bytes are tried as the decoder's own format.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;

/// `application/json`
pub const JSON: &str = "application/json";
/// `text/plain; charset=utf-8`
pub const TEXT: &str = "text/plain; charset=utf-8";
/// `application/octet-stream`
pub const BYTES: &str = "application/octet-stream";

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
/// ```
pub trait Decoder<T>: Send + Sync + 'static {
    /// Decodes a body delivered with `content_type`.
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error>;
}

/// JSON through serde (the default codec).
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

/// UTF-8 text, for `String` payloads.
///
/// ```
/// use acemq::codec::{Decoder, Encoder, Text};
/// assert_eq!(&Text.encode("hi").unwrap()[..], b"hi");
/// let s: String = Text.decode(Some("text/plain"), b"hi").unwrap();
/// assert_eq!(s, "hi");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Text;

/// Raw bytes, passed through untouched, whatever the content type.
///
/// ```
/// use acemq::codec::{Decoder, Encoder, RawBytes};
/// let b: Vec<u8> = RawBytes.decode(Some("application/x-anything"), &[0, 159]).unwrap();
/// assert_eq!(b, vec![0, 159]);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct RawBytes;

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
    let mime = essence(content_type);
    mime == "application/json"
        || mime == "text/json"
        || (mime.starts_with("application/") && mime.ends_with("+json"))
}

fn is_text(content_type: &str) -> bool {
    essence(content_type).starts_with("text/")
}

fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

impl<T: Serialize + ?Sized> Encoder<T> for Json {
    fn content_type(&self) -> &str {
        JSON
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        serde_json::to_vec(value)
            .map(Bytes::from)
            .map_err(|e| Error::Encode {
                content_type: JSON.into(),
                reason: e.to_string(),
            })
    }
}

impl<T: DeserializeOwned> Decoder<T> for Json {
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if let Some(ct) = content_type.filter(|ct| !ct.is_empty() && !is_json(ct)) {
            return Err(Error::Decode {
                reason: format!(
                    "content type {ct:?} is not JSON; consume it with a codec for {ct:?}"
                ),
            });
        }
        serde_json::from_slice(body).map_err(|e| Error::Decode {
            reason: format!("invalid JSON for {}: {e}", std::any::type_name::<T>()),
        })
    }
}

impl Encoder<str> for Text {
    fn content_type(&self) -> &str {
        TEXT
    }
    fn encode(&self, value: &str) -> Result<Bytes, Error> {
        Ok(Bytes::copy_from_slice(value.as_bytes()))
    }
}

impl Encoder<String> for Text {
    fn content_type(&self) -> &str {
        TEXT
    }
    fn encode(&self, value: &String) -> Result<Bytes, Error> {
        Ok(Bytes::copy_from_slice(value.as_bytes()))
    }
}

impl Decoder<String> for Text {
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<String, Error> {
        if let Some(ct) = content_type.filter(|ct| !ct.is_empty() && !is_text(ct)) {
            return Err(Error::Decode {
                reason: format!("content type {ct:?} is not text"),
            });
        }
        String::from_utf8(body.to_vec()).map_err(|e| Error::Decode {
            reason: format!("text body is not valid UTF-8: {e}"),
        })
    }
}

impl Encoder<[u8]> for RawBytes {
    fn content_type(&self) -> &str {
        BYTES
    }
    fn encode(&self, value: &[u8]) -> Result<Bytes, Error> {
        Ok(Bytes::copy_from_slice(value))
    }
}

impl Encoder<Vec<u8>> for RawBytes {
    fn content_type(&self) -> &str {
        BYTES
    }
    fn encode(&self, value: &Vec<u8>) -> Result<Bytes, Error> {
        Ok(Bytes::copy_from_slice(value))
    }
}

impl Encoder<Bytes> for RawBytes {
    fn content_type(&self) -> &str {
        BYTES
    }
    fn encode(&self, value: &Bytes) -> Result<Bytes, Error> {
        Ok(value.clone())
    }
}

impl Decoder<Vec<u8>> for RawBytes {
    fn decode(&self, _content_type: Option<&str>, body: &[u8]) -> Result<Vec<u8>, Error> {
        Ok(body.to_vec())
    }
}

impl Decoder<Bytes> for RawBytes {
    fn decode(&self, _content_type: Option<&str>, body: &[u8]) -> Result<Bytes, Error> {
        Ok(Bytes::copy_from_slice(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq)]
    struct Order {
        id: String,
    }

    #[test]
    fn json_reads_its_aliases_and_no_content_type() {
        for ct in [
            Some("application/json"),
            Some("text/json"),
            Some("application/vnd.acme+json; charset=utf-8"),
            Some("APPLICATION/JSON"),
            None,
            Some(""),
        ] {
            let o: Order = Json.decode(ct, br#"{"id":"o-1"}"#).unwrap();
            assert_eq!(o.id, "o-1", "{ct:?}");
        }
    }

    #[test]
    fn json_refuses_other_content_types_and_bad_bytes() {
        let e = Decoder::<Order>::decode(&Json, Some("application/xml"), b"<o/>").unwrap_err();
        assert!(matches!(e, Error::Decode { ref reason } if reason.contains("not JSON")));
        let e = Decoder::<Order>::decode(&Json, Some(JSON), b"{not json").unwrap_err();
        assert!(matches!(e, Error::Decode { ref reason } if reason.contains("invalid JSON")));
    }

    #[test]
    fn text_requires_utf8_and_a_text_type() {
        assert!(Decoder::<String>::decode(&Text, Some(TEXT), &[0xff]).is_err());
        assert!(Decoder::<String>::decode(&Text, Some(JSON), b"x").is_err());
        assert_eq!(
            Decoder::<String>::decode(&Text, None, "ö".as_bytes()).unwrap(),
            "ö"
        );
    }
}
