//! [`Composite`]: one consumer reading several formats, each body decoded by the codec its
//! content type names.

use std::sync::Arc;

use super::{Decoder, given, refused};
use crate::error::Error;

/// A decoder that reads every format it was given, choosing by content type: the first
/// codec (in the order added) whose [`accepts`](Decoder::accepts) says yes decodes the
/// body. A body no codec accepts is refused (the consumer parks it) with a reason that names
/// the content type, and, when the type is a family format whose cargo feature is off, the
/// feature to enable. A message without content type goes to the first codec that reads one.
///
/// A publisher writes one format: give it that codec alone.
///
/// ```
/// use acemq::codec::{Composite, Decoder, Json, Text};
/// let reads = Composite::<String>::new().with(Json).with(Text);
/// let a: String = reads.decode(Some("application/json"), br#""hi""#).unwrap();
/// let b: String = reads.decode(Some("text/plain"), b"hi").unwrap();
/// assert_eq!((a.as_str(), b.as_str()), ("hi", "hi"));
/// assert!(reads.decode(Some("image/png"), b"..").is_err());
/// ```
pub struct Composite<T> {
    decoders: Vec<Arc<dyn Decoder<T>>>,
}

impl<T: 'static> Composite<T> {
    /// A composite with no codec yet (it refuses every body until one is added).
    ///
    /// ```
    /// use acemq::codec::{Composite, Decoder};
    /// assert!(!Composite::<String>::new().accepts(None));
    /// ```
    pub fn new() -> Self {
        Self {
            decoders: Vec::new(),
        }
    }

    /// Adds a codec; earlier ones are asked first.
    ///
    /// ```
    /// use acemq::codec::{Composite, Decoder, Json};
    /// assert!(Composite::<u32>::new().with(Json).accepts(Some("text/json")));
    /// ```
    #[must_use]
    pub fn with(mut self, decoder: impl Decoder<T>) -> Self {
        self.decoders.push(Arc::new(decoder));
        self
    }
}

impl<T> std::fmt::Debug for Composite<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Composite")
            .field("codecs", &self.decoders.len())
            .finish()
    }
}

impl<T: 'static> Default for Composite<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: 'static> Decoder<T> for Composite<T> {
    fn expects(&self) -> &str {
        "one of this consumer's formats"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        self.decoders.iter().any(|d| d.accepts(content_type))
    }

    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        match self.decoders.iter().find(|d| d.accepts(content_type)) {
            Some(d) => d.decode(content_type, body),
            None => Err(match given(content_type) {
                Some(ct) => refused(ct, "one of this consumer's formats"),
                None => Error::Decode {
                    reason: "the message has no content type and none of this consumer's codecs reads one without it; publish with a content type".into(),
                },
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Json, RawBytes, Text};

    #[test]
    fn picks_the_codec_by_content_type_and_refuses_the_rest() {
        let c = Composite::<String>::new().with(Json).with(Text);
        assert_eq!(c.decode(Some("text/json"), br#""j""#).unwrap(), "j");
        assert_eq!(c.decode(Some("text/plain"), b"t").unwrap(), "t");
        // No content type: the first codec that reads one (JSON) decides.
        assert_eq!(c.decode(None, br#""n""#).unwrap(), "n");
        let e = c.decode(Some("application/zip"), b"z").unwrap_err();
        assert!(
            matches!(e, Error::Decode { ref reason } if reason.contains("application/zip")),
            "{e}"
        );
    }

    #[test]
    fn a_family_type_without_its_feature_names_the_feature() {
        let c = Composite::<Vec<u8>>::new().with(Json);
        let e = c.decode(Some("application/x-yaml"), b"a: 1").unwrap_err();
        let Error::Decode { reason } = e else {
            panic!("not a decode error")
        };
        if cfg!(feature = "yaml") {
            assert!(!reason.contains("feature"), "{reason}");
        } else {
            assert!(reason.contains("needs acemq's `yaml` feature"), "{reason}");
        }
        let raw = Composite::<bytes::Bytes>::new().with(RawBytes);
        assert!(raw.decode(Some("application/x-yaml"), b"a: 1").is_ok());
    }
}
