//! Settlement under faults, on `memory://` with injected faults and on RabbitMQ
//! for real:
//!
//! - a decision is made once: with publishing impossible, a failing delivery's handler runs
//!   exactly once, its move is tried again with backoff, and the consumer takes no new
//!   deliveries meanwhile (saying why); only a lost consuming channel runs it again;
//! - a copy that can never be sent (target missing, too large for the frame) is held, or
//!   rejected to `{q}.dlq` by the broker when the queue has the dead-letter arguments;
//! - no copy larger than the frame: the reason is cut first, and the connection stays open;
//! - engine moves never wait behind application publishes.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::consume::{Consumer, ConsumerOptions, HandlerError, Message, SET_ASIDE_PAUSE};
use acemq::envelope;
use acemq::headers::HeaderValue;
use acemq::topology::{QueueDecl, Topology};
use acemq::transport::memory::{MemoryBroker, MemoryTransport};
use acemq::transport::recovery::RecoveryPolicy;
use acemq::transport::{Outbound, Properties, Transport, header_frame_size};
use support::{Broker, eventually, on_each_target, take_one, unique};
use tokio::sync::Semaphore;

const WAIT: Duration = Duration::from_secs(20);

/// Handler runs per message id.
type Runs = Arc<Mutex<HashMap<String, Vec<bool>>>>;

fn runs(r: &Runs, id: &str) -> Vec<bool> {
    r.lock().unwrap().get(id).cloned().unwrap_or_default()
}

/// A consumer whose handler records each run (with its redelivered flag), waits for
/// `gate` on the first run of `m1`, and fails fatally for every id starting with `bad`.
async fn consume_recording(mq: &Connection, q: &str, gate: Arc<Semaphore>) -> (Consumer, Runs) {
    let seen: Runs = Arc::default();
    let s = seen.clone();
    let consumer = mq
        .consume(
            q,
            ConsumerOptions::default(),
            move |m: Message<serde_json::Value>| {
                let s = s.clone();
                let gate = gate.clone();
                async move {
                    let id = m.envelope().id().to_owned();
                    if id == "bad-1" && !m.redelivered() {
                        let _ = gate.acquire().await;
                    }
                    s.lock()
                        .unwrap()
                        .entry(id.clone())
                        .or_default()
                        .push(m.redelivered());
                    if id.starts_with("bad") {
                        return Err(HandlerError::fatal("cannot be processed"));
                    }
                    Ok(())
                }
            },
        )
        .await
        .unwrap();
    (consumer, seen)
}

async fn send(mq: &Connection, q: &str, id: &str) {
    mq.publisher::<serde_json::Value>("", q)
        .send_with(
            &serde_json::json!({ "id": id }),
            acemq::publish::SendOptions::new().message_id(id),
        )
        .await
        .unwrap();
}

async fn count(t: &dyn Transport, q: &str) -> u32 {
    t.inspect_queue(q).await.unwrap().message_count
}

async fn delete_all(t: &dyn Transport, q: &str) {
    for suffix in ["", ".dlq", ".parked"] {
        let _ = t.delete_queue(&format!("{q}{suffix}")).await;
    }
}

/// How a test makes publishing impossible: the memory broker blocks publishing; on
/// RabbitMQ this test's own publishing connection is closed from the broker side (its
/// recovery is slow enough for the outage to be seen).
enum Outage {
    Memory(Arc<MemoryBroker>),
    Amqp(String),
}

impl Outage {
    async fn start(&self) {
        match self {
            Outage::Memory(b) => b.block("an injected alarm"),
            Outage::Amqp(name) => {
                support::close_rabbit_connection_named(&format!("{name} (publish)"))
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        }
    }

    fn end(&self) {
        if let Outage::Memory(b) = self {
            b.unblock();
        }
    }
}

async fn connect_for_outage(target: &Broker) -> (Connection, Outage) {
    let name = unique("settle-outage");
    let slow = RecoveryPolicy::default().delays(Duration::from_secs(3), Duration::from_secs(4));
    let options = ConnectionOptions::default().name(&name).recovery(slow);
    match target {
        Broker::Memory(broker) => (
            Connection::connect_with(&target.url(), options)
                .await
                .unwrap(),
            Outage::Memory(MemoryBroker::named(broker)),
        ),
        Broker::Amqp(url) => (
            Connection::connect_with(url, options).await.unwrap(),
            Outage::Amqp(name),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_publishing_impossible_each_failing_handler_runs_once_and_moves_back_off() {
    on_each_target(|target: Broker| async move {
        let (mq, outage) = connect_for_outage(&target).await;
        let t = mq.transport().clone();
        let q = unique("outage");
        t.declare_queue(&QueueDecl::classic(&q)).await.unwrap();
        for id in ["bad-1", "bad-2", "bad-3"] {
            send(&mq, &q, id).await;
        }
        let gate = Arc::new(Semaphore::new(0));
        let (consumer, seen) = consume_recording(&mq, &q, gate.clone()).await;
        eventually(WAIT, "bad-1's handler started", || async {
            (consumer.in_flight() == 1).then_some(())
        })
        .await;

        outage.start().await;
        eventually(WAIT, "publishing impossible", || async {
            let s = mq.status();
            (!s.connected || s.blocked.is_some()).then_some(())
        })
        .await;
        gate.add_permits(1);

        if let Outage::Memory(_) = outage {
            // The outage lasts: the consumer stops taking deliveries and says why.
            let why = eventually(WAIT, "the consumer waiting for publishing", || async {
                consumer.moves().waiting_for_publish
            })
            .await;
            assert!(why.contains("blocks publishing"), "{why}");
            let started = Instant::now();
            tokio::time::sleep(Duration::from_secs(3)).await;
            let tries = consumer.stats().set_aside_failed;
            // A fixed 250 ms pause would have tried about 12 times by now.
            let fixed = (started.elapsed().as_millis() / SET_ASIDE_PAUSE.as_millis()) as u64;
            assert!(
                (1..=5).contains(&tries) && tries * 2 < fixed,
                "backed off: {tries} tries in {:?}",
                started.elapsed()
            );
            assert_eq!(consumer.moves().moves_failing, 1);
            assert_eq!(
                runs(&seen, "bad-1"),
                vec![false],
                "run once, kept its decision"
            );
            assert!(runs(&seen, "bad-2").is_empty(), "no new delivery taken");
            assert_eq!(count(&*t, &format!("{q}.dlq")).await, 0);
        }
        outage.end();

        eventually(WAIT, "all three moved to .dlq", || async {
            (consumer.stats().rejected == 3).then_some(())
        })
        .await;
        for id in ["bad-1", "bad-2", "bad-3"] {
            assert_eq!(
                runs(&seen, id),
                vec![false],
                "{id}: its handler ran exactly once"
            );
        }
        let s = consumer.stats();
        assert!(s.set_aside_failed >= 1, "the outage was met: {s:?}");
        assert_eq!((s.settle_failed, s.requeued_on_close), (0, 0), "{s:?}");
        assert_eq!(consumer.moves().waiting_for_publish, None);
        assert_eq!(count(&*t, &format!("{q}.dlq")).await, 3);
        assert_eq!(count(&*t, &q).await, 0);
        consumer.close().await;
        delete_all(&*t, &q).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dlq_holds_the_message_without_running_it_again_and_the_consumer_serves_on() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let t = mq.transport().clone();
        let q = unique("held");
        t.declare_queue(&QueueDecl::classic(&q)).await.unwrap();
        let (consumer, seen) = consume_recording(&mq, &q, Arc::new(Semaphore::new(1))).await;
        t.delete_queue(&format!("{q}.dlq")).await.unwrap();
        send(&mq, &q, "bad-held").await;
        eventually(WAIT, "held, reported", || async {
            (consumer.moves().held_unsendable == 1).then_some(())
        })
        .await;
        // The consumer keeps serving (the held one holds no handler slot).
        send(&mq, &q, "good").await;
        eventually(WAIT, "the good one acked", || async {
            (consumer.stats().acked == 1).then_some(())
        })
        .await;
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let tries = consumer.stats().set_aside_failed;
        assert!(
            tries <= 6,
            "the move backs off: {tries} tries in {:?}",
            started.elapsed()
        );
        assert_eq!(runs(&seen, "bad-held"), vec![false], "never run again");
        assert_eq!(consumer.in_flight(), 1, "held unacked");
        consumer.close().await;
        assert_eq!(consumer.stats().rejected, 0);
        // Closing hands it back: the original is still there.
        let d = take_one(&*t, &q, WAIT).await;
        assert_eq!(d.properties.message_id.as_deref(), Some("bad-held"));
        delete_all(&*t, &q).await;
        mq.close().await.ok();
    })
    .await;
}

/// A message whose own headers bring its content header to `frame_max - within` bytes.
fn near_the_frame(id: &str, frame_max: u32, within: usize) -> Properties {
    let mut p = Properties {
        message_id: Some(id.into()),
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        ..Default::default()
    };
    p.headers
        .insert("x-big".into(), HeaderValue::Str(String::new()));
    let base = header_frame_size(&p);
    let fill = frame_max as usize - within - base;
    p.headers
        .insert("x-big".into(), HeaderValue::Str("b".repeat(fill)));
    assert_eq!(header_frame_size(&p), frame_max as usize - within);
    p
}

async fn publish_big(t: &dyn Transport, q: &str, id: &str, within: usize) {
    let props = near_the_frame(id, t.frame_max(), within);
    let body = serde_json::to_vec(&serde_json::json!({ "id": id })).unwrap();
    let c = support::publish_raw(t, q, props, &body).await;
    assert_eq!(c, acemq::transport::Confirmation::Routed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_within_200_bytes_of_frame_max_end_in_dlq_and_the_connection_stays_open() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let t = mq.transport().clone();
        assert!(t.frame_max() >= 4096, "{}", t.frame_max());
        let q = unique("frame");
        mq.declare(
            &Topology::define()
                .queue_with_dead_letter(&q)
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
        let (consumer, seen) = consume_recording(&mq, &q, Arc::new(Semaphore::new(1))).await;
        let dlq = format!("{q}.dlq");
        // Room for the envelope fields but not the whole reason: the copy is sent with
        // the reason cut.
        publish_big(&*t, &q, "bad-cut", 1500).await;
        let cut = take_one(&*t, &dlq, WAIT).await;
        assert_eq!(cut.properties.message_id.as_deref(), Some("bad-cut"));
        assert!(!cut.properties.headers.contains_key("x-death"), "a copy");
        let reason = cut.properties.headers[envelope::ERROR].as_str().unwrap();
        assert!(
            reason.starts_with("the handler reported an unprocessable message"),
            "{reason}"
        );
        assert!(header_frame_size(&cut.properties) <= t.frame_max() as usize);
        // Within 200 bytes: no copy can be sent; the broker dead-letters the original.
        publish_big(&*t, &q, "bad-huge", 150).await;
        eventually(WAIT, "counted", || async {
            (consumer.stats().rejected == 2 && consumer.moves().dead_lettered_by_broker == 1)
                .then_some(())
        })
        .await;
        if let Broker::Memory(_) = target {
            let dead = take_one(&*t, &dlq, WAIT).await;
            assert_eq!(dead.properties.message_id.as_deref(), Some("bad-huge"));
            assert!(
                dead.properties.headers.contains_key("x-death"),
                "moved by the broker"
            );
        } else {
            // RabbitMQ adds `x-death` when it dead-letters, which takes this header past
            // frame_max on the way out: it is counted here, not fetched.
            assert_eq!(support::wait_for_count(&*t, &dlq, 1, WAIT).await, 1);
        }
        // The publishing connection is still open: a normal publish succeeds.
        assert!(mq.status().connected);
        send(&mq, &q, "good").await;
        eventually(WAIT, "the good one acked", || async {
            (consumer.stats().acked == 1).then_some(())
        })
        .await;
        assert!(mq.status().connected);
        assert_eq!(runs(&seen, "bad-huge"), vec![false]);
        assert_eq!(runs(&seen, "bad-cut"), vec![false]);
        let s = consumer.stats();
        assert_eq!((s.rejected, s.set_aside_failed >= 1), (2, true), "{s:?}");
        consumer.close().await;
        delete_all(&*t, &q).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_too_large_without_dead_letter_arguments_is_held_and_reported() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let t = mq.transport().clone();
        let q = unique("frame-held");
        t.declare_queue(&QueueDecl::classic(&q)).await.unwrap();
        let (consumer, seen) = consume_recording(&mq, &q, Arc::new(Semaphore::new(1))).await;
        publish_big(&*t, &q, "bad-huge", 100).await;
        eventually(WAIT, "held, reported", || async {
            (consumer.moves().held_unsendable == 1).then_some(())
        })
        .await;
        assert!(mq.status().connected, "nothing over the frame was sent");
        send(&mq, &q, "good").await;
        eventually(WAIT, "the good one acked", || async {
            (consumer.stats().acked == 1).then_some(())
        })
        .await;
        assert_eq!(runs(&seen, "bad-huge"), vec![false]);
        assert_eq!(count(&*t, &format!("{q}.dlq")).await, 0);
        consumer.close().await;
        assert_eq!(count(&*t, &q).await, 1, "handed back on close");
        delete_all(&*t, &q).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test]
async fn the_memory_broker_refuses_a_header_frame_over_frame_max_like_rabbitmq() {
    let t = MemoryTransport::connect(&unique("mem-frame"));
    let q = unique("frame-refused");
    t.declare_queue(&QueueDecl::classic(&q)).await.unwrap();
    let props = near_the_frame("too-big", t.frame_max(), 0);
    let mut over = props.clone();
    over.headers
        .insert("x-one-more".into(), HeaderValue::Bool(true));
    let e = match t.publish(Outbound::new("", &q, over, "{}")).await {
        Err(e) => e,
        Ok(_) => panic!("an over-large header frame was accepted"),
    };
    assert!(e.to_string().contains("frame_too_large"), "{e}");
    // Exactly frame_max fits.
    let c = support::publish_raw(&t, &q, props, b"{}").await;
    assert_eq!(c, acemq::transport::Confirmation::Routed);
    t.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_lost_consuming_channel_runs_a_held_delivery_again() {
    let broker = unique("mem-lost");
    let fast = RecoveryPolicy::default().delays(Duration::from_millis(100), Duration::from_secs(1));
    let m = Arc::new(MemoryTransport::connect(&broker).with_recovery(fast.clone()));
    let mq = Connection::with_transport(m.clone(), ConnectionOptions::default().recovery(fast));
    let q = unique("lost");
    m.declare_queue(&QueueDecl::classic(&q)).await.unwrap();
    send(&mq, &q, "bad-1").await;
    let b = MemoryBroker::named(&broker);
    b.block("an injected alarm");
    let gate = Arc::new(Semaphore::new(1));
    let (consumer, seen) = consume_recording(&mq, &q, gate).await;
    eventually(WAIT, "the move failing", || async {
        (consumer.moves().moves_failing == 1).then_some(())
    })
    .await;
    assert_eq!(runs(&seen, "bad-1"), vec![false]);
    // The consuming channel is lost: the broker has the message back, the held move is
    // dropped (no duplicate copy), and the redelivery runs the handler again.
    m.drop_connection("test");
    b.unblock();
    eventually(WAIT, "moved once recovered", || async {
        (consumer.stats().rejected == 1).then_some(())
    })
    .await;
    assert_eq!(runs(&seen, "bad-1"), vec![false, true]);
    eventually(WAIT, "the held move given up", || async {
        (consumer.moves().moves_failing == 0).then_some(())
    })
    .await;
    assert_eq!(
        count(&**mq.transport(), &format!("{q}.dlq")).await,
        1,
        "one copy"
    );
    consumer.close().await;
    delete_all(&**mq.transport(), &q).await;
    mq.close().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_moves_do_not_wait_behind_a_full_application_window() {
    let broker = unique("mem-window");
    let mq = Connection::connect_with(
        &format!("memory://{broker}"),
        ConnectionOptions::default().max_outstanding_confirms(1),
    )
    .await
    .unwrap();
    let t = mq.transport().clone();
    let (q, other) = (unique("window"), unique("window-app"));
    t.declare_queue(&QueueDecl::classic(&q)).await.unwrap();
    t.declare_queue(&QueueDecl::classic(&other)).await.unwrap();
    send(&mq, &q, "bad-1").await;
    // The application fills its window of one with a publish whose confirm takes 60 s.
    let b = MemoryBroker::named(&broker);
    b.delay_confirms(Some(Duration::from_secs(60)));
    let app = {
        let mq = mq.clone();
        let other = other.clone();
        tokio::spawn(async move { send(&mq, &other, "slow").await })
    };
    eventually(WAIT, "the application publish in flight", || async {
        (count(&*t, &other).await == 1).then_some(())
    })
    .await;
    b.delay_confirms(None);
    let started = Instant::now();
    let (consumer, _seen) = consume_recording(&mq, &q, Arc::new(Semaphore::new(1))).await;
    eventually(WAIT, "the dead-letter move done", || async {
        (consumer.stats().rejected == 1).then_some(())
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the move did not wait for the application's window: {:?}",
        started.elapsed()
    );
    assert!(
        !app.is_finished(),
        "the application publish still awaits its confirm"
    );
    app.abort();
    consumer.close().await;
    delete_all(&*t, &q).await;
    let _ = t.delete_queue(&other).await;
}

/// The source queue as another service (or an operator) declared it: a quorum queue, with
/// the contract's dead-letter arguments when `dead_letter`, through a transport of its own
/// (never this connection's topology helpers).
async fn declare_elsewhere(target: &Broker, q: &str, dead_letter: bool) -> Arc<dyn Transport> {
    let other = target.transport().await;
    let mut decl = QueueDecl::quorum(q);
    if dead_letter {
        decl.arguments.insert(
            "x-dead-letter-exchange".into(),
            HeaderValue::from(acemq::topology::DEAD_LETTER_EXCHANGE),
        );
        decl.arguments.insert(
            "x-dead-letter-routing-key".into(),
            HeaderValue::from(format!("{q}.dlq")),
        );
    }
    other.declare_queue(&decl).await.unwrap();
    other
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_fallback_applies_to_a_queue_someone_else_declared_with_the_contract_arguments()
{
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let t = mq.transport().clone();
        let q = unique("frame-elsewhere");
        let other = declare_elsewhere(&target, &q, true).await;
        let (consumer, seen) = consume_recording(&mq, &q, Arc::new(Semaphore::new(1))).await;
        let dlq = format!("{q}.dlq");
        // No copy can be sent: the broker's DLX must move the original.
        publish_big(&*t, &q, "bad-huge", 150).await;
        eventually(WAIT, "rejected to the broker's DLX", || async {
            let m = consumer.moves();
            (m.dead_lettered_by_broker == 1 || m.held_unsendable == 1).then_some(())
        })
        .await;
        let m = consumer.moves();
        assert_eq!(
            (m.dead_lettered_by_broker, m.held_unsendable),
            (1, 0),
            "the broker fallback was taken, not a hold: {m:?}"
        );
        assert_eq!(support::wait_for_count(&*t, &dlq, 1, WAIT).await, 1);
        if let Broker::Memory(_) = target {
            let dead = take_one(&*t, &dlq, WAIT).await;
            assert_eq!(dead.properties.message_id.as_deref(), Some("bad-huge"));
            assert!(dead.properties.headers.contains_key("x-death"));
        }
        assert_eq!(consumer.in_flight(), 0, "nothing unacked");
        assert_eq!(consumer.stats().rejected, 1);
        assert_eq!(runs(&seen, "bad-huge"), vec![false]);
        assert!(mq.status().connected);
        consumer.close().await;
        assert_eq!(count(&*t, &q).await, 0, "nothing was handed back on close");
        delete_all(&*t, &q).await;
        other.close().await.ok();
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_someone_else_declared_without_the_contract_arguments_holds_it_and_says_why() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let t = mq.transport().clone();
        let q = unique("frame-elsewhere-plain");
        let other = declare_elsewhere(&target, &q, false).await;
        let (consumer, seen) = consume_recording(&mq, &q, Arc::new(Semaphore::new(1))).await;
        publish_big(&*t, &q, "bad-huge", 150).await;
        let why = eventually(WAIT, "held, with its reason", || async {
            let m = consumer.moves();
            (m.held_unsendable == 1).then_some(m.held_reason).flatten()
        })
        .await;
        assert!(
            why.contains("cannot be sent") && why.contains("x-dead-letter-exchange"),
            "{why}"
        );
        assert_eq!(consumer.moves().dead_lettered_by_broker, 0);
        // The consumer serves on, and the channel the check ran on was not its own.
        send(&mq, &q, "good").await;
        eventually(WAIT, "the good one acked", || async {
            (consumer.stats().acked == 1).then_some(())
        })
        .await;
        assert!(mq.status().connected);
        assert_eq!(runs(&seen, "bad-huge"), vec![false]);
        assert_eq!(count(&*t, &format!("{q}.dlq")).await, 0);
        consumer.close().await;
        assert_eq!(
            consumer.moves().held_reason,
            None,
            "cleared once none is held"
        );
        // A quorum queue counts a message returned by a closing channel a moment later.
        eventually(WAIT, "handed back on close", || async {
            (count(&*t, &q).await == 1).then_some(())
        })
        .await;
        delete_all(&*t, &q).await;
        other.close().await.ok();
        mq.close().await.ok();
    })
    .await;
}

/// A retry hop whose confirm was answered in doubt (the broker blocked while
/// it was outstanding; the copy is in its queue all the same) is not published a second
/// time: its confirm is waited for, so each message's handler runs once per attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_in_doubt_is_not_published_twice_so_runs_equal_attempts() {
    let broker = unique("mem-doubt");
    let mq = Connection::connect(&format!("memory://{broker}"))
        .await
        .unwrap();
    let t = mq.transport().clone();
    let q = unique("doubt");
    t.declare_queue(&QueueDecl::classic(&q)).await.unwrap();
    let ids: Vec<String> = (1..=5).map(|i| format!("m-{i}")).collect();
    for id in &ids {
        send(&mq, &q, id).await;
    }
    let b = MemoryBroker::named(&broker);
    b.delay_confirms(Some(Duration::from_millis(1500)));
    let policy = acemq::retry::RetryPolicy::fixed(3, Duration::from_millis(100)).unwrap();
    let (consumer, seen) = support::settle::consume_always_failing(&mq, &q, policy).await;
    eventually(WAIT, "five first runs", || async {
        (seen.total() >= 5).then_some(())
    })
    .await;
    // The retry hops are published 100 ms after each run; their confirms take 1.5 s. The
    // broker blocks while they are outstanding: they are answered in doubt.
    tokio::time::sleep(Duration::from_millis(400)).await;
    b.block("an injected alarm");
    eventually(WAIT, "moves failing while blocked", || async {
        (consumer.moves().moves_failing >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.unblock();
    support::settle::assert_runs_equal_attempts(
        &*t,
        &consumer,
        &seen,
        &q,
        &ids,
        support::settle::Expected {
            attempts: 3,
            duplicated_hops: 0,
        },
        WAIT,
    )
    .await;
    b.delay_confirms(None);
    consumer.close().await;
    delete_all(&*t, &q).await;
    mq.close().await.ok();
}
