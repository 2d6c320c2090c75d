//! The XML codec (feature `xml`), through serde on `quick-xml` (maintained, pure Rust, no
//! DTD processing at all), and [`list`], which reads a list in either of the family's
//! shapes.
//!
//! Safety: a body with a document type declaration (`<!DOCTYPE …>`) is refused before it is
//! parsed, so no external entity is fetched and no internal entity is expanded; an entity
//! reference other than the five predefined ones is an error, never a lookup.

use ::bytes::Bytes;
use std::marker::PhantomData;
use std::sync::Arc;

use quick_xml::events::Event;
use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::known::Format;
use super::{Decoder, Encoder, XML, given, refused};
use crate::error::Error;

/// XML through serde. Writes `application/xml` with the payload type's name as the root
/// element (Java's Jackson writes a POJO `Order` as `<Order>…</Order>`; [`Xml::with_root`]
/// names another); accepts `application/xml`, `text/xml`, `application/*+xml` or no content
/// type. The root element's name is not checked when reading (Go writes `<order>`).
///
/// XML has no types: a field declared as a number or a boolean is parsed from its text. A
/// list written by Go (`<lines>a</lines><lines>b</lines>`) reads as a `Vec`; Java's Jackson
/// wraps it (`<lines><lines>a</lines>…</lines>`): annotate the field with
/// `#[serde(deserialize_with = "acemq::codec::xml::list")]` to read both.
///
/// ```
/// use acemq::codec::{Decoder, Encoder, Xml};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Order { id: String, total: u32 }
/// let body = Xml::default().encode(&Order { id: "o-1".into(), total: 5 }).unwrap();
/// assert_eq!(&body[..], b"<Order><id>o-1</id><total>5</total></Order>");
/// let back: Order = Xml::default().decode(Some("text/xml"), &body).unwrap();
/// assert_eq!(back.total, 5);
/// let dtd = br#"<!DOCTYPE o [<!ENTITY x "y">]><o><id>&x;</id><total>1</total></o>"#;
/// assert!(Decoder::<Order>::decode(&Xml::default(), None, dtd).is_err());
/// ```
#[derive(Clone, Debug, Default)]
pub struct Xml {
    root: Option<Arc<str>>,
}

impl Xml {
    /// An XML codec that writes `root` as the root element's name (needed for a map or any
    /// payload type without a name of its own).
    ///
    /// ```
    /// use acemq::codec::{Encoder, Xml};
    /// let m = std::collections::BTreeMap::from([("id", "o-1")]);
    /// assert_eq!(&Xml::with_root("order").encode(&m).unwrap()[..], b"<order><id>o-1</id></order>");
    /// ```
    pub fn with_root(root: &str) -> Self {
        Self {
            root: Some(Arc::from(root)),
        }
    }
}

impl<T: Serialize + ?Sized> Encoder<T> for Xml {
    fn content_type(&self) -> &str {
        XML
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        let written = match &self.root {
            Some(root) => quick_xml::se::to_string_with_root(root, value),
            None => quick_xml::se::to_string(value),
        };
        written.map(Bytes::from).map_err(|e| Error::Encode {
            content_type: XML.into(),
            reason: format!("{e} (a payload without a type name needs Xml::with_root)"),
        })
    }
}

impl<T: DeserializeOwned> Decoder<T> for Xml {
    fn expects(&self) -> &str {
        "XML"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        given(content_type).is_none_or(|ct| Format::Xml.names(ct))
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if let Some(ct) = given(content_type).filter(|ct| !Format::Xml.names(ct)) {
            return Err(refused(ct, "XML"));
        }
        refuse_dtd(body)?;
        let text = std::str::from_utf8(body).map_err(|e| Error::Decode {
            reason: format!("XML body is not UTF-8: {e}"),
        })?;
        quick_xml::de::from_str(text).map_err(|e| Error::Decode {
            reason: format!("invalid XML for {}: {e}", std::any::type_name::<T>()),
        })
    }
}

/// Reads the prolog (everything before the root element) and refuses a document type
/// declaration: DTDs are where external entities and entity expansion live.
fn refuse_dtd(body: &[u8]) -> Result<(), Error> {
    let mut reader = quick_xml::Reader::from_reader(body);
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::DocType(_)) => {
                return Err(Error::Decode {
                    reason: "XML body has a DOCTYPE: DTDs (and their entities) are refused, never expanded; publish the document without one".into(),
                });
            }
            Ok(Event::Start(_) | Event::Empty(_) | Event::Eof) => return Ok(()),
            Ok(_) => buf.clear(),
            Err(e) => {
                return Err(Error::Decode {
                    reason: format!("invalid XML: {e}"),
                });
            }
        }
    }
}

/// Reads a list field written either way the family writes lists: repeated elements (Go,
/// Python: `<lines>a</lines><lines>b</lines>`) or wrapped (Java's Jackson:
/// `<lines><lines>a</lines><lines>b</lines></lines>`). Use it with
/// `#[serde(deserialize_with = "acemq::codec::xml::list")]`.
///
/// ```
/// use acemq::codec::{Decoder, Xml};
/// #[derive(serde::Deserialize)]
/// struct Order {
///     #[serde(deserialize_with = "acemq::codec::xml::list")]
///     lines: Vec<String>,
/// }
/// let go = b"<order><lines>a</lines><lines>b</lines></order>";
/// let java = b"<Order><lines><lines>a</lines><lines>b</lines></lines></Order>";
/// for body in [&go[..], &java[..]] {
///     let o: Order = Xml::default().decode(None, body).unwrap();
///     assert_eq!(o.lines, ["a", "b"]);
/// }
/// ```
pub fn list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let entries = Vec::<Entry<T>>::deserialize(deserializer)?;
    Ok(entries.into_iter().flat_map(|e| e.0).collect())
}

/// One element of a list field: an item, or a wrapper holding items.
struct Entry<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Entry<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(EntryVisitor(PhantomData))
    }
}

struct EntryVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for EntryVisitor<T> {
    type Value = Entry<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list item or a wrapper element holding list items")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        T::deserialize(serde::de::value::StrDeserializer::new(v)).map(|t| Entry(vec![t]))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        self.visit_str(&v)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "$text" || key == "$value" {
                items.push(map.next_value::<T>()?);
            } else {
                items.extend(map.next_value::<Vec<T>>()?);
            }
        }
        Ok(Entry(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug)]
    struct Doc {
        id: String,
    }

    #[test]
    fn external_and_internal_entities_are_never_expanded() {
        let xxe = br#"<?xml version="1.0"?><!DOCTYPE o [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><o><id>&xxe;</id></o>"#;
        let e = Decoder::<Doc>::decode(&Xml::default(), Some(XML), xxe).unwrap_err();
        assert!(e.to_string().contains("DOCTYPE"), "{e}");
        let bomb = br#"<!DOCTYPE o [<!ENTITY a "aaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]><o><id>&b;</id></o>"#;
        assert!(Decoder::<Doc>::decode(&Xml::default(), Some(XML), bomb).is_err());
        // Without a DTD an undeclared entity is an error, not a lookup.
        let undeclared = br#"<o><id>&xxe;</id></o>"#;
        assert!(Decoder::<Doc>::decode(&Xml::default(), Some(XML), undeclared).is_err());
        let ok: Doc = Xml::default()
            .decode(
                Some(XML),
                br#"<?xml version="1.0"?><o><id>a&amp;b</id></o>"#,
            )
            .unwrap();
        assert_eq!(ok.id, "a&b");
    }

    #[test]
    fn xml_refuses_other_content_types() {
        let e =
            Decoder::<Doc>::decode(&Xml::default(), Some("application/json"), b"{}").unwrap_err();
        assert!(e.to_string().contains("not XML"), "{e}");
    }
}
