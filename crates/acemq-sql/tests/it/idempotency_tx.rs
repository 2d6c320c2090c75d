//! Confirming a claim in the handler's own transaction (`confirm_in`), on every database:
//! directly against the store, and end to end through an idempotent consumer on
//! `memory://` and RabbitMQ (commit: a duplicate is acked unrun; rollback: the message is
//! retried and the rolled-back business row does not exist). And the background purge task.

use crate::support;

use crate::amqp_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::idempotency::{ClaimOutcome, IdempotencyStore};
use acemq::publish::SendOptions;
use acemq::retry::RetryPolicy;
use acemq_sql::{IdempotencyOptions, SqlIdempotencyStore, SqlPool};
use amqp_support::{Broker, on_each_target};
use support::{drop_table, eventually, unique_table};

const WAIT: Duration = Duration::from_secs(30);

async fn store(pool: &SqlPool, table: &str, owner: &str, lease: Duration) -> SqlIdempotencyStore {
    let s = SqlIdempotencyStore::with_options(
        pool.clone(),
        IdempotencyOptions::new()
            .table(table)
            .owner(owner)
            .claim_timeout(lease),
    )
    .unwrap();
    s.create_table_if_absent().await.unwrap();
    s
}

async fn exec(pool: &SqlPool, sql: String) {
    let sql = sqlx::AssertSqlSafe(sql);
    let r = match pool {
        SqlPool::Postgres(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
        SqlPool::MySql(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
        SqlPool::Sqlite(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
        _ => Ok(()),
    };
    r.unwrap();
}

async fn count(pool: &SqlPool, sql: String) -> i64 {
    let sql = sqlx::AssertSqlSafe(sql);
    match pool {
        SqlPool::Postgres(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        SqlPool::MySql(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        SqlPool::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        _ => unreachable!(),
    }
}

/// The business table: one row per handled order.
async fn orders_table(pool: &SqlPool) -> String {
    let t = unique_table("orders");
    exec(
        pool,
        format!("CREATE TABLE {t} (id VARCHAR(255) NOT NULL PRIMARY KEY)"),
    )
    .await;
    t
}

async fn orders(pool: &SqlPool, orders: &str, id: &str) -> i64 {
    count(
        pool,
        format!("SELECT COUNT(*) FROM {orders} WHERE id = '{id}'"),
    )
    .await
}

/// A handler's unit of work: insert the order and confirm the claim in one transaction,
/// then commit or roll back.
async fn write_order(
    pool: &SqlPool,
    orders: &str,
    store: &SqlIdempotencyStore,
    id: &str,
    commit: bool,
) -> Result<(), acemq_sql::Error> {
    let insert = format!(
        "INSERT INTO {orders} (id) VALUES ({})",
        pool.dialect().placeholder(1)
    );
    macro_rules! unit {
        ($p:expr) => {{
            let mut tx = $p.begin().await?;
            sqlx::query(sqlx::AssertSqlSafe(insert))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            store.confirm_in(&mut tx, id).await?;
            if commit {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
        }};
    }
    match pool {
        SqlPool::Postgres(p) => unit!(p),
        SqlPool::MySql(p) => unit!(p),
        SqlPool::Sqlite(p) => unit!(p),
        _ => unreachable!(),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_confirm_commits_and_rolls_back_with_the_business_write() {
    for (name, pool) in support::databases().await {
        let t = unique_table("acemq_idem_tx");
        let mine = store(&pool, &t, "mine", Duration::from_secs(60)).await;
        let other = store(&pool, &t, "other", Duration::from_secs(60)).await;
        let orders_t = orders_table(&pool).await;
        let k = format!("order-{}", uuid::Uuid::new_v4());

        assert_eq!(mine.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
        write_order(&pool, &orders_t, &mine, &k, false)
            .await
            .unwrap();
        assert_eq!(orders(&pool, &orders_t, &k).await, 0, "{name}: rolled back");
        assert_eq!(
            other.try_claim(&k).await.unwrap(),
            ClaimOutcome::InProgress,
            "{name}: the claim is as it was, unconfirmed"
        );
        mine.release(&k).await.unwrap();
        assert_eq!(mine.try_claim(&k).await.unwrap(), ClaimOutcome::Claimed);
        write_order(&pool, &orders_t, &mine, &k, true)
            .await
            .unwrap();
        assert_eq!(orders(&pool, &orders_t, &k).await, 1, "{name}: committed");
        assert_eq!(
            other.try_claim(&k).await.unwrap(),
            ClaimOutcome::Duplicate,
            "{name}: confirmed with the write"
        );
        // The consumer's own confirm afterwards is harmless; a release leaves it confirmed.
        mine.confirm(&k).await.unwrap();
        mine.release(&k).await.unwrap();
        assert_eq!(other.try_claim(&k).await.unwrap(), ClaimOutcome::Duplicate);

        // A claim taken over after its lease: confirm_in refuses, the write rolls back.
        let slow = store(&pool, &t, "slow", Duration::from_millis(200)).await;
        let k2 = format!("order-{}", uuid::Uuid::new_v4());
        assert!(slow.claim(&k2).await.unwrap());
        eventually("the lease runs out and other takes over", WAIT, || async {
            other.try_claim(&k2).await.unwrap() == ClaimOutcome::Claimed
        })
        .await;
        let e = write_order(&pool, &orders_t, &slow, &k2, true)
            .await
            .unwrap_err();
        assert!(
            matches!(e, acemq_sql::Error::ClaimLost { .. }),
            "{name}: {e}"
        );
        assert_eq!(orders(&pool, &orders_t, &k2).await, 0, "{name}");
        assert_eq!(
            slow.try_claim(&k2).await.unwrap(),
            ClaimOutcome::InProgress,
            "{name}: still other's claim"
        );
        drop_table(&pool, &t).await;
        drop_table(&pool, &orders_t).await;
    }
}

type Runs = Arc<Mutex<HashMap<String, usize>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_consumer_whose_handler_confirms_in_its_transaction() {
    on_each_target(|target: Broker| async move {
        for (name, pool) in support::databases().await {
            let t = unique_table("acemq_idem_txc");
            let st = Arc::new(store(&pool, &t, "consumer", Duration::from_secs(60)).await);
            let orders_t = orders_table(&pool).await;
            let (mq, q) = amqp_support::connect_with_classic_queue(&target, "idem-tx").await;
            let rung = Duration::from_millis(10);
            let runs: Runs = Arc::default();
            // The orders each run found already written for its id, before writing.
            let found: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
            let handler = {
                let (pool, st, orders_t, runs, found) = (
                    pool.clone(),
                    st.clone(),
                    orders_t.clone(),
                    runs.clone(),
                    found.clone(),
                );
                move |m: Message<u32>| {
                    let (pool, st, orders_t, runs, found) = (
                        pool.clone(),
                        st.clone(),
                        orders_t.clone(),
                        runs.clone(),
                        found.clone(),
                    );
                    async move {
                        let id = m.envelope().id().to_owned();
                        let run = {
                            let mut r = runs.lock().unwrap();
                            let n = r.entry(id.clone()).or_default();
                            *n += 1;
                            *n
                        };
                        let before = orders(&pool, &orders_t, &id).await;
                        found.lock().unwrap().push((id.clone(), before));
                        // rollback-*: the first run's transaction rolls back.
                        // commitfail-*: commits, then the handler fails anyway.
                        let commit = !(id.starts_with("rollback") && run == 1);
                        write_order(&pool, &orders_t, &st, &id, commit)
                            .await
                            .map_err(HandlerError::retry)?;
                        if !commit || id.starts_with("commitfail") {
                            return Err(HandlerError::retry("failed after the transaction"));
                        }
                        Ok(())
                    }
                }
            };
            let options = ConsumerOptions::default()
                .retry(RetryPolicy::fixed(3, rung).unwrap())
                .idempotent(st.clone());
            let consumer = mq.consume(&q, options, handler).await.unwrap();
            let publisher = mq.publisher::<u32>("", &q);
            let send = |id: &'static str| {
                let p = publisher.clone();
                async move {
                    p.send_with(&1, SendOptions::new().message_id(id))
                        .await
                        .unwrap()
                }
            };
            let runs_of = |id: &str| runs.lock().unwrap().get(id).copied().unwrap_or(0);

            // Committed: handled once; the same id again is acked without running.
            send("commit-1").await;
            amqp_support::eventually(WAIT, "commit-1 handled", || async {
                (consumer.stats().acked >= 1).then_some(())
            })
            .await;
            send("commit-1").await;
            amqp_support::eventually(WAIT, "commit-1 acked as a duplicate", || async {
                (consumer.stats().duplicates == 1).then_some(())
            })
            .await;
            assert_eq!(runs_of("commit-1"), 1, "{name}: the duplicate did not run");
            assert_eq!(orders(&pool, &orders_t, "commit-1").await, 1);

            // Rolled back: retried; the retry finds no order; it commits the second time.
            send("rollback-1").await;
            amqp_support::eventually(WAIT, "rollback-1 handled on its retry", || async {
                (runs_of("rollback-1") == 2 && consumer.stats().acked >= 2).then_some(())
            })
            .await;
            let seen: Vec<i64> = found
                .lock()
                .unwrap()
                .iter()
                .filter(|(id, _)| id == "rollback-1")
                .map(|(_, n)| *n)
                .collect();
            assert_eq!(seen, [0, 0], "{name}: the rolled-back order never existed");
            assert_eq!(orders(&pool, &orders_t, "rollback-1").await, 1);
            assert!(consumer.stats().retried >= 1, "{name}: it was retried");

            // Committed, then the handler failed: the retry is a duplicate, not a rerun.
            send("commitfail-1").await;
            amqp_support::eventually(
                WAIT,
                "commitfail-1's retry acked as a duplicate",
                || async { (consumer.stats().duplicates == 2).then_some(()) },
            )
            .await;
            assert_eq!(runs_of("commitfail-1"), 1, "{name}: the work ran once");
            assert_eq!(orders(&pool, &orders_t, "commitfail-1").await, 1);
            let stats = consumer.stats();
            assert_eq!(stats.dead_lettered, 0, "{name}: {stats:?}");

            consumer.close().await;
            amqp_support::teardown(&mq, &q, &[rung]).await;
            drop_table(&pool, &t).await;
            drop_table(&pool, &orders_t).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_task_purges_every_interval_and_stops() {
    for (name, pool) in support::databases().await {
        let t = unique_table("acemq_idem_purge");
        let lease = Duration::from_millis(100);
        let st = Arc::new(store(&pool, &t, "purged", lease).await);
        let rows = || count(&pool, format!("SELECT COUNT(*) FROM {t}"));

        assert!(st.spawn_purge(Duration::ZERO).is_err(), "{name}");
        let task = st.spawn_purge(Duration::from_millis(50)).unwrap();
        for i in 0..5 {
            assert!(st.claim(&format!("abandoned-{i}")).await.unwrap());
        }
        let kept = format!("done-{}", uuid::Uuid::new_v4());
        st.confirm(&kept).await.unwrap();
        eventually("the abandoned claims are purged", WAIT, || async {
            rows().await == 1
        })
        .await;
        assert!(task.purged() >= 5, "{name}");
        assert_eq!(st.try_claim(&kept).await.unwrap(), ClaimOutcome::Duplicate);

        // Stopped: it ends, and purges no more.
        task.stop().await;
        assert!(st.claim("after-stop").await.unwrap());
        tokio::time::sleep(lease + Duration::from_millis(300)).await;
        assert_eq!(rows().await, 2, "{name}: nothing purged after stop");

        // Dropped: it ends too (it is cancelled on drop).
        let task = st.spawn_purge(Duration::from_millis(50)).unwrap();
        eventually("purging again", WAIT, || async { rows().await == 1 }).await;
        let cancelled = st.spawn_purge(Duration::from_secs(3600)).unwrap();
        cancelled.cancel();
        eventually("a cancelled task ends", WAIT, || async {
            cancelled.is_finished()
        })
        .await;
        drop(task);
        assert!(st.claim("after-drop").await.unwrap());
        tokio::time::sleep(lease + Duration::from_millis(300)).await;
        assert_eq!(rows().await, 2, "{name}: nothing purged after drop");
        drop_table(&pool, &t).await;
    }
}
