//! The YAML codec (feature `yaml`), through serde on `serde-saphyr`.
//!
//! Why `serde-saphyr`: `serde_yaml` is archived and unmaintained, `serde_yml` (its best-known
//! fork) was itself archived after soundness problems, and the remaining forks
//! (`serde_yaml_ng`, `serde_norway`) keep `unsafe-libyaml`, a machine translation of C
//! libyaml. `serde-saphyr` is actively released, pure safe Rust on the saphyr parser
//! family, deserializes straight into the target type without an intermediate tree, and
//! bounds alias expansion (the "billion laughs" document is refused, not expanded).

use ::bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::known::Format;
use super::{Decoder, Encoder, YAML, given, refused};
use crate::error::Error;

/// YAML through serde. Writes `application/yaml`; accepts `application/yaml`,
/// `application/x-yaml`, `text/yaml`, `text/x-yaml`, `application/*+yaml` or no content type.
///
/// ```
/// use acemq::codec::{Decoder, Encoder, Yaml};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Order { id: String, lines: Vec<String> }
/// let o = Order { id: "o-1".into(), lines: vec!["widget".into()] };
/// let body = Yaml.encode(&o).unwrap();
/// let back: Order = Yaml.decode(Some("text/x-yaml"), &body).unwrap();
/// assert_eq!(back, o);
/// assert!(!Decoder::<Order>::accepts(&Yaml, Some("application/json")));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Yaml;

impl<T: Serialize + ?Sized> Encoder<T> for Yaml {
    fn content_type(&self) -> &str {
        YAML
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        serde_saphyr::to_string(&value)
            .map(Bytes::from)
            .map_err(|e| Error::Encode {
                content_type: YAML.into(),
                reason: e.to_string(),
            })
    }
}

impl<T: DeserializeOwned> Decoder<T> for Yaml {
    fn expects(&self) -> &str {
        "YAML"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        given(content_type).is_none_or(|ct| Format::Yaml.names(ct))
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if let Some(ct) = given(content_type).filter(|ct| !Format::Yaml.names(ct)) {
            return Err(refused(ct, "YAML"));
        }
        serde_saphyr::from_slice(body).map_err(|e| Error::Decode {
            reason: format!("invalid YAML for {}: {e}", std::any::type_name::<T>()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn yaml_round_trips_and_refuses_other_types() {
        let mut m = BTreeMap::new();
        m.insert("a".to_owned(), vec![1, 2]);
        let body = Yaml.encode(&m).unwrap();
        let back: BTreeMap<String, Vec<i32>> = Yaml.decode(Some(YAML), &body).unwrap();
        assert_eq!(back, m);
        let e = Decoder::<BTreeMap<String, i32>>::decode(&Yaml, Some("application/json"), b"{}")
            .unwrap_err();
        assert!(e.to_string().contains("not YAML"), "{e}");
    }

    #[test]
    fn an_alias_bomb_is_refused_not_expanded() {
        let mut doc = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for name in 'b'..='k' {
            doc.push_str(&format!(
                "{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
            prev = name;
        }
        let r: Result<serde_json::Value, _> = Yaml.decode(Some(YAML), doc.as_bytes());
        assert!(r.is_err(), "10^11 nodes must be refused");
    }
}
