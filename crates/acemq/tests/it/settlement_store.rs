//! Our outages are not the message's failures, with a fake
//! idempotency store on `memory://` and RabbitMQ: a store that cannot be asked spends no
//! attempt and sends nothing to `.dlq` (the delivery waits with backoff and is put back),
//! health shows the store Degraded while it is out and Up once it answers; a claim whose
//! reply was lost is given back at once instead of making its message wait "in progress"
//! for a lease; and a consumer holding deliveries without settling any is reported stalled
//! (Degraded, never Down) within its `stall_after` (paused clock).

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::health::HealthStatus;
use acemq::idempotency::{
    ClaimOutcome, HEALTH_COMPONENT, IdempotencyStore, InMemoryIdempotencyStore, StoreError,
};
use acemq::publish::SendOptions;
use acemq::retry::RetryPolicy;
use acemq::transport::BoxFuture;
use support::{Broker, eventually, on_each_target, unique};

const WAIT: Duration = Duration::from_secs(20);

/// An in-memory store whose `try_claim` fails its first `failing` calls without doing
/// anything, then fails `losing` calls after committing the claim (a lost reply).
#[derive(Debug)]
struct FlakyStore {
    inner: InMemoryIdempotencyStore,
    failing: AtomicU32,
    losing: AtomicU32,
    releases: AtomicU32,
}

impl FlakyStore {
    fn new(failing: u32, losing: u32) -> Arc<FlakyStore> {
        Arc::new(FlakyStore {
            inner: InMemoryIdempotencyStore::for_one_day(),
            failing: AtomicU32::new(failing),
            losing: AtomicU32::new(losing),
            releases: AtomicU32::new(0),
        })
    }
}

fn take_one(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

impl IdempotencyStore for FlakyStore {
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.claim(key)
    }
    fn confirm<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.confirm(key)
    }
    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(key)
    }
    fn is_confirmed<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.is_confirmed(key)
    }
    fn try_claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        Box::pin(async move {
            if take_one(&self.failing) {
                return Err(StoreError::Unavailable(
                    "connection refused (test outage)".into(),
                ));
            }
            if take_one(&self.losing) {
                self.inner.try_claim(key).await?;
                return Err(StoreError::Unavailable("the reply was lost (test)".into()));
            }
            self.inner.try_claim(key).await
        })
    }
}

/// The attempt header each handler run saw.
type Seen = Arc<Mutex<Vec<i32>>>;

fn recording(
    seen: Seen,
) -> impl Fn(Message<u32>) -> std::future::Ready<Result<(), HandlerError>> + Send + Sync + 'static {
    move |m: Message<u32>| {
        seen.lock().unwrap().push(m.envelope().attempt());
        std::future::ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_spends_no_attempt_and_shows_in_health() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "store-outage").await;
        let store = FlakyStore::new(4, 0);
        let seen: Seen = Arc::default();
        // Two attempts 10 ms apart: a store failure that spent attempts would reach .dlq
        // long before the outage ends.
        let options = ConsumerOptions::default()
            .retry(RetryPolicy::fixed(2, Duration::from_millis(10)).unwrap())
            .idempotent(store.clone());
        let consumer = mq
            .consume(&q, options, recording(seen.clone()))
            .await
            .unwrap();
        assert_eq!(
            mq.health().report(HEALTH_COMPONENT).map(|r| r.status),
            Some(HealthStatus::Up),
            "the consumer registers its store"
        );
        mq.publisher::<u32>("", &q).send(&7).await.unwrap();

        let during = eventually(WAIT, "the store reported Degraded", || async {
            let h = mq.health();
            let r = h.report(HEALTH_COMPONENT)?.clone();
            (r.status == HealthStatus::Degraded).then_some((h.status, r))
        })
        .await;
        let (overall, report) = during;
        assert_eq!(overall, HealthStatus::Degraded, "degraded, never down");
        assert!(
            report
                .detail("error")
                .is_some_and(|e| e.contains("connection refused")),
            "{report:?}"
        );
        assert!(report.detail("since").is_some(), "{report:?}");
        assert_eq!(report.details["queues"], serde_json::json!([q]));

        eventually(WAIT, "handled once the store answers", || async {
            (consumer.stats().acked == 1).then_some(())
        })
        .await;
        // The put-back of the last failed claim is counted once its copy landed and the
        // original was acked, which can come after the copy was already handled.
        let stats = eventually(WAIT, "every put-back counted", || async {
            let s = consumer.stats();
            (s.store_unavailable >= 4).then_some(s)
        })
        .await;
        assert_eq!(*seen.lock().unwrap(), [1], "handled once, on attempt 1");
        assert_eq!(stats.store_unavailable, 4, "each failed claim put it back");
        assert_eq!((stats.retried, stats.dead_lettered), (0, 0));
        let dlq = mq
            .transport()
            .inspect_queue(&format!("{q}.dlq"))
            .await
            .unwrap();
        assert_eq!(dlq.message_count, 0, "nothing dead-lettered");
        assert_eq!(
            mq.health().report(HEALTH_COMPONENT).map(|r| r.status),
            Some(HealthStatus::Up),
            "up again after a successful call"
        );
        consumer.close().await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_was_lost_is_given_back_at_once() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "store-lost-reply").await;
        let store = FlakyStore::new(0, 1);
        let seen: Seen = Arc::default();
        let options = ConsumerOptions::default()
            .in_progress_delay(Duration::from_secs(60))
            .idempotent(store.clone());
        let consumer = mq
            .consume(&q, options, recording(seen.clone()))
            .await
            .unwrap();
        mq.publisher::<u32>("", &q)
            .send_with(&1, SendOptions::new().message_id("lost-1"))
            .await
            .unwrap();
        // The in-progress wait is a minute: handled well within it means the committed
        // claim was given back, not waited out.
        // The put-back is counted once the original is acked, which can follow the
        // copy's handling by a moment: wait for both counts.
        eventually(WAIT, "handled after one put-back", || async {
            let s = consumer.stats();
            (s.acked == 1 && s.store_unavailable == 1).then_some(())
        })
        .await;
        let stats = consumer.stats();
        assert_eq!((stats.store_unavailable, stats.in_progress), (1, 0));
        assert_eq!(*seen.lock().unwrap(), [1]);
        assert!(store.releases.load(Ordering::SeqCst) >= 1);
        assert!(store.inner.is_confirmed("lost-1").await.unwrap());
        consumer.close().await;
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_stalled_consumer_is_degraded_within_its_stall_after() {
    let mq = Connection::connect(&format!("memory://{}", unique("stall")))
        .await
        .unwrap();
    let q = unique("stall");
    support::declare_classic(&mq, &q).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(AtomicU32::new(0));
    let (r, s) = (release.clone(), started.clone());
    let consumer = mq
        .consume(
            &q,
            ConsumerOptions::default().stall_after(Duration::from_secs(30)),
            move |_m: Message<u32>| {
                let (r, s) = (r.clone(), s.clone());
                async move {
                    s.fetch_add(1, Ordering::SeqCst);
                    r.notified().await;
                    Ok(())
                }
            },
        )
        .await
        .unwrap();
    let consumers = |mq: &Connection| mq.health().report("consumers").cloned().unwrap();
    assert_eq!(
        consumers(&mq).detail(&format!("{q}.lastDelivery")),
        Some("never")
    );
    mq.publisher::<u32>("", &q).send(&1).await.unwrap();
    eventually(WAIT, "the handler running", || async {
        (started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let busy = consumers(&mq);
    assert_eq!(busy.status, HealthStatus::Up);
    assert_eq!(busy.details[&format!("{q}.running")], 1);
    assert_eq!(busy.details[&format!("{q}.inFlight")], 1);
    assert_ne!(busy.detail(&format!("{q}.lastDelivery")), Some("never"));
    assert_eq!(busy.detail(&format!("{q}.lastSettlement")), Some("never"));

    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(consumers(&mq).status, HealthStatus::Up, "not yet");
    tokio::time::advance(Duration::from_secs(1)).await;
    let stalled = consumers(&mq);
    assert_eq!(stalled.status, HealthStatus::Degraded);
    let reason = stalled.detail(&format!("stalled.{q}")).unwrap();
    assert!(reason.contains("no settlement for 30 s"), "{reason}");
    let health = mq.health();
    assert_eq!(
        health.status,
        HealthStatus::Degraded,
        "Down is for a closed connection"
    );
    assert_eq!(
        health.report("acemq").map(|r| r.status),
        Some(HealthStatus::Up)
    );
    let json = health.to_json();
    assert_eq!(json["components"]["consumers"]["status"], "DEGRADED");

    release.notify_one();
    eventually(WAIT, "settled", || async {
        (consumer.stats().acked == 1).then_some(())
    })
    .await;
    let after = consumers(&mq);
    assert_eq!(after.status, HealthStatus::Up);
    assert_ne!(after.detail(&format!("{q}.lastSettlement")), Some("never"));
    consumer.close().await;
    support::teardown(&mq, &q, &[]).await;
}

/// The same on RabbitMQ, in real time: a handler that does not finish makes the consumer
/// Degraded after `stall_after`, the connection stays Up, and a settlement clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_consumer_on_rabbitmq_is_degraded_within_its_stall_after() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    let mq = Connection::connect(&url).await.unwrap();
    let q = unique("stall-amqp");
    support::declare_classic(&mq, &q).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let stall_after = Duration::from_millis(500);
    let consumer = mq
        .consume(
            &q,
            ConsumerOptions::default().stall_after(stall_after),
            move |_m: Message<u32>| {
                let r = r.clone();
                async move {
                    r.notified().await;
                    Ok(())
                }
            },
        )
        .await
        .unwrap();
    mq.publisher::<u32>("", &q).send(&1).await.unwrap();
    let started = std::time::Instant::now();
    let stalled = eventually(WAIT, "the consumer stalled", || async {
        let r = mq.health().report("consumers").cloned().unwrap();
        (r.status == HealthStatus::Degraded).then_some(r)
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "not before stall_after"
    );
    assert!(
        stalled.detail(&format!("stalled.{q}")).is_some(),
        "{stalled:?}"
    );
    assert_eq!(
        mq.health().report("acemq").map(|r| r.status),
        Some(HealthStatus::Up)
    );
    release.notify_one();
    eventually(WAIT, "settled and Up again", || async {
        let up = consumer.stats().acked == 1
            && mq.health().report("consumers").map(|r| r.status) == Some(HealthStatus::Up);
        up.then_some(())
    })
    .await;
    consumer.close().await;
    support::teardown(&mq, &q, &[]).await;
    mq.close().await.unwrap();
}
