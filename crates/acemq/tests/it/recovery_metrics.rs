//! The recovery metrics, counted exactly (on `memory://`, with a recorder local to the test's
//! single-threaded runtime): `acemq.connection.recovery.total` per event and
//! `acemq.consumer.resubscribed.total` for a consumer the broker forgot.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::consume::{ConsumerOptions, Message};
use acemq::observe::metrics::CONSUMER_RESUBSCRIBED_TOTAL;
use acemq::transport::Transport;
use acemq::transport::memory::MemoryTransport;
use acemq::transport::recovery::RECOVERY_TOTAL;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

type Rows = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// Everything recorded (a snapshot resets the counters: take one).
fn rows(snap: &Snapshotter) -> Rows {
    snap.snapshot().into_vec()
}

/// The counter `name` whose labels include every one of `labels`, summed.
fn counter(rows: &Rows, name: &str, labels: &[(&str, &str)]) -> u64 {
    rows.iter()
        .filter(|(k, _, _, _)| k.key().name() == name)
        .filter(|(k, _, _, _)| {
            labels
                .iter()
                .all(|(lk, lv)| k.key().labels().any(|l| l.key() == *lk && l.value() == *lv))
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

#[test]
fn a_lost_and_recovered_connection_is_counted_per_event() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    runtime().block_on(async {
        let t = MemoryTransport::connect(&support::unique("metrics-recovery"));
        let mut events = t.recovery_events();
        t.broker().set_down(true);
        t.drop_connection("metrics test");
        // Two failed redials, then the broker is back.
        let mut retrying = 0;
        while retrying < 3 {
            if let Ok(acemq::transport::recovery::RecoveryEvent::Retrying { .. }) =
                events.recv().await
            {
                retrying += 1;
            }
        }
        t.broker().set_down(false);
        support::eventually(Duration::from_secs(60), "recovered", || {
            let up = t.status().connected;
            async move { up.then_some(()) }
        })
        .await;
    });
    let snap = rows(&snap);
    let memory = ("transport", "memory");
    assert_eq!(
        counter(&snap, RECOVERY_TOTAL, &[("event", "lost"), memory]),
        1
    );
    assert_eq!(
        counter(&snap, RECOVERY_TOTAL, &[("event", "recovered"), memory]),
        1
    );
    assert!(counter(&snap, RECOVERY_TOTAL, &[("event", "retrying"), memory]) >= 3);
    assert_eq!(counter(&snap, RECOVERY_TOTAL, &[("event", "gave_up")]), 0);
}

#[test]
fn a_consumer_the_broker_forgot_is_counted_once_when_subscribed_again() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let q = "metrics.forgot";
    runtime().block_on(async {
        let m = Arc::new(MemoryTransport::connect(&support::unique("metrics-forgot")));
        let mq = Connection::with_transport(m.clone(), ConnectionOptions::default());
        support::declare_classic(&mq, q).await;
        let consumer = mq
            .consume(
                q,
                ConsumerOptions::default().broker_check(Some(Duration::from_secs(1))),
                |_: Message<u32>| async { Ok(()) },
            )
            .await
            .expect("consume");
        assert_eq!(m.broker().forget_consumers(q), 1);
        support::eventually(Duration::from_secs(30), "subscribed again", || {
            let m = m.clone();
            async move {
                let info = m.inspect_queue(q).await.ok()?;
                (info.consumer_count == 1).then_some(())
            }
        })
        .await;
        // A few more checks: a healthy consumer is not counted again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        consumer.close().await;
        mq.close().await.expect("close");
    });
    assert_eq!(
        counter(
            &rows(&snap),
            CONSUMER_RESUBSCRIBED_TOTAL,
            &[("queue", q), ("transport", "memory")]
        ),
        1
    );
}
