//! The family's pinned vector (pinned by the Python member, matched by Go and Java)
//! and the framing's edges. The nonce is private API, so byte-exactness is checked here.

use super::*;
use crate::codec::{Json, RawBytes, Text};

fn fixture_key() -> Key {
    let secret: [u8; 32] = std::array::from_fn(|i| i as u8);
    Key::new("2026-01", secret).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const VECTOR: &str =
    "ae0107323032362d3031 000102030405060708090a0b 2f67ba77aa632797b83b1f88ef1394bb9ff6e85641";

#[test]
fn the_family_vector_is_matched_byte_for_byte_and_opens() {
    let nonce: [u8; 12] = std::array::from_fn(|i| i as u8);
    let body = seal(&fixture_key(), nonce, b"hello").unwrap();
    assert_eq!(&body[..], &hex(VECTOR)[..]);
    let ring = Keyring::of(fixture_key());
    assert_eq!(open(&ring, &hex(VECTOR)).unwrap(), b"hello");
    assert_eq!(key_id_of(&hex(VECTOR)).unwrap(), "2026-01");
}

#[test]
fn a_26_byte_key_id_round_trips() {
    let key = Key::new("orders-2025-06-rotated-out", [3u8; 32]).unwrap();
    assert_eq!(key.id().len(), 26);
    let codec = Encrypted::wrapping(Text, Keyring::of(key));
    let body =
        Encoder::<str>::encode(&codec, "multi-block text, longer than sixteen bytes").unwrap();
    assert_eq!(body[2], 26);
    let back: String = codec.decode(Some(ENCRYPTED), &body).unwrap();
    assert_eq!(back, "multi-block text, longer than sixteen bytes");
}

#[test]
fn every_message_gets_a_fresh_nonce() {
    let codec = Encrypted::wrapping(Json, Keyring::of(fixture_key()));
    let a = codec.encode(&1).unwrap();
    let b = codec.encode(&1).unwrap();
    assert_eq!(a.len(), 3 + 7 + 12 + 1 + 16);
    assert_ne!(a[10..22], b[10..22], "nonces repeat");
}

#[test]
fn tampering_anywhere_is_refused_with_a_reason() {
    let codec = Encrypted::wrapping(Json, Keyring::of(fixture_key()));
    let body = codec.encode(&serde_json::json!({"id": "o-1"})).unwrap();
    for i in 3..body.len() {
        let mut bad = body.to_vec();
        bad[i] ^= 0x01;
        let e = Decoder::<serde_json::Value>::decode(&codec, Some(ENCRYPTED), &bad).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("failed authentication") || text.contains("does not hold"),
            "byte {i}: {text}"
        );
    }
}

#[test]
fn a_wrong_key_an_unknown_key_and_a_plain_body_are_decode_errors() {
    let writer = Encrypted::wrapping(Json, Keyring::of(fixture_key()));
    let body = writer.encode(&5).unwrap();
    let same_id_other_key =
        Encrypted::wrapping(Json, Keyring::of(Key::new("2026-01", [0xFF; 32]).unwrap()));
    let e = Decoder::<i32>::decode(&same_id_other_key, Some(ENCRYPTED), &body).unwrap_err();
    assert!(matches!(e, Error::Decode { ref reason } if reason.contains("failed authentication")));
    let other = Encrypted::wrapping(Json, Keyring::of(Key::new("k9", [1; 32]).unwrap()));
    let e = Decoder::<i32>::decode(&other, Some(ENCRYPTED), &body).unwrap_err();
    assert!(e.to_string().contains("\"2026-01\""), "{e}");
    let e = Decoder::<i32>::decode(&other, None, b"5").unwrap_err();
    assert!(
        e.to_string()
            .contains("not in the AceMQ encryption framing"),
        "{e}"
    );
    let e = Decoder::<i32>::decode(&other, Some("application/json"), &body).unwrap_err();
    assert!(e.to_string().contains("not encrypted"), "{e}");
    // The old Go framing (`01 00 07 …`) is refused.
    assert!(key_id_of(&hex("0100 07 323032362d3031")).is_err());
    for short in [&[0xAEu8, 0x01][..], &[0xAE, 0x01, 7], &hex(VECTOR)[..30]] {
        assert!(matches!(
            key_id_of(short),
            Err(EncryptionError::NotFramed { .. })
        ));
    }
}

#[test]
fn a_rotated_keyring_opens_old_bodies_and_seals_with_the_new_key() {
    let old = Encrypted::wrapping(Json, Keyring::of(Key::new("k1", [1; 32]).unwrap()));
    let body = old.encode(&"x").unwrap();
    let ring = Keyring::builder()
        .older(Key::new("k1", [1; 32]).unwrap())
        .current(Key::new("k2", [2; 32]).unwrap())
        .build()
        .unwrap();
    let new = Encrypted::wrapping(Json, ring);
    let v: String = new.decode(Some(ENCRYPTED), &body).unwrap();
    assert_eq!(v, "x");
    assert_eq!(key_id_of(&new.encode(&"y").unwrap()).unwrap(), "k2");
    let dup = Keyring::builder()
        .older(Key::new("k1", [1; 32]).unwrap())
        .current(Key::new("k1", [2; 32]).unwrap())
        .build();
    assert!(matches!(dup, Err(EncryptionError::DuplicateKeyId { .. })));
    assert!(Key::new("", [0; 32]).is_err());
    assert!(Key::new("x".repeat(256), [0; 32]).is_err());
}

/// A body Java's `EncryptedCodec` wrote (key `00..1f`, id `2026-01`, `hello`), as pinned by
/// the Python member's `tests/test_encrypted.py`.
const JAVA_BODY: &str =
    "ae0107323032362d303175345ecc4a26ac55fcb992696364875909f4a91111aa73a811e509a7fedf911916";
/// The old Go framing for the same key and plaintext (no magic, two-byte length): refused.
const GO_BODY: &str =
    "010007323032362d30311abb60483ecd9b10f2817d6bbc6716a5813db519e5fe797c96d6c725baf9ddbbe6";

#[test]
fn a_body_java_wrote_opens_and_the_old_go_framing_is_refused() {
    let ring = Keyring::of(fixture_key());
    assert_eq!(open(&ring, &hex(JAVA_BODY)).unwrap(), b"hello");
    assert_eq!(key_id_of(&hex(JAVA_BODY)).unwrap(), "2026-01");
    let codec = Encrypted::wrapping(RawBytes, ring);
    let e = Decoder::<Vec<u8>>::decode(&codec, Some(ENCRYPTED), &hex(GO_BODY)).unwrap_err();
    assert!(e.to_string().contains("does not start with AE 01"), "{e}");
}

#[test]
fn a_relabelled_key_id_fails_even_when_both_ids_hold_the_same_key() {
    let secret: [u8; 32] = std::array::from_fn(|i| i as u8);
    let written = seal(&fixture_key(), [9; 12], b"hello").unwrap();
    let mut relabelled = vec![0xAE, 0x01, 7];
    relabelled.extend_from_slice(b"2026-02");
    relabelled.extend_from_slice(&written[10..]);
    let ring = Keyring::of(Key::new("2026-02", secret).unwrap());
    assert!(matches!(
        open(&ring, &relabelled),
        Err(EncryptionError::Tampered { .. })
    ));
}

#[test]
fn no_failure_message_shows_key_material_or_plaintext() {
    let codec = Encrypted::wrapping(Text, Keyring::of(fixture_key()));
    let body = Encoder::<str>::encode(&codec, "4111111111111111").unwrap();
    let mut tampered = body.to_vec();
    tampered[20] ^= 1;
    let other = Encrypted::wrapping(Text, Keyring::of(Key::new("2026-01", [0; 32]).unwrap()));
    let failures = [
        Decoder::<String>::decode(&codec, Some(ENCRYPTED), &tampered).unwrap_err(),
        Decoder::<String>::decode(&other, Some(ENCRYPTED), &body).unwrap_err(),
        Decoder::<String>::decode(&codec, Some(ENCRYPTED), &body[..14]).unwrap_err(),
    ];
    let key_hex: String = (0u8..32).map(|b| format!("{b:02x}")).collect();
    for e in failures {
        let text = e.to_string();
        assert!(!text.contains("4111") && !text.contains(&key_hex), "{text}");
    }
    // A wrong key and a tampered body read the same.
    let (a, b) = (
        Decoder::<String>::decode(&codec, Some(ENCRYPTED), &tampered).unwrap_err(),
        Decoder::<String>::decode(&other, Some(ENCRYPTED), &body).unwrap_err(),
    );
    assert_eq!(a.to_string(), b.to_string());
    assert!(!format!("{:?}", fixture_key()).contains("1f"));
}
