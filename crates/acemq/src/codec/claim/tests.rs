//! Framing and threshold edges of the claim-check codec.

use super::*;
use crate::codec::{Json, RawBytes};

fn codec(store: Arc<InMemoryClaimCheckStore>) -> ClaimCheck<RawBytes> {
    ClaimCheck::wrapping(RawBytes, store)
}

#[test]
fn exactly_the_threshold_is_stored_and_one_byte_less_is_inline() {
    let store = Arc::new(InMemoryClaimCheckStore::new());
    let c = codec(store.clone());
    let below = vec![7u8; DEFAULT_THRESHOLD - 1];
    let body = c.encode(&below).unwrap();
    assert_eq!(&body[..3], &INLINE);
    assert_eq!(&body[3..], &below[..]);
    assert!(store.is_empty());
    let at = vec![7u8; DEFAULT_THRESHOLD];
    let body = c.encode(&at).unwrap();
    assert_eq!(&body[..3], &STORED);
    let key = key_of(&body).unwrap();
    assert_eq!(&body[3..], key.as_bytes());
    assert_eq!(store.len(), 1);
    let back: Vec<u8> = c.decode(None, &body).unwrap();
    assert_eq!(back, at);
}

#[test]
fn threshold_zero_stores_everything_and_unframed_bodies_pass_to_the_inner_codec() {
    let store = Arc::new(InMemoryClaimCheckStore::new());
    let c = ClaimCheck::wrapping(Json, store.clone()).threshold(0);
    let body = c.encode(&"x").unwrap();
    assert!(key_of(&body).is_some());
    assert_eq!(Encoder::<str>::content_type(&c), "application/json");
    let plain: String = c.decode(Some("application/json"), b"\"y\"").unwrap();
    assert_eq!(plain, "y");
    let inline: String = c
        .decode(Some("application/json"), b"\xAC\x01\x00\"z\"")
        .unwrap();
    assert_eq!(inline, "z");
}

#[test]
fn a_missing_claim_is_a_decode_error_naming_the_key() {
    let c = codec(Arc::new(InMemoryClaimCheckStore::new()));
    let e = Decoder::<Vec<u8>>::decode(&c, None, b"\xAC\x01\x01gone-1").unwrap_err();
    assert!(
        matches!(e, Error::Decode { ref reason } if reason.contains("\"gone-1\" is not in the store")),
        "{e}"
    );
    let e = Decoder::<Vec<u8>>::decode(&c, None, b"\xAC\x01\x01").unwrap_err();
    assert!(e.to_string().contains("not a claim-check key"), "{e}");
}

#[test]
fn the_filesystem_store_refuses_keys_that_are_not_uuids() {
    let dir = std::env::temp_dir().join(format!("acemq-claims-{}", uuid::Uuid::new_v4()));
    let fs = Arc::new(FilesystemClaimCheckStore::new(&dir).unwrap());
    let c = ClaimCheck::wrapping(RawBytes, fs.clone()).threshold(1);
    let body = c.encode(&vec![1u8, 2, 3]).unwrap();
    let key = key_of(&body).unwrap().to_owned();
    assert!(dir.join(&key).exists());
    let back: Vec<u8> = c.decode(None, &body).unwrap();
    assert_eq!(back, [1, 2, 3]);
    let e = Decoder::<Vec<u8>>::decode(&c, None, b"\xAC\x01\x01../../etc/passwd").unwrap_err();
    assert!(e.to_string().contains("UUIDs"), "{e}");
    futures::executor::block_on(fs.delete(&key)).unwrap();
    let e = Decoder::<Vec<u8>>::decode(&c, None, &body).unwrap_err();
    assert!(e.to_string().contains("is not in the store"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_codec_drives_the_store_inside_a_multi_thread_runtime() {
    let store = Arc::new(InMemoryClaimCheckStore::new());
    let c = codec(store).threshold(2);
    let body = c.encode(&vec![1u8, 2, 3]).unwrap();
    let back: Vec<u8> = c.decode(None, &body).unwrap();
    assert_eq!(back, [1, 2, 3]);
}

#[test]
fn other_framings_and_versions_go_to_the_inner_codec_whole() {
    let c = codec(Arc::new(InMemoryClaimCheckStore::new()));
    for body in [
        &b"\xAC\x02\x00stuff"[..],
        b"\xAC\x01\x09stuff",
        b"\xAC",
        b"",
    ] {
        let v: Vec<u8> = c.decode(None, body).unwrap();
        assert_eq!(v, body);
        assert!(key_of(body).is_none() && !is_claim_check(body));
    }
    assert!(!is_claim_check(b"\xAC\x01\x00{}"));
}
