//! The PostgreSQL idempotency store cut off for 12 s, on `memory://` and
//! RabbitMQ: a TCP proxy in this test sits between the store's pool and PostgreSQL and can
//! cut every connection and refuse new ones, then let them through again.
//!
//! While it is cut, deliveries wait and are put back without spending attempts, nothing is
//! dead-lettered, and health shows the store Degraded; once it is back, every message is
//! handled once, on attempt 1, long before a claim's 5-minute lease could run out. And the
//! store's own rule for lost replies: a live claim with its own owner that the instance is
//! not working on is taken back at once; one it is working on, or another owner's, is not.

use crate::amqp_support;
use crate::support;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::health::HealthStatus;
use acemq::idempotency::{ClaimOutcome, HEALTH_COMPONENT, IdempotencyStore};
use acemq::publish::SendOptions;
use acemq::retry::RetryPolicy;
use acemq_sql::{IdempotencyOptions, SqlIdempotencyStore, SqlPool};
use amqp_support::{Broker, eventually, on_each_target, unique};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(60);
const OUTAGE: Duration = Duration::from_secs(12);

fn postgres_url() -> Option<String> {
    match std::env::var("ACEMQ_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            assert!(
                std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                "ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_POSTGRES_URL is not set"
            );
            eprintln!("note: ACEMQ_TEST_POSTGRES_URL unset; skipped");
            None
        }
    }
}

/// A TCP proxy to PostgreSQL that can be cut (every connection dropped, new ones refused)
/// and restored.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (c, l) = (cut.clone(), links.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                l.lock().unwrap().push(tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }));
            }
        });
        Proxy {
            port,
            cut,
            links,
            accept,
        }
    }

    /// Drops every connection through the proxy and refuses new ones.
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// A pool to PostgreSQL through `proxy`, giving up on a connection after 500 ms.
async fn proxied_pool(url: &str, proxy: &Proxy) -> SqlPool {
    let options = PgConnectOptions::from_str(url)
        .unwrap()
        .host("127.0.0.1")
        .port(proxy.port);
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_millis(500))
        .connect_with(options)
        .await
        .unwrap()
        .into()
}

async fn direct_pool(url: &str) -> SqlPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap()
        .into()
}

fn table(prefix: &str) -> String {
    unique(prefix)
        .replace(['.', '-'], "_")
        .replace("acemq_test_", "t_")
}

fn store(pool: SqlPool, table: &str, owner: &str) -> SqlIdempotencyStore {
    SqlIdempotencyStore::with_options(pool, IdempotencyOptions::new().table(table).owner(owner))
        .unwrap()
}

/// `(id, attempt)` of every handler run.
type Runs = Arc<Mutex<Vec<(String, i32)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twelve_second_store_outage_spends_no_attempt_and_strands_nothing() {
    let Some(url) = postgres_url() else { return };
    let upstream = {
        let o = PgConnectOptions::from_str(&url).unwrap();
        format!("{}:{}", o.get_host(), o.get_port())
    };
    on_each_target(|target: Broker| {
        let (url, upstream) = (url.clone(), upstream.clone());
        async move {
            let proxy = Proxy::start(upstream).await;
            let t = table("outage");
            let s = store(proxied_pool(&url, &proxy).await, &t, "outage-consumer");
            s.create_table_if_absent().await.unwrap();
            let (mq, q) = amqp_support::connect_with_classic_queue(&target, "pg-outage").await;
            let runs: Runs = Arc::default();
            let r = runs.clone();
            // Three attempts 10 ms apart: spending attempts on the outage would dead-letter
            // every message within a second.
            let options = ConsumerOptions::default()
                .retry(RetryPolicy::fixed(3, Duration::from_millis(10)).unwrap())
                .idempotent(s);
            let consumer = mq
                .consume(&q, options, move |m: Message<u32>| {
                    r.lock()
                        .unwrap()
                        .push((m.envelope().id().to_owned(), m.envelope().attempt()));
                    std::future::ready(Ok::<(), HandlerError>(()))
                })
                .await
                .unwrap();
            let publisher = mq.publisher::<u32>("", &q);
            publisher
                .send_with(&0, SendOptions::new().message_id("before-0"))
                .await
                .unwrap();
            eventually(WAIT, "handled before the outage", || async {
                (consumer.stats().acked == 1).then_some(())
            })
            .await;

            proxy.cut();
            let cut_at = tokio::time::Instant::now();
            for n in 1..=10u32 {
                publisher
                    .send_with(&n, SendOptions::new().message_id(format!("during-{n}")))
                    .await
                    .unwrap();
            }
            let report = eventually(OUTAGE, "the store reported Degraded", || async {
                let r = mq.health().report(HEALTH_COMPONENT)?.clone();
                (r.status == HealthStatus::Degraded).then_some(r)
            })
            .await;
            assert!(report.detail("error").is_some(), "{report:?}");
            assert!(report.detail("since").is_some(), "{report:?}");
            assert_ne!(mq.health().status, HealthStatus::Down);
            tokio::time::sleep_until(cut_at + OUTAGE).await;
            let during = consumer.stats();
            assert!(during.store_unavailable >= 1, "{during:?}");
            assert_eq!(
                (during.dead_lettered, during.retried),
                (0, 0),
                "no attempt spent during the outage"
            );
            proxy.restore();

            eventually(
                WAIT,
                "every message handled once the store is back",
                || async { (consumer.stats().acked == 11).then_some(()) },
            )
            .await;
            let back = cut_at.elapsed();
            assert!(
                back < Duration::from_secs(90),
                "nothing waited out a 5-minute lease ({back:?})"
            );
            let runs = runs.lock().unwrap().clone();
            let mut by_id: HashMap<&str, Vec<i32>> = HashMap::new();
            for (id, attempt) in &runs {
                by_id.entry(id.as_str()).or_default().push(*attempt);
            }
            assert_eq!(by_id.len(), 11, "{runs:?}");
            assert!(
                by_id.values().all(|a| a.as_slice() == [1]),
                "each handled once, on attempt 1: {by_id:?}"
            );
            let stats = consumer.stats();
            assert_eq!(
                (stats.dead_lettered, stats.retried, stats.in_progress),
                (0, 0, 0)
            );
            let dlq = mq
                .transport()
                .inspect_queue(&format!("{q}.dlq"))
                .await
                .unwrap();
            assert_eq!(dlq.message_count, 0, "nothing dead-lettered");
            eventually(WAIT, "the store Up again", || async {
                let r = mq.health().report(HEALTH_COMPONENT)?.clone();
                (r.status == HealthStatus::Up).then_some(())
            })
            .await;
            consumer.close().await;
            amqp_support::teardown(&mq, &q, &[]).await;
            support::drop_table(&direct_pool(&url).await, &t).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stores_own_live_claim_is_taken_back_unless_it_is_working_on_it() {
    let Some(url) = postgres_url() else { return };
    let pool = direct_pool(&url).await;
    let t = table("own_claim");
    let mine = store(pool.clone(), &t, "me");
    let other = store(pool.clone(), &t, "someone-else");
    mine.create_table_if_absent().await.unwrap();

    // A claim whose INSERT committed but whose reply was lost: the row is there, ours.
    let lost = format!("lost-{}", uuid::Uuid::new_v4());
    let SqlPool::Postgres(pg) = &pool else {
        unreachable!()
    };
    let now = time::OffsetDateTime::now_utc();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (message_id, state, claimed_by, recorded_at, expires_at) VALUES ($1, 'CLAIMED', 'me', $2, $3)"
    )))
    .bind(&lost)
    .bind(now)
    .bind(now + time::Duration::minutes(5))
    .execute(pg)
    .await
    .unwrap();
    assert_eq!(
        other.try_claim(&lost).await.unwrap(),
        ClaimOutcome::InProgress,
        "another owner's live claim is in progress"
    );
    assert_eq!(
        mine.try_claim(&lost).await.unwrap(),
        ClaimOutcome::Claimed,
        "our own, nobody here on it: taken back"
    );
    assert_eq!(
        mine.try_claim(&lost).await.unwrap(),
        ClaimOutcome::InProgress,
        "our own, and we are working on it now"
    );
    let (a, b) = tokio::join!(mine.try_claim(&lost), mine.try_claim(&lost));
    assert_eq!(
        (a.unwrap(), b.unwrap()),
        (ClaimOutcome::InProgress, ClaimOutcome::InProgress)
    );
    mine.confirm(&lost).await.unwrap();
    assert_eq!(
        mine.try_claim(&lost).await.unwrap(),
        ClaimOutcome::Duplicate
    );

    // Two callers racing for a fresh id through one instance: exactly one wins.
    for n in 0..20 {
        let k = format!("race-{n}-{}", uuid::Uuid::new_v4());
        let (a, b) = tokio::join!(mine.try_claim(&k), mine.try_claim(&k));
        let won = [a.unwrap(), b.unwrap()]
            .iter()
            .filter(|o| **o == ClaimOutcome::Claimed)
            .count();
        assert_eq!(won, 1, "{k}");
        mine.release(&k).await.unwrap();
    }
    support::drop_table(&pool, &t).await;
}
