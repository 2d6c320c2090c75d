//! A JSON encoding of AMQP header tables that keeps every wire type exactly.
//!
//! Each value is a one-key object naming its AMQP field type, so a header read back from
//! the outbox is the header that was written, bit for bit:
//!
//! | [`HeaderValue`] | JSON |
//! |---|---|
//! | `Bool` | `{"t": true}` |
//! | `I8` / `U8` / `I16` / `U16` / `I32` / `U32` / `I64` | `{"b": n}` / `{"B": n}` / `{"s": n}` / `{"u": n}` / `{"I": n}` / `{"i": n}` / `{"l": n}` |
//! | `F32` / `F64` | `{"f": "1.5"}` / `{"d": "1.5"}` (a string, so every value, NaN included, round-trips exactly) |
//! | `Decimal` | `{"D": {"scale": s, "value": v}}` |
//! | `Str` | `{"S": "text"}` |
//! | `Bytes` | `{"x": "hex"}` |
//! | `Timestamp` | `{"T": seconds}` |
//! | `Array` | `{"A": [values]}` |
//! | `Table` | `{"F": {table}}` |
//! | `Void` | `{"V": null}` |
//!
//! ```
//! use acemq::headers::{Headers, HeaderValue};
//! use acemq_sql::headers_json::{decode, encode};
//! let mut h = Headers::new();
//! h.insert("x-acemq-attempt".into(), HeaderValue::I32(1));
//! let json = encode(&h);
//! assert_eq!(json, r#"{"x-acemq-attempt":{"I":1}}"#);
//! assert_eq!(decode(&json).unwrap(), h);
//! ```

use acemq::headers::{HeaderValue, Headers};
use serde_json::{Map, Value, json};

/// Encodes a header table as JSON text.
pub fn encode(headers: &Headers) -> String {
    table_to_value(headers).to_string()
}

/// Decodes JSON text written by [`encode`].
pub fn decode(text: &str) -> Result<Headers, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    value_to_table(&v)
}

fn table_to_value(h: &Headers) -> Value {
    Value::Object(
        h.iter()
            .map(|(k, v)| (k.to_string(), to_value(v)))
            .collect::<Map<_, _>>(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err("odd-length hex".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("bad hex {s:?}"))
        })
        .collect()
}

fn to_value(v: &HeaderValue) -> Value {
    match v {
        HeaderValue::Bool(b) => json!({ "t": b }),
        HeaderValue::I8(n) => json!({ "b": n }),
        HeaderValue::U8(n) => json!({ "B": n }),
        HeaderValue::I16(n) => json!({ "s": n }),
        HeaderValue::U16(n) => json!({ "u": n }),
        HeaderValue::I32(n) => json!({ "I": n }),
        HeaderValue::U32(n) => json!({ "i": n }),
        HeaderValue::I64(n) => json!({ "l": n }),
        HeaderValue::F32(f) => json!({ "f": f.to_string() }),
        HeaderValue::F64(f) => json!({ "d": f.to_string() }),
        HeaderValue::Decimal { scale, value } => {
            json!({ "D": { "scale": scale, "value": value } })
        }
        HeaderValue::Str(s) => json!({ "S": s }),
        HeaderValue::Bytes(b) => json!({ "x": hex(b) }),
        HeaderValue::Timestamp(t) => json!({ "T": t }),
        HeaderValue::Array(a) => json!({ "A": a.iter().map(to_value).collect::<Vec<_>>() }),
        HeaderValue::Table(t) => json!({ "F": table_to_value(t) }),
        HeaderValue::Void => json!({ "V": null }),
        // HeaderValue is non-exhaustive; a variant added later is kept as Void rather than
        // failing the enqueue.
        #[allow(unreachable_patterns)]
        _ => json!({ "V": null }),
    }
}

fn value_to_table(v: &Value) -> Result<Headers, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("a header table must be a JSON object, got {v}"))?;
    obj.iter()
        .map(|(k, v)| Ok((k.into(), from_value(v).map_err(|e| format!("{k}: {e}"))?)))
        .collect()
}

fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value) -> Result<T, String> {
    if let Some(n) = v.as_i64() {
        T::try_from(n).map_err(|_| format!("{n} out of range"))
    } else if let Some(n) = v.as_u64() {
        T::try_from(n).map_err(|_| format!("{n} out of range"))
    } else {
        Err(format!("expected an integer, got {v}"))
    }
}

fn from_value(v: &Value) -> Result<HeaderValue, String> {
    let obj = v
        .as_object()
        .filter(|o| o.len() == 1)
        .ok_or_else(|| format!("expected a one-key typed object, got {v}"))?;
    let Some((tag, inner)) = obj.iter().next() else {
        return Err("empty typed object".into());
    };
    let s = || {
        inner
            .as_str()
            .ok_or_else(|| format!("expected a string, got {inner}"))
    };
    Ok(match tag.as_str() {
        "t" => HeaderValue::Bool(
            inner
                .as_bool()
                .ok_or_else(|| format!("expected a bool, got {inner}"))?,
        ),
        "b" => HeaderValue::I8(int(inner)?),
        "B" => HeaderValue::U8(int(inner)?),
        "s" => HeaderValue::I16(int(inner)?),
        "u" => HeaderValue::U16(int(inner)?),
        "I" => HeaderValue::I32(int(inner)?),
        "i" => HeaderValue::U32(int(inner)?),
        "l" => HeaderValue::I64(int(inner)?),
        "f" => HeaderValue::F32(s()?.parse().map_err(|e| format!("bad f32: {e}"))?),
        "d" => HeaderValue::F64(s()?.parse().map_err(|e| format!("bad f64: {e}"))?),
        "D" => HeaderValue::Decimal {
            scale: int(&inner["scale"])?,
            value: int(&inner["value"])?,
        },
        "S" => HeaderValue::Str(s()?.to_owned()),
        "x" => HeaderValue::Bytes(unhex(s()?)?),
        "T" => HeaderValue::Timestamp(int(inner)?),
        "A" => HeaderValue::Array(
            inner
                .as_array()
                .ok_or_else(|| format!("expected an array, got {inner}"))?
                .iter()
                .map(from_value)
                .collect::<Result<_, _>>()?,
        ),
        "F" => HeaderValue::Table(value_to_table(inner)?),
        "V" => HeaderValue::Void,
        other => return Err(format!("unknown field type {other:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips_exactly() {
        let mut inner = Headers::new();
        inner.insert("n".into(), HeaderValue::I64(i64::MIN));
        let mut h = Headers::new();
        let values = vec![
            HeaderValue::Bool(true),
            HeaderValue::I8(-8),
            HeaderValue::U8(255),
            HeaderValue::I16(-16),
            HeaderValue::U16(65535),
            HeaderValue::I32(i32::MIN),
            HeaderValue::U32(u32::MAX),
            HeaderValue::I64(i64::MAX),
            HeaderValue::F32(0.1),
            HeaderValue::F64(std::f64::consts::PI),
            HeaderValue::F64(f64::INFINITY),
            HeaderValue::Decimal {
                scale: 2,
                value: 12345,
            },
            HeaderValue::Str("héllo \"q\"".into()),
            HeaderValue::Bytes(vec![0, 1, 254, 255]),
            HeaderValue::Timestamp(1_700_000_000),
            HeaderValue::Array(vec![HeaderValue::I32(1), HeaderValue::Str("a".into())]),
            HeaderValue::Table(inner),
            HeaderValue::Void,
        ];
        for (i, v) in values.into_iter().enumerate() {
            h.insert(format!("k{i}").into(), v);
        }
        assert_eq!(decode(&encode(&h)).unwrap(), h);
        let nan = Headers::from([("n".into(), HeaderValue::F64(f64::NAN))]);
        match &decode(&encode(&nan)).unwrap()["n"] {
            HeaderValue::F64(f) => assert!(f.is_nan()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refuses_what_it_did_not_write() {
        assert!(decode("[]").is_err());
        assert!(decode(r#"{"a":1}"#).is_err());
        assert!(decode(r#"{"a":{"I":1e100}}"#).is_err());
        assert!(decode(r#"{"a":{"b":300}}"#).is_err());
        assert!(decode(r#"{"a":{"Q":1}}"#).is_err());
    }
}
