//! The idempotent consumer end to end on `memory://` and RabbitMQ with a PostgreSQL claim
//! store: two consumers on two connections run each id once; what a CLAIMED (expired or
//! live) or CONFIRMED row makes the consumer do; the outbox feeding an idempotent consumer
//! that absorbs a relay's republish; and a consumer process killed mid-handler whose claim
//! a second consumer takes over once its lease runs out (RabbitMQ and PostgreSQL only).

use crate::amqp_support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::idempotency::IdempotencyStore;
use acemq::intercept::{ConsumeContext, ConsumeInterceptor};
use acemq::publish::SendOptions;
use acemq_sql::outbox::{Outbox, OutboxRelay};
use acemq_sql::{IdempotencyOptions, SqlIdempotencyStore, SqlPool};
use amqp_support::{Broker, eventually, on_each_target, unique};

const WAIT: Duration = Duration::from_secs(30);

fn table(prefix: &str) -> String {
    unique(prefix)
        .replace(['.', '-'], "_")
        .replace("acemq_test_", "t_")
}

async fn postgres() -> Option<SqlPool> {
    let url = match std::env::var("ACEMQ_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            assert!(
                std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                "ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_POSTGRES_URL is not set"
            );
            eprintln!("note: ACEMQ_TEST_POSTGRES_URL unset; skipped");
            return None;
        }
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e}"));
    Some(pool.into())
}

async fn store(pool: &SqlPool, table: &str, owner: &str, claim: Duration) -> SqlIdempotencyStore {
    let s = SqlIdempotencyStore::with_options(
        pool.clone(),
        IdempotencyOptions::new()
            .table(table)
            .owner(owner)
            .claim_timeout(claim),
    )
    .unwrap();
    s.create_table_if_absent().await.unwrap();
    s
}

async fn drop_table(pool: &SqlPool, table: &str) {
    if let SqlPool::Postgres(p) = pool {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
            .execute(p)
            .await
            .unwrap();
    }
}

type Runs = Arc<Mutex<HashMap<String, usize>>>;

fn counting(
    runs: Runs,
) -> impl Fn(Message<u32>) -> std::future::Ready<Result<(), HandlerError>> + Send + Sync + 'static {
    move |m: Message<u32>| {
        *runs
            .lock()
            .unwrap()
            .entry(m.envelope().id().to_owned())
            .or_default() += 1;
        std::future::ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_on_two_connections_run_each_id_once() {
    let Some(pool) = postgres().await else { return };
    on_each_target(|target: Broker| {
        let pool = pool.clone();
        async move {
            let t = table("idem_two");
            let a = Connection::connect(&target.url()).await.unwrap();
            let b = Connection::connect(&target.url()).await.unwrap();
            let q = unique("idem-two");
            amqp_support::declare_classic(&a, &q).await;
            let runs: Runs = Arc::default();
            let mut consumers = Vec::new();
            for (mq, owner) in [(&a, "a"), (&b, "b")] {
                let options = ConsumerOptions::default()
                    .concurrency(4)
                    .idempotent(store(&pool, &t, owner, Duration::from_secs(60)).await)
                    .in_progress_delay(Duration::from_millis(20));
                consumers.push(
                    mq.consume(&q, options, counting(runs.clone()))
                        .await
                        .unwrap(),
                );
            }
            let publisher = a.publisher::<u32>("", &q);
            for chunk in (0..1000u32).collect::<Vec<_>>().chunks(100) {
                let sends = chunk.iter().flat_map(|n| {
                    let p = publisher.clone();
                    [0, 1].map(move |_| {
                        let p = p.clone();
                        async move {
                            p.send_with(n, SendOptions::new().message_id(format!("order-{n}")))
                                .await
                        }
                    })
                });
                for r in futures::future::join_all(sends).await {
                    r.unwrap();
                }
            }
            eventually(WAIT, "all 2,000 deliveries settled", || async {
                let settled: u64 = consumers
                    .iter()
                    .map(|c| c.stats().acked + c.stats().duplicates)
                    .sum();
                (settled == 2000).then_some(())
            })
            .await;
            let runs = runs.lock().unwrap().clone();
            assert_eq!(runs.len(), 1000);
            let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
            assert!(
                twice.is_empty(),
                "handler bodies ran more than once: {twice:?}"
            );
            let dup: u64 = consumers.iter().map(|c| c.stats().duplicates).sum();
            assert_eq!(dup, 1000, "every second copy was acked as a duplicate");
            for c in &consumers {
                c.close().await;
            }
            amqp_support::delete_queues(&a, &q, &[]).await;
            a.close().await.ok();
            b.close().await.ok();
            drop_table(&pool, &t).await;
        }
    })
    .await;
}

/// Records the attempt each delivery arrives with, read from its header.
struct Attempts(Arc<Mutex<Vec<(String, i32)>>>);

impl ConsumeInterceptor for Attempts {
    fn before_handle(&self, ctx: &ConsumeContext<'_>) -> Result<(), HandlerError> {
        self.0
            .lock()
            .unwrap()
            .push((ctx.envelope.id().to_owned(), ctx.envelope.attempt()));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimed_and_confirmed_rows_decide_what_the_consumer_does() {
    let Some(pool) = postgres().await else { return };
    on_each_target(|target: Broker| {
        let pool = pool.clone();
        async move {
            let t = table("idem_rows");
            let (mq, q) = amqp_support::connect_with_classic_queue(&target, "idem-rows").await;
            let seen = Arc::new(Mutex::new(Vec::new()));
            mq.intercept_consume(Attempts(seen.clone()));
            let runs: Runs = Arc::default();
            let options = ConsumerOptions::default()
                .idempotent(store(&pool, &t, "consumer", Duration::from_secs(60)).await)
                .in_progress_delay(Duration::from_millis(100));
            let consumer = mq
                .consume(&q, options, counting(runs.clone()))
                .await
                .unwrap();
            let publisher = mq.publisher::<u32>("", &q);
            let send = |id: &'static str| {
                let p = publisher.clone();
                async move {
                    p.send_with(&1, SendOptions::new().message_id(id))
                        .await
                        .unwrap()
                }
            };

            // A claim whose holder died: once its lease is over, it is taken over and handled.
            let dead_holder = store(&pool, &t, "dead-holder", Duration::from_millis(300)).await;
            assert!(dead_holder.claim("expired-1").await.unwrap());
            send("expired-1").await;
            eventually(WAIT, "the expired claim taken over", || async {
                (runs.lock().unwrap().get("expired-1") == Some(&1)).then_some(())
            })
            .await;

            // A live claim: the delivery comes back after the in-progress delay with the same
            // attempt, without running the handler, until the holder confirms.
            let holder = store(&pool, &t, "holder", Duration::from_secs(60)).await;
            assert!(holder.claim("live-1").await.unwrap());
            let before = consumer.stats().in_progress;
            send("live-1").await;
            eventually(WAIT, "three in-progress rounds", || async {
                (consumer.stats().in_progress >= before + 3).then_some(())
            })
            .await;
            assert_eq!(
                runs.lock().unwrap().get("live-1"),
                None,
                "the handler did not run"
            );
            holder.confirm("live-1").await.unwrap();
            eventually(WAIT, "acked as a duplicate", || async {
                (consumer.stats().duplicates == 1).then_some(())
            })
            .await;
            let live: Vec<i32> = seen
                .lock()
                .unwrap()
                .iter()
                .filter(|(id, _)| id == "live-1")
                .map(|(_, a)| *a)
                .collect();
            assert!(
                live.len() >= 3 && live.iter().all(|a| *a == 1),
                "attempt unchanged on the wire: {live:?}"
            );
            assert_eq!(runs.lock().unwrap().get("live-1"), None);

            // A confirmed row: acked without running the handler.
            let other = store(&pool, &t, "other", Duration::from_secs(60)).await;
            assert!(other.claim("done-1").await.unwrap());
            other.confirm("done-1").await.unwrap();
            send("done-1").await;
            eventually(WAIT, "acked as a duplicate", || async {
                (consumer.stats().duplicates == 2).then_some(())
            })
            .await;
            assert_eq!(runs.lock().unwrap().get("done-1"), None);
            let stats = consumer.stats();
            assert_eq!(
                (stats.dead_lettered, stats.retried),
                (0, 0),
                "waiting spends no attempt"
            );
            consumer.close().await;
            amqp_support::teardown(&mq, &q, &[]).await;
            drop_table(&pool, &t).await;
        }
    })
    .await;
}

/// A store that cannot answer is our outage, not the message's failure: the
/// message is never handled without a claim and never acked, and it spends no attempt and
/// is never dead-lettered for it; it waits, is put back, and health says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_a_retry_never_a_silent_accept() {
    on_each_target(|target: Broker| async move {
        // A store whose table does not exist fails every call.
        let pool = amqp_support_sqlite().await;
        let broken = SqlIdempotencyStore::with_options(
            pool,
            IdempotencyOptions::new().table("no_such_table"),
        )
        .unwrap();
        let (mq, q) = amqp_support::connect_with_classic_queue(&target, "idem-broken").await;
        let runs: Runs = Arc::default();
        let policy = acemq::retry::RetryPolicy::fixed(2, Duration::from_millis(10)).unwrap();
        let consumer = mq
            .consume(
                &q,
                ConsumerOptions::default().retry(policy).idempotent(broken),
                counting(runs.clone()),
            )
            .await
            .unwrap();
        mq.publisher::<u32>("", &q).send(&1).await.unwrap();
        // Three put-backs (250 + 500 + 1000 ms): a policy of two attempts would have
        // dead-lettered it at the second failure if the outage spent attempts.
        eventually(WAIT, "put back three times", || async {
            (consumer.stats().store_unavailable >= 3).then_some(())
        })
        .await;
        let report = mq
            .health()
            .report(acemq::idempotency::HEALTH_COMPONENT)
            .cloned()
            .unwrap();
        assert_eq!(report.status, acemq::health::HealthStatus::Degraded);
        let reason = report.detail("error").unwrap_or_default().to_owned();
        assert!(reason.contains("idempotency store"), "{reason}");
        assert!(
            runs.lock().unwrap().is_empty(),
            "never handled without a claim"
        );
        let stats = consumer.stats();
        assert_eq!(stats.acked, 0);
        assert_eq!((stats.dead_lettered, stats.retried), (0, 0));
        let dlq = mq
            .transport()
            .inspect_queue(&format!("{q}.dlq"))
            .await
            .unwrap();
        assert_eq!(dlq.message_count, 0, "never dead-lettered for our outage");
        consumer.close().await;
        amqp_support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

async fn amqp_support_sqlite() -> SqlPool {
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_feeds_an_idempotent_consumer_that_absorbs_a_relay_republish() {
    let Some(pool) = postgres().await else { return };
    on_each_target(|target: Broker| {
        let pool = pool.clone();
        async move {
            let (outbox_table, idem_table) = (table("outbox"), table("idem_outbox"));
            let (mq, q) = amqp_support::connect_with_classic_queue(&target, "outbox-orders").await;
            let outbox = Outbox::with_table(pool.clone(), &outbox_table).unwrap();
            outbox.create_table_if_absent().await.unwrap();
            let SqlPool::Postgres(pg) = &pool else {
                unreachable!()
            };
            for n in 0..200u32 {
                let mut tx = pg.begin().await.unwrap();
                outbox.enqueue(&mut tx, "", &q, &n).await.unwrap();
                if n % 10 == 0 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                }
            }
            let runs: Runs = Arc::default();
            let options = ConsumerOptions::default()
                .concurrency(4)
                .idempotent(store(&pool, &idem_table, "c", Duration::from_secs(60)).await)
                .in_progress_delay(Duration::from_millis(20));
            let consumer = mq
                .consume(&q, options, counting(runs.clone()))
                .await
                .unwrap();
            let relay = OutboxRelay::new(mq.clone(), outbox.clone());
            while relay.drain_once().await.unwrap() > 0 {}
            // A relay that died between publishing and marking: the rows are published again,
            // with the same ids.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {outbox_table} SET published_at = NULL"
            )))
            .execute(pg)
            .await
            .unwrap();
            while relay.drain_once().await.unwrap() > 0 {}
            eventually(WAIT, "360 deliveries settled", || async {
                let s = consumer.stats();
                (s.acked + s.duplicates == 360).then_some(())
            })
            .await;
            let runs = runs.lock().unwrap().clone();
            assert_eq!(runs.len(), 180, "the 20 rolled-back orders never left");
            assert!(runs.values().all(|n| *n == 1), "each order handled once");
            assert_eq!(consumer.stats().duplicates, 180);
            consumer.close().await;
            amqp_support::teardown(&mq, &q, &[]).await;
            drop_table(&pool, &outbox_table).await;
            drop_table(&pool, &idem_table).await;
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// A consumer process killed mid-handler (SIGKILL) leaves its claim behind; a second
// consumer takes the message over once the claim's lease runs out, and handles it: not
// lost. RabbitMQ and PostgreSQL only: the two consumers are two processes.
//
// The test binary runs itself as the child: with `ACEMQ_CHILD_QUEUE` set, the same test
// function (run alone with `--exact`) plays the consumer that dies.
// ---------------------------------------------------------------------------------------

/// Kills the child if the test fails before it does.
struct Reaper(u32);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.0.to_string()])
            .status();
    }
}

const KILLED_CLAIM: Duration = Duration::from_secs(2);
const KILLED_TEST: &str = "a_killed_consumer_leaves_a_claim_that_a_second_consumer_takes_over";

async fn pg_store(url: &str, table: &str, owner: &str) -> SqlIdempotencyStore {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap();
    let s = SqlIdempotencyStore::with_options(
        pool,
        IdempotencyOptions::new()
            .table(table)
            .owner(owner)
            .claim_timeout(KILLED_CLAIM),
    )
    .unwrap();
    s.create_table_if_absent().await.unwrap();
    s
}

/// Where the child says which message it claimed.
fn claimed_marker(queue: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{queue}.claimed"))
}

/// The consumer that dies: claims, says so, and never returns.
async fn dying_child(amqp: &str, pg: &str, queue: &str, table: &str) {
    let mq = Connection::connect(amqp).await.unwrap();
    let options = ConsumerOptions::default().idempotent(pg_store(pg, table, "child").await);
    let _consumer = mq
        .consume(queue, options, move |m: Message<u32>| async move {
            // Written aside, then renamed: the parent polls the marker, and a plain write
            // lets it read the file created but still empty.
            let marker = claimed_marker(m.queue());
            let aside = marker.with_extension("writing");
            std::fs::write(&aside, m.envelope().id()).unwrap();
            std::fs::rename(&aside, &marker).unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumer_leaves_a_claim_that_a_second_consumer_takes_over() {
    let (Some(amqp), Ok(pg)) = (
        amqp_support::amqp_url(),
        std::env::var("ACEMQ_TEST_POSTGRES_URL"),
    ) else {
        assert!(
            std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
            "ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_POSTGRES_URL is not set"
        );
        eprintln!("note: needs RabbitMQ and PostgreSQL; skipped");
        return;
    };
    if let (Ok(queue), Ok(table)) = (
        std::env::var("ACEMQ_CHILD_QUEUE"),
        std::env::var("ACEMQ_CHILD_TABLE"),
    ) {
        return dying_child(&amqp, &pg, &queue, &table).await;
    }
    let queue = amqp_support::unique("killed");
    let table = format!("t_killed_{}", std::process::id());
    let mq = Connection::connect(&amqp).await.unwrap();
    amqp_support::declare_classic(&mq, &queue).await;
    let parent_store = pg_store(&pg, &table, "parent").await;

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &amqp_support::this_test(module_path!(), KILLED_TEST),
            "--test-threads",
            "1",
        ])
        .env("ACEMQ_CHILD_QUEUE", &queue)
        .env("ACEMQ_CHILD_TABLE", &table)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _reaper = Reaper(child.id());
    mq.publisher::<u32>("", &queue)
        .send_with(&42, SendOptions::new().message_id("order-42"))
        .await
        .unwrap();
    let marker = claimed_marker(&queue);
    let claimed =
        amqp_support::eventually(Duration::from_secs(30), "the child to claim", || async {
            std::fs::read_to_string(&marker).ok()
        })
        .await;
    assert_eq!(claimed, "order-42");
    let _ = std::fs::remove_file(&marker);
    let claimed_at = Instant::now();
    child.kill().unwrap(); // SIGKILL: nothing runs, nothing is released
    child.wait().unwrap();

    let handled = Arc::new(Mutex::new(Vec::new()));
    let h = handled.clone();
    let options = ConsumerOptions::default()
        .idempotent(parent_store)
        .in_progress_delay(Duration::from_millis(200));
    let consumer = mq
        .consume(&queue, options, move |m: Message<u32>| {
            let h = h.clone();
            async move {
                h.lock()
                    .unwrap()
                    .push((m.envelope().id().to_owned(), Instant::now()));
                Ok(())
            }
        })
        .await
        .unwrap();
    amqp_support::eventually(
        Duration::from_secs(30),
        "the message taken over and handled",
        || async { (consumer.stats().acked == 1).then_some(()) },
    )
    .await;
    let handled = handled.lock().unwrap().clone();
    assert_eq!(handled.len(), 1);
    assert_eq!(handled[0].0, "order-42");
    assert!(
        handled[0].1.duration_since(claimed_at) >= KILLED_CLAIM - Duration::from_millis(300),
        "taken over only once the dead consumer's lease ran out"
    );
    assert!(
        consumer.stats().in_progress >= 1,
        "the live claim was respected first"
    );
    consumer.close().await;
    amqp_support::teardown(&mq, &queue, &[]).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&pg)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(&pool)
        .await
        .unwrap();
}
