//! Conformance: the encrypting and claim-check codecs on `memory://` and
//! RabbitMQ: a body sealed under key k1 is read by a consumer whose keyring was rotated
//! (current k2, k1 kept for reading); a tampered body, an unknown key and a missing claim
//! land in `{q}.parked` with a reason that says which, and the handler never runs.
//!
//! The family's fixtures hold no encryption or claim-check vectors; the family's pinned
//! encryption vector (key 00..1f, id `2026-01`, nonce 00..0b, `hello`) is checked byte for
//! byte in `src/codec/encrypt/tests.rs` (the nonce is private API). Here every body of
//! `codec-interop-fixtures.json` (other members' bytes) goes through both wrappers
//! unchanged.

use crate::support;

use std::sync::{Arc, Mutex};

use acemq::codec::claim::{ClaimCheck, ClaimCheckStore, InMemoryClaimCheckStore, key_of};
use acemq::codec::encrypt::{ENCRYPTED, Encrypted, Key, Keyring, key_id_of};
use acemq::codec::{Decoder, Encoder, Json, RawBytes};
use acemq::consume::{ConsumerOptions, Message};
use acemq::envelope;
use acemq::transport::Properties;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use support::settle::{WAIT, header_str, settled};
use support::{
    Broker, connect_with_classic_queue, on_each_target, publish_raw, take_one, teardown,
};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Order {
    id: String,
    cents: i64,
}

fn key(id: &str, byte: u8) -> Key {
    Key::new(id, [byte; 32]).unwrap()
}

type Got = Arc<Mutex<Vec<Order>>>;

fn recorder(
    got: &Got,
) -> impl Fn(Message<Order>) -> std::future::Ready<Result<(), acemq::consume::HandlerError>>
+ Send
+ Sync
+ 'static {
    let got = got.clone();
    move |m: Message<Order>| {
        got.lock().unwrap().push(m.payload().clone());
        std::future::ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_with_k1_is_read_with_a_rotated_keyring_and_tampering_is_parked() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "encrypted").await;
        let writer = Encrypted::wrapping(Json, Keyring::of(key("k1", 1)));
        let rotated = Keyring::builder()
            .older(key("k1", 1))
            .current(key("k2", 2))
            .build()
            .unwrap();
        let got: Got = Arc::default();
        let consumer = mq
            .consume_with(
                &q,
                Encrypted::wrapping(Json, rotated),
                ConsumerOptions::default(),
                recorder(&got),
            )
            .await
            .unwrap();
        let order = Order {
            id: "o-1".into(),
            cents: 4250,
        };
        mq.publisher_with::<Order, _>("", &q, writer.clone())
            .send(&order)
            .await
            .unwrap();
        settled(&consumer, |s| s.acked == 1).await;
        assert_eq!(*got.lock().unwrap(), std::slice::from_ref(&order));

        // One bit of the ciphertext flipped: parked, the reason says authentication failed.
        let mut tampered = writer.encode(&order).unwrap().to_vec();
        let last = tampered.len() - 1;
        tampered[last] ^= 0x80;
        let props = |id: &str| Properties {
            message_id: Some(id.into()),
            content_type: Some(ENCRYPTED.into()),
            ..Default::default()
        };
        publish_raw(&**mq.transport(), &q, props("tampered"), &tampered).await;
        let parked = take_one(&**mq.transport(), &format!("{q}.parked"), WAIT).await;
        assert_eq!(&parked.body[..], &tampered[..], "parked as delivered");
        let reason = header_str(&parked, envelope::ERROR);
        assert!(
            reason.contains("failed authentication under key \"k1\""),
            "{reason}"
        );

        // Sealed under a key the reader does not hold: parked, naming the key to add.
        let stranger = Encrypted::wrapping(Json, Keyring::of(key("k0", 9)));
        let body = stranger.encode(&order).unwrap();
        publish_raw(&**mq.transport(), &q, props("unknown-key"), &body).await;
        let parked = take_one(&**mq.transport(), &format!("{q}.parked"), WAIT).await;
        let reason = header_str(&parked, envelope::ERROR);
        assert!(
            reason.contains("key \"k0\", which this keyring does not hold"),
            "{reason}"
        );
        assert_eq!(key_id_of(&parked.body).unwrap(), "k0");

        settled(&consumer, |s| s.parked == 2).await;
        assert_eq!(
            got.lock().unwrap().len(),
            1,
            "the handler never saw a bad body"
        );
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_checked_payload_is_read_back_and_a_missing_claim_is_parked() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "claim").await;
        let store = Arc::new(InMemoryClaimCheckStore::new());
        let codec = ClaimCheck::wrapping(Json, store.clone()).threshold(32);
        let got: Got = Arc::default();
        let consumer = mq
            .consume_with(
                &q,
                codec.clone(),
                ConsumerOptions::default(),
                recorder(&got),
            )
            .await
            .unwrap();
        let small = Order {
            id: "s".into(),
            cents: 1,
        };
        let big = Order {
            id: "b".repeat(100),
            cents: 2,
        };
        let publisher = mq.publisher_with::<Order, _>("", &q, codec.clone());
        publisher.send(&small).await.unwrap();
        publisher.send(&big).await.unwrap();
        settled(&consumer, |s| s.acked == 2).await;
        assert_eq!(*got.lock().unwrap(), [small, big]);
        assert_eq!(store.len(), 1, "only the big one was stored");

        let props = Properties {
            message_id: Some("gone".into()),
            content_type: Some("application/json".into()),
            ..Default::default()
        };
        let body = b"\xAC\x01\x01d2f4b6a8-0000-4000-8000-000000000000".to_vec();
        publish_raw(&**mq.transport(), &q, props, &body).await;
        let parked = take_one(&**mq.transport(), &format!("{q}.parked"), WAIT).await;
        assert_eq!(&parked.body[..], &body[..]);
        let reason = header_str(&parked, envelope::ERROR);
        assert!(
            reason.contains("\"d2f4b6a8-0000-4000-8000-000000000000\" is not in the store"),
            "{reason}"
        );
        settled(&consumer, |s| s.parked == 1).await;
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_members_bodies_pass_through_both_wrappers_unchanged() {
    let Some(fixtures) = support::fixture("codec-interop-fixtures.json") else {
        return;
    };
    let samples = fixtures["samples"].as_array().expect("samples");
    assert!(samples.len() >= 10, "{} samples", samples.len());
    let sealed = Encrypted::wrapping(RawBytes, Keyring::of(key("2026-01", 7)));
    let store = Arc::new(InMemoryClaimCheckStore::new());
    let claim = ClaimCheck::wrapping(RawBytes, store.clone()).threshold(64);
    for sample in samples {
        let body = STANDARD
            .decode(sample["body_base64"].as_str().expect("body"))
            .expect("base64");
        let ct = sample["content_type"].as_str();
        let wire = sealed.encode(&body).unwrap();
        assert_eq!(&wire[..3], &[0xAE, 0x01, 7]);
        assert_eq!(wire.len(), 3 + 7 + 12 + body.len() + 16);
        let back: Vec<u8> = sealed.decode(Some(ENCRYPTED), &wire).unwrap();
        assert_eq!(back, body);

        let wire = claim.encode(&body).unwrap();
        if body.len() < 64 {
            assert_eq!(&wire[..3], b"\xAC\x01\x00");
            assert_eq!(&wire[3..], &body[..]);
        } else {
            let k = key_of(&wire).expect("stored");
            assert_eq!(store.get(k).await.unwrap().as_deref(), Some(&body[..]));
        }
        let back: Vec<u8> = claim.decode(ct, &wire).unwrap();
        assert_eq!(back, body);
        // A body with no claim-check framing is read as the inner codec's.
        let plain: Vec<u8> = claim.decode(ct, &body).unwrap();
        assert_eq!(plain, body);
    }
    assert_eq!(
        Encoder::<Vec<u8>>::content_type(&claim),
        "application/octet-stream"
    );
    assert!(Decoder::<Vec<u8>>::accepts(&sealed, Some(ENCRYPTED)));
}
