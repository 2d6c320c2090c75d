//! One delivery path under every consumer kind: a plain consumer, a responder, an ordered
//! partition and a stream reader behave the same for what the path owns — the
//! connection's consume interceptors and handler layers, the idempotency claim, the
//! crash-loop guard, and what a handler's publishes inherit (correlation and causation).
//! Each case runs every kind on `memory://` and on RabbitMQ (streams: RabbitMQ only, as
//! `memory://` has none). And stream offsets committed to a store survive a restart.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::envelope::Envelope;
use acemq::idempotency::InMemoryIdempotencyStore;
use acemq::intercept::{
    ConsumeContext, ConsumeInterceptor, HandleInfo, HandleResult, HandlerFuture,
};
use acemq::ordered::{OnFailure, OrderedQueue};
use acemq::publish::SendOptions;
use acemq::retry::RetryPolicy;
use acemq::stream::{MemoryOffsetStore, StreamRetention};
use acemq::topology::QueueDecl;
use support::{Broker, eventually, on_each_target, spec, take_one, unique};

const WAIT: Duration = Duration::from_secs(30);

/// The consumer kinds the path runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    Responder,
    Ordered,
    Stream,
}

/// The kinds a target can run: streams need RabbitMQ.
fn kinds(target: &Broker) -> Vec<Kind> {
    let mut k = vec![Kind::Plain, Kind::Responder, Kind::Ordered];
    if target.kind() == "amqp" {
        k.push(Kind::Stream);
    }
    k
}

/// One running consumer of some kind, with where to send to it.
struct Running {
    kind: Kind,
    mq: Connection,
    /// The queue (plain, responder, stream) or the ordered queue's name.
    name: String,
    /// Where the responder's replies go.
    replies: String,
    ordered: Option<OrderedQueue<u32>>,
    close: Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>,
}

impl Running {
    /// The queue a delivery of this kind is consumed from (an ordered queue: its only
    /// partition).
    fn queue(&self) -> String {
        match self.kind {
            Kind::Ordered => format!("{}.p0", self.name),
            _ => self.name.clone(),
        }
    }

    async fn send(&self, n: u32, options: SendOptions) {
        match (&self.ordered, self.kind) {
            (Some(q), _) => {
                q.send_with(&n, options).await.expect("ordered send");
            }
            (None, Kind::Responder) => {
                self.mq
                    .publisher::<u32>("", &self.name)
                    .send_with(&n, options.reply_to(self.replies.clone()))
                    .await
                    .expect("request sent");
            }
            (None, _) => {
                self.mq
                    .publisher::<u32>("", &self.name)
                    .send_with(&n, options)
                    .await
                    .expect("sent");
            }
        }
    }

    /// Takes the next message from the consumed queue's `.dlq`: its `x-acemq-error`.
    async fn dead_letter_reason(&self) -> String {
        let dlq = format!("{}.dlq", self.queue());
        let dead = take_one(&**self.mq.transport(), &dlq, WAIT).await;
        dead.properties.headers["x-acemq-error"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    async fn stop(self) {
        (self.close)().await;
        let t = self.mq.transport().clone();
        let mut queues = vec![self.name.clone(), self.replies.clone()];
        if self.kind == Kind::Ordered {
            queues = vec![
                format!("{}.p0", self.name),
                format!("{}.p0.lock", self.name),
            ];
        }
        for q in queues {
            for name in [format!("{q}.dlq"), format!("{q}.parked"), q] {
                let _ = t.delete_queue(&name).await;
            }
        }
        if self.kind == Kind::Ordered {
            let _ = t.delete_exchange(&self.name).await;
        }
        self.mq.close().await.ok();
    }
}

/// Declares what `kind` consumes (quorum queues: the crash-loop guard reads their
/// `x-delivery-count`) and returns its name; an ordered queue has one partition.
async fn declare(mq: &Connection, kind: Kind, prefix: &str) -> (String, Option<OrderedQueue<u32>>) {
    let name = unique(&format!("{prefix}-{kind:?}").to_lowercase());
    match kind {
        Kind::Plain | Kind::Responder => {
            mq.transport()
                .declare_queue(&QueueDecl::quorum(name.clone()))
                .await
                .expect("declare");
            (name, None)
        }
        Kind::Ordered => {
            let q = ordered_queue(mq, &name);
            q.declare().await.expect("declare ordered");
            (name, Some(q))
        }
        Kind::Stream => {
            mq.declare_stream(
                &name,
                StreamRetention::new().max_age(Duration::from_secs(3600)),
            )
            .await
            .expect("declare stream");
            (name, None)
        }
    }
}

/// The ordered queue `name` of these tests on `mq`: one partition, one key, `Skip`.
fn ordered_queue(mq: &Connection, name: &str) -> OrderedQueue<u32> {
    mq.ordered::<u32>(name)
        .partitions(1)
        .keyed_by(|_| "one key".to_owned())
        .on_failure(OnFailure::Skip)
}

/// Starts a consumer of `kind` with `options` whose handler calls `run` on each message.
async fn start<F>(
    target: &Broker,
    kind: Kind,
    prefix: &str,
    options: ConsumerOptions,
    run: F,
) -> Running
where
    F: Fn(&Message<u32>) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    let mq = Connection::connect(&target.url()).await.expect("connect");
    start_on(mq, kind, prefix, options, run).await
}

async fn start_on<F>(
    mq: Connection,
    kind: Kind,
    prefix: &str,
    options: ConsumerOptions,
    run: F,
) -> Running
where
    F: Fn(&Message<u32>) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    let (name, _) = declare(&mq, kind, prefix).await;
    consume_declared(mq, kind, name, options, run).await
}

/// Starts a consumer of `kind` on what [`declare`] declared as `name`.
async fn consume_declared<F>(
    mq: Connection,
    kind: Kind,
    name: String,
    options: ConsumerOptions,
    run: F,
) -> Running
where
    F: Fn(&Message<u32>) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    let ordered = (kind == Kind::Ordered).then(|| ordered_queue(&mq, &name));
    let replies = format!("{name}.replies");
    let run = Arc::new(run);
    let close: Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send> = match kind {
        Kind::Plain => {
            let c = mq
                .consume(&name, options, move |m: Message<u32>| {
                    let r = run(&m);
                    async move { r }
                })
                .await
                .expect("consume");
            Box::new(move || Box::pin(async move { c.close().await }))
        }
        Kind::Responder => {
            mq.transport()
                .declare_queue(&QueueDecl::classic(replies.clone()))
                .await
                .expect("reply queue");
            let c = mq
                .respond(&name, options, move |m: Message<u32>| {
                    let r = run(&m).map(|()| *m.payload());
                    async move { r }
                })
                .await
                .expect("respond");
            Box::new(move || Box::pin(async move { c.close().await }))
        }
        Kind::Ordered => {
            let c = ordered
                .as_ref()
                .expect("an ordered queue")
                .consume_with(options, move |m: Message<u32>| {
                    let r = run(&m);
                    async move { r }
                })
                .await
                .expect("consume ordered");
            Box::new(move || Box::pin(async move { c.close().await }))
        }
        Kind::Stream => {
            let c = mq
                .stream::<u32>(&name)
                .from_first()
                .consume_with(options, move |m: Message<u32>| {
                    let r = run(&m);
                    async move { r }
                })
                .await
                .expect("read stream");
            Box::new(move || Box::pin(async move { c.close().await }))
        }
    };
    Running {
        kind,
        mq,
        name,
        replies,
        ordered,
        close,
    }
}

/// Waits until `handled` has counted exactly one handled message.
async fn handled_once(handled: &AtomicU32, what: &str) {
    eventually(WAIT, what, || async {
        (handled.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
}

#[derive(Default)]
struct Counting {
    before: AtomicU32,
    after: AtomicU32,
}

struct Counter(Arc<Counting>);

impl ConsumeInterceptor for Counter {
    fn before_handle(&self, _: &ConsumeContext<'_>) -> Result<(), HandlerError> {
        self.0.before.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn after_handle(&self, _: &ConsumeContext<'_>, _: &HandleResult<'_>) {
        self.0.after.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interceptors_and_handler_layers_run_for_every_consumer_kind() {
    on_each_target(|target: Broker| async move {
        for kind in kinds(&target) {
            let mq = Connection::connect(&target.url()).await.expect("connect");
            let counting = Arc::new(Counting::default());
            mq.intercept_consume(Counter(counting.clone()));
            let wrapped = Arc::new(AtomicU32::new(0));
            let w = wrapped.clone();
            mq.wrap_handlers(
                move |info: &HandleInfo, next: HandlerFuture| -> HandlerFuture {
                    let (w, queue) = (w.clone(), info.queue.clone());
                    Box::pin(async move {
                        let r = next.await;
                        assert!(!queue.is_empty());
                        w.fetch_add(1, Ordering::SeqCst);
                        r
                    })
                },
            );
            let handled = Arc::new(AtomicU32::new(0));
            let h = handled.clone();
            let running = start_on(
                mq,
                kind,
                "intercepted",
                ConsumerOptions::default(),
                move |_| {
                    h.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                },
            )
            .await;
            for n in 0..3 {
                running.send(n, SendOptions::default()).await;
            }
            eventually(WAIT, &format!("{kind:?}: three handled"), || async {
                (handled.load(Ordering::SeqCst) == 3 && counting.after.load(Ordering::SeqCst) == 3)
                    .then_some(())
            })
            .await;
            assert_eq!(counting.before.load(Ordering::SeqCst), 3, "{kind:?}");
            assert_eq!(
                wrapped.load(Ordering::SeqCst),
                3,
                "{kind:?}: the layer wrapped each run"
            );
            running.stop().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_can_answer_without_running_the_handler() {
    on_each_target(|target: Broker| async move {
        // Queue kinds: the refused message is dead-lettered. (A stream has no `.dlq`: a
        // refused entry stops the reader, as any final failure does; see `streams.rs`.)
        for kind in kinds(&target).into_iter().filter(|k| *k != Kind::Stream) {
            let mq = Connection::connect(&target.url()).await.expect("connect");
            // A tenancy check: messages without the tenant header never reach the handler.
            mq.wrap_handlers(|info: &HandleInfo, next: HandlerFuture| -> HandlerFuture {
                if info.headers.contains_key("x-tenant") {
                    next
                } else {
                    Box::pin(async { Err(HandlerError::fatal("no tenant")) })
                }
            });
            let handled = Arc::new(AtomicU32::new(0));
            let h = handled.clone();
            let options = ConsumerOptions::default().retry(RetryPolicy::none());
            let running = start_on(mq, kind, "tenancy", options, move |_| {
                h.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .await;
            running.send(1, SendOptions::default()).await;
            running
                .send(2, SendOptions::default().header("x-tenant", "acme"))
                .await;
            let reason = running.dead_letter_reason().await;
            assert!(reason.contains("no tenant"), "{kind:?}: {reason}");
            handled_once(&handled, &format!("{kind:?}: the tenant's message handled")).await;
            running.stop().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_before_returning_its_future_fails_only_that_message() {
    on_each_target(|target: Broker| async move {
        // Queue kinds: the failed message is dead-lettered (a stream stops its reader on a
        // final failure instead; see `streams.rs`).
        for kind in kinds(&target).into_iter().filter(|k| *k != Kind::Stream) {
            let handled = Arc::new(AtomicU32::new(0));
            let h = handled.clone();
            let options = ConsumerOptions::default().retry(RetryPolicy::none());
            // The harness calls this inside the handler's `call`, before the future exists.
            let running = start(&target, kind, "panics-early", options, move |m| {
                if *m.payload() == 1 {
                    panic!("message 1 refused before a future was made");
                }
                h.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .await;
            running.send(1, SendOptions::default()).await;
            running.send(2, SendOptions::default()).await;
            let reason = running.dead_letter_reason().await;
            assert!(
                reason.contains("panicked") && reason.contains("message 1 refused"),
                "{kind:?}: {reason}"
            );
            handled_once(
                &handled,
                &format!("{kind:?}: the consumer goes on to message 2"),
            )
            .await;
            running.stop().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_store_skips_a_duplicate_on_every_consumer_kind() {
    on_each_target(|target: Broker| async move {
        for kind in kinds(&target) {
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let s = seen.clone();
            let options =
                ConsumerOptions::default().idempotent(InMemoryIdempotencyStore::for_one_day());
            let running = start(&target, kind, "idem", options, move |m| {
                s.lock().unwrap().push(*m.payload());
                Ok(())
            })
            .await;
            running
                .send(1, SendOptions::default().message_id("order-1"))
                .await;
            running
                .send(2, SendOptions::default().message_id("order-1"))
                .await;
            running
                .send(3, SendOptions::default().message_id("order-2"))
                .await;
            eventually(WAIT, &format!("{kind:?}: order-2 handled"), || async {
                seen.lock().unwrap().contains(&3).then_some(())
            })
            .await;
            // In order, one at a time: the duplicate was settled before order-2 ran.
            assert_eq!(
                *seen.lock().unwrap(),
                [1, 3],
                "{kind:?}: the duplicate never ran"
            );
            running.stop().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_message_is_dead_lettered_unhandled_on_every_queue_kind() {
    on_each_target(|target: Broker| async move {
        // A stream has no redeliveries to count: nothing there can loop.
        for kind in kinds(&target).into_iter().filter(|k| *k != Kind::Stream) {
            let mq = Connection::connect(&target.url()).await.expect("connect");
            let (name, ordered) = declare(&mq, kind, "crash").await;
            let queue = match kind {
                Kind::Ordered => format!("{name}.p0"),
                _ => name.clone(),
            };
            match &ordered {
                Some(q) => {
                    q.send(&7).await.expect("send");
                }
                None => {
                    mq.publisher::<u32>("", &queue)
                        .send_with(&7, SendOptions::default().reply_to("nowhere"))
                        .await
                        .expect("send");
                }
            }
            for _ in 0..3 {
                // A consumer that dies holding it: its connection closes unsettled.
                let t = target.transport().await;
                let mut sub = t.consume(spec(&queue, 1)).await.expect("consume");
                tokio::time::timeout(WAIT, sub.next())
                    .await
                    .expect("a delivery")
                    .expect("open")
                    .expect("delivery");
                t.close().await.expect("close");
            }
            mq.close().await.ok();
            let runs = Arc::new(AtomicU32::new(0));
            let r = runs.clone();
            let options = ConsumerOptions::default()
                .retry(RetryPolicy::fixed(3, Duration::from_millis(10)).unwrap());
            let mq = Connection::connect(&target.url()).await.expect("connect");
            let running = consume_declared(mq, kind, name, options, move |_| {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .await;
            let dead = take_one(&**running.mq.transport(), &format!("{queue}.dlq"), WAIT).await;
            let reason = dead.properties.headers["x-acemq-error"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                reason.contains("exhausted 3 attempts: delivered 3 times without a settlement"),
                "{kind:?}: {reason}"
            );
            assert_eq!(
                runs.load(Ordering::SeqCst),
                0,
                "{kind:?}: the handler never ran"
            );
            running.stop().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_publish_carries_the_correlation_and_the_message_it_came_from() {
    on_each_target(|target: Broker| async move {
        for kind in kinds(&target) {
            let mq = Connection::connect(&target.url()).await.expect("connect");
            let out = unique("caused");
            mq.transport()
                .declare_queue(&QueueDecl::classic(out.clone()))
                .await
                .expect("declare out");
            let publisher = Arc::new(mq.publisher::<String>("", &out));
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let (name, ordered) = declare(&mq, kind, "cause").await;
            let replies = format!("{name}.replies");
            let handler = {
                let publisher = publisher.clone();
                move |m: Message<u32>| {
                    let (publisher, tx) = (publisher.clone(), tx.clone());
                    async move {
                        let sent = publisher
                            .send(&"follow-up".to_owned())
                            .await
                            .map_err(HandlerError::retry)?;
                        tx.send(sent.message_id.clone()).ok();
                        let _ = m.payload();
                        Ok(())
                    }
                }
            };
            let close: futures::future::BoxFuture<'static, ()> = match kind {
                Kind::Plain => {
                    let c = mq
                        .consume(&name, ConsumerOptions::default(), handler)
                        .await
                        .expect("consume");
                    Box::pin(async move { c.close().await })
                }
                Kind::Responder => {
                    mq.transport()
                        .declare_queue(&QueueDecl::classic(replies.clone()))
                        .await
                        .expect("replies");
                    let c = mq
                        .respond(&name, ConsumerOptions::default(), move |m: Message<u32>| {
                            let inner = handler(m);
                            async move { inner.await.map(|()| 0u32) }
                        })
                        .await
                        .expect("respond");
                    Box::pin(async move { c.close().await })
                }
                Kind::Ordered => {
                    let c = ordered
                        .as_ref()
                        .expect("ordered")
                        .consume_with(ConsumerOptions::default(), handler)
                        .await
                        .expect("consume");
                    Box::pin(async move { c.close().await })
                }
                Kind::Stream => {
                    let c = mq
                        .stream::<u32>(&name)
                        .from_first()
                        .consume(handler)
                        .await
                        .expect("read");
                    Box::pin(async move { c.close().await })
                }
            };
            let incoming = SendOptions::default()
                .message_id("in-1")
                .correlation_id("corr-1");
            match (&ordered, kind) {
                (Some(q), _) => {
                    q.send_with(&1, incoming).await.expect("send");
                }
                (None, Kind::Responder) => {
                    mq.publisher::<u32>("", &name)
                        .send_with(&1, incoming.reply_to(replies.clone()))
                        .await
                        .expect("send");
                }
                _ => {
                    mq.publisher::<u32>("", &name)
                        .send_with(&1, incoming)
                        .await
                        .expect("send");
                }
            }
            let sent_id = tokio::time::timeout(WAIT, rx.recv())
                .await
                .expect("the handler published")
                .expect("an id");
            let d = take_one(&**mq.transport(), &out, WAIT).await;
            let e = Envelope::read(&d.properties, &d.routing_key);
            assert_eq!(e.id(), sent_id, "{kind:?}");
            assert_eq!(
                e.correlation_id(),
                "corr-1",
                "{kind:?}: the correlation flows on"
            );
            assert_eq!(
                e.causation_id(),
                Some("in-1"),
                "{kind:?}: caused by the handled message"
            );
            close.await;
            let t = mq.transport();
            let mut queues = vec![out.clone(), name.clone(), replies.clone()];
            if kind == Kind::Ordered {
                queues = vec![out.clone(), format!("{name}.p0")];
                let _ = t.delete_exchange(&name).await;
            }
            for q in queues {
                for n in [format!("{q}.dlq"), format!("{q}.parked"), q] {
                    let _ = t.delete_queue(&n).await;
                }
            }
            mq.close().await.ok();
        }
    })
    .await;
}

/// Stream offsets committed to a store survive a restart (RabbitMQ: `memory://` has no
/// streams). The reader starts after the committed offset, not at `from_first`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reader_resumes_after_its_committed_offset() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    let mq = Connection::connect(&url).await.expect("connect");
    let stream = unique("offsets");
    mq.declare_stream(
        &stream,
        StreamRetention::new().max_age(Duration::from_secs(3600)),
    )
    .await
    .expect("declare");
    let store = Arc::new(MemoryOffsetStore::new());
    let publisher = mq.publisher::<u32>("", &stream);
    for n in 0..5 {
        publisher.send(&n).await.expect("send");
    }
    let read = |store: Arc<MemoryOffsetStore>| {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let reader = mq
            .stream::<u32>(&stream)
            .from_first()
            .offsets(store, "indexer")
            .consume(move |m: Message<u32>| {
                s.lock().unwrap().push((m.stream_offset(), *m.payload()));
                async { Ok(()) }
            });
        (reader, seen)
    };
    let (reader, seen) = read(store.clone());
    let reader = reader.await.expect("first reader");
    eventually(WAIT, "five read", || async {
        (seen.lock().unwrap().len() == 5).then_some(())
    })
    .await;
    reader.close().await;
    let last = seen.lock().unwrap()[4].0.expect("an offset");
    use acemq::stream::OffsetStore;
    assert_eq!(
        store.load(&stream, "indexer").await.unwrap(),
        Some(last),
        "committed on close"
    );
    for n in 5..7 {
        publisher.send(&n).await.expect("send");
    }
    let (reader, seen) = read(store.clone());
    let reader = reader.await.expect("second reader");
    eventually(WAIT, "the two new ones read", || async {
        (seen.lock().unwrap().len() >= 2).then_some(())
    })
    .await;
    reader.close().await;
    let got: Vec<u32> = seen.lock().unwrap().iter().map(|(_, n)| *n).collect();
    assert_eq!(
        got,
        [5, 6],
        "resumed just after the committed offset (exclusive)"
    );
    let _ = mq.transport().delete_queue(&stream).await;
    mq.close().await.ok();
}

/// A decoder that reads only CSV and counts its calls.
struct Csv(Arc<AtomicU32>);

impl acemq::codec::Decoder<String> for Csv {
    fn accepts(&self, content_type: Option<&str>) -> bool {
        content_type.is_some_and(|ct| ct.starts_with("text/csv"))
    }
    fn expects(&self) -> &str {
        "CSV"
    }
    fn decode(&self, _: Option<&str>, body: &[u8]) -> Result<String, acemq::Error> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(String::from_utf8_lossy(body).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_decoder_does_not_accept_is_parked_without_decoding() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "accepts").await;
        let decodes = Arc::new(AtomicU32::new(0));
        let handled = Arc::new(AtomicU32::new(0));
        let h = handled.clone();
        let consumer = mq
            .consume_with(
                &q,
                Csv(decodes.clone()),
                ConsumerOptions::default(),
                move |_: Message<String>| {
                    h.fetch_add(1, Ordering::SeqCst);
                    async { Ok(()) }
                },
            )
            .await
            .expect("consume");
        for ct in ["application/json", "text/csv"] {
            let props = acemq::transport::Properties {
                content_type: Some(ct.into()),
                ..Default::default()
            };
            support::publish_raw(&**mq.transport(), &q, props, b"a,b").await;
        }
        let parked = take_one(&**mq.transport(), &format!("{q}.parked"), WAIT).await;
        assert_eq!(
            parked.properties.content_type.as_deref(),
            Some("application/json")
        );
        let reason = parked.properties.headers["x-acemq-error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            reason.contains("\"application/json\" is not CSV"),
            "{reason}"
        );
        handled_once(&handled, "the CSV one handled").await;
        assert_eq!(
            decodes.load(Ordering::SeqCst),
            1,
            "only the accepted body was decoded"
        );
        consumer.close().await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}
