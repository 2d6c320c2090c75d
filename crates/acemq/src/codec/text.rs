//! The text codec: UTF-8 `String` payloads.

use ::bytes::Bytes;

use super::{Decoder, Encoder, TEXT, given, is_text, refused};
use crate::error::Error;

/// UTF-8 text, for `String` payloads. Writes `text/plain; charset=utf-8`; accepts any
/// `text/*` content type or none.
///
/// ```
/// use acemq::codec::{Decoder, Encoder, Text};
/// assert_eq!(&Text.encode("hi").unwrap()[..], b"hi");
/// let s: String = Text.decode(Some("text/plain"), b"hi").unwrap();
/// assert_eq!(s, "hi");
/// assert!(Text.accepts(Some("text/csv")));
/// assert!(!Text.accepts(Some("application/json")));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Text;

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
    fn expects(&self) -> &str {
        "text"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        given(content_type).is_none_or(is_text)
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<String, Error> {
        if let Some(ct) = given(content_type).filter(|ct| !self.accepts(Some(ct))) {
            return Err(refused(ct, "text"));
        }
        String::from_utf8(body.to_vec()).map_err(|e| Error::Decode {
            reason: format!("text body is not valid UTF-8: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::JSON;

    #[test]
    fn text_requires_utf8_and_a_text_type() {
        assert!(Decoder::<String>::decode(&Text, Some(TEXT), &[0xff]).is_err());
        assert!(Decoder::<String>::decode(&Text, Some(JSON), b"x").is_err());
        assert_eq!(
            Decoder::<String>::decode(&Text, None, "ö".as_bytes()).unwrap(),
            "ö"
        );
    }

    #[test]
    fn text_accepts_any_text_type_and_none() {
        for ct in [
            None,
            Some(""),
            Some("text/plain"),
            Some(TEXT),
            Some("TEXT/PLAIN; charset=ISO-8859-1"),
            Some("text/csv"),
            Some("text/json"),
            Some(" text/html ; q=1"),
        ] {
            assert!(Text.accepts(ct), "{ct:?} is text");
        }
        for ct in [
            JSON,
            "application/octet-stream",
            "application/xml",
            "application/text",
            "plain/text",
            "texts/plain",
        ] {
            assert!(!Text.accepts(Some(ct)), "{ct:?} is not text");
        }
    }

    #[test]
    fn text_decode_refuses_exactly_what_accepts_refuses() {
        for ct in [Some(JSON), Some("application/xml"), Some("text/csv"), None] {
            let refused = matches!(
                Text.decode(ct, b"hi"),
                Err(Error::Decode { ref reason }) if reason.contains("is not text")
            );
            assert_eq!(refused, !Text.accepts(ct), "{ct:?}");
        }
    }
}
