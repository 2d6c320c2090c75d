//! [`Properties`] and [`HeaderValue`] to and from lapin's `BasicProperties` and field tables.
//!
//! The mapping is one AMQP field type per [`HeaderValue`] variant, both ways, so a message
//! republished by the engine carries its headers with their original types:
//!
//! | `HeaderValue` | AMQP (tag) | lapin `AMQPValue` |
//! |---|---|---|
//! | `Bool` | boolean (`t`) | `Boolean` |
//! | `I8` / `U8` | `b` / `B` | `ShortShortInt` / `ShortShortUInt` |
//! | `I16` / `U16` | `s` / `u` | `ShortInt` / `ShortUInt` |
//! | `I32` / `U32` | `I` / `i` | `LongInt` / `LongUInt` |
//! | `I64` | `l` | `LongLongInt` |
//! | `F32` / `F64` | `f` / `d` | `Float` / `Double` |
//! | `Decimal` | `D` | `DecimalValue` |
//! | `Str` | long string (`S`) | `LongString` (never `ShortString`, whose tag `_` RabbitMQ rejects) |
//! | `Bytes` | byte array (`x`) | `ByteArray` |
//! | `Timestamp` | `T` | `Timestamp` |
//! | `Array` / `Table` | `A` / `F` | `FieldArray` / `FieldTable` |
//! | `Void` | `V` | `Void` |
//!
//! Reading is total: a `ShortString` (which only lapin itself produces) reads as `Str`, and a
//! long string that is not UTF-8 reads as `Bytes` rather than being mangled. Every shortstr on
//! the way out (header keys, property strings) is length-checked with `ShortString::try_new`,
//! so an over-long value is an [`TransportError::InvalidName`], never a panic inside lapin.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, DecimalValue, FieldArray, FieldTable, ShortString};

use crate::headers::{HeaderName, HeaderValue, Headers};
use crate::transport::{Properties, TransportError};

/// A shortstr (name, key or property), refusing more than 255 bytes.
pub(crate) fn short(what: &str, value: String) -> Result<ShortString, TransportError> {
    ShortString::try_new(value).map_err(|e| TransportError::InvalidName {
        name: what.to_owned(),
        reason: e.to_string(),
    })
}

/// A name (queue, exchange, routing key, consumer tag) as a shortstr.
pub(crate) fn name(value: &str) -> Result<ShortString, TransportError> {
    crate::topology::check_short(value)?;
    short(value, value.to_owned())
}

/// A header table as an AMQP field table.
pub(crate) fn to_table(headers: &Headers) -> Result<FieldTable, TransportError> {
    let mut table = FieldTable::default();
    // Last name first, as in `into_table`.
    for (key, value) in headers.iter().rev() {
        table.insert(header_key(key)?, to_value(value)?);
    }
    Ok(table)
}

/// A header table as an AMQP field table, consuming it (no string copies). Inserted last
/// name first: a B-tree node is searched from its first key, so each name, smaller than
/// every one already there, is compared with one name only (in ascending order, with all).
pub(crate) fn into_table(headers: Headers) -> Result<FieldTable, TransportError> {
    let mut table = FieldTable::default();
    for (key, value) in headers.into_iter().rev() {
        crate::topology::check_short(&key)?;
        let key = short("header key", String::from(key))?;
        table.insert(key, into_value(value)?);
    }
    Ok(table)
}

fn header_key(key: &str) -> Result<ShortString, TransportError> {
    crate::topology::check_short(key)?;
    short("header key", key.to_owned())
}

fn to_value(value: &HeaderValue) -> Result<AMQPValue, TransportError> {
    into_value(value.clone())
}

fn into_value(value: HeaderValue) -> Result<AMQPValue, TransportError> {
    Ok(match value {
        HeaderValue::Bool(v) => AMQPValue::Boolean(v),
        HeaderValue::I8(v) => AMQPValue::ShortShortInt(v),
        HeaderValue::U8(v) => AMQPValue::ShortShortUInt(v),
        HeaderValue::I16(v) => AMQPValue::ShortInt(v),
        HeaderValue::U16(v) => AMQPValue::ShortUInt(v),
        HeaderValue::I32(v) => AMQPValue::LongInt(v),
        HeaderValue::U32(v) => AMQPValue::LongUInt(v),
        HeaderValue::I64(v) => AMQPValue::LongLongInt(v),
        HeaderValue::F32(v) => AMQPValue::Float(v),
        HeaderValue::F64(v) => AMQPValue::Double(v),
        HeaderValue::Decimal { scale, value } => {
            AMQPValue::DecimalValue(DecimalValue { scale, value })
        }
        HeaderValue::Str(s) => AMQPValue::LongString(s.into()),
        HeaderValue::Bytes(b) => AMQPValue::ByteArray(b.into()),
        HeaderValue::Timestamp(t) => AMQPValue::Timestamp(t),
        HeaderValue::Array(items) => {
            let mut array = FieldArray::default();
            for item in items {
                array.push(into_value(item)?);
            }
            AMQPValue::FieldArray(array)
        }
        HeaderValue::Table(t) => AMQPValue::FieldTable(into_table(t)?),
        HeaderValue::Void => AMQPValue::Void,
        // `HeaderValue` is non-exhaustive only towards other crates; a new variant must get
        // its own arm above. Until then, refuse it rather than guess a type.
        #[allow(unreachable_patterns)]
        other => {
            return Err(TransportError::Unsupported(format!(
                "header value {other:?} has no AMQP mapping"
            )));
        }
    })
}

/// An AMQP field table as a header table.
pub(crate) fn from_table(table: &FieldTable) -> Headers {
    table
        .inner()
        .iter()
        .map(|(k, v)| (HeaderName::wire(k.as_str()), from_value(v)))
        .collect()
}

/// One AMQP field value as a [`HeaderValue`].
pub(crate) fn from_value(value: &AMQPValue) -> HeaderValue {
    match value {
        AMQPValue::Boolean(v) => HeaderValue::Bool(*v),
        AMQPValue::ShortShortInt(v) => HeaderValue::I8(*v),
        AMQPValue::ShortShortUInt(v) => HeaderValue::U8(*v),
        AMQPValue::ShortInt(v) => HeaderValue::I16(*v),
        AMQPValue::ShortUInt(v) => HeaderValue::U16(*v),
        AMQPValue::LongInt(v) => HeaderValue::I32(*v),
        AMQPValue::LongUInt(v) => HeaderValue::U32(*v),
        AMQPValue::LongLongInt(v) => HeaderValue::I64(*v),
        AMQPValue::Float(v) => HeaderValue::F32(*v),
        AMQPValue::Double(v) => HeaderValue::F64(*v),
        AMQPValue::DecimalValue(d) => HeaderValue::Decimal {
            scale: d.scale,
            value: d.value,
        },
        AMQPValue::ShortString(s) => HeaderValue::Str(s.as_str().to_owned()),
        AMQPValue::LongString(s) => match std::str::from_utf8(s.as_bytes()) {
            Ok(text) => HeaderValue::Str(text.to_owned()),
            Err(_) => HeaderValue::Bytes(s.as_bytes().to_vec()),
        },
        AMQPValue::FieldArray(a) => {
            HeaderValue::Array(a.as_slice().iter().map(from_value).collect())
        }
        AMQPValue::Timestamp(t) => HeaderValue::Timestamp(*t),
        AMQPValue::FieldTable(t) => HeaderValue::Table(from_table(t)),
        AMQPValue::ByteArray(b) => HeaderValue::Bytes(b.as_slice().to_vec()),
        AMQPValue::Void => HeaderValue::Void,
    }
}

/// [`Properties`] as lapin `BasicProperties`, consuming them (strings are moved, not copied).
pub(crate) fn to_basic(p: Properties) -> Result<BasicProperties, TransportError> {
    let mut b = BasicProperties::default();
    if let Some(v) = p.content_type {
        b = b.with_content_type(short("content_type", v)?);
    }
    if let Some(v) = p.content_encoding {
        b = b.with_content_encoding(short("content_encoding", v)?);
    }
    if !p.headers.is_empty() {
        b = b.with_headers(into_table(p.headers)?);
    }
    if let Some(v) = p.delivery_mode {
        b = b.with_delivery_mode(v);
    }
    if let Some(v) = p.priority {
        b = b.with_priority(v);
    }
    if let Some(v) = p.correlation_id {
        b = b.with_correlation_id(short("correlation_id", v)?);
    }
    if let Some(v) = p.reply_to {
        b = b.with_reply_to(short("reply_to", v)?);
    }
    if let Some(v) = p.expiration {
        b = b.with_expiration(short("expiration", v)?);
    }
    if let Some(v) = p.message_id {
        b = b.with_message_id(short("message_id", v)?);
    }
    if let Some(v) = p.timestamp {
        b = b.with_timestamp(v);
    }
    if let Some(v) = p.kind {
        b = b.with_type(short("type", v)?);
    }
    if let Some(v) = p.user_id {
        b = b.with_user_id(short("user_id", v)?);
    }
    if let Some(v) = p.app_id {
        b = b.with_app_id(short("app_id", v)?);
    }
    if let Some(v) = p.cluster_id {
        b = b.with_cluster_id(short("cluster_id", v)?);
    }
    Ok(b)
}

fn owned(s: &Option<ShortString>) -> Option<String> {
    s.as_ref().map(|s| s.as_str().to_owned())
}

/// lapin `BasicProperties` as [`Properties`].
pub(crate) fn from_basic(b: &BasicProperties) -> Properties {
    Properties {
        message_id: owned(b.message_id()),
        content_type: owned(b.content_type()),
        content_encoding: owned(b.content_encoding()),
        delivery_mode: *b.delivery_mode(),
        priority: *b.priority(),
        correlation_id: owned(b.correlation_id()),
        reply_to: owned(b.reply_to()),
        expiration: owned(b.expiration()),
        timestamp: *b.timestamp(),
        kind: owned(b.kind()),
        user_id: owned(b.user_id()),
        app_id: owned(b.app_id()),
        cluster_id: owned(b.cluster_id()),
        headers: b.headers().as_ref().map(from_table).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant() -> Headers {
        let mut inner = Headers::new();
        inner.insert("n".into(), HeaderValue::I64(-5));
        let mut h = Headers::new();
        h.insert("bool".into(), HeaderValue::Bool(true));
        h.insert("i8".into(), HeaderValue::I8(-8));
        h.insert("u8".into(), HeaderValue::U8(200));
        h.insert("i16".into(), HeaderValue::I16(-300));
        h.insert("u16".into(), HeaderValue::U16(60_000));
        h.insert("i32".into(), HeaderValue::I32(-70_000));
        h.insert("u32".into(), HeaderValue::U32(4_000_000_000));
        h.insert("i64".into(), HeaderValue::I64(-9_000_000_000));
        h.insert("f32".into(), HeaderValue::F32(1.5));
        h.insert("f64".into(), HeaderValue::F64(-2.25));
        h.insert(
            "dec".into(),
            HeaderValue::Decimal {
                scale: 2,
                value: 12345,
            },
        );
        h.insert("str".into(), HeaderValue::Str("héllo".into()));
        h.insert("bytes".into(), HeaderValue::Bytes(vec![0, 159, 146, 150]));
        h.insert("ts".into(), HeaderValue::Timestamp(1_700_000_000));
        h.insert(
            "arr".into(),
            HeaderValue::Array(vec![HeaderValue::I32(1), HeaderValue::Str("a".into())]),
        );
        h.insert("table".into(), HeaderValue::Table(inner));
        h.insert("void".into(), HeaderValue::Void);
        h
    }

    #[test]
    fn every_header_variant_round_trips_with_its_type() {
        let h = every_variant();
        let table = to_table(&h).expect("encodable");
        assert!(matches!(table.inner()["str"], AMQPValue::LongString(_)));
        assert!(matches!(table.inner()["i32"], AMQPValue::LongInt(-70_000)));
        assert!(matches!(table.inner()["i64"], AMQPValue::LongLongInt(_)));
        assert!(matches!(
            table.inner()["u32"],
            AMQPValue::LongUInt(4_000_000_000)
        ));
        assert_eq!(from_table(&table), h);
        assert_eq!(from_table(&into_table(h.clone()).expect("encodable")), h);
    }

    #[test]
    fn non_utf8_long_strings_read_as_bytes_and_short_strings_as_str() {
        assert_eq!(
            from_value(&AMQPValue::LongString(vec![0xff, 0xfe].into())),
            HeaderValue::Bytes(vec![0xff, 0xfe])
        );
        assert_eq!(
            from_value(&AMQPValue::ShortString("s".into())),
            HeaderValue::Str("s".into())
        );
    }

    #[test]
    fn properties_round_trip() {
        let p = Properties {
            message_id: Some("m-1".into()),
            content_type: Some("application/json".into()),
            content_encoding: Some("gzip".into()),
            delivery_mode: Some(2),
            priority: Some(3),
            correlation_id: Some("c".into()),
            reply_to: Some("r".into()),
            expiration: Some("6000".into()),
            timestamp: Some(1_700_000_000),
            kind: Some("t".into()),
            user_id: Some("guest".into()),
            app_id: Some("app".into()),
            cluster_id: Some("cl".into()),
            headers: every_variant(),
        };
        assert_eq!(from_basic(&to_basic(p.clone()).expect("encodable")), p);
    }

    #[test]
    fn over_long_strings_are_refused_not_panicked() {
        let p = Properties {
            message_id: Some("x".repeat(256)),
            ..Default::default()
        };
        assert!(matches!(
            to_basic(p),
            Err(TransportError::InvalidName { .. })
        ));
        let mut h = Headers::new();
        h.insert("k".repeat(300).into(), HeaderValue::Void);
        assert!(matches!(
            to_table(&h),
            Err(TransportError::InvalidName { .. })
        ));
        assert!(matches!(
            name(&"q".repeat(256)),
            Err(TransportError::InvalidName { .. })
        ));
    }
}
