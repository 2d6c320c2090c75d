//! A consumer process killed mid-handler (SIGKILL) leaves its claim behind; a second
//! consumer takes the message over once the claim's lease runs out, and handles it: not
//! lost (issue 4). RabbitMQ and PostgreSQL only: the two consumers are two processes.
//!
//! The test binary runs itself as the child: with `ACEMQ_CHILD_QUEUE` set, the same test
//! function plays the consumer that dies.

#[path = "../../acemq/tests/support/mod.rs"]
mod amqp_support;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};
use acemq::publish::SendOptions;
use acemq_sql::{IdempotencyOptions, SqlIdempotencyStore};

/// Kills the child if the test fails before it does.
struct Reaper(u32);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.0.to_string()])
            .status();
    }
}

const CLAIM: Duration = Duration::from_secs(2);
const TEST: &str = "a_killed_consumer_leaves_a_claim_that_a_second_consumer_takes_over";

async fn store(url: &str, table: &str, owner: &str) -> SqlIdempotencyStore {
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
            .claim_timeout(CLAIM),
    )
    .unwrap();
    s.create_table_if_absent().await.unwrap();
    s
}

/// Where the child says which message it claimed.
fn marker(queue: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{queue}.claimed"))
}

/// The consumer that dies: claims, says so, and never returns.
async fn child(amqp: &str, pg: &str, queue: &str, table: &str) {
    let mq = Connection::connect(amqp).await.unwrap();
    let options = ConsumerOptions::default().idempotent(store(pg, table, "child").await);
    let _consumer = mq
        .consume(queue, options, move |m: Message<u32>| async move {
            std::fs::write(marker(m.queue()), m.envelope().id()).unwrap();
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
        return child(&amqp, &pg, &queue, &table).await;
    }
    let queue = amqp_support::unique("killed");
    let table = format!("t_killed_{}", std::process::id());
    let mq = Connection::connect(&amqp).await.unwrap();
    amqp_support::declare_classic(&mq, &queue).await;
    let parent_store = store(&pg, &table, "parent").await;

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--test-threads", "1"])
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
    let marker = marker(&queue);
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
        handled[0].1.duration_since(claimed_at) >= CLAIM - Duration::from_millis(300),
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
