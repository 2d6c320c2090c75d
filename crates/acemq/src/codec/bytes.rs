//! The raw-bytes codec: bodies passed through untouched.

use ::bytes::Bytes;

use super::{BYTES, Decoder, Encoder};
use crate::error::Error;

/// Raw bytes, passed through untouched, whatever the content type. Writes
/// `application/octet-stream`; accepts every content type (Java's bytes codec reads only
/// `application/octet-stream`; see `docs/wire.md`, "Content types").
///
/// ```
/// use acemq::codec::{Decoder, Encoder, RawBytes};
/// let b: Vec<u8> = RawBytes.decode(Some("application/x-anything"), &[0, 159]).unwrap();
/// assert_eq!(b, vec![0, 159]);
/// assert!(Decoder::<Vec<u8>>::accepts(&RawBytes, Some("application/json")));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct RawBytes;

impl RawBytes {
    /// Whether raw bytes are read from a body delivered with `content_type`: always (the
    /// same answer as [`Decoder::accepts`], callable without naming the payload type).
    ///
    /// ```
    /// use acemq::codec::RawBytes;
    /// assert!(RawBytes.accepts(Some("application/json")));
    /// assert!(RawBytes.accepts(None));
    /// ```
    pub fn accepts(&self, content_type: Option<&str>) -> bool {
        let _ = content_type;
        true
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
    fn accepts(&self, content_type: Option<&str>) -> bool {
        RawBytes::accepts(self, content_type)
    }
    fn decode(&self, _content_type: Option<&str>, body: &[u8]) -> Result<Vec<u8>, Error> {
        Ok(body.to_vec())
    }
}

impl Decoder<Bytes> for RawBytes {
    fn accepts(&self, content_type: Option<&str>) -> bool {
        RawBytes::accepts(self, content_type)
    }
    fn decode(&self, _content_type: Option<&str>, body: &[u8]) -> Result<Bytes, Error> {
        Ok(Bytes::copy_from_slice(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{JSON, TEXT};

    #[test]
    fn raw_bytes_accept_every_content_type_and_pass_the_body_through() {
        let body = [0u8, 159, 255];
        for ct in [
            None,
            Some(""),
            Some(BYTES),
            Some(JSON),
            Some(TEXT),
            Some("application/vnd.acemq.encrypted"),
            Some("not a mime type"),
        ] {
            assert!(Decoder::<Vec<u8>>::accepts(&RawBytes, ct), "{ct:?}");
            assert!(Decoder::<Bytes>::accepts(&RawBytes, ct), "{ct:?}");
            let v: Vec<u8> = RawBytes.decode(ct, &body).unwrap();
            assert_eq!(v, body);
            let b: Bytes = RawBytes.decode(ct, &body).unwrap();
            assert_eq!(&b[..], &body);
        }
    }
}
