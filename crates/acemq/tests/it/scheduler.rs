//! The scheduler (`acemq::schedule`): the family's ladder and wire, on time, identity kept,
//! one failure rule, cancellation, health.
//!
//! On every target (`memory://` and RabbitMQ): Java's literal argument table, a message
//! due now, a 3 s schedule that arrives on time with its identity, a hop written the way
//! the Java member writes it, two schedulers competing, and the failure rule (unroutable
//! and unreadable messages kept in `acemq.schedule.due.dlq`). On RabbitMQ the ladder is
//! shared by every test of the run (the names are the family's), so a case asserts on its
//! own destination queue and its own ids, never on which scheduler delivered.
//!
//! In virtual time on `memory://` (its TTLs and dead-lettering are faithful): a one-hour
//! message does not hold back a two-second one, a 30-day schedule runs in milliseconds of
//! test time, a crash between the delivery's confirm and the control message's ack makes a
//! duplicate an idempotent consumer recognises by id, cancellation, and the backlog health.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};
use acemq::envelope::Envelope;
use acemq::headers::{HeaderValue, Headers};
use acemq::health::HealthStatus;
use acemq::idempotency::InMemoryIdempotencyStore;
use acemq::observe::trace::{self, TraceContext};
use acemq::publish::SendOptions;
use acemq::schedule::{
    CONTROL_QUEUE, DEAD_LETTER_QUEUE, EXCHANGE, MemoryCancelStore, SchedulerOptions, When,
};
use acemq::topology::QueueDecl;
use acemq::transport::memory::MemoryTransport;
use acemq::transport::{
    Confirmation, Delivery, Outbound, Properties, Subscription, Transport, TransportError,
};
use support::{Broker, eventually, on_each_target, spec, unique};

const WAIT: Duration = Duration::from_secs(30);

/// Java's literal rung table, as the Java member declares it (`Duration.toMillis()`: a long).
fn java_rung(name: &str, ttl_ms: i64) -> QueueDecl {
    QueueDecl::classic(name)
        .argument("x-message-ttl", HeaderValue::I64(ttl_ms))
        .argument("x-dead-letter-exchange", "acemq.schedule")
        .argument("x-dead-letter-routing-key", "acemq.schedule.due")
}

const JAVA_RUNGS: [(&str, i64); 5] = [
    ("acemq.schedule.1h", 3_600_000),
    ("acemq.schedule.10m", 600_000),
    ("acemq.schedule.1m", 60_000),
    ("acemq.schedule.10s", 10_000),
    ("acemq.schedule.1s", 1_000),
];

/// A connection and a destination queue of its own.
async fn destination(target: &Broker, prefix: &str) -> (Connection, String) {
    support::connect_with_classic_queue(target, prefix).await
}

/// The next message of a subscription, within `timeout` (of the runtime's clock).
async fn next(sub: &mut Box<dyn Subscription>, timeout: Duration) -> Delivery {
    let d = tokio::time::timeout(timeout, sub.next())
        .await
        .expect("a scheduled message within the wait")
        .expect("the subscription is open")
        .expect("a delivery");
    d.acker.ack().await.expect("ack");
    d
}

fn epoch_ms() -> i64 {
    acemq::envelope::now_millis()
}

#[tokio::test]
async fn the_ladder_is_javas_literal_argument_table() {
    on_each_target(|target| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let s = mq
            .scheduler_with(SchedulerOptions::declare_only())
            .await
            .unwrap();
        let t = mq.transport();
        for (name, ttl) in JAVA_RUNGS {
            // Java declaring the same ladder on a shared broker is accepted...
            t.check_queue(&java_rung(name, ttl))
                .await
                .unwrap_or_else(|e| panic!("Java's table for {name} refused: {e}"));
            // ...and a table one millisecond different, or quorum, is refused: the
            // comparison above is a real one.
            let off = t.check_queue(&java_rung(name, ttl - 1)).await;
            assert!(
                matches!(off, Err(TransportError::PreconditionFailed { .. })),
                "{name}: {off:?}"
            );
            let quorum = java_rung(name, ttl).argument("x-queue-type", "quorum");
            assert!(matches!(
                t.check_queue(&quorum).await,
                Err(TransportError::PreconditionFailed { .. })
            ));
        }
        t.check_queue(&QueueDecl::classic(CONTROL_QUEUE))
            .await
            .expect("the control queue is classic, durable, no arguments");
        if target.kind() == "amqp" {
            support::assert_rabbit_queue_arguments(
                "acemq.schedule.10m",
                &[
                    ("x-dead-letter-exchange", "longstr", "acemq.schedule"),
                    ("x-dead-letter-routing-key", "longstr", "acemq.schedule.due"),
                    ("x-message-ttl", "long", "600000"),
                ],
            );
            support::assert_rabbit_queue_arguments(CONTROL_QUEUE, &[]);
        }
        // Declare-only: no consumer, no dead-letter queue of its own.
        assert!(s.consumer().is_none());
        s.close().await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test]
async fn a_message_due_now_is_delivered_without_a_hop() {
    on_each_target(|target| async move {
        let (mq, q) = destination(&target, "sched-now").await;
        let s = mq.scheduler().await.unwrap();
        let mut sub = mq.transport().consume(spec(&q, 10)).await.unwrap();
        let past = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
        let id = s
            .at(past, "", &q, &serde_json::json!({"n": 1}))
            .await
            .unwrap();
        let d = next(&mut sub, WAIT).await;
        assert_eq!(d.properties.message_id.as_deref(), Some(id.as_str()));
        assert_eq!(d.body.as_ref(), br#"{"n":1}"#);
        assert_eq!(s.stats().hops, 0);
        assert_eq!(s.stats().delivered, 1);
        s.close().await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test]
async fn a_scheduled_message_arrives_on_time_with_its_identity() {
    on_each_target(|target| async move {
        let (mq, q) = destination(&target, "sched-on-time").await;
        let s = mq.scheduler().await.unwrap();
        let mut sub = mq.transport().consume(spec(&q, 10)).await.unwrap();
        // A run the machine disturbed (stalled, or the wall clock stepped) cannot judge
        // "on time": it is scheduled again, at most three times in all.
        let mut attempt = 0;
        let (d, id, root) = loop {
            attempt += 1;
            let mut headers = Headers::new();
            headers.insert("x-tenant".into(), HeaderValue::from("acme"));
            let id = unique("reminder");
            let watch = support::ClockWatch::start();
            let scheduled_at = epoch_ms();
            // Scheduled inside a trace: the delivered message continues it.
            let root = TraceContext::new_root();
            let got = trace::scope(
                root.clone(),
                s.schedule_with(
                    When::After(Duration::from_secs(3)),
                    "",
                    &q,
                    acemq::codec::Text,
                    "call Ada",
                    SendOptions::new()
                        .message_id(id.clone())
                        .message_type("reminder.due")
                        .correlation_id("conversation-7")
                        .causation_id("booking-3")
                        .headers(headers),
                ),
            )
            .await
            .unwrap();
            assert_eq!(got, id);
            let d = next(&mut sub, WAIT).await;
            let after = epoch_ms() - scheduled_at;
            assert_eq!(d.properties.message_id.as_deref(), Some(id.as_str()));
            let seen = format!("delivered {after} ms after scheduling");
            if watch.run_again(attempt, 3, &seen) {
                continue;
            }
            assert!(
                after >= 3_000,
                "delivered {after} ms after scheduling: early"
            );
            assert!(after < 3_500, "delivered {after} ms after scheduling: late");
            break (d, id, root);
        };
        let e = Envelope::read(&d.properties, &d.routing_key);
        assert_eq!(e.id(), id);
        assert_eq!(d.properties.message_id.as_deref(), Some(id.as_str()));
        assert_eq!(e.message_type(), "reminder.due");
        assert_eq!(e.correlation_id(), "conversation-7");
        assert_eq!(e.causation_id(), Some("booking-3"));
        assert_eq!(e.attempt(), 1);
        assert_eq!(
            d.properties.content_type.as_deref(),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(d.body.as_ref(), b"call Ada");
        let h = &d.properties.headers;
        assert_eq!(h["x-tenant"].as_str(), Some("acme"));
        let traceparent = h["traceparent"].as_str().unwrap_or_default();
        assert!(
            traceparent.contains(&root.trace_id_hex()),
            "the trace travels: {traceparent}"
        );
        assert!(
            h.keys()
                .all(|k| !k.starts_with("x-schedule-") && k != "x-death"),
            "no scheduler bookkeeping delivered: {h:?}"
        );
        s.close().await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

/// A hop exactly as the Java member writes one (`Scheduler.route`): a fresh
/// `ScheduledMessage` envelope, the four headers, the payload's bytes as octet-stream.
fn java_hop(q: &str, due_at: i64, body: &[u8]) -> Outbound {
    let mut headers = Headers::new();
    headers.insert(
        "x-acemq-id".into(),
        HeaderValue::from(uuid::Uuid::new_v4().to_string()),
    );
    headers.insert("x-acemq-type".into(), HeaderValue::from("ScheduledMessage"));
    headers.insert("x-acemq-version".into(), HeaderValue::I32(1));
    headers.insert("x-acemq-attempt".into(), HeaderValue::I32(1));
    headers.insert("x-acemq-first-seen".into(), HeaderValue::I64(epoch_ms()));
    headers.insert(
        "x-acemq-origin".into(),
        HeaderValue::from("billing@java-host"),
    );
    headers.insert("x-schedule-exchange".into(), HeaderValue::from(""));
    headers.insert("x-schedule-routing-key".into(), HeaderValue::from(q));
    headers.insert("x-schedule-due-at".into(), HeaderValue::I64(due_at));
    headers.insert(
        "x-schedule-content-type".into(),
        HeaderValue::from("application/json"),
    );
    let properties = Properties {
        content_type: Some("application/octet-stream".into()),
        delivery_mode: Some(2),
        headers,
        ..Properties::default()
    };
    Outbound::new(EXCHANGE, "acemq.schedule.1s", properties, body.to_vec())
}

#[tokio::test]
async fn a_hop_the_java_member_wrote_is_delivered() {
    on_each_target(|target| async move {
        let (mq, q) = destination(&target, "sched-java").await;
        let s = mq.scheduler().await.unwrap();
        let mut sub = mq.transport().consume(spec(&q, 10)).await.unwrap();
        let due = epoch_ms() + 1_500;
        let body = br#"{"invoice":"inv-9"}"#;
        let c = support::publish_confirmed(&**mq.transport(), java_hop(&q, due, body)).await;
        assert_eq!(c, Confirmation::Routed);
        let d = next(&mut sub, WAIT).await;
        assert!(epoch_ms() >= due, "never before its due time");
        assert_eq!(d.body.as_ref(), body, "the body verbatim");
        assert_eq!(
            d.properties.content_type.as_deref(),
            Some("application/json")
        );
        let e = Envelope::read(&d.properties, &d.routing_key);
        // No identity of its own travelled: the family's fresh envelope.
        assert_eq!(e.message_type(), "ScheduledMessage");
        assert_eq!(e.correlation_id(), e.id());
        assert!(
            d.properties
                .headers
                .keys()
                .all(|k| !k.starts_with("x-schedule-")),
            "{:?}",
            d.properties.headers
        );
        s.close().await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test]
async fn two_schedulers_compete_and_each_message_arrives_once() {
    on_each_target(|target| async move {
        let (mq, q) = destination(&target, "sched-compete").await;
        let other = Connection::connect(&target.url()).await.unwrap();
        let a = mq.scheduler().await.unwrap();
        let b = other.scheduler().await.unwrap();
        let mut ids = Vec::new();
        for n in 0..20u32 {
            let s = if n % 2 == 0 { &a } else { &b };
            let delay = Duration::from_millis(1_000 + u64::from(n) * 50);
            ids.push(s.after(delay, "", &q, &n).await.unwrap());
        }
        let mut sub = mq.transport().consume(spec(&q, 50)).await.unwrap();
        let mut seen = Vec::new();
        while seen.len() < ids.len() {
            let d = next(&mut sub, WAIT).await;
            seen.push(d.properties.message_id.clone().unwrap_or_default());
        }
        // Nothing more arrives: no duplicate.
        assert!(
            tokio::time::timeout(Duration::from_millis(1_500), sub.next())
                .await
                .is_err(),
            "a duplicate delivery"
        );
        seen.sort();
        ids.sort();
        assert_eq!(seen, ids);
        a.close().await;
        b.close().await;
        other.close().await.ok();
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

/// Takes from `acemq.schedule.due.dlq` the message whose carried id is `id` (stale ones of
/// earlier runs are dropped on the way).
async fn dead_lettered(t: &dyn Transport, id: &str) -> Delivery {
    eventually(WAIT, &format!("{id} in {DEAD_LETTER_QUEUE}"), || async {
        let d = t.get(DEAD_LETTER_QUEUE).await.unwrap()?;
        d.acker.ack().await.unwrap();
        let ours = d
            .properties
            .headers
            .get("x-schedule-acemq-id")
            .and_then(HeaderValue::as_str)
            == Some(id)
            || d.properties
                .headers
                .get("x-schedule-routing-key")
                .and_then(HeaderValue::as_str)
                == Some(id);
        ours.then_some(d)
    })
    .await
}

#[tokio::test]
async fn undeliverable_and_unreadable_messages_are_kept_with_the_reason() {
    on_each_target(|target| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let s = mq
            .scheduler_with(SchedulerOptions::default().undeliverable_tries(2))
            .await
            .unwrap();
        let t = mq.transport();
        // A destination queue that does not exist: unroutable, tried, then kept.
        let nowhere = unique("sched-nowhere");
        let id = s
            .after(Duration::from_millis(1_200), "", &nowhere, &"lost?")
            .await
            .unwrap();
        let d = dead_lettered(&**t, &id).await;
        let e = Envelope::read(&d.properties, &d.routing_key);
        let reason = e.error().unwrap_or_default();
        assert!(reason.contains("undeliverable after"), "{reason}");
        assert!(reason.contains("routed to no queue"), "{reason}");
        // Replayable: everything the scheduler needs travels with it.
        assert_eq!(
            d.properties.headers["x-schedule-routing-key"].as_str(),
            Some(nowhere.as_str())
        );
        assert_eq!(d.body.as_ref(), br#""lost?""#);
        // A message in the control queue without the scheduler's headers.
        let mut headers = Headers::new();
        headers.insert(
            "x-schedule-routing-key".into(),
            HeaderValue::from(nowhere.clone() + "-x"),
        );
        let props = Properties {
            headers,
            ..Properties::default()
        };
        let c = support::publish_confirmed(
            &**t,
            Outbound::new(EXCHANGE, CONTROL_QUEUE, props, &b"?"[..]),
        )
        .await;
        assert_eq!(c, Confirmation::Routed);
        let d = dead_lettered(&**t, &(nowhere.clone() + "-x")).await;
        let reason = Envelope::read(&d.properties, "")
            .error()
            .unwrap_or_default()
            .to_owned();
        assert!(reason.contains("x-schedule-due-at is missing"), "{reason}");
        s.close().await;
        mq.close().await.ok();
    })
    .await;
}

// --- Virtual time, on memory:// -----------------------------------------------------------

async fn memory(prefix: &str) -> (Connection, String, Arc<dyn Transport>) {
    let target = Broker::Memory(unique(prefix));
    let (mq, q) = destination(&target, "dest").await;
    let t = mq.transport().clone();
    (mq, q, t)
}

#[tokio::test(start_paused = true)]
async fn a_one_hour_message_does_not_hold_back_a_two_second_one() {
    let (mq, q, t) = memory("sched-hol").await;
    let s = mq.scheduler().await.unwrap();
    let mut sub = t.consume(spec(&q, 10)).await.unwrap();
    let start = tokio::time::Instant::now();
    let long = s
        .after(Duration::from_secs(3_600), "", &q, &"long")
        .await
        .unwrap();
    let short = s
        .after(Duration::from_secs(2), "", &q, &"short")
        .await
        .unwrap();
    let first = next(&mut sub, Duration::from_secs(7_200)).await;
    let at = start.elapsed();
    assert_eq!(first.properties.message_id.as_deref(), Some(short.as_str()));
    assert!(
        at >= Duration::from_secs(2) && at < Duration::from_millis(2_300),
        "{at:?}"
    );
    let second = next(&mut sub, Duration::from_secs(7_200)).await;
    let at = start.elapsed();
    assert_eq!(second.properties.message_id.as_deref(), Some(long.as_str()));
    assert!(
        at >= Duration::from_secs(3_600) && at < Duration::from_millis(3_600_300),
        "{at:?}"
    );
    s.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_thirty_day_schedule_runs_in_milliseconds_of_test_time() {
    // A run the machine disturbed (stalled, or the wall clock stepped: the scheduler's now
    // follows it) cannot judge the timing: it runs again on a fresh broker, at most three
    // times in all.
    for attempt in 1..=3 {
        let watch = support::ClockWatch::start();
        let (mq, q, t) = memory("sched-30d").await;
        let s = mq.scheduler().await.unwrap();
        let mut sub = t.consume(spec(&q, 10)).await.unwrap();
        let real = std::time::Instant::now();
        let start = tokio::time::Instant::now();
        let thirty_days = Duration::from_secs(30 * 86_400);
        let id = s
            .after(thirty_days + Duration::from_millis(1_500), "", &q, &"renew")
            .await
            .unwrap();
        let d = next(&mut sub, thirty_days * 2).await;
        let at = start.elapsed();
        let real = real.elapsed();
        s.close().await;
        assert_eq!(d.properties.message_id.as_deref(), Some(id.as_str()));
        let seen = format!("delivered at {at:?} of test time after {real:?}");
        if watch.run_again(attempt, 3, &seen) {
            continue;
        }
        assert!(at >= thirty_days + Duration::from_millis(1_500), "{at:?}");
        assert!(at < thirty_days + Duration::from_secs(2), "{at:?}");
        // 720 one-hour hops, then one of a second; the last half second waited in the
        // consumer.
        assert_eq!(s.stats().hops, 721);
        assert!(real < Duration::from_secs(20), "{real:?}");
        return;
    }
}

#[tokio::test(start_paused = true)]
async fn a_crash_between_confirm_and_ack_is_a_duplicate_recognised_by_id() {
    let name = unique("sched-crash");
    let url = format!("memory://{name}");
    let (mq, q) = destination(&Broker::Memory(name.clone()), "dest").await;
    // The scheduler that crashes: its connection is lost right after its delivery was
    // confirmed, before the control message's ack is sent.
    let crashing_transport = Arc::new(MemoryTransport::connect(&name));
    let crashing = Connection::with_transport(crashing_transport.clone(), Default::default());
    let lose = crashing_transport.clone();
    let confirmed = Arc::new(AtomicU32::new(0));
    let seen = confirmed.clone();
    crashing.wrap_handlers(
        move |info: &acemq::intercept::HandleInfo,
              next: acemq::intercept::HandlerFuture|
              -> acemq::intercept::HandlerFuture {
            let lose = lose.clone();
            let seen = seen.clone();
            let control = info.queue.as_ref() == CONTROL_QUEUE;
            Box::pin(async move {
                let result = next.await;
                if control && result.is_ok() && seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    // Confirmed, not yet acked: the ack goes nowhere, the broker gives the
                    // control message back.
                    lose.drop_connection("the scheduler crashed");
                }
                result
            })
        },
    );
    let s1 = crashing.scheduler().await.unwrap();
    let id = s1
        .after(Duration::from_millis(1_500), "", &q, &"once")
        .await
        .unwrap();
    // An idempotent consumer of the destination.
    let handled = Arc::new(AtomicU32::new(0));
    let h = handled.clone();
    let consumer = mq
        .consume(
            &q,
            ConsumerOptions::default().idempotent(InMemoryIdempotencyStore::for_one_day()),
            move |m: Message<String>| {
                let h = h.clone();
                async move {
                    assert_eq!(m.payload(), "once");
                    h.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        )
        .await
        .unwrap();
    eventually(WAIT, "the first delivery confirmed", || async {
        (confirmed.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    // Another scheduler takes the control message the crash gave back and delivers it again.
    let other = Connection::connect(&url).await.unwrap();
    let s2 = other.scheduler().await.unwrap();
    eventually(WAIT, "the duplicate delivered and recognised", || async {
        (consumer.stats().duplicates >= 1).then_some(())
    })
    .await;
    assert_eq!(handled.load(Ordering::SeqCst), 1, "handled once");
    // The destination saw two copies, both with the id the message was scheduled with.
    assert_eq!(consumer.stats().acked, 1);
    let _ = id;
    s2.close().await;
    consumer.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_message_is_not_delivered() {
    let (mq, q, t) = memory("sched-cancel").await;
    let store = Arc::new(MemoryCancelStore::default());
    let s = mq
        .scheduler_with(SchedulerOptions::default().cancellations(store.clone()))
        .await
        .unwrap();
    let mut sub = t.consume(spec(&q, 10)).await.unwrap();
    let dropped = s
        .after(Duration::from_secs(90), "", &q, &"dropped")
        .await
        .unwrap();
    let kept = s
        .after(Duration::from_secs(95), "", &q, &"kept")
        .await
        .unwrap();
    s.cancel(&dropped).await.unwrap();
    let d = next(&mut sub, Duration::from_secs(300)).await;
    assert_eq!(d.properties.message_id.as_deref(), Some(kept.as_str()));
    assert_eq!(s.stats().cancelled, 1);
    assert!(
        tokio::time::timeout(Duration::from_secs(600), sub.next())
            .await
            .is_err()
    );
    // Without a store, cancel says what to do.
    let plain = mq
        .scheduler_with(SchedulerOptions::declare_only())
        .await
        .unwrap();
    let e = plain.cancel(&kept).await.unwrap_err();
    assert!(e.to_string().contains("cancellation store"), "{e}");
    s.close().await;
}

#[tokio::test]
async fn health_is_degraded_while_due_messages_wait_and_no_scheduler_consumes() {
    let (mq, q, t) = memory("sched-health").await;
    let only = mq
        .scheduler_with(
            SchedulerOptions::declare_only().backlog_check(Some(Duration::from_millis(50))),
        )
        .await
        .unwrap();
    // Due at once, waiting in the control queue.
    let c = support::publish_confirmed(&*t, {
        let mut m = java_hop(&q, epoch_ms(), b"1");
        m.routing_key = CONTROL_QUEUE.into();
        m
    })
    .await;
    assert_eq!(c, Confirmation::Routed);
    let report = eventually(WAIT, "the scheduler component degraded", || async {
        let h = mq.health();
        let r = h.report("scheduler")?.clone();
        (r.status == HealthStatus::Degraded).then_some(r)
    })
    .await;
    assert!(
        report
            .detail("reason")
            .unwrap()
            .contains("no scheduler consumes it")
    );
    let delivering = mq.scheduler().await.unwrap();
    support::wait_for_count(&*t, &q, 1, WAIT).await;
    eventually(WAIT, "the scheduler component up again", || async {
        let h = mq.health();
        (h.report("scheduler")?.status == HealthStatus::Up).then_some(())
    })
    .await;
    delivering.close().await;
    only.close().await;
}
