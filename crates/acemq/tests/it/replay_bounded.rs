//! Conformance: looking at dead letters without moving them, and bounded filtered passes
//! (wire.md §7) on `memory://` and RabbitMQ.
//!
//! "Unacked" is watched from a second connection while a peek or pass runs: the ready
//! count of the dead-letter queue (which excludes unacked messages) must never drop by
//! more than the bound; on `memory://` the broker's unacked count is read too.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::envelope::{self, Envelope};
use acemq::headers::HeaderValue;
use acemq::transport::memory::MemoryTransport;
use acemq::transport::{ConsumeSpec, Delivery, Outbound, Properties, Transport, header_frame_size};
use support::{
    Broker, connect_with_classic_queue, declare_classic, on_each_target, teardown, wait_for_count,
};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(60);
const FIRST_SEEN: i64 = 1_767_323_045_678;

async fn setup(target: &Broker, prefix: &str) -> (Connection, String) {
    let (mq, q) = connect_with_classic_queue(target, prefix).await;
    for name in [format!("{q}.dlq"), format!("{q}.parked")] {
        declare_classic(&mq, &name).await;
    }
    (mq, q)
}

/// The tenant of dead letter `i`: `vip` when `vip(i)`, else `even` / `odd`.
fn tenant(i: usize, vip: &dyn Fn(usize) -> bool) -> &'static str {
    if vip(i) {
        "vip"
    } else if i.is_multiple_of(2) {
        "even"
    } else {
        "odd"
    }
}

/// Puts `n` dead letters `dl-{i}` into `{q}.dlq` the way the engine writes them, the
/// confirms pipelined.
async fn dead_letters(t: &dyn Transport, q: &str, n: usize, vip: &dyn Fn(usize) -> bool) {
    let mut confirms = Vec::with_capacity(n);
    for i in 0..n {
        let mut props = Properties {
            message_id: Some(format!("dl-{i}")),
            content_type: Some("application/json".into()),
            delivery_mode: Some(2),
            ..Default::default()
        };
        Envelope::new("order.placed")
            .with_id(format!("dl-{i}"))
            .with_attempt(3)
            .with_first_seen_millis(FIRST_SEEN)
            .with_error(Some(format!("exhausted 3 attempts: boom {i}")))
            .write(&mut props.headers, "java@host");
        props
            .headers
            .insert("x-tenant".into(), HeaderValue::from(tenant(i, vip)));
        let body = format!("{{\"n\":{i}}}").into_bytes();
        confirms.push(
            t.publish(Outbound::new("", format!("{q}.dlq"), props, body))
                .await
                .unwrap(),
        );
    }
    for c in confirms {
        c.await.unwrap();
    }
    wait_for_count(t, &format!("{q}.dlq"), n as u32, WAIT).await;
}

fn no_vip(_: usize) -> bool {
    false
}

/// Takes every message of `queue` (expecting `n`) through a subscription, acks them, and
/// returns them in the order they came.
async fn drain(t: &dyn Transport, queue: &str, n: usize) -> Vec<Delivery> {
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut sub = t.consume(ConsumeSpec::new(queue, 500)).await.unwrap();
    while out.len() < n {
        let d = tokio::time::timeout(WAIT, sub.next())
            .await
            .unwrap_or_else(|_| panic!("{queue}: only {} of {n} arrived", out.len()))
            .expect("subscription open")
            .unwrap();
        d.acker.ack().await.unwrap();
        out.push(d);
    }
    sub.close().await.unwrap();
    out
}

fn ids(ds: &[Delivery]) -> Vec<String> {
    ds.iter()
        .map(|d| d.properties.message_id.clone().unwrap())
        .collect()
}

fn numbered(range: impl Iterator<Item = usize>) -> Vec<String> {
    range.map(|i| format!("dl-{i}")).collect()
}

/// Watches a queue from a second connection until stopped: the lowest ready count seen,
/// the highest unacked count seen (`memory://` only), and how many samples were taken.
struct Watcher {
    stop: Arc<AtomicBool>,
    samples: Arc<AtomicUsize>,
    task: JoinHandle<(u32, Option<u32>, usize)>,
}

impl Watcher {
    async fn start(target: &Broker, queue: &str) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let t = target.transport().await;
        let memory = match target {
            Broker::Memory(name) => Some(MemoryTransport::connect(name)),
            Broker::Amqp(_) => None,
        };
        let samples = Arc::new(AtomicUsize::new(0));
        let (queue, flag, counted) = (queue.to_owned(), stop.clone(), samples.clone());
        let task = tokio::spawn(async move {
            let (mut min_ready, mut max_unacked, mut samples) = (u32::MAX, None, 0usize);
            while !flag.load(Ordering::SeqCst) {
                let ready = t.inspect_queue(&queue).await.unwrap().message_count;
                min_ready = min_ready.min(ready);
                if let Some(m) = &memory {
                    let unacked = m.broker().unacked_count(&queue).unwrap_or(0);
                    max_unacked = Some(max_unacked.unwrap_or(0).max(unacked));
                }
                samples += 1;
                counted.store(samples, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
            t.close().await.ok();
            (min_ready, max_unacked, samples)
        });
        let watcher = Watcher {
            stop,
            samples,
            task,
        };
        // Watching before the work starts.
        watcher.wait_for_samples(1).await;
        watcher
    }

    /// Waits until the watcher has taken `n` samples in all.
    async fn wait_for_samples(&self, n: usize) {
        support::eventually(WAIT, "the watcher to sample", || async {
            (self.samples.load(Ordering::SeqCst) >= n).then_some(())
        })
        .await;
    }

    fn samples(&self) -> usize {
        self.samples.load(Ordering::SeqCst)
    }

    async fn stop(self) -> (u32, Option<u32>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_shows_the_reason_and_provenance_and_moves_nothing() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "peek-small").await;
        let t = mq.transport();
        let dlq = format!("{q}.dlq");
        dead_letters(&**t, &q, 20, &no_vip).await;
        // One message that was replayed once before, with its provenance.
        let mut props = Properties {
            message_id: Some("again".into()),
            ..Default::default()
        };
        Envelope::new("order.placed")
            .with_id("again")
            .with_first_seen_millis(FIRST_SEEN)
            .with_error(Some("failed after replay".into()))
            .replayed(dlq.clone(), time::OffsetDateTime::now_utc())
            .write(&mut props.headers, "rust@host");
        t.publish(Outbound::new("", &dlq, props, "x"))
            .await
            .unwrap()
            .await
            .unwrap();
        wait_for_count(&**t, &dlq, 21, WAIT).await;

        let replay = mq.replay(&q);
        let seen = replay.peek(5).await.unwrap();
        let seen_ids: Vec<_> = seen.iter().map(|m| m.id.clone().unwrap()).collect();
        assert_eq!(seen_ids, numbered(0..5), "the head, in order");
        let m = &seen[2];
        assert_eq!(m.error.as_deref(), Some("exhausted 3 attempts: boom 2"));
        assert_eq!(m.message_type.as_deref(), Some("order.placed"));
        assert_eq!(m.attempt, Some(3));
        assert_eq!(m.origin.as_deref(), Some("java@host"));
        assert_eq!(
            m.first_seen.map(|f| f.unix_timestamp_nanos() / 1_000_000),
            Some(i128::from(FIRST_SEEN))
        );
        assert!(m.age.is_some_and(|a| a > Duration::from_secs(1)));
        assert_eq!((m.replay_count, m.replayed_from.as_deref()), (None, None));
        assert_eq!(m.headers["x-tenant"], HeaderValue::from("even"));
        assert!(
            m.headers.keys().all(|k| !k.starts_with("x-acemq-")),
            "application headers only: {:?}",
            m.headers.keys()
        );
        assert!(m.all_headers.contains_key(envelope::ERROR));
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(&m.body[..], b"{\"n\":2}");

        // Nothing moved: the count and the order are what they were.
        assert_eq!(wait_for_count(&**t, &dlq, 21, WAIT).await, 21);
        assert_eq!(replay.pending().await.unwrap(), 21);
        let all = replay.peek(100).await.unwrap();
        assert_eq!(all.len(), 21, "a peek past the end shows what there is");
        let last = &all[20];
        assert_eq!(last.id.as_deref(), Some("again"));
        assert_eq!(last.replay_count, Some(1));
        assert_eq!(last.replayed_from.as_deref(), Some(dlq.as_str()));
        assert!(
            last.replayed_at
                .as_deref()
                .is_some_and(|at| at.ends_with('Z'))
        );
        assert!(all[0].redelivered, "peeked before");
        // Two peeks at once on one connection take turns: each sees the head.
        let parked = replay.clone().parked();
        let (a, b) = tokio::join!(replay.peek(3), parked.peek(3));
        assert_eq!(a.unwrap().len(), 3);
        assert!(b.unwrap().is_empty());
        let (a, b) = tokio::join!(replay.peek(3), replay.peek(3));
        let heads = |v: Vec<acemq::replay::PeekedMessage>| -> Vec<String> {
            v.into_iter().map(|m| m.id.unwrap()).collect()
        };
        assert_eq!(heads(a.unwrap()), numbered(0..3));
        assert_eq!(heads(b.unwrap()), numbered(0..3));
        assert_eq!(wait_for_count(&**t, &dlq, 21, WAIT).await, 21);
        let mut expected = numbered(0..20);
        expected.push("again".into());
        assert_eq!(ids(&drain(&**t, &dlq, 21).await), expected, "order kept");
        assert_eq!(t.inspect_queue(&q).await.unwrap().message_count, 0);
        assert!(mq.replay(&q).parked().peek(5).await.unwrap().is_empty());
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peeking_five_of_ten_thousand_never_holds_more_than_five() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "peek-10k").await;
        let t = mq.transport();
        let dlq = format!("{q}.dlq");
        dead_letters(&**t, &q, 10_000, &no_vip).await;
        let replay = mq.replay(&q);
        let watcher = Watcher::start(&target, &dlq).await;
        // At least 50 peeks, and until the watcher has sampled 50 times while they ran.
        let from = watcher.samples();
        let mut peeks = 0;
        while peeks < 50 || watcher.samples() < from + 50 {
            assert!(peeks < 1_000_000, "the watcher never got to sample");
            peeks += 1;
            let seen = replay.peek(5).await.unwrap();
            assert_eq!(seen.len(), 5);
            assert_eq!(
                seen[0].id.as_deref(),
                Some("dl-0"),
                "the head stays the head"
            );
        }
        let (min_ready, max_unacked, samples) = watcher.stop().await;
        assert!(samples > 0);
        assert!(min_ready >= 10_000 - 5, "ready went down to {min_ready}");
        if let Some(unacked) = max_unacked {
            assert!(unacked <= 5, "{unacked} unacked at once");
        }
        assert_eq!(wait_for_count(&**t, &dlq, 10_000, WAIT).await, 10_000);
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_replay_of_ten_among_ten_thousand_holds_a_bounded_number() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-10k").await;
        let t = mq.transport();
        let dlq = format!("{q}.dlq");
        let vip = |i: usize| i % 1000 == 7;
        dead_letters(&**t, &q, 10_000, &vip).await;
        let progress = Arc::new(Mutex::new(Vec::new()));
        let seen = progress.clone();
        let replay = mq
            .replay(&q)
            .hold_limit(100)
            .on_progress(move |p| seen.lock().unwrap().push(*p));
        let watcher = Watcher::start(&target, &dlq).await;
        let report = replay
            .replay_matching(usize::MAX, |dl| {
                dl.header("x-tenant").as_deref() == Some("vip")
            })
            .await
            .unwrap();
        let (min_ready, max_unacked, samples) = watcher.stop().await;
        assert!(samples > 0);
        // At most 100 held, one in hand, and the 10 moved out.
        assert!(
            min_ready >= 10_000 - 10 - 101,
            "ready went down to {min_ready}"
        );
        if let Some(unacked) = max_unacked {
            assert!(unacked <= 101, "{unacked} unacked at once");
        }
        assert_eq!(
            (
                report.scanned,
                report.replayed,
                report.declined,
                report.failed
            ),
            (10_000, 10, 9_990, 0)
        );
        let vips: Vec<_> = (0..10_000).filter(|i| vip(*i)).collect();
        assert_eq!(report.matched_ids, numbered(vips.iter().copied()));
        let progress = progress.lock().unwrap().clone();
        assert_eq!(progress.len(), 10_000, "called after each message");
        assert!(progress.windows(2).all(|w| w[0].scanned < w[1].scanned));
        assert_eq!(progress[9_999].replayed, 10);
        assert_eq!(progress[0].total_hint, Some(10_000));

        // Exactly those ten moved, with provenance; the rest stayed, in their order.
        let moved = drain(&**t, &q, 10).await;
        assert_eq!(ids(&moved), numbered(vips.iter().copied()));
        for d in &moved {
            assert_eq!(
                d.properties.headers[envelope::REPLAYED_FROM],
                HeaderValue::from(dlq.clone())
            );
            assert_eq!(
                d.properties.headers[envelope::REPLAY_COUNT],
                HeaderValue::I32(1)
            );
            assert_eq!(d.properties.headers[envelope::ATTEMPT], HeaderValue::I32(1));
        }
        assert_eq!(wait_for_count(&**t, &dlq, 9_990, WAIT).await, 9_990);
        let left = drain(&**t, &dlq, 9_990).await;
        let rest: Vec<_> = (0..10_000).filter(|i| !vip(*i)).collect();
        assert_eq!(
            ids(&left),
            numbered(rest.into_iter()),
            "relative order kept"
        );
        let d = &left[0];
        assert_eq!(&d.body[..], b"{\"n\":0}", "moved to the tail byte for byte");
        assert_eq!(
            d.properties.headers[envelope::ERROR],
            HeaderValue::from("exhausted 3 attempts: boom 0")
        );
        assert_eq!(d.properties.headers[envelope::ATTEMPT], HeaderValue::I32(3));
        assert_eq!(t.inspect_queue(&dlq).await.unwrap().message_count, 0);
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_moves_nothing_and_names_what_would_move() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-dry").await;
        let t = mq.transport();
        let dlq = format!("{q}.dlq");
        dead_letters(&**t, &q, 250, &no_vip).await;
        let even =
            |dl: &acemq::replay::DeadLetter<'_>| dl.header("x-tenant").as_deref() == Some("even");
        // Held in full (no message moves at all) ...
        let report = mq
            .replay(&q)
            .hold_limit(1_000)
            .dry_run_matching(usize::MAX, even)
            .await
            .unwrap();
        assert_eq!(
            (
                report.scanned,
                report.replayed,
                report.declined,
                report.purged
            ),
            (250, 0, 125, 0)
        );
        assert_eq!(report.matched_ids, numbered((0..250).step_by(2)));
        // (RabbitMQ requeues asynchronously: the next pass counts the queue when all are back.)
        wait_for_count(&**t, &dlq, 250, WAIT).await;
        // ... and with a hold smaller than the queue (held ones go to the tail).
        let small = mq
            .replay(&q)
            .hold_limit(40)
            .dry_run_matching(usize::MAX, even)
            .await
            .unwrap();
        assert_eq!(small.matched_ids, report.matched_ids);
        assert_eq!(small.declined, 125);
        wait_for_count(&**t, &dlq, 250, WAIT).await;
        // A bounded dry run stops at `max` matches.
        let three = mq.replay(&q).dry_run_matching(3, even).await.unwrap();
        assert_eq!((three.scanned, three.matched_ids.len()), (5, 3));

        assert_eq!(t.inspect_queue(&q).await.unwrap().message_count, 0);
        assert_eq!(wait_for_count(&**t, &dlq, 250, WAIT).await, 250);
        assert_eq!(ids(&drain(&**t, &dlq, 250).await), numbered(0..250));
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_drops_only_what_matches() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-purge").await;
        let t = mq.transport();
        let dlq = format!("{q}.dlq");
        dead_letters(&**t, &q, 30, &no_vip).await;
        let report = mq
            .replay(&q)
            .hold_limit(4)
            .purge_matching(|dl| dl.header("x-tenant").as_deref() == Some("odd"))
            .await
            .unwrap();
        assert_eq!(
            (
                report.scanned,
                report.purged,
                report.declined,
                report.replayed
            ),
            (30, 15, 15, 0)
        );
        assert_eq!(report.matched_ids, numbered((1..30).step_by(2)));
        assert_eq!(wait_for_count(&**t, &dlq, 15, WAIT).await, 15);
        assert_eq!(
            ids(&drain(&**t, &dlq, 15).await),
            numbered((0..30).step_by(2))
        );
        assert_eq!(t.inspect_queue(&q).await.unwrap().message_count, 0);
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_limit_stops_the_pass() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-scan-limit").await;
        let t = mq.transport();
        let dlq = format!("{q}.dlq");
        dead_letters(&**t, &q, 50, &no_vip).await;
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let looked = mq
            .replay(&q)
            .scan_limit(20)
            .on_progress(move |p| {
                counted.fetch_add(1, Ordering::SeqCst);
                assert_eq!(p.total_hint, Some(20));
            })
            .replay_matching(usize::MAX, |_| false)
            .await
            .unwrap();
        assert_eq!(
            (looked.scanned, looked.declined, looked.replayed),
            (20, 20, 0)
        );
        assert_eq!(calls.load(Ordering::SeqCst), 20);
        assert_eq!(wait_for_count(&**t, &dlq, 50, WAIT).await, 50);

        let moved = mq.replay(&q).scan_limit(20).replay_all().await.unwrap();
        assert_eq!((moved.scanned, moved.replayed), (20, 20));
        assert_eq!(mq.replay(&q).pending().await.unwrap(), 30);
        assert_eq!(ids(&drain(&**t, &q, 20).await), numbered(0..20));
        assert_eq!(ids(&drain(&**t, &dlq, 30).await), numbered(20..50));
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

/// A dead letter whose headers already come within 100 bytes of `frame_max`: its replayed
/// copy (with the provenance headers) cannot be sent, so it counts as failed and stays
/// where it was, and the pass goes on to the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_too_large_to_send_counts_as_failed_and_the_pass_goes_on() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "replay-too-large").await;
        let t = mq.transport();
        let dlq = format!("{q}.dlq");
        let mut big = Properties {
            message_id: Some("huge".into()),
            ..Default::default()
        };
        big.headers.insert("x-big".into(), HeaderValue::from(""));
        let fill = t.frame_max() as usize - 100 - header_frame_size(&big);
        big.headers
            .insert("x-big".into(), HeaderValue::from("b".repeat(fill)));
        let fine = Properties {
            message_id: Some("fine".into()),
            ..Default::default()
        };
        for props in [big, fine] {
            let c = t
                .publish(Outbound::new("", &dlq, props, "{}"))
                .await
                .unwrap();
            assert_eq!(c.await.unwrap(), acemq::transport::Confirmation::Routed);
        }
        wait_for_count(&**t, &dlq, 2, WAIT).await;
        let report = mq.replay(&q).replay_all().await.unwrap();
        assert_eq!(
            (
                report.scanned,
                report.replayed,
                report.failed,
                report.declined
            ),
            (2, 1, 1, 0)
        );
        assert_eq!(report.matched_ids, vec!["fine".to_owned()]);
        assert_eq!(ids(&drain(&**t, &q, 1).await), ["fine"]);
        wait_for_count(&**t, &dlq, 1, WAIT).await;
        assert_eq!(ids(&drain(&**t, &dlq, 1).await), ["huge"]);
        teardown(&mq, &q, &[]).await;
    })
    .await;
}

/// A peek killed while it holds messages loses nothing: they go back when its connection
/// closes, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_killed_while_holding_loses_nothing() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = setup(&target, "peek-kill").await;
        let dlq = format!("{q}.dlq");
        dead_letters(&**mq.transport(), &q, 2_000, &no_vip).await;
        let replay = mq.replay(&q);
        let task = tokio::spawn(async move { replay.peek(1_500).await });
        // Killed once it holds some (on RabbitMQ), or once done (`memory://` peeks in one go).
        let watch = target.transport().await;
        support::eventually(WAIT, "the peek to hold messages", || async {
            let ready = watch.inspect_queue(&dlq).await.unwrap().message_count;
            (ready < 2_000 || task.is_finished()).then_some(())
        })
        .await;
        let finished = task.is_finished();
        task.abort();
        let ended = task.await;
        if matches!(target, Broker::Amqp(_)) {
            assert!(
                !finished && ended.is_err_and(|e| e.is_cancelled()),
                "the kill landed while the peek held messages"
            );
        }
        mq.close().await.unwrap();
        assert_eq!(wait_for_count(&*watch, &dlq, 2_000, WAIT).await, 2_000);
        let back = drain(&*watch, &dlq, 2_000).await;
        assert_eq!(ids(&back), numbered(0..2_000), "each once, in order");
        assert_eq!(watch.inspect_queue(&dlq).await.unwrap().message_count, 0);
        for name in [q.clone(), dlq, format!("{q}.parked")] {
            watch.delete_queue(&name).await.ok();
        }
        watch.close().await.ok();
    })
    .await;
}
