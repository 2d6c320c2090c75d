//! Header values as AMQP field tables carry them.
//!
//! This module owns the transport-neutral representation of a header table ([`Headers`],
//! keyed by [`HeaderName`], which holds a `&'static str` for free). Every AMQP
//! field type has a variant, so a message republished by the engine keeps the headers it
//! arrived with (a newer library's unknown headers, the broker's `x-death` tables) exactly.
//! The AceMQ envelope writes only [`HeaderValue::Str`], [`HeaderValue::I32`] and
//! [`HeaderValue::I64`]; readers accept any integer width and numeric strings.

use std::borrow::{Borrow, Cow};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

/// A header table: names to values, as in an AMQP field table.
///
/// ```
/// use acemq::headers::{Headers, HeaderValue};
/// let mut h = Headers::new();
/// h.insert("x-tenant".into(), HeaderValue::from("acme"));
/// assert_eq!(h["x-tenant"].as_str(), Some("acme"));
/// ```
pub type Headers = BTreeMap<HeaderName, HeaderValue>;

/// The name of a header: a `&'static str` costs nothing to hold or copy (every name the
/// envelope writes is one), a name read off the wire owns its `String`. It orders, compares
/// and looks up as the `str` it holds, so `headers.get("x-tenant")` works.
///
/// ```
/// use acemq::headers::HeaderName;
/// let fixed = HeaderName::from("x-tenant");
/// let owned = HeaderName::from(String::from("x-tenant"));
/// assert_eq!(fixed, owned);
/// assert_eq!(&*fixed, "x-tenant");
/// assert!(owned.starts_with("x-"));
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HeaderName(Cow<'static, str>);

impl HeaderName {
    /// The name as a `str`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it holds a `&'static str` (no copy of its own).
    #[cfg(test)]
    pub(crate) fn is_static(&self) -> bool {
        matches!(self.0, Cow::Borrowed(_))
    }
}

/// The names on nearly every message (the envelope's, the trace context's, the broker's
/// dead-letter ones): read off the wire, they come back as these `&'static str`s, so a
/// delivery's table holds no copy of them. `envelope/tests.rs` checks that every
/// envelope name is here.
#[cfg(any(feature = "amqp", test))]
pub(crate) const WELL_KNOWN: &[&str] = &[
    "x-acemq-id",
    "x-acemq-type",
    "x-acemq-version",
    "x-acemq-correlation",
    "x-acemq-causation",
    "x-acemq-attempt",
    "x-acemq-first-seen",
    "x-acemq-origin",
    "x-acemq-error",
    "x-acemq-claim",
    "acemq-replayed-from",
    "acemq-replayed-at",
    "acemq-replay-count",
    "acemq-reply-to",
    "acemq-error",
    "traceparent",
    "tracestate",
    "x-death",
    "x-delivery-count",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
];

#[cfg(any(feature = "amqp", test))]
impl HeaderName {
    /// A name read off the wire: one of [`WELL_KNOWN`] as its static `str`, any other as
    /// an owned copy.
    pub(crate) fn wire(name: &str) -> HeaderName {
        match WELL_KNOWN.iter().find(|k| **k == name) {
            Some(known) => HeaderName::from(*known),
            None => HeaderName::from(name.to_owned()),
        }
    }
}

impl From<&'static str> for HeaderName {
    fn from(name: &'static str) -> Self {
        HeaderName(Cow::Borrowed(name))
    }
}

impl From<String> for HeaderName {
    fn from(name: String) -> Self {
        HeaderName(Cow::Owned(name))
    }
}

impl From<&String> for HeaderName {
    fn from(name: &String) -> Self {
        HeaderName(Cow::Owned(name.clone()))
    }
}

impl From<HeaderName> for String {
    fn from(name: HeaderName) -> Self {
        name.0.into_owned()
    }
}

impl Deref for HeaderName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for HeaderName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for HeaderName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for HeaderName {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for HeaderName {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl fmt::Debug for HeaderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for HeaderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One value of an AMQP field table.
///
/// ```
/// use acemq::headers::HeaderValue;
/// assert_eq!(HeaderValue::I32(3).as_i64(), Some(3));
/// assert_eq!(HeaderValue::from("42").as_i64(), Some(42));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HeaderValue {
    /// `t`
    Bool(bool),
    /// `b`
    I8(i8),
    /// `B`
    U8(u8),
    /// `s`
    I16(i16),
    /// `u`
    U16(u16),
    /// `I` (int32; the envelope's attempt and version)
    I32(i32),
    /// `i`
    U32(u32),
    /// `l` (int64; the envelope's first-seen)
    I64(i64),
    /// `f`
    F32(f32),
    /// `d`
    F64(f64),
    /// `D`
    Decimal {
        /// Number of decimal places.
        scale: u8,
        /// Unscaled value.
        value: u32,
    },
    /// `S` (long string; every string the envelope writes)
    Str(String),
    /// `x` (byte array)
    Bytes(Vec<u8>),
    /// `T` (seconds since the epoch)
    Timestamp(u64),
    /// `A`
    Array(Vec<HeaderValue>),
    /// `F`
    Table(Headers),
    /// `V`
    Void,
}

impl HeaderValue {
    /// The value as a string, when it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            HeaderValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an integer: any integer width, or a string holding a decimal integer.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            HeaderValue::I8(v) => Some(i64::from(*v)),
            HeaderValue::U8(v) => Some(i64::from(*v)),
            HeaderValue::I16(v) => Some(i64::from(*v)),
            HeaderValue::U16(v) => Some(i64::from(*v)),
            HeaderValue::I32(v) => Some(i64::from(*v)),
            HeaderValue::U32(v) => Some(i64::from(*v)),
            HeaderValue::I64(v) => Some(*v),
            HeaderValue::Timestamp(v) => i64::try_from(*v).ok(),
            HeaderValue::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// The value as a table, when it is one.
    pub fn as_table(&self) -> Option<&Headers> {
        match self {
            HeaderValue::Table(t) => Some(t),
            _ => None,
        }
    }

    /// The value as an array, when it is one.
    pub fn as_array(&self) -> Option<&[HeaderValue]> {
        match self {
            HeaderValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl From<&str> for HeaderValue {
    fn from(s: &str) -> Self {
        HeaderValue::Str(s.to_owned())
    }
}

impl From<String> for HeaderValue {
    fn from(s: String) -> Self {
        HeaderValue::Str(s)
    }
}

impl From<i32> for HeaderValue {
    fn from(v: i32) -> Self {
        HeaderValue::I32(v)
    }
}

impl From<i64> for HeaderValue {
    fn from(v: i64) -> Self {
        HeaderValue::I64(v)
    }
}

impl From<bool> for HeaderValue {
    fn from(v: bool) -> Self {
        HeaderValue::Bool(v)
    }
}

/// The consumer argument that says where a stream reader starts, and the delivery header
/// that carries each entry's offset (re-exported as `acemq::stream::STREAM_OFFSET`).
pub const STREAM_OFFSET: &str = "x-stream-offset";

/// The offset of a delivered stream entry, from its `x-stream-offset` header (any integer
/// width); `None` when the header is absent (not a stream delivery).
pub(crate) fn stream_offset(headers: &Headers) -> Option<u64> {
    headers
        .get(STREAM_OFFSET)
        .and_then(HeaderValue::as_i64)
        .and_then(|v| u64::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_order_compare_and_look_up_as_their_str_whoever_owns_them() {
        let mut h = Headers::new();
        h.insert(HeaderName::from(String::from("b")), HeaderValue::I32(2));
        h.insert("a".into(), HeaderValue::I32(1));
        h.insert(HeaderName::from(String::from("c")), HeaderValue::I32(3));
        // The same name, static or owned, is one key.
        h.insert("b".into(), HeaderValue::I32(20));
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(h["b"], HeaderValue::I32(20));
        assert_eq!(h.get("c").and_then(HeaderValue::as_i64), Some(3));
        assert!(HeaderName::from("x").is_static());
        assert!(!HeaderName::from(String::from("x")).is_static());
        assert_eq!(HeaderName::from("x"), HeaderName::from(String::from("x")));
        assert_eq!(
            format!("{:?} {}", HeaderName::from("x"), HeaderName::from("y")),
            "\"x\" y"
        );
    }

    #[test]
    fn integers_read_at_any_width_and_from_numeric_strings() {
        assert_eq!(HeaderValue::U8(7).as_i64(), Some(7));
        assert_eq!(HeaderValue::I16(-2).as_i64(), Some(-2));
        assert_eq!(HeaderValue::U32(9).as_i64(), Some(9));
        assert_eq!(HeaderValue::from(" 12 ").as_i64(), Some(12));
        assert_eq!(HeaderValue::from("x").as_i64(), None);
        assert_eq!(HeaderValue::Bool(true).as_i64(), None);
    }
}
