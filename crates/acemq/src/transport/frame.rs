//! The size of a message's AMQP content-header frame, so that nothing the engine publishes
//! outgrows the connection's negotiated `frame_max` (a broker closes the connection that
//! sends one: RabbitMQ's `FRAME_ERROR` "frame_too_large").
//!
//! The body is split across as many body frames as it needs, so only the header frame has to
//! fit: frame header (type 1 + channel 2 + size 4) and frame end (1) = 8 bytes of overhead,
//! then class id 2, weight 2, body size 8, property flags 2, then the properties that are
//! set (short strings 1 + length, `delivery-mode` and `priority` 1, `timestamp` 8, the
//! header table 4 + its entries). A table entry is its key (1 + length), a type octet and
//! the value in AMQP 0-9-1 field encoding. The figure is exact for what the transports
//! send; [`HEADER_MARGIN`] is kept free on top of it for anything a client library adds.

use super::Properties;
use crate::headers::{HeaderValue, Headers};

/// The `frame_max` a transport reports when it has nothing negotiated (RabbitMQ's default).
pub const DEFAULT_FRAME_MAX: u32 = 131_072;

/// Bytes kept free under `frame_max` when the engine sizes a copy.
pub const HEADER_MARGIN: usize = 256;

/// The bytes of the content-header frame carrying `properties` (overhead included).
///
/// ```
/// use acemq::transport::{Properties, header_frame_size};
/// assert_eq!(header_frame_size(&Properties::default()), 8 + 14);
/// ```
pub fn header_frame_size(p: &Properties) -> usize {
    let short = |s: &Option<String>| s.as_ref().map_or(0, |s| 1 + s.len());
    let mut n = 8 + 14;
    for s in [
        &p.content_type,
        &p.content_encoding,
        &p.correlation_id,
        &p.reply_to,
        &p.expiration,
        &p.message_id,
        &p.kind,
        &p.user_id,
        &p.app_id,
        &p.cluster_id,
    ] {
        n += short(s);
    }
    n += usize::from(p.delivery_mode.is_some()) + usize::from(p.priority.is_some());
    n += if p.timestamp.is_some() { 8 } else { 0 };
    if !p.headers.is_empty() {
        n += table_size(&p.headers);
    }
    n
}

/// A field table: its 4-byte length, then every entry.
fn table_size(t: &Headers) -> usize {
    4 + t
        .iter()
        .map(|(k, v)| 1 + k.len() + 1 + value_size(v))
        .sum::<usize>()
}

/// A field value without its type octet.
fn value_size(v: &HeaderValue) -> usize {
    match v {
        HeaderValue::Bool(_) | HeaderValue::I8(_) | HeaderValue::U8(_) => 1,
        HeaderValue::I16(_) | HeaderValue::U16(_) => 2,
        HeaderValue::I32(_) | HeaderValue::U32(_) | HeaderValue::F32(_) => 4,
        HeaderValue::I64(_) | HeaderValue::F64(_) | HeaderValue::Timestamp(_) => 8,
        HeaderValue::Decimal { .. } => 5,
        HeaderValue::Str(s) => 4 + s.len(),
        HeaderValue::Bytes(b) => 4 + b.len(),
        HeaderValue::Array(a) => 4 + a.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        HeaderValue::Table(t) => table_size(t),
        HeaderValue::Void => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_is_counted() {
        let mut p = Properties {
            message_id: Some("m-1".into()),
            delivery_mode: Some(2),
            timestamp: Some(1),
            ..Default::default()
        };
        let base = 8 + 14 + 4 + 1 + 8;
        assert_eq!(header_frame_size(&p), base);
        p.headers.insert("k".into(), HeaderValue::Str("abc".into()));
        // table length 4 + key 1+1 + type 1 + 4+3
        assert_eq!(header_frame_size(&p), base + 4 + 2 + 1 + 7);
        p.headers.insert(
            "a".into(),
            HeaderValue::Array(vec![HeaderValue::I64(1), HeaderValue::Bool(true)]),
        );
        assert_eq!(
            header_frame_size(&p),
            base + 4 + 2 + 1 + 7 + 2 + 1 + 4 + 9 + 2
        );
    }
}
