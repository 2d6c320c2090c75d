//! Recovery drill: the outbox relay across a broker restart, on PostgreSQL.
//!
//! Rows are committed to the outbox all along (before, during and after the outage); the
//! relay publishes them on one AceMQ connection while the broker's application is stopped
//! and started again. At the end: every committed row was published, none was retired
//! (broker unavailability must not spend a row's attempts; `max_attempts` is set low, 3, so
//! it would show), every committed id is on the queue (lost = 0), duplicates stay within
//! the relay's failed attempts (each may have been stored before the connection went), and
//! the relay published again within 30 s of the broker being back, with nothing restarted.
//!
//! `#[ignore]`d: it stops the broker, so `scripts/test.sh`'s drill step runs it on its own:
//! `cargo test -p acemq-sql --all-features --test drills -- --ignored --test-threads=1`.
//! The broker is `ACEMQ_DRILL_AMQP_URL` (else `ACEMQ_TEST_AMQP_URL`), its node
//! `ACEMQ_DRILL_NODE` (else rabbitmqctl's default); the database `ACEMQ_TEST_POSTGRES_URL`.
//! The harness files are shared with `crates/acemq/tests/drills/`.

mod support;

#[path = "../../acemq/tests/drills/broker.rs"]
mod broker;
#[path = "../../acemq/tests/drills/connect.rs"]
mod connect;
#[path = "../../acemq/tests/drills/ledger.rs"]
mod ledger;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use acemq::publish::SendOptions;
use acemq::topology::{QueueDecl, Topology};
use acemq::transport::Transport;
use acemq::transport::amqp::{AmqpOptions, AmqpTransport};
use acemq_sql::SqlPool;
use acemq_sql::outbox::{Outbox, OutboxRelay};
use broker::{AppStopped, DrillTarget, delete_queue_cli};
use connect::{connect_named, drill_name};
use ledger::Ledger;
use support::{drop_table, unique_table};
use tokio_stop::Stop;

/// How long the broker stays stopped.
const OUTAGE: Duration = Duration::from_secs(8);
/// How long after the broker is back the relay must publish again.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);
/// How long the end may take (the backlog published, the queue drained).
const FINISH_BOUND: Duration = Duration::from_secs(60);

/// A stop flag for the enqueue loop (tokio-util is not a dependency here).
mod tokio_stop {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Clone, Default)]
    pub struct Stop(Arc<AtomicBool>);

    impl Stop {
        pub fn stop(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
        pub fn stopped(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }
}

/// The drill's queue and outbox table, deleted (through `rabbitmqctl`, and a connection of
/// its own on a thread of its own) if the drill panics.
struct Cleanup {
    node: Option<String>,
    queue: String,
    pg_url: String,
    table: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        delete_queue_cli(self.node.as_deref(), &self.queue);
        let (url, table) = (self.pg_url.clone(), self.table.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let pool = sqlx::postgres::PgPool::connect(&url).await.ok()?;
                let sql = sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}"));
                sqlx::query(sql).execute(&pool).await.ok()
            })
        })
        .join();
    }
}

/// Commits one row per transaction, with payload `{"id": n}` and message id `{label}-{n}`,
/// every `pace`, until stopped; books each committed id as sent.
async fn enqueue_loop(
    pool: sqlx::PgPool,
    outbox: Outbox,
    queue: String,
    label: String,
    ledger: Arc<Ledger>,
    committed: Arc<AtomicU64>,
    stop: Stop,
) {
    for id in 0u64.. {
        if stop.stopped() {
            return;
        }
        let mut tx = pool.begin().await.expect("begin");
        outbox
            .enqueue_with(
                &mut tx,
                "",
                &queue,
                &serde_json::json!({ "id": id }),
                SendOptions::new().message_id(format!("{label}-{id}")),
            )
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        ledger.attempt(id);
        committed.store(id + 1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_outbox_relay_across_a_broker_restart() {
    let Some(target) = DrillTarget::from_env() else {
        return;
    };
    let pg_url = match std::env::var("ACEMQ_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            assert!(
                std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                "ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_POSTGRES_URL is not set"
            );
            eprintln!("note: ACEMQ_TEST_POSTGRES_URL unset; outbox drill skipped");
            return;
        }
    };
    let pg = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&pg_url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {pg_url}: {e}"));
    let pool: SqlPool = pg.clone().into();
    let label = "outbox-restart";
    let name = drill_name(label);
    let mq = connect_named(&target.url, &name).await.unwrap();
    let queue = unique_table("acemq_drill_outbox");
    let table = unique_table("acemq_drill_outbox");
    let _cleanup = Cleanup {
        node: target.node.clone(),
        queue: queue.clone(),
        pg_url: pg_url.clone(),
        table: table.clone(),
    };
    mq.declare(
        &Topology::define()
            .queue_decl(QueueDecl::quorum(&queue))
            .build()
            .unwrap(),
    )
    .await
    .expect("declare the drill's queue");
    let outbox = Outbox::with_table(pool.clone(), &table).unwrap();
    outbox.create_table_if_absent().await.unwrap();

    let ledger = Arc::new(Ledger::default());
    let committed = Arc::new(AtomicU64::new(0));
    let stop = Stop::default();
    let enqueuer = tokio::spawn(enqueue_loop(
        pg.clone(),
        outbox.clone(),
        queue.clone(),
        label.to_owned(),
        ledger.clone(),
        committed.clone(),
        stop.clone(),
    ));
    let relay = OutboxRelay::new(mq.clone(), outbox.clone())
        .batch_size(20)
        .poll_interval(Duration::from_millis(50))
        .retry_delay(Duration::from_millis(200))
        .max_attempts(3);
    relay.start().unwrap();
    support::eventually("the relay publishing", RECOVERY_BOUND, || async {
        relay.published() >= 200
    })
    .await;

    // The outage: rows keep being committed.
    let node = target.node.clone();
    let stopped = tokio::task::spawn_blocking(move || AppStopped::stop(node.as_deref()))
        .await
        .unwrap()
        .expect("rabbitmqctl stop_app");
    tokio::time::sleep(OUTAGE).await;
    let took = stopped.start_async().await.expect("rabbitmqctl start_app");
    eprintln!("drill {label}: start_app took {took:?}");
    let t0 = Instant::now();
    let at_t0 = relay.published();
    support::eventually(
        "the relay to publish again after the broker is back",
        RECOVERY_BOUND,
        || async { relay.published() > at_t0 },
    )
    .await;
    let recovered_in = t0.elapsed();
    eprintln!(
        "drill {label}: relay published again {}ms after the broker was back",
        recovered_in.as_millis()
    );
    // A little more traffic after recovery, then the backlog must clear.
    let more = committed.load(Ordering::SeqCst) + 100;
    support::eventually("more rows committed", RECOVERY_BOUND, || async {
        committed.load(Ordering::SeqCst) >= more
    })
    .await;
    stop.stop();
    enqueuer.await.unwrap();
    support::eventually("every committed row published", FINISH_BOUND, || async {
        outbox.pending_count().await.unwrap() == 0
    })
    .await;
    relay.stop().await;

    // Books: a row marked published is a broker confirm.
    let total = committed.load(Ordering::SeqCst);
    let mut unpublished = Vec::new();
    for id in 0..total {
        let rec = outbox
            .record(&format!("{label}-{id}"))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("committed row {id} is missing"));
        if rec.published_at_millis.is_some() {
            ledger.confirmed(id);
        } else {
            unpublished.push((id, rec.attempts, rec.last_error));
        }
    }
    // The consumer side: drain the queue through a connection of its own.
    let raw = AmqpTransport::connect_with(
        &target.url,
        AmqpOptions::default().connection_name(format!("{name}-operator")),
    )
    .await
    .expect("connect");
    let end = Instant::now() + FINISH_BOUND;
    while !ledger.unhandled_confirmed().is_empty() && Instant::now() < end {
        match raw.get(&queue).await.expect("basic.get") {
            Some(d) => {
                let v: serde_json::Value = serde_json::from_slice(&d.body).expect("json body");
                ledger.handled(v["id"].as_u64().expect("an id"));
                d.acker.ack().await.expect("ack");
            }
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    // Anything else still there is a duplicate; count it too.
    while let Some(d) = raw.get(&queue).await.expect("basic.get") {
        let v: serde_json::Value = serde_json::from_slice(&d.body).expect("json body");
        ledger.handled(v["id"].as_u64().expect("an id"));
        d.acker.ack().await.expect("ack");
    }
    let c = ledger.counts();
    println!("{}", c.line(label, Some(recovered_in)));
    let retired = outbox.retired().await.unwrap();
    // Every distinct last error among the retired rows, with how many rows it retired.
    let mut why: Vec<(String, usize)> = Vec::new();
    for r in &retired {
        let e = r.last_error.clone().unwrap_or_default();
        match why.iter_mut().find(|(w, _)| *w == e) {
            Some((_, n)) => *n += 1,
            None => why.push((e, 1)),
        }
    }
    assert!(
        retired.is_empty() && relay.retired() == 0,
        "drill {label}: {} rows retired, e.g. {:?}; their last errors: {why:?}",
        retired.len(),
        retired.first().map(|r| (&r.id, r.attempts, &r.last_error))
    );
    assert!(
        unpublished.is_empty(),
        "drill {label}: committed rows not published: {:?}…",
        &unpublished[..unpublished.len().min(5)]
    );
    assert_eq!(c.confirmed, total, "every committed row published");
    assert_eq!(
        c.lost,
        0,
        "drill {label}: published rows not on the queue: {:?}…",
        &ledger.unhandled_confirmed()[..c.lost.min(10) as usize]
    );
    assert_eq!(c.phantom, 0);
    assert!(
        c.duplicates <= relay.failed(),
        "drill {label}: {} duplicates, above the relay's {} failed (in-doubt) attempts",
        c.duplicates,
        relay.failed()
    );
    let _ = raw.delete_queue(&queue).await;
    raw.close().await.ok();
    drop_table(&pool, &table).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), mq.close()).await;
}
