//! The transactional outbox on SQLite, PostgreSQL and MariaDB (when configured), published
//! through a recording broker, `memory://` and RabbitMQ (when
//! `ACEMQ_TEST_AMQP_URL` is set); the relay's metrics, counted exactly on PostgreSQL.

use crate::support;

use crate::broker;
mod faults;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::publish::SendOptions;
use acemq::topology::QueueDecl;
use acemq::transport::Transport;
use acemq_sql::SqlPool;
use acemq_sql::outbox::{Outbox, OutboxRelay};
use serde_json::json;
use support::{RecordingBroker, drop_table, eventually, unique_table};

const DEADLINE: Duration = Duration::from_secs(60);

async fn outbox_on(pool: &SqlPool) -> (Outbox, String) {
    let table = unique_table("acemq_outbox");
    let outbox = Outbox::with_table(pool.clone(), &table).unwrap();
    outbox.create_table_if_absent().await.unwrap();
    (outbox, table)
}

/// Enqueues `n` orders, each in its own transaction; every tenth is rolled back. Returns
/// the committed ids with the body bytes their payload encodes to.
async fn enqueue_orders(
    pool: &SqlPool,
    outbox: &Outbox,
    queue: &str,
    n: usize,
    rollback_every: usize,
) -> HashMap<String, Vec<u8>> {
    let mut committed = HashMap::new();
    for i in 0..n {
        let payload = json!({"order": i, "note": "naïve ✓"});
        let id = format!("order-{i}-{}", uuid::Uuid::new_v4());
        let opts = SendOptions::new()
            .message_id(&id)
            .header("x-tenant", "acme")
            .header("n", i as i64);
        let keep = rollback_every == 0 || i % rollback_every != 0;
        macro_rules! go {
            ($p:expr) => {{
                let mut tx = $p.begin().await.unwrap();
                let got = outbox
                    .enqueue_with(&mut tx, "", queue, &payload, opts)
                    .await
                    .unwrap();
                assert_eq!(got, id);
                if keep {
                    tx.commit().await.unwrap()
                } else {
                    tx.rollback().await.unwrap()
                }
            }};
        }
        match pool {
            SqlPool::Postgres(p) => go!(p),
            SqlPool::MySql(p) => go!(p),
            SqlPool::Sqlite(p) => go!(p),
            _ => unreachable!(),
        }
        if keep {
            committed.insert(id, serde_json::to_vec(&payload).unwrap());
        }
    }
    committed
}

fn check_delivered(
    delivered: &[acemq::transport::Outbound],
    expected: &HashMap<String, Vec<u8>>,
) -> HashMap<String, usize> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for m in delivered {
        let id = m.properties.message_id.clone().expect("message id");
        let body = expected
            .get(&id)
            .unwrap_or_else(|| panic!("unexpected id {id}"));
        assert_eq!(&m.body[..], &body[..], "bytes verbatim for {id}");
        assert_eq!(
            m.properties.headers["x-acemq-id"].as_str(),
            Some(id.as_str())
        );
        assert_eq!(m.properties.headers["x-tenant"].as_str(), Some("acme"));
        assert!(matches!(
            m.properties.headers["n"],
            acemq::headers::HeaderValue::I64(_)
        ));
        assert!(matches!(
            m.properties.headers["x-acemq-attempt"],
            acemq::headers::HeaderValue::I32(_)
        ));
        assert_eq!(
            m.properties.content_type.as_deref(),
            Some("application/json")
        );
        assert_eq!(m.properties.delivery_mode, Some(2));
        *seen.entry(id).or_default() += 1;
    }
    seen
}

fn recording_connection(broker: &Arc<RecordingBroker>) -> Connection {
    Connection::with_transport(broker.clone(), ConnectionOptions::default())
}

fn relay(conn: &Connection, outbox: &Outbox) -> OutboxRelay {
    OutboxRelay::new(conn.clone(), outbox.clone())
        .batch_size(50)
        .poll_interval(Duration::from_millis(20))
        .retry_delay(Duration::from_millis(20))
}

async fn nine_hundred_of_a_thousand(pool: &SqlPool) {
    let broker = RecordingBroker::new();
    broker.declare("orders");
    let conn = recording_connection(&broker);
    let (outbox, table) = outbox_on(pool).await;
    let expected = enqueue_orders(pool, &outbox, "orders", 1000, 10).await;
    assert_eq!(expected.len(), 900);
    assert_eq!(outbox.pending_count().await.unwrap(), 900);
    let r = relay(&conn, &outbox);
    r.start().unwrap();
    eventually("900 published", DEADLINE, || async {
        r.published() == 900 && outbox.pending_count().await.unwrap() == 0
    })
    .await;
    r.stop().await;
    let seen = check_delivered(&broker.messages("orders"), &expected);
    assert_eq!(seen.len(), 900);
    assert!(seen.values().all(|n| *n == 1), "each once");
    assert_eq!(r.failed(), 0);
    let rec = outbox
        .record(expected.keys().next().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(rec.published_at_millis.is_some());
    drop_table(pool, &table).await;
}

async fn stopped_mid_way_then_restarted_loses_none(pool: &SqlPool) {
    let broker = RecordingBroker::new();
    broker.declare("orders");
    let conn = recording_connection(&broker);
    let (outbox, table) = outbox_on(pool).await;
    let expected = enqueue_orders(pool, &outbox, "orders", 300, 0).await;
    let first = relay(&conn, &outbox).batch_size(10);
    first.start().unwrap();
    eventually("some published", DEADLINE, || async {
        first.published() >= 20
    })
    .await;
    first.stop().await;
    assert!(!first.is_running());
    let after_stop = first.published();
    assert_eq!(
        broker.count("orders") as u64,
        after_stop,
        "stop() finished its batch"
    );
    let second = relay(&conn, &outbox);
    second.start().unwrap();
    eventually("the rest published", DEADLINE, || async {
        outbox.pending_count().await.unwrap() == 0
    })
    .await;
    second.stop().await;
    let seen = check_delivered(&broker.messages("orders"), &expected);
    assert_eq!(seen.len(), 300);
    assert!(seen.values().all(|n| *n == 1));
    drop_table(pool, &table).await;
}

async fn killed_between_publish_and_mark_publishes_again(pool: &SqlPool) {
    let broker = RecordingBroker::new();
    broker.declare("orders");
    let conn = recording_connection(&broker);
    let (outbox, table) = outbox_on(pool).await;
    let expected = enqueue_orders(pool, &outbox, "orders", 20, 0).await;
    broker.hold.store(true, Ordering::SeqCst);
    let doomed = relay(&conn, &outbox).lease(Duration::from_millis(300));
    let task = tokio::spawn(async move { doomed.drain_once().await });
    eventually("the first publish arrives", DEADLINE, || async {
        broker.count("orders") == 1
    })
    .await;
    task.abort(); // the relay dies after publishing, before marking
    let _ = task.await;
    broker.hold.store(false, Ordering::SeqCst);
    let second = relay(&conn, &outbox);
    second.start().unwrap();
    eventually(
        "all published after the lease ran out",
        DEADLINE,
        || async { outbox.pending_count().await.unwrap() == 0 },
    )
    .await;
    second.stop().await;
    let seen = check_delivered(&broker.messages("orders"), &expected);
    assert_eq!(seen.len(), 20, "none lost");
    assert_eq!(
        seen.values().filter(|n| **n == 2).count(),
        1,
        "the one in flight arrives twice (at least once), with the same id"
    );
    drop_table(pool, &table).await;
}

async fn two_relays_publish_each_row_once(pool: &SqlPool) {
    let broker = RecordingBroker::new();
    broker.declare("orders");
    let conn = recording_connection(&broker);
    let (outbox, table) = outbox_on(pool).await;
    let expected = enqueue_orders(pool, &outbox, "orders", 400, 0).await;
    let a = relay(&conn, &outbox).batch_size(20);
    let b = relay(&conn, &outbox).batch_size(20);
    a.start().unwrap();
    b.start().unwrap();
    let end = tokio::time::Instant::now() + DEADLINE;
    while outbox.pending_count().await.unwrap() != 0 {
        if tokio::time::Instant::now() > end {
            let now = acemq::envelope::now_millis();
            let rows = support::unpublished_rows(pool, &table).await;
            panic!(
                "two relays: {} rows unpublished after {DEADLINE:?} (a published {}, b published {}, failed {} + {}, now {now}); first: {:#?}",
                rows.len(),
                a.published(),
                b.published(),
                a.failed(),
                b.failed(),
                &rows[..rows.len().min(5)]
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.stop().await;
    b.stop().await;
    let seen = check_delivered(&broker.messages("orders"), &expected);
    assert_eq!(seen.len(), 400);
    assert!(seen.values().all(|n| *n == 1), "each row once");
    assert_eq!(a.published() + b.published(), 400);
    eprintln!("two relays: {} + {}", a.published(), b.published());
    drop_table(pool, &table).await;
}

async fn unroutable_row_is_retried_then_retired(pool: &SqlPool, conn: &Connection) {
    let (outbox, table) = outbox_on(pool).await;
    let missing = unique_table("no_such_queue");
    let ids = enqueue_orders(pool, &outbox, &missing, 1, 0).await;
    let id = ids.keys().next().unwrap().clone();
    let r = relay(conn, &outbox).max_attempts(3);
    r.start().unwrap();
    eventually("retired", DEADLINE, || async {
        outbox
            .record(&id)
            .await
            .unwrap()
            .unwrap()
            .retired_at_millis
            .is_some()
    })
    .await;
    r.stop().await;
    let rec = outbox
        .record(&id)
        .await
        .unwrap()
        .expect("kept, not deleted");
    assert_eq!(rec.attempts, 3);
    assert!(rec.published_at_millis.is_none());
    let err = rec.last_error.unwrap();
    assert!(err.contains("could not be routed"), "{err}");
    assert_eq!(r.failed(), 3);
    assert_eq!(r.retired(), 1);
    assert_eq!(outbox.pending_count().await.unwrap(), 0);
    assert_eq!(outbox.retired().await.unwrap().len(), 1);
    // never claimed again
    assert_eq!(r.drain_once().await.unwrap(), 0);
    drop_table(pool, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outbox_through_a_recording_broker() {
    for (name, pool) in support::databases().await {
        eprintln!("outbox on {name}");
        nine_hundred_of_a_thousand(&pool).await;
        stopped_mid_way_then_restarted_loses_none(&pool).await;
        killed_between_publish_and_mark_publishes_again(&pool).await;
        two_relays_publish_each_row_once(&pool).await;
        let broker = RecordingBroker::new();
        unroutable_row_is_retried_then_retired(&pool, &recording_connection(&broker)).await;
    }
}

/// The real transports: `memory://` always, RabbitMQ when `ACEMQ_TEST_AMQP_URL` is set (and
/// required when `ACEMQ_TEST_REQUIRE_BROKER=1`).
fn real_targets() -> Vec<String> {
    let mut urls = vec![format!("memory://{}", unique_table("outbox"))];
    match std::env::var("ACEMQ_TEST_AMQP_URL") {
        Ok(u) if !u.is_empty() => urls.push(u),
        _ => {
            if std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() == Ok("1") {
                panic!("ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_AMQP_URL is not set");
            }
            eprintln!("note: ACEMQ_TEST_AMQP_URL unset; the RabbitMQ outbox case did not run");
        }
    }
    urls
}

async fn drain_queue(t: &Arc<dyn Transport>, queue: &str) -> Vec<acemq::transport::Outbound> {
    let mut out = Vec::new();
    while let Some(d) = t.get(queue).await.unwrap() {
        d.acker.ack().await.unwrap();
        out.push(acemq::transport::Outbound::new(
            d.exchange.clone(),
            d.routing_key.clone(),
            acemq::transport::Properties::clone(&d.properties),
            d.body.clone(),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outbox_through_real_transports() {
    for url in real_targets() {
        for (name, pool) in support::databases().await {
            if name == "mysql" {
                continue; // PostgreSQL and SQLite cover the transports
            }
            eprintln!(
                "outbox on {name} through {}",
                url.split("://").next().unwrap_or("")
            );
            let conn = Connection::connect(&url).await.unwrap();
            let queue = unique_table("acemq_outbox_q");
            conn.transport()
                .declare_queue(&QueueDecl::classic(&queue))
                .await
                .unwrap();
            let (outbox, table) = outbox_on(&pool).await;
            let expected = enqueue_orders(&pool, &outbox, &queue, 1000, 10).await;
            // A relay stopped part-way (it finishes its batch), then a fresh one.
            let first = relay(&conn, &outbox).batch_size(10);
            first.start().unwrap();
            eventually("some published", DEADLINE, || async {
                first.published() >= 100
            })
            .await;
            first.stop().await;
            let after_stop = first.published();
            assert!(after_stop < 900, "stopped before the end");
            let on_queue = conn.transport().inspect_queue(&queue).await.unwrap();
            assert_eq!(
                u64::from(on_queue.message_count),
                after_stop,
                "stop() finished its batch"
            );
            let second = relay(&conn, &outbox);
            second.start().unwrap();
            eventually("900 published", DEADLINE, || async {
                outbox.pending_count().await.unwrap() == 0
            })
            .await;
            second.stop().await;
            let delivered = drain_queue(conn.transport(), &queue).await;
            let seen = check_delivered(&delivered, &expected);
            assert_eq!(seen.len(), 900);
            assert!(seen.values().all(|n| *n == 1));
            let _ = conn.transport().delete_queue(&queue).await;
            unroutable_row_is_retried_then_retired(&pool, &conn).await;
            drop_table(&pool, &table).await;
            tokio::time::timeout(Duration::from_secs(10), conn.close())
                .await
                .expect("the connection closes in time")
                .expect("the connection closes cleanly");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_refuses_a_second_start_and_table_names_are_checked() {
    let pool = support::sqlite().await;
    assert!(Outbox::with_table(pool.clone(), "x; drop table").is_err());
    let (outbox, _table) = outbox_on(&pool).await;
    let broker = RecordingBroker::new();
    let r = relay(&recording_connection(&broker), &outbox);
    r.start().unwrap();
    assert!(matches!(r.start(), Err(acemq_sql::Error::AlreadyRunning)));
    r.stop().await;
    r.start().unwrap();
    r.stop().await;
    let ddl = outbox.create_table_sql();
    assert!(ddl.contains("body BLOB NOT NULL"), "{ddl}");
}

/// One relay pass on PostgreSQL, with a recorder local to the test's single-threaded
/// runtime: `acemq.outbox.total` counts each published row and each failed publish with the
/// row's exchange, routing key and transport, and `acemq.outbox.lag` holds one value per
/// published row, its seconds from enqueue to publish.
#[test]
fn a_relay_pass_records_outbox_totals_and_lag() {
    use acemq::observe::metrics::{OUTBOX_LAG, OUTBOX_TOTAL};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (queue, missing) = (
        unique_table("outbox_metrics_q"),
        unique_table("no_such_queue"),
    );
    let ran = rt.block_on(async {
        let Some((_, pool)) = support::databases()
            .await
            .into_iter()
            .find(|(name, _)| *name == "postgres")
        else {
            eprintln!("note: ACEMQ_TEST_POSTGRES_URL unset; the outbox metrics case did not run");
            return false;
        };
        let conn = Connection::connect(&format!("memory://{}", unique_table("outbox_metrics")))
            .await
            .unwrap();
        conn.transport()
            .declare_queue(&QueueDecl::classic(&queue))
            .await
            .unwrap();
        let (outbox, table) = outbox_on(&pool).await;
        enqueue_orders(&pool, &outbox, &queue, 3, 0).await;
        enqueue_orders(&pool, &outbox, &missing, 1, 0).await;
        // Every row waits at least this long between its enqueue and its publish.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = relay(&conn, &outbox).max_attempts(3);
        assert_eq!(
            r.drain_once().await.unwrap(),
            4,
            "three published, one refused"
        );
        assert_eq!((r.published(), r.failed()), (3, 1));
        drop_table(&pool, &table).await;
        conn.close().await.unwrap();
        true
    });
    if !ran {
        return;
    }
    let rows = snap.snapshot().into_vec();
    let has = |k: &metrics_util::CompositeKey, labels: &[(&str, &str)]| {
        labels
            .iter()
            .all(|(lk, lv)| k.key().labels().any(|l| l.key() == *lk && l.value() == *lv))
    };
    let total = |routing_key: &str, outcome: &str| -> u64 {
        rows.iter()
            .filter(|(k, ..)| k.key().name() == OUTBOX_TOTAL)
            .filter(|(k, ..)| {
                has(
                    k,
                    &[
                        ("exchange", ""),
                        ("routing.key", routing_key),
                        ("transport", "memory"),
                        ("outcome", outcome),
                    ],
                )
            })
            .map(|(.., v)| match v {
                DebugValue::Counter(n) => *n,
                other => panic!("{OUTBOX_TOTAL} is a counter, got {other:?}"),
            })
            .sum()
    };
    assert_eq!(total(&queue, "published"), 3);
    assert_eq!(total(&queue, "failed"), 0);
    assert_eq!(total(&missing, "failed"), 1);
    assert_eq!(total(&missing, "published"), 0);
    let lags: Vec<f64> = rows
        .iter()
        .filter(|(k, ..)| k.key().name() == OUTBOX_LAG)
        .filter(|(k, ..)| {
            has(
                k,
                &[
                    ("exchange", ""),
                    ("routing.key", &queue),
                    ("transport", "memory"),
                ],
            )
        })
        .flat_map(|(.., v)| match v {
            DebugValue::Histogram(values) => values.iter().map(|x| x.0).collect::<Vec<_>>(),
            other => panic!("{OUTBOX_LAG} is a histogram, got {other:?}"),
        })
        .collect();
    assert_eq!(lags.len(), 3, "one lag per published row: {lags:?}");
    assert!(
        lags.iter().all(|s| (0.3..60.0).contains(s)),
        "seconds from enqueue to publish: {lags:?}"
    );
    assert!(
        !rows
            .iter()
            .any(|(k, ..)| k.key().name() == OUTBOX_LAG && has(k, &[("routing.key", &missing)])),
        "no lag for a row that was not published"
    );
}
