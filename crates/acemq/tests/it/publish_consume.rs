//! Conformance: typed publish and consume on `memory://` and RabbitMQ.
//!
//! Pins: a typed round trip with the envelope and application headers a handler sees;
//! unroutable publishes are errors; `send_all` returns one confirmed result per message;
//! the reserved prefix is refused with nothing sent; concurrency really runs handlers in
//! parallel; a body published by a plain AMQP client with no AceMQ headers is consumable;
//! one message id sent to two destinations gets two outcomes; the 1,000-confirm window;
//! the text and raw-bytes codecs.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use acemq::connection::{ConnectionOptions, DEFAULT_MAX_OUTSTANDING_CONFIRMS};
use acemq::consume::{ConsumerOptions, Message};
use acemq::headers::HeaderValue;
use acemq::publish::SendOptions;
use acemq::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl};
use acemq::transport::memory::MemoryTransport;
use acemq::transport::{
    ConsumeSpec, Delivery, Outbound, PendingConfirm, Properties, QueueInfo, Subscription,
    Transport, TransportError, TransportStatus,
};
use acemq::{Connection, Error};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use support::{
    Broker, connect_with_classic_queue, on_each_target, publish_raw, teardown, unique,
    wait_for_count,
};
use tokio::sync::{Semaphore, mpsc, watch};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderPlaced {
    id: String,
    amount_cents: u64,
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_round_trip_with_envelope_and_application_headers() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "roundtrip").await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default(),
                move |m: Message<OrderPlaced>| {
                    let tx = tx.clone();
                    async move {
                        tx.send((
                            m.payload().clone(),
                            m.attempt(),
                            m.envelope().clone(),
                            m.headers().clone(),
                            m.content_type().map(str::to_owned),
                        ))
                        .ok();
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        let order = OrderPlaced {
            id: "o-1".into(),
            amount_cents: 1250,
        };
        let r = mq
            .publisher::<OrderPlaced>("", &q)
            .send_with(
                &order,
                SendOptions::new()
                    .message_id("m-1")
                    .message_type("order.placed")
                    .causation_id("cause-1")
                    .header("x-tenant", "acme"),
            )
            .await
            .unwrap();
        assert_eq!(r.message_id, "m-1");
        assert!(r.routed);
        let (payload, attempt, env, headers, ct) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(payload, order);
        assert_eq!(attempt, 1);
        assert_eq!(env.id(), "m-1");
        assert_eq!(env.correlation_id(), "m-1");
        assert_eq!(env.causation_id(), Some("cause-1"));
        assert_eq!(env.message_type(), "order.placed");
        assert!(env.origin().unwrap().starts_with("acemq@"));
        assert!(env.first_seen_millis().is_some());
        assert_eq!(ct.as_deref(), Some("application/json"));
        assert_eq!(headers.get("x-tenant"), Some(&HeaderValue::from("acme")));
        assert!(
            headers.keys().all(|k| !k.starts_with("x-acemq-")),
            "reserved headers leaked to the handler: {headers:?}"
        );
        consumer.close().await;
        assert_eq!(consumer.stats().acked, 1);
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_publishes_are_errors() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let missing = unique("nowhere");
        let err = mq
            .publisher::<u32>("", &missing)
            .send(&1)
            .await
            .unwrap_err();
        assert!(err.is_unroutable(), "{err}");
        let ex = unique("ex-unbound");
        mq.transport()
            .declare_exchange(&ExchangeDecl::durable(&ex, ExchangeKind::Topic))
            .await
            .unwrap();
        let err = mq.publisher::<u32>(&ex, "a.b").send(&1).await.unwrap_err();
        assert!(matches!(err, Error::Unroutable { ref exchange, .. } if *exchange == ex));
        // A prepared publish is mandatory whatever the caller built.
        let mut prepared = acemq::transport::Outbound::new(
            "",
            missing.clone(),
            acemq::transport::Properties::default(),
            "1",
        );
        prepared.mandatory = false;
        let err = mq.publish_prepared(prepared).await.unwrap_err();
        assert!(err.is_unroutable(), "{err}");
        // Not an error when the caller allows it.
        mq.publisher::<u32>(&ex, "a.b")
            .allow_unroutable()
            .send(&1)
            .await
            .unwrap();
        mq.transport().delete_exchange(&ex).await.unwrap();
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_returns_one_confirmed_result_per_message() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "batch").await;
        let payloads: Vec<u32> = (0..1000).collect();
        let results = mq
            .publisher::<u32>("", &q)
            .send_all(&payloads)
            .await
            .unwrap();
        assert_eq!(results.len(), 1000);
        assert!(results.iter().all(|r| r.routed));
        let ids: std::collections::HashSet<_> = results.iter().map(|r| &r.message_id).collect();
        assert_eq!(ids.len(), 1000, "every message has its own id");
        assert_eq!(
            wait_for_count(&**mq.transport(), &q, 1000, WAIT).await,
            1000
        );
        // A batch with unroutable members reports how many failed.
        let missing = unique("batch-missing");
        let err = mq
            .publisher::<u32>("", &missing)
            .send_all(&[1, 2, 3])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Batch {
                    failed: 3,
                    total: 3,
                    ..
                }
            ),
            "{err}"
        );
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_prefix_is_refused_and_nothing_is_sent() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "reserved").await;
        let err = mq
            .publisher::<u32>("", &q)
            .send_with(&1, SendOptions::new().header("x-acemq-attempt", 7))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ReservedHeader { ref name } if name == "x-acemq-attempt"));
        let err = mq
            .publisher::<u32>("", &q)
            .send_with(&1, SendOptions::new().version(0))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        assert_eq!(
            mq.transport()
                .inspect_queue(&q)
                .await
                .unwrap()
                .message_count,
            0
        );
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_publishing_is_refused_with_nothing_sent() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "paused").await;
        mq.pause_publishing();
        let err = mq.publisher::<u32>("", &q).send(&1).await.unwrap_err();
        assert!(matches!(err, Error::PublishingPaused) && err.is_refused());
        mq.resume_publishing();
        mq.publisher::<u32>("", &q).send(&2).await.unwrap();
        assert_eq!(wait_for_count(&**mq.transport(), &q, 1, WAIT).await, 1);
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_four_runs_four_handlers_at_once() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "concurrency").await;
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        // Every handler waits until four are inside at once: with fewer in parallel the
        // barrier never opens and the test times out.
        let barrier = Arc::new(tokio::sync::Barrier::new(4));
        let (r, p, b) = (running.clone(), peak.clone(), barrier.clone());
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().concurrency(4).prefetch(10),
                move |_m: Message<u32>| {
                    let (r, p, b) = (r.clone(), p.clone(), b.clone());
                    async move {
                        let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                        p.fetch_max(now, Ordering::SeqCst);
                        b.wait().await;
                        r.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        mq.publisher::<u32>("", &q)
            .send_all(&(0..8).collect::<Vec<_>>())
            .await
            .unwrap();
        support::eventually(WAIT, "8 acks", || async {
            (consumer.stats().acked == 8).then_some(())
        })
        .await;
        assert_eq!(peak.load(Ordering::SeqCst), 4);
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_acemq_headers_is_consumable() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "raw").await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default(),
                move |m: Message<OrderPlaced>| {
                    let tx = tx.clone();
                    async move {
                        tx.send((m.attempt(), m.envelope().message_type().to_owned()))
                            .ok();
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        publish_raw(
            &**mq.transport(),
            &q,
            Properties::default(),
            br#"{"id":"raw-1","amount_cents":5}"#,
        )
        .await;
        let (attempt, kind) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(attempt, 1);
        assert_eq!(kind, q, "type falls back to the routing key");
        consumer.close().await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

/// One message id published to two destinations at once, one routable and one not, many
/// times over, pipelined: each publish gets its own outcome (returns are matched by message
/// id *and* destination, never by id alone or by arrival order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_id_sent_to_two_destinations_gets_each_its_own_outcome() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "twin-ids").await;
        let nowhere = unique("twin-ids.nowhere");
        // Persistent and transient publishes are confirmed at different speeds, so RabbitMQ
        // coalesces acks (multiple=true) and lapin hangs a return on another publish's
        // confirm, often the twin's.
        let to_queue = [
            mq.publisher::<u32>("", &q),
            mq.publisher::<u32>("", &q).transient(),
        ];
        let to_nowhere = [
            mq.publisher::<u32>("", &nowhere),
            mq.publisher::<u32>("", &nowhere).transient(),
        ];
        const ROUNDS: u32 = 500;
        let (to_queue, to_nowhere) = (&to_queue, &to_nowhere);
        let mut meta = Vec::new();
        let mut futures = Vec::new();
        for n in 0..ROUNDS {
            let id = format!("twin-{n}");
            let speed = usize::from(n % 4 < 2);
            for routable in [true, false] {
                let publisher = if routable {
                    &to_queue[speed]
                } else {
                    &to_nowhere[speed]
                };
                let id = id.clone();
                meta.push((n, routable));
                futures.push(async move {
                    publisher
                        .send_with(&n, SendOptions::new().message_id(id))
                        .await
                });
            }
        }
        let outcomes = futures::future::join_all(futures).await;
        for ((n, routable), outcome) in meta.into_iter().zip(outcomes) {
            if routable {
                outcome.unwrap_or_else(|e| panic!("twin-{n} to {q} was routable: {e}"));
            } else {
                let err = outcome.expect_err("the twin to nowhere is unroutable");
                assert!(
                    matches!(&err, Error::Unroutable { routing_key, .. } if *routing_key == nowhere),
                    "twin-{n} to nowhere: {err}"
                );
            }
        }
        let held = wait_for_count(&**mq.transport(), &q, ROUNDS, WAIT).await;
        assert_eq!(held, ROUNDS, "exactly the routable twins arrived");
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

/// A transport that hands publishes to a `memory://` broker but withholds their confirms
/// until the test releases them: the confirm window is observable.
struct WithheldConfirms {
    inner: MemoryTransport,
    handed_over: AtomicUsize,
    confirms: Arc<Semaphore>,
}

impl Transport for WithheldConfirms {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn publish(&self, message: Outbound) -> BoxFuture<'_, Result<PendingConfirm, TransportError>> {
        Box::pin(async move {
            let pending = self.inner.publish(message).await?;
            self.handed_over.fetch_add(1, Ordering::SeqCst);
            let confirms = self.confirms.clone();
            let withheld: PendingConfirm = Box::pin(async move {
                confirms
                    .acquire()
                    .await
                    .expect("the confirm gate stays open")
                    .forget();
                pending.await
            });
            Ok(withheld)
        })
    }
    fn consume(
        &self,
        spec: ConsumeSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Subscription>, TransportError>> {
        self.inner.consume(spec)
    }
    fn get(&self, queue: &str) -> BoxFuture<'_, Result<Option<Delivery>, TransportError>> {
        self.inner.get(queue)
    }
    fn declare_exchange(&self, decl: &ExchangeDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.declare_exchange(decl)
    }
    fn declare_queue(&self, decl: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        self.inner.declare_queue(decl)
    }
    fn bind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.bind_queue(decl)
    }
    fn unbind_queue(&self, decl: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.unbind_queue(decl)
    }
    fn inspect_queue(&self, name: &str) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        self.inner.inspect_queue(name)
    }
    fn inspect_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.inspect_exchange(name)
    }
    fn delete_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        self.inner.delete_queue(name)
    }
    fn delete_exchange(&self, name: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.delete_exchange(name)
    }
    fn purge_queue(&self, name: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        self.inner.purge_queue(name)
    }
    fn status(&self) -> TransportStatus {
        self.inner.status()
    }
    fn watch_status(&self) -> watch::Receiver<TransportStatus> {
        self.inner.watch_status()
    }
    fn close(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.close()
    }
}

/// A connection allows 1,000 publishes awaiting their confirm: the 1,001st waits, handing
/// nothing to the transport, until a confirm frees a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thousand_and_first_unconfirmed_publish_waits_for_a_confirm() {
    assert_eq!(DEFAULT_MAX_OUTSTANDING_CONFIRMS, 1000);
    let transport = Arc::new(WithheldConfirms {
        inner: MemoryTransport::connect(&unique("confirm-window")),
        handed_over: AtomicUsize::new(0),
        confirms: Arc::new(Semaphore::new(0)),
    });
    let mq = Connection::with_transport(transport.clone(), ConnectionOptions::default());
    let q = unique("confirm-window");
    support::declare_classic(&mq, &q).await;
    let publisher = Arc::new(mq.publisher::<u32>("", &q));
    let mut first = tokio::task::JoinSet::new();
    for n in 0..1000 {
        let p = publisher.clone();
        first.spawn(async move { p.send(&n).await });
    }
    let handed_over = || transport.handed_over.load(Ordering::SeqCst);
    support::eventually(WAIT, "1,000 publishes handed over", || async {
        (handed_over() == 1000).then_some(())
    })
    .await;
    let p = publisher.clone();
    let next = tokio::spawn(async move { p.send(&1000).await });
    // A negative: for a while, the 1,001st reaches nothing (no condition to await).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(handed_over(), 1000, "the 1,001st publish waits for a slot");
    assert!(!next.is_finished());
    // One confirm frees one slot: the waiting publish goes out.
    transport.confirms.add_permits(1);
    support::eventually(WAIT, "the 1,001st handed over", || async {
        (handed_over() == 1001).then_some(())
    })
    .await;
    transport.confirms.add_permits(1000);
    next.await.unwrap().unwrap();
    while let Some(sent) = first.join_next().await {
        sent.unwrap().unwrap();
    }
    let held = wait_for_count(&**mq.transport(), &q, 1001, WAIT).await;
    assert_eq!(held, 1001);
    mq.close().await.ok();
}

/// The text and raw-bytes codecs end to end, on `memory://` and RabbitMQ: on the wire the
/// body is the exact bytes with the codec's content type, and a consumer with the same
/// codec gets the value back (non-ASCII text, bytes that are not UTF-8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_raw_bytes_codecs_round_trip() {
    use acemq::codec::{RawBytes, Text};

    on_each_target(|target: Broker| async move {
        let (mq, q) = connect_with_classic_queue(&target, "codecs").await;
        let text = "grüße, 世界 — ok".to_owned();
        let bytes: Vec<u8> = vec![0, 159, 146, 150, 255, b'\n', 0];

        // On the wire: exact bytes and content types.
        mq.publisher_with::<String, _>("", &q, Text)
            .send(&text)
            .await
            .unwrap();
        mq.publisher_with::<Vec<u8>, _>("", &q, RawBytes)
            .send(&bytes)
            .await
            .unwrap();
        let t = mq.transport();
        let wire_text = support::take_one(&**t, &q, WAIT).await;
        assert_eq!(&wire_text.body[..], text.as_bytes());
        assert_eq!(
            wire_text.properties.content_type.as_deref(),
            Some(acemq::codec::TEXT)
        );
        let wire_bytes = support::take_one(&**t, &q, WAIT).await;
        assert_eq!(&wire_bytes.body[..], &bytes[..]);
        assert_eq!(
            wire_bytes.properties.content_type.as_deref(),
            Some(acemq::codec::BYTES)
        );

        // Decoded by consumers with the same codecs.
        let q_bytes = format!("{q}.bytes");
        support::declare_classic(&mq, &q_bytes).await;
        mq.publisher_with::<String, _>("", &q, Text)
            .send(&text)
            .await
            .unwrap();
        mq.publisher_with::<Vec<u8>, _>("", &q_bytes, RawBytes)
            .send(&bytes)
            .await
            .unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let text_consumer = mq
            .consume_with(
                &q,
                Text,
                ConsumerOptions::default(),
                move |m: Message<String>| {
                    let tx = tx.clone();
                    async move {
                        tx.send(m.into_payload()).ok();
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        let (btx, mut brx) = mpsc::unbounded_channel::<Vec<u8>>();
        let bytes_consumer = mq
            .consume_with(
                &q_bytes,
                RawBytes,
                ConsumerOptions::default(),
                move |m: Message<Vec<u8>>| {
                    let btx = btx.clone();
                    async move {
                        btx.send(m.into_payload()).ok();
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        let got = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, text);
        let got = tokio::time::timeout(WAIT, brx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, bytes);
        support::eventually(WAIT, "both acked", || async {
            (text_consumer.stats().acked == 1 && bytes_consumer.stats().acked == 1).then_some(())
        })
        .await;
        assert_eq!(text_consumer.stats().parked, 0);
        assert_eq!(bytes_consumer.stats().parked, 0);
        text_consumer.close().await;
        bytes_consumer.close().await;
        support::delete_queues(&mq, &q_bytes, &[]).await;
        teardown(&mq, &q, &[]).await;
    })
    .await;
}
