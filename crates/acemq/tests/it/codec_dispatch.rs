//! A body in one of the family's formats reaching a consumer that cannot read it is parked
//! with a reason that says what to do: without the format's cargo feature, the reason names
//! the feature ("needs acemq's `yaml` feature"); with it, the reason says the consumer was
//! not given that codec. Runs on `memory://` and RabbitMQ, with any feature set (CI runs it
//! both with default features and with `--all-features`).
//!
//! Run: `cargo test -p acemq --test codec_dispatch` (and again with `--all-features`).

use crate::support;

use acemq::consume::{ConsumerOptions, Message};
use acemq::envelope;
use acemq::transport::Properties;
use support::settle::{WAIT, header_str, settled};
use support::{
    Broker, connect_with_classic_queue, on_each_target, publish_raw, take_one, teardown,
};

#[tokio::test]
async fn a_family_format_the_consumer_cannot_read_is_parked_naming_what_is_missing() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "dispatch").await;
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default(),
                |_m: Message<serde_json::Value>| async {
                    panic!("the handler must not run for a body it cannot read")
                },
            )
            .await
            .unwrap();
        let cases = [
            ("application/x-yaml", "yaml", &b"orderId: o-1\n"[..]),
            (
                "application/vnd.acemq.avro",
                "avro",
                &b"\x00\x00\x00\x00\x07\x06o-1"[..],
            ),
            ("application/x-protobuf", "protobuf", &b"\x0a\x03o-1"[..]),
        ];
        for (ct, _, body) in cases {
            let props = Properties {
                message_id: Some(format!("m-{ct}")),
                content_type: Some(ct.into()),
                ..Default::default()
            };
            publish_raw(&**mq.transport(), &q, props, body).await;
        }
        for _ in cases {
            let parked = take_one(&**mq.transport(), &format!("{q}.parked"), WAIT).await;
            let ct = parked.properties.content_type.clone().unwrap_or_default();
            let (_, feature, body) = cases
                .iter()
                .find(|(c, _, _)| *c == ct)
                .expect("a parked body is one of the published ones");
            assert_eq!(&parked.body[..], *body, "bytes unchanged");
            let reason = header_str(&parked, envelope::ERROR);
            let compiled = match *feature {
                "yaml" => cfg!(feature = "yaml"),
                "avro" => cfg!(feature = "avro"),
                _ => cfg!(feature = "protobuf"),
            };
            if compiled {
                assert!(reason.contains("is not JSON"), "{ct}: {reason}");
            } else {
                assert!(
                    reason.contains(&format!("needs acemq's `{feature}` feature")),
                    "{ct}: {reason}"
                );
            }
        }
        settled(&consumer, |s| s.parked == 3).await;
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}
