//! Codec-wrapper scenarios: encode + decode throughput of the encrypting codec
//! (AES-256-GCM) and of the claim-check codec (inline, stored in memory, stored on disk),
//! next to plain JSON, in messages per second. No broker: this measures the codec alone.
//! Run with `cargo run --release -p acemq-bench -- --wrappers [--messages N] [--size B]`.

use std::sync::Arc;
use std::time::Instant;

use acemq::codec::claim::{ClaimCheck, FilesystemClaimCheckStore, InMemoryClaimCheckStore};
use acemq::codec::encrypt::{ENCRYPTED, Encrypted, Key, Keyring};
use acemq::codec::{Decoder, Encoder, Json};

use crate::BoxError;

/// One row: a codec's encode and decode rates.
#[derive(Clone, Debug)]
pub struct WrapperRate {
    /// What was measured.
    pub name: &'static str,
    /// Messages encoded, then decoded.
    pub messages: u64,
    /// Body bytes on the wire for one message.
    pub body_bytes: usize,
    /// Encodes per second.
    pub encode_per_sec: f64,
    /// Decodes per second.
    pub decode_per_sec: f64,
}

impl WrapperRate {
    /// One table line.
    pub fn line(&self) -> String {
        format!(
            "{:<32} {:>8} msgs  body {:>7} B  encode {:>10.0}/s  decode {:>10.0}/s",
            self.name, self.messages, self.body_bytes, self.encode_per_sec, self.decode_per_sec
        )
    }
}

type Payload = serde_json::Value;

fn measure<C>(
    name: &'static str,
    codec: &C,
    content_type: &str,
    n: u64,
    payload: &Payload,
) -> Result<WrapperRate, BoxError>
where
    C: Encoder<Payload> + Decoder<Payload>,
{
    let t = Instant::now();
    let mut bodies = Vec::with_capacity(n as usize);
    for _ in 0..n {
        bodies.push(codec.encode(payload)?);
    }
    let encode = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for body in &bodies {
        let back: Payload = codec.decode(Some(content_type), body)?;
        if back != *payload {
            return Err(format!("{name}: decoded a different payload").into());
        }
    }
    let decode = t.elapsed().as_secs_f64();
    Ok(WrapperRate {
        name,
        messages: n,
        body_bytes: bodies.first().map_or(0, |b| b.len()),
        encode_per_sec: n as f64 / encode.max(1e-9),
        decode_per_sec: n as f64 / decode.max(1e-9),
    })
}

/// Runs every wrapper scenario with `n` messages of about `size` bytes of JSON.
pub fn run(n: u64, size: usize) -> Result<Vec<WrapperRate>, BoxError> {
    let payload = serde_json::json!({ "id": "o-1", "data": "x".repeat(size) });
    let json = "application/json";
    let keyring = Keyring::of(Key::new("bench", [7u8; 32])?);
    let dir = std::env::temp_dir().join(format!("acemq-bench-claims-{}", std::process::id()));
    let fs = Arc::new(FilesystemClaimCheckStore::new(&dir)?);
    let rows = vec![
        measure("json (baseline)", &Json, json, n, &payload)?,
        measure(
            "encrypted json (AES-256-GCM)",
            &Encrypted::wrapping(Json, keyring),
            ENCRYPTED,
            n,
            &payload,
        )?,
        measure(
            "claim check, inline",
            &ClaimCheck::wrapping(Json, Arc::new(InMemoryClaimCheckStore::new())),
            json,
            n,
            &payload,
        )?,
        measure(
            "claim check, stored in memory",
            &ClaimCheck::wrapping(Json, Arc::new(InMemoryClaimCheckStore::new())).threshold(0),
            json,
            n,
            &payload,
        )?,
        measure(
            "claim check, stored on disk",
            &ClaimCheck::wrapping(Json, fs).threshold(0),
            json,
            n,
            &payload,
        )?,
    ];
    std::fs::remove_dir_all(&dir)?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_wrapper_scenario_runs() {
        let rows = super::run(20, 64).unwrap();
        assert_eq!(rows.len(), 5);
        assert!(
            rows.iter()
                .all(|r| r.encode_per_sec > 0.0 && r.decode_per_sec > 0.0)
        );
    }
}
