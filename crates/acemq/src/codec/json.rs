//! The JSON codec (the default), through serde.

use std::cell::Cell;

use ::bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Decoder, Encoder, JSON, given, is_json, refused};
use crate::error::Error;

/// JSON through serde (the default codec). Writes `application/json`; accepts
/// `application/json`, `text/json`, `application/*+json` or no content type.
///
/// ```
/// use acemq::codec::{Decoder, Encoder, Json};
/// assert_eq!(&Json.encode(&[1, 2]).unwrap()[..], b"[1,2]");
/// let v: Vec<u8> = Json.decode(Some("application/vnd.acme+json"), b"[1,2]").unwrap();
/// assert_eq!(v, [1, 2]);
/// assert!(Decoder::<Vec<u8>>::accepts(&Json, Some("text/json; charset=utf-8")));
/// assert!(!Decoder::<Vec<u8>>::accepts(&Json, Some("application/xml")));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl Json {
    /// Whether JSON is read from a body delivered with `content_type` (the same answer as
    /// [`Decoder::accepts`], callable without naming the payload type).
    ///
    /// ```
    /// use acemq::codec::Json;
    /// assert!(Json.accepts(Some("application/problem+json")));
    /// assert!(Json.accepts(None));
    /// assert!(!Json.accepts(Some("text/plain")));
    /// ```
    pub fn accepts(&self, content_type: Option<&str>) -> bool {
        given(content_type).is_none_or(is_json)
    }
}

/// The largest buffer an encode starts with (a large body once does not make every later
/// one reserve as much).
const MAX_HINT: usize = 64 * 1024;

thread_local! {
    /// The length of the last body this thread encoded. The next encode's buffer starts at
    /// it, so a run of like-sized bodies costs one allocation each (`serde_json::to_vec`
    /// starts at 128 bytes and doubles: two or three, and a copy per doubling).
    static LAST_LEN: Cell<usize> = const { Cell::new(128) };
}

impl<T: Serialize + ?Sized> Encoder<T> for Json {
    fn content_type(&self) -> &str {
        JSON
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        let mut out = Vec::with_capacity(LAST_LEN.get());
        serde_json::to_writer(&mut out, value).map_err(|e| Error::Encode {
            content_type: JSON.into(),
            reason: e.to_string(),
        })?;
        LAST_LEN.set(out.len().min(MAX_HINT));
        // Exact length: `Bytes` then holds the buffer itself (from a `Vec` with spare
        // capacity it would allocate a shared header besides).
        Ok(Bytes::from(out.into_boxed_slice()))
    }
}

impl<T: DeserializeOwned> Decoder<T> for Json {
    fn expects(&self) -> &str {
        "JSON"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        Json::accepts(self, content_type)
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if let Some(ct) = given(content_type).filter(|ct| !Json::accepts(self, Some(ct))) {
            return Err(refused(ct, "JSON"));
        }
        serde_json::from_slice(body).map_err(|e| Error::Decode {
            reason: format!("invalid JSON for {}: {e}", std::any::type_name::<T>()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq)]
    struct Order {
        id: String,
    }

    fn accepts(ct: Option<&str>) -> bool {
        Decoder::<Order>::accepts(&Json, ct)
    }

    #[test]
    fn encoding_is_exact_whatever_size_the_last_body_was() {
        // The buffer starts at the last body's length: larger, smaller, equal and beyond
        // the hint's cap, each body comes out whole and nothing more.
        for len in [0, 3, 300, 300, 10, 200_000, 5, 70_000, 70_000, 1] {
            let order = Order {
                id: "x".repeat(len),
            };
            let body = Encoder::<Order>::encode(&Json, &order).unwrap();
            assert_eq!(body.len(), len + 9, "{len}");
            assert_eq!(body, serde_json::to_vec(&order).unwrap(), "{len}");
            let back: Order = Json.decode(None, &body).unwrap();
            assert_eq!(back, order);
        }
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
    fn json_accepts_exactly_its_aliases() {
        for ct in [
            None,
            Some(""),
            Some("application/json"),
            Some("application/json; charset=utf-8"),
            Some(" Application/JSON ;charset=UTF-8"),
            Some("text/json"),
            Some("TEXT/JSON; charset=utf-8"),
            Some("application/vnd.acme.order+json"),
            Some("application/problem+json; charset=utf-8"),
        ] {
            assert!(accepts(ct), "{ct:?} is JSON");
        }
        for ct in [
            "application/xml",
            "text/plain",
            "text/plain; charset=utf-8",
            "application/octet-stream",
            "application/vnd.acemq.encrypted",
            "application/json-seq",
            "text/json5",
            "image/svg+json",
            "application/x-protobuf",
            "avro/binary",
            ";",
        ] {
            assert!(!accepts(Some(ct)), "{ct:?} is not JSON");
        }
    }

    #[test]
    fn json_decode_refuses_exactly_what_accepts_refuses() {
        for ct in [
            Some("application/xml"),
            Some("text/plain"),
            Some(JSON),
            None,
        ] {
            let refused = matches!(
                Decoder::<Order>::decode(&Json, ct, br#"{"id":"o-1"}"#),
                Err(Error::Decode { ref reason }) if reason.contains("not JSON")
            );
            assert_eq!(refused, !accepts(ct), "{ct:?}");
        }
    }
}
