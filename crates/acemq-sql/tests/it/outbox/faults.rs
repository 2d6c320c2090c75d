//! The relay across broker faults injected on `memory://` (feature `testing`), on SQLite
//! and PostgreSQL: an outage spends no attempt and loses nothing, a lost confirm spends no
//! attempt (the row is published again: one counted duplicate), a blocked broker spends no
//! attempt, a refused row is still retired, a closed connection stops the relay. On
//! RabbitMQ (when `ACEMQ_TEST_AMQP_URL` is set) the broker force-closes this test's own
//! connections (found by connection name) while the relay publishes.
//!
//! Real time with short delays: sqlx's pools keep their own timers, so the clock cannot be
//! paused under them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::topology::QueueDecl;
use acemq::transport::Transport;
use acemq::transport::amqp::{AmqpOptions, AmqpTransport};
use acemq::transport::memory::MemoryTransport;
use acemq::transport::recovery::RecoveryPolicy;
use acemq_sql::SqlPool;
use acemq_sql::outbox::Outbox;

use super::broker::close_our_connections_async;
use super::support::{drop_table, eventually, unique_table};
use super::{
    DEADLINE, check_delivered, drain_queue, enqueue_orders, outbox_on, real_targets, relay,
    unroutable_row_is_retried_then_retired,
};

const MAX_ATTEMPTS: u32 = 3;

/// A `memory://` connection whose faults the test controls, redialling every 10-50 ms,
/// with `queue` declared.
async fn faulty(queue: &str) -> (Arc<MemoryTransport>, Connection) {
    let t = Arc::new(
        MemoryTransport::connect(&unique_table("outbox_faults")).with_recovery(
            RecoveryPolicy::default().delays(Duration::from_millis(10), Duration::from_millis(50)),
        ),
    );
    t.declare_queue(&QueueDecl::classic(queue)).await.unwrap();
    let conn = Connection::with_transport(t.clone(), ConnectionOptions::default());
    (t, conn)
}

/// Every row in `ids` is published, with its attempts untouched.
async fn all_published_none_spent(outbox: &Outbox, ids: impl Iterator<Item = &String>) {
    for id in ids {
        let rec = outbox.record(id).await.unwrap().expect("row kept");
        assert!(rec.published_at_millis.is_some(), "{id} published");
        assert!(rec.retired_at_millis.is_none(), "{id} not retired");
        assert_eq!(rec.attempts, 0, "{id}: unavailability spends no attempt");
    }
}

/// Rows committed during an outage as long as 10× `max_attempts` polls are all published
/// once the broker is back; none is retired and none spent an attempt.
async fn an_outage_spends_no_attempt(pool: &SqlPool) {
    let queue = unique_table("outbox_outage_q");
    let (t, conn) = faulty(&queue).await;
    let (outbox, table) = outbox_on(pool).await;
    let r = relay(&conn, &outbox).max_attempts(MAX_ATTEMPTS);
    r.start().unwrap();
    let mut expected = enqueue_orders(pool, &outbox, &queue, 20, 0).await;
    eventually("the rows before the outage published", DEADLINE, || async {
        r.published() == 20
    })
    .await;

    t.broker().set_down(true);
    t.drop_connection("outage drill");
    assert!(!conn.status().connected);
    let during = enqueue_orders(pool, &outbox, &queue, 50, 10).await;
    assert_eq!(during.len(), 45);
    // 10× max_attempts polls, each of which meets the outage with a publish.
    let probe = relay(&conn, &outbox).max_attempts(MAX_ATTEMPTS);
    let polls = 10 * MAX_ATTEMPTS;
    for _ in 0..polls {
        assert_eq!(probe.drain_once().await.unwrap(), 0, "nothing handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        probe.unavailable(),
        u64::from(polls),
        "each poll met the outage"
    );
    assert_eq!(probe.failed(), u64::from(polls));
    assert_eq!(probe.retired(), 0);
    assert_eq!(
        outbox.pending_count().await.unwrap(),
        45,
        "all still pending"
    );
    for id in during.keys() {
        let rec = outbox.record(id).await.unwrap().unwrap();
        assert_eq!(
            rec.attempts, 0,
            "{id}: no attempt spent while the broker is down"
        );
        assert!(rec.retired_at_millis.is_none());
    }
    assert!(
        outbox.retired().await.unwrap().is_empty(),
        "nothing retired during the outage"
    );
    assert_eq!(r.published(), 20, "the running relay waits");

    t.broker().set_down(false);
    eventually("every row published after the outage", DEADLINE, || async {
        outbox.pending_count().await.unwrap() == 0
    })
    .await;
    expected.extend(during);
    assert!(r.is_running(), "the relay was not restarted");
    r.stop().await;
    assert_eq!(r.retired(), 0);
    assert!(outbox.retired().await.unwrap().is_empty());
    all_published_none_spent(&outbox, expected.keys()).await;
    let seen = check_delivered(&drain_queue(conn.transport(), &queue).await, &expected);
    assert_eq!(seen.len(), 65, "none lost");
    assert!(
        seen.values().all(|n| *n == 1),
        "nothing was sent while down"
    );
    eprintln!(
        "outage: running relay {} published, {} unavailable; probe {} unavailable",
        r.published(),
        r.unavailable(),
        probe.unavailable()
    );
    drop_table(pool, &table).await;
    conn.close().await.unwrap();
}

/// A running relay that meets an outage mid-stream hands its batch back and waits for the
/// connection (no hot loop, no attempt spent, even with `max_attempts(1)`), then publishes
/// the rest once the broker is back, without a restart.
async fn an_outage_mid_stream_hands_the_batch_back(pool: &SqlPool) {
    let queue = unique_table("outbox_midstream_q");
    let (t, conn) = faulty(&queue).await;
    let (outbox, table) = outbox_on(pool).await;
    let expected = enqueue_orders(pool, &outbox, &queue, 200, 0).await;
    t.broker().delay_confirms(Some(Duration::from_millis(2)));
    let r = relay(&conn, &outbox).max_attempts(1);
    r.start().unwrap();
    eventually("publishing under way", DEADLINE, || async {
        r.published() >= 20
    })
    .await;
    t.broker().set_down(true);
    t.drop_connection("mid-stream drill");
    eventually("the relay meets the outage", DEADLINE, || async {
        r.unavailable() >= 1
    })
    .await;
    let at = r.published();
    // The outage lasts 10× max_attempts polls (poll and retry delay 20 ms each).
    tokio::time::sleep(Duration::from_millis(40) * 10 * MAX_ATTEMPTS).await;
    assert_eq!(r.published(), at, "nothing published while down");
    assert!(
        r.unavailable() <= 3,
        "the relay waits for the connection instead of polling: {} failed publishes",
        r.unavailable()
    );
    assert!(outbox.retired().await.unwrap().is_empty());
    t.broker().set_down(false);
    eventually("every row published after the outage", DEADLINE, || async {
        outbox.pending_count().await.unwrap() == 0
    })
    .await;
    assert!(r.is_running(), "the relay was not restarted");
    r.stop().await;
    assert_eq!(r.retired(), 0);
    all_published_none_spent(&outbox, expected.keys()).await;
    let seen = check_delivered(&drain_queue(conn.transport(), &queue).await, &expected);
    assert_eq!(seen.len(), 200, "none lost");
    let duplicates = seen.values().map(|n| (n - 1) as u64).sum::<u64>();
    assert!(
        duplicates <= r.in_doubt(),
        "{duplicates} duplicates, above the {} in-doubt publishes",
        r.in_doubt()
    );
    eprintln!(
        "mid-stream outage: {} unavailable, {} in doubt, {duplicates} duplicates",
        r.unavailable(),
        r.in_doubt()
    );
    drop_table(pool, &table).await;
    conn.close().await.unwrap();
}

/// A lost confirm (in doubt) spends no attempt even with `max_attempts(1)`: the row is
/// published again after the retry delay, so it reaches the queue twice, and
/// `in_doubt()` counts it.
async fn a_lost_confirm_spends_no_attempt(pool: &SqlPool) {
    let queue = unique_table("outbox_doubt_q");
    let (t, conn) = faulty(&queue).await;
    let (outbox, table) = outbox_on(pool).await;
    let expected = enqueue_orders(pool, &outbox, &queue, 10, 0).await;
    t.broker().lose_next_confirms(1);
    let r = relay(&conn, &outbox).max_attempts(1);
    r.start().unwrap();
    eventually("every row published", DEADLINE, || async {
        outbox.pending_count().await.unwrap() == 0
    })
    .await;
    r.stop().await;
    assert_eq!(r.retired(), 0, "an in-doubt publish never retires a row");
    assert_eq!(r.in_doubt(), 1);
    assert_eq!(r.unavailable(), 1);
    assert_eq!(r.published(), 10);
    all_published_none_spent(&outbox, expected.keys()).await;
    let mut doubted = Vec::new();
    for id in expected.keys() {
        if let Some(e) = outbox.record(id).await.unwrap().unwrap().last_error {
            doubted.push((id.clone(), e));
        }
    }
    assert_eq!(doubted.len(), 1, "{doubted:?}");
    assert!(doubted[0].1.contains("in doubt"), "{}", doubted[0].1);
    let seen = check_delivered(&drain_queue(conn.transport(), &queue).await, &expected);
    assert_eq!(seen.len(), 10, "none lost");
    let twice: HashMap<_, _> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert_eq!(
        twice.len() as u64,
        r.in_doubt(),
        "duplicates: exactly the in-doubt rows"
    );
    assert_eq!(
        twice.get(&doubted[0].0).copied(),
        Some(&2),
        "the in-doubt row arrives twice, with the same id"
    );
    drop_table(pool, &table).await;
    conn.close().await.unwrap();
}

/// A blocked broker spends no attempt; the relay publishes once it is unblocked.
async fn a_blocked_broker_spends_no_attempt(pool: &SqlPool) {
    let queue = unique_table("outbox_blocked_q");
    let (t, conn) = faulty(&queue).await;
    let (outbox, table) = outbox_on(pool).await;
    let expected = enqueue_orders(pool, &outbox, &queue, 10, 0).await;
    t.broker().block("low on memory");
    let r = relay(&conn, &outbox).max_attempts(1);
    for _ in 0..3 {
        assert_eq!(r.drain_once().await.unwrap(), 0);
    }
    assert_eq!(r.unavailable(), 3);
    assert_eq!(outbox.pending_count().await.unwrap(), 10);
    r.start().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.published(), 0, "nothing goes while blocked");
    t.broker().unblock();
    eventually("every row published", DEADLINE, || async {
        outbox.pending_count().await.unwrap() == 0
    })
    .await;
    r.stop().await;
    assert_eq!(r.retired(), 0);
    all_published_none_spent(&outbox, expected.keys()).await;
    let seen = check_delivered(&drain_queue(conn.transport(), &queue).await, &expected);
    assert_eq!(seen.len(), 10);
    assert!(seen.values().all(|n| *n == 1));
    drop_table(pool, &table).await;
    conn.close().await.unwrap();
}

/// Closing the AceMQ connection stops the relay at its next publish; the row stays pending
/// with its attempts.
async fn a_closed_connection_stops_the_relay(pool: &SqlPool) {
    let queue = unique_table("outbox_closed_q");
    let (_t, conn) = faulty(&queue).await;
    let (outbox, table) = outbox_on(pool).await;
    let r = relay(&conn, &outbox);
    r.start().unwrap();
    conn.close().await.unwrap();
    let ids = enqueue_orders(pool, &outbox, &queue, 3, 0).await;
    eventually("the relay stops", DEADLINE, || async { !r.is_running() }).await;
    assert_eq!(r.published(), 0);
    assert_eq!(r.unavailable(), 0, "closed is not unavailability");
    assert_eq!(
        outbox.pending_count().await.unwrap(),
        3,
        "rows stay pending"
    );
    for id in ids.keys() {
        let rec = outbox.record(id).await.unwrap().unwrap();
        assert_eq!(rec.attempts, 0);
    }
    r.stop().await;
    drop_table(pool, &table).await;
}

/// RabbitMQ force-closes the relay's connection (both of its connections, found by this
/// test's unique connection name) while the relay publishes and rows keep being committed:
/// the connection recovers, every row is published, none is retired (`max_attempts(1)`,
/// so any counted failure would show) and none spent an attempt; duplicates stay within
/// the in-doubt publishes.
async fn a_force_closed_rabbitmq_connection_spends_no_attempt(pool: &SqlPool, url: &str) {
    let name = format!("acemq-test.{}", unique_table("outbox_relay"));
    let t = AmqpTransport::connect_with(
        url,
        AmqpOptions::default().connection_name(&name).recovery(
            RecoveryPolicy::default().delays(Duration::from_millis(200), Duration::from_secs(2)),
        ),
    )
    .await
    .expect("connect");
    let conn = Connection::with_transport(Arc::new(t), ConnectionOptions::default());
    let queue = unique_table("acemq_outbox_forced_q");
    conn.transport()
        .declare_queue(&QueueDecl::classic(&queue))
        .await
        .unwrap();
    let (outbox, table) = outbox_on(pool).await;
    let mut expected = enqueue_orders(pool, &outbox, &queue, 100, 0).await;
    let r = relay(&conn, &outbox).batch_size(10).max_attempts(1);
    r.start().unwrap();
    // Rows keep being committed, so the relay is publishing when the connection goes.
    let stop = Arc::new(AtomicBool::new(false));
    let enqueuer = tokio::spawn({
        let (pool, outbox, queue, stop) =
            (pool.clone(), outbox.clone(), queue.clone(), stop.clone());
        async move {
            let mut committed = HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                committed.extend(enqueue_orders(&pool, &outbox, &queue, 2, 0).await);
                // Pacing (about 200 rows a second), not waiting for anything.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            committed
        }
    });
    eventually("publishing under way", DEADLINE, || async {
        r.published() >= 150
    })
    .await;
    let closed = close_our_connections_async(None, name.clone(), "acemq outbox relay test")
        .await
        .expect("rabbitmqctl close_connection");
    assert_eq!(closed, 2, "both of this test's connections closed");
    let at_close = r.published();
    eventually("publishing again after recovery", DEADLINE, || async {
        r.published() >= at_close + 100
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    expected.extend(enqueuer.await.unwrap());
    eventually("every row published", DEADLINE, || async {
        outbox.pending_count().await.unwrap() == 0
    })
    .await;
    assert!(r.is_running(), "the relay was not restarted");
    r.stop().await;
    assert_eq!(r.retired(), 0);
    assert!(outbox.retired().await.unwrap().is_empty());
    all_published_none_spent(&outbox, expected.keys()).await;
    let seen = check_delivered(&drain_queue(conn.transport(), &queue).await, &expected);
    assert_eq!(seen.len(), expected.len(), "none lost");
    let duplicates = seen.values().map(|n| (n - 1) as u64).sum::<u64>();
    assert!(
        duplicates <= r.in_doubt(),
        "{duplicates} duplicates, above the {} in-doubt publishes",
        r.in_doubt()
    );
    eprintln!(
        "rabbitmq force-close: {} rows, {} unavailable, {} in doubt, {duplicates} duplicates",
        expected.len(),
        r.unavailable(),
        r.in_doubt()
    );
    let _ = conn.transport().delete_queue(&queue).await;
    drop_table(pool, &table).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), conn.close()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outbox_relay_across_injected_faults() {
    for (name, pool) in super::support::databases().await {
        if name == "mysql" {
            continue; // SQLite and PostgreSQL cover the relay's fault handling
        }
        eprintln!("outbox faults on {name}");
        an_outage_spends_no_attempt(&pool).await;
        an_outage_mid_stream_hands_the_batch_back(&pool).await;
        a_lost_confirm_spends_no_attempt(&pool).await;
        a_blocked_broker_spends_no_attempt(&pool).await;
        a_closed_connection_stops_the_relay(&pool).await;
        // A refused row is still retired after max_attempts, on a connection that
        // recovers.
        let (_t, conn) = faulty(&unique_table("outbox_refused_q")).await;
        unroutable_row_is_retried_then_retired(&pool, &conn).await;
        conn.close().await.unwrap();
        if let Some(url) = real_targets().into_iter().find(|u| u.starts_with("amqp")) {
            a_force_closed_rabbitmq_connection_spends_no_attempt(&pool, &url).await;
        }
    }
}
