//! A process running durable sagas is **killed** (SIGKILL, between and inside steps) on
//! PostgreSQL; after the restart (this process, another owner) recovery drives every saga
//! the dead one left to an end, and every saga is completed or compensated, never
//! half-applied: the outbox holds exactly the rows of its outcome, each once. Then the
//! relay publishes them to RabbitMQ, and the queue holds exactly that set.
//!
//! The child is this test binary running this test with `ACEMQ_SAGA_KILL_*` set: four
//! workers start sagas one after the other (a quarter fail at the hotel, a quarter at the
//! car), each step paced so the kill finds steps in hand.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq_sql::SqlPool;
use acemq_sql::outbox::OutboxRelay;

use super::saga::{Hooks, STEPS, Trip, ids, tables, trip};
use crate::amqp_support;
use crate::support::{databases, drop_table, eventually, outbox_ids};

const WAIT: Duration = Duration::from_secs(60);
const LEASE: Duration = Duration::from_secs(2);
const WORKERS: usize = 4;
/// Outbox rows the child must have committed before it is killed.
const ROWS_BEFORE_KILL: usize = 60;

fn fail_at(n: usize) -> Option<usize> {
    match n % 4 {
        0 => Some(1),
        1 => Some(2),
        _ => None,
    }
}

/// The child's side: run sagas until killed. Each worker has its own pace (13, 22, 31, 40
/// ms a step), so the workers drift apart and the kill finds them at different points of
/// their steps: before a write, inside a step's transaction, between two steps.
async fn child(pool: sqlx::PgPool, outbox_table: String, saga_table: String, route: String) {
    let outbox = acemq_sql::outbox::Outbox::with_table(pool.clone(), &outbox_table).unwrap();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let hooks = Arc::new(Hooks::default());
            *hooks.pace.lock().unwrap() = Duration::from_millis(13 + 9 * w as u64);
            let saga = trip(pool.clone(), &outbox, &saga_table, LEASE, &hooks);
            let route = route.clone();
            tokio::spawn(async move {
                for n in 0.. {
                    let t = Trip {
                        key: format!("w{w}-{n}"),
                        fail_at: fail_at(n),
                        route: route.clone(),
                    };
                    saga.run(t).await.expect("a saga run");
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_saga_killed_between_steps_is_compensated_or_completed_after_restart() {
    let pg = databases().await.into_iter().find_map(|(_, p)| match p {
        SqlPool::Postgres(p) => Some(p),
        _ => None,
    });
    if let (Ok(ot), Ok(st), Ok(route)) = (
        std::env::var("ACEMQ_SAGA_KILL_OUTBOX"),
        std::env::var("ACEMQ_SAGA_KILL_SAGAS"),
        std::env::var("ACEMQ_SAGA_KILL_ROUTE"),
    ) {
        child(pg.expect("the child's PostgreSQL"), ot, st, route).await;
        return;
    }
    let Some(url) = amqp_support::amqp_url() else {
        // amqp_url() already panics when a broker is required; said here too.
        assert!(
            !amqp_support::broker_required(),
            "ACEMQ_TEST_REQUIRE_BROKER=1: the saga kill drill needs RabbitMQ"
        );
        return;
    };
    let Some(pool) = pg else {
        assert!(
            !amqp_support::broker_required(),
            "ACEMQ_TEST_REQUIRE_BROKER=1: the saga kill drill needs PostgreSQL"
        );
        return;
    };
    let (outbox, ot, st) = tables(&pool).await;
    let sql: SqlPool = pool.clone().into();
    let mq = Connection::connect(&url).await.unwrap();
    let route = amqp_support::unique("saga-kill");
    amqp_support::declare_classic(&mq, &route).await;

    let mut child = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args([
            "--exact",
            &amqp_support::this_test(
                module_path!(),
                "a_durable_saga_killed_between_steps_is_compensated_or_completed_after_restart",
            ),
            "--nocapture",
        ])
        .env("ACEMQ_SAGA_KILL_OUTBOX", &ot)
        .env("ACEMQ_SAGA_KILL_SAGAS", &st)
        .env("ACEMQ_SAGA_KILL_ROUTE", &route)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the saga process");
    eventually("the child to commit its rows", WAIT, || async {
        outbox_ids(&sql, &ot).await.len() >= ROWS_BEFORE_KILL
    })
    .await;
    child.kill().expect("SIGKILL the saga process");
    let _ = child.wait();
    let killed = Instant::now();

    let live = |states: &[(String, String, String)]| {
        states
            .iter()
            .filter(|(_, _, s)| s == "running" || s == "compensating")
            .count()
    };
    let left = live(&saga_rows(&pool, &st).await);
    assert!(
        left >= 1,
        "the kill left sagas in flight to recover ({left})"
    );

    // The restart: the same definition in this process, another owner.
    let hooks = Arc::new(Hooks::default());
    let saga = trip(pool.clone(), &outbox, &st, LEASE, &hooks);
    let mut resumed = Vec::new();
    loop {
        resumed.extend(saga.recover().await.unwrap());
        if live(&saga_rows(&pool, &st).await) == 0 {
            break;
        }
        assert!(
            killed.elapsed() < WAIT,
            "recovery did not finish every saga"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        resumed.len(),
        left,
        "recovery resumed each saga left in flight once"
    );
    eprintln!(
        "saga kill: {left} sagas in flight at the kill, all resumed {:?} after it",
        killed.elapsed()
    );

    // Every saga is at an end, and the outbox holds exactly what its end says.
    let rows = saga_rows(&pool, &st).await;
    let mut expected = Vec::new();
    let (mut completed, mut compensated) = (0, 0);
    for (id, subject, state) in &rows {
        let t: Trip = serde_json::from_str(subject).unwrap();
        match (state.as_str(), t.fail_at) {
            ("completed", None) => {
                completed += 1;
                expected.extend(ids(&t.key, &STEPS));
            }
            ("compensated", Some(at)) => {
                compensated += 1;
                for step in &STEPS[..at] {
                    expected.push(format!("{}:{step}", t.key));
                    expected.push(format!("{}:{step}:undo", t.key));
                }
            }
            other => panic!("saga {id} ({}) ended {other:?}", t.key),
        }
    }
    expected.sort();
    let stored = outbox_ids(&sql, &ot).await;
    assert_eq!(
        stored.len(),
        stored.iter().collect::<BTreeSet<_>>().len(),
        "no row twice"
    );
    assert_eq!(
        stored, expected,
        "the outbox holds exactly the rows of each saga's end"
    );
    assert!(
        completed > 0 && compensated > 0,
        "{completed} completed, {compensated} compensated"
    );
    assert_eq!(
        saga.status(&rows[0].0)
            .await
            .unwrap()
            .map(|s| s.state().is_final()),
        Some(true)
    );

    // The relay publishes them; the queue holds exactly that set.
    let relay = OutboxRelay::new(mq.clone(), outbox.clone());
    while relay.drain_once().await.unwrap() > 0 {}
    let t = mq.transport().clone();
    let mut on_queue = Vec::new();
    for _ in 0..expected.len() {
        let d = amqp_support::take_one(&*t, &route, Duration::from_secs(10)).await;
        on_queue.push(d.properties.message_id.clone().unwrap_or_default());
    }
    on_queue.sort();
    assert_eq!(on_queue, expected, "RabbitMQ got each row once");
    eventually(
        "nothing more on the queue",
        Duration::from_secs(5),
        || async {
            t.inspect_queue(&route)
                .await
                .is_ok_and(|q| q.message_count == 0)
        },
    )
    .await;
    eprintln!(
        "saga kill: {completed} completed, {compensated} compensated, {} rows published",
        expected.len()
    );
    amqp_support::delete_queues(&mq, &route, &[]).await;
    drop_table(&sql, &ot).await;
    drop_table(&sql, &st).await;
}

/// `(id, subject, state)` of every saga in `table`.
async fn saga_rows(pool: &sqlx::PgPool, table: &str) -> Vec<(String, String, String)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, subject, state FROM {table} ORDER BY created_at, id"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}
