//! The TOML codec (feature `toml`), through serde on the `toml` crate (the toml-rs project,
//! the ecosystem's maintained TOML implementation).

use ::bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::known::Format;
use super::{Decoder, Encoder, TOML, given, refused};
use crate::error::Error;

/// TOML through serde. Writes `application/toml`; accepts `application/toml`, `text/toml`,
/// `application/*+toml` or no content type. A TOML document is a table, so a payload whose
/// top level is not a table (a number, a list, a string) is refused when encoding, as the
/// family's TOML codecs do.
///
/// ```
/// use acemq::codec::{Decoder, Encoder, Toml};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Order { id: String, total: i64 }
/// let o = Order { id: "o-1".into(), total: 4250 };
/// let body = Toml.encode(&o).unwrap();
/// assert_eq!(&body[..], b"id = \"o-1\"\ntotal = 4250\n");
/// let back: Order = Toml.decode(Some("text/toml"), &body).unwrap();
/// assert_eq!(back, o);
/// assert!(Toml.encode(&vec![1, 2]).is_err());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Toml;

impl<T: Serialize + ?Sized> Encoder<T> for Toml {
    fn content_type(&self) -> &str {
        TOML
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        let fail = |reason: String| Error::Encode {
            content_type: TOML.into(),
            reason,
        };
        // The serializer itself refuses a non-table top level; the message says what to do.
        toml::to_string(value).map(Bytes::from).map_err(|e| {
            fail(format!(
                "{e} (a TOML document's top level must be a table: send a struct or a map)"
            ))
        })
    }
}

impl<T: DeserializeOwned> Decoder<T> for Toml {
    fn expects(&self) -> &str {
        "TOML"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        given(content_type).is_none_or(|ct| Format::Toml.names(ct))
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if let Some(ct) = given(content_type).filter(|ct| !Format::Toml.names(ct)) {
            return Err(refused(ct, "TOML"));
        }
        let text = std::str::from_utf8(body).map_err(|e| Error::Decode {
            reason: format!("TOML body is not UTF-8: {e}"),
        })?;
        toml::from_str(text).map_err(|e| Error::Decode {
            reason: format!("invalid TOML for {}: {e}", std::any::type_name::<T>()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn toml_refuses_a_top_level_that_is_not_a_table() {
        for bad in [
            Toml.encode(&5).unwrap_err(),
            Toml.encode(&vec!["a"]).unwrap_err(),
            Toml.encode("text").unwrap_err(),
        ] {
            assert!(bad.to_string().contains("must be a table"), "{bad}");
        }
        let mut m = BTreeMap::new();
        m.insert("k", 1);
        assert_eq!(&Toml.encode(&m).unwrap()[..], b"k = 1\n");
    }

    #[test]
    fn toml_refuses_other_content_types_and_bad_bytes() {
        let e = Decoder::<BTreeMap<String, i64>>::decode(&Toml, Some("application/yaml"), b"a=1")
            .unwrap_err();
        assert!(e.to_string().contains("not TOML"), "{e}");
        let e = Decoder::<BTreeMap<String, i64>>::decode(&Toml, None, b"= nope").unwrap_err();
        assert!(e.to_string().contains("invalid TOML"), "{e}");
    }
}
