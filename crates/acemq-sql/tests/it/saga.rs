//! Durable sagas on every database: each step's outbox rows commit with its log entry (a
//! failing step leaves none), compensation in reverse, a saga whose run was dropped
//! mid-step resumed by another instance's recovery, the lease kept through a slow step, an
//! unresolved compensation retried by `resume`, a saga begun in the caller's transaction,
//! and the refusals. `saga_kill.rs` kills a process running sagas.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::publish::SendOptions;
use acemq_sql::outbox::{Outbox, OutboxDatabase};
use acemq_sql::saga::{DurableSaga, SagaDatabase, SagaState, SagaTx};
use acemq_sql::{Error, SqlPool};
use serde::{Deserialize, Serialize};

use crate::support::{databases, drop_table, eventually, outbox_ids, unique_table};

const WAIT: Duration = Duration::from_secs(30);
pub const STEPS: [&str; 3] = ["flight", "hotel", "car"];

/// What a trip saga is about: its key prefixes every outbox row it writes; it fails at
/// `fail_at` (after writing that step's row, which must roll back); the rows are routed
/// to `route`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trip {
    pub key: String,
    pub fail_at: Option<usize>,
    pub route: String,
}

impl Trip {
    pub fn new(key: &str, fail_at: Option<usize>) -> Trip {
        Trip {
            key: key.into(),
            fail_at,
            route: "trips".into(),
        }
    }
}

/// Knobs a test turns while a saga runs, and what the steps saw.
#[derive(Default)]
pub struct Hooks {
    /// While set, the hotel step (after writing its row) waits forever.
    pub hold_hotel: AtomicBool,
    /// While set, the hotel step waits forever before it writes anything (on SQLite a
    /// written row holds the database's one write lock).
    pub hold_hotel_early: AtomicBool,
    /// While set, the flight's compensation fails.
    pub break_flight_undo: AtomicBool,
    /// How long each step sleeps before writing (the kill drill's pacing).
    pub pace: Mutex<Duration>,
    /// How many times each step (or `step:undo`) body started.
    pub runs: Mutex<HashMap<String, u32>>,
}

impl Hooks {
    pub fn runs(&self, what: &str) -> u32 {
        self.runs.lock().unwrap().get(what).copied().unwrap_or(0)
    }
    fn ran(&self, what: String) {
        *self.runs.lock().unwrap().entry(what).or_default() += 1;
    }
}

async fn write<DB: OutboxDatabase>(
    outbox: &Outbox,
    tx: &mut SagaTx<DB>,
    route: &str,
    id: String,
) -> Result<(), acemq_sql::Error> {
    outbox
        .enqueue_with(
            tx,
            "",
            route,
            &id,
            SendOptions::new().message_id(id.clone()),
        )
        .await
        .map(|_| ())
}

/// The trip saga: three steps, each writing `{key}:{step}` to the outbox in its
/// transaction; each compensation writes `{key}:{step}:undo`.
pub fn trip<DB>(
    pool: sqlx::Pool<DB>,
    outbox: &Outbox,
    table: &str,
    lease: Duration,
    hooks: &Arc<Hooks>,
) -> DurableSaga<DB, Trip>
where
    DB: SagaDatabase + OutboxDatabase,
{
    let mut b = DurableSaga::<DB, Trip>::named("trip", pool)
        .table(table)
        .lease(lease)
        .compensation_retry(2, Duration::from_millis(10));
    for (i, step) in STEPS.iter().enumerate() {
        let (o, h) = (outbox.clone(), hooks.clone());
        b = b.step(*step, move |t: Arc<Trip>, mut tx: SagaTx<DB>| {
            let (o, h) = (o.clone(), h.clone());
            async move {
                h.ran(step.to_string());
                let pace = *h.pace.lock().unwrap();
                if !pace.is_zero() {
                    tokio::time::sleep(pace).await;
                }
                if i == 1 && h.hold_hotel_early.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                write(&o, &mut tx, &t.route, format!("{}:{step}", t.key)).await?;
                if i == 1 && h.hold_hotel.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                if t.fail_at == Some(i) {
                    return Err(format!("no {step} for {}", t.key).into());
                }
                Ok(tx)
            }
        });
        if *step == "car" {
            continue; // the last step has no compensation: it is never compensated
        }
        let (o, h) = (outbox.clone(), hooks.clone());
        b = b.compensate_with(move |t: Arc<Trip>, mut tx: SagaTx<DB>| {
            let (o, h) = (o.clone(), h.clone());
            async move {
                h.ran(format!("{step}:undo"));
                if *step == "flight" && h.break_flight_undo.load(Ordering::SeqCst) {
                    return Err("the airline is down".into());
                }
                write(&o, &mut tx, &t.route, format!("{}:{step}:undo", t.key)).await?;
                Ok(tx)
            }
        });
    }
    b.build().expect("the trip saga")
}

/// A saga table and an outbox table of their own on `pool`, created.
pub async fn tables<DB>(pool: &sqlx::Pool<DB>) -> (Outbox, String, String)
where
    DB: SagaDatabase + OutboxDatabase,
    sqlx::Pool<DB>: Into<SqlPool>,
{
    let outbox_table = unique_table("acemq_saga_outbox");
    let saga_table = unique_table("acemq_sagas");
    let outbox = Outbox::with_table(pool.clone(), &outbox_table).unwrap();
    outbox.create_table_if_absent().await.unwrap();
    let probe = trip(
        pool.clone(),
        &outbox,
        &saga_table,
        Duration::from_secs(30),
        &Arc::default(),
    );
    probe.create_table_if_absent().await.unwrap();
    (outbox, outbox_table, saga_table)
}

pub fn ids(key: &str, rows: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = rows.iter().map(|r| format!("{key}:{r}")).collect();
    v.sort();
    v
}

macro_rules! on_each_db {
    ($case:ident) => {
        for (db, pool) in databases().await {
            match pool {
                SqlPool::Postgres(p) => $case::<sqlx::Postgres>(db, p).await,
                SqlPool::MySql(p) => $case::<sqlx::MySql>(db, p).await,
                SqlPool::Sqlite(p) => $case::<sqlx::Sqlite>(db, p).await,
                _ => unreachable!("a backend this test does not know"),
            }
        }
    };
}

async fn cleanup<DB>(pool: sqlx::Pool<DB>, tables: &[&str])
where
    DB: SagaDatabase,
    sqlx::Pool<DB>: Into<SqlPool>,
{
    let pool: SqlPool = pool.into();
    for t in tables {
        drop_table(&pool, t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_commit_with_their_log_and_a_failure_is_compensated_in_reverse() {
    async fn case<DB>(db: &str, pool: sqlx::Pool<DB>)
    where
        DB: SagaDatabase + OutboxDatabase,
        sqlx::Pool<DB>: Into<SqlPool>,
    {
        let (outbox, ot, st) = tables(&pool).await;
        let sql: SqlPool = pool.clone().into();
        let hooks = Arc::new(Hooks::default());
        let saga = trip(pool.clone(), &outbox, &st, Duration::from_secs(30), &hooks);

        let ok = saga.run(Trip::new("ok", None)).await.unwrap();
        assert_eq!(ok.state(), SagaState::Completed, "{db}");
        assert_eq!(ok.applied(), STEPS, "{db}");
        assert_eq!((ok.failed_step(), ok.last_error()), (None, None), "{db}");
        assert_eq!(saga.status(ok.id()).await.unwrap().as_ref(), Some(&ok));

        // The car fails after writing its row: that row rolls back; hotel then flight are
        // compensated, in that order.
        let car = saga.run(Trip::new("nocar", Some(2))).await.unwrap();
        assert_eq!(car.state(), SagaState::Compensated, "{db}");
        assert!(car.applied().is_empty(), "{db}");
        assert_eq!(car.failed_step(), Some("car"), "{db}");
        assert_eq!(car.last_error(), Some("no car for nocar"), "{db}");

        // The first step fails: nothing to compensate.
        let flight = saga.run(Trip::new("noflight", Some(0))).await.unwrap();
        assert_eq!(flight.state(), SagaState::Compensated, "{db}");
        assert_eq!(flight.failed_step(), Some("flight"), "{db}");

        let mut expected = ids("ok", &STEPS);
        expected.extend(ids(
            "nocar",
            &["flight", "hotel", "hotel:undo", "flight:undo"],
        ));
        expected.sort();
        assert_eq!(
            outbox_ids(&sql, &ot).await,
            expected,
            "{db}: the exact rows"
        );
        let records: Vec<_> = futures::future::join_all(
            ["nocar:hotel:undo", "nocar:flight:undo"].map(|id| outbox.record(id)),
        )
        .await;
        let created: Vec<i64> = records
            .into_iter()
            .map(|r| r.unwrap().unwrap().created_at_millis)
            .collect();
        assert!(created[0] <= created[1], "{db}: hotel undone before flight");
        assert_eq!(
            hooks.runs("car:undo"),
            0,
            "{db}: a failing step is not compensated"
        );
        cleanup(pool, &[&ot, &st]).await;
    }
    on_each_db!(case);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_dropped_mid_step_is_resumed_by_another_instance_and_applied_once() {
    async fn case<DB>(db: &str, pool: sqlx::Pool<DB>)
    where
        DB: SagaDatabase + OutboxDatabase,
        sqlx::Pool<DB>: Into<SqlPool>,
    {
        let (outbox, ot, st) = tables(&pool).await;
        let sql: SqlPool = pool.clone().into();
        let lease = Duration::from_secs(1);
        let hooks = Arc::new(Hooks::default());
        hooks.hold_hotel.store(true, Ordering::SeqCst);
        let first = trip(pool.clone(), &outbox, &st, lease, &hooks);
        let run = tokio::spawn({
            let first = first.clone();
            async move { first.run(Trip::new("t", None)).await }
        });
        eventually("the hotel step in hand", WAIT, || async {
            hooks.runs("hotel") == 1
        })
        .await;
        // The "crash": the run's future goes away while the hotel step holds its
        // transaction (with the hotel row written, not committed).
        run.abort();
        assert!(run.await.unwrap_err().is_cancelled());
        assert_eq!(outbox_ids(&sql, &ot).await, ids("t", &["flight"]), "{db}");

        hooks.hold_hotel.store(false, Ordering::SeqCst);
        let second = trip(pool.clone(), &outbox, &st, lease, &hooks);
        let resumed = Arc::new(Mutex::new(Vec::new()));
        eventually(
            "recovery resumes the saga once its lease ran out",
            WAIT,
            || {
                let (second, resumed) = (second.clone(), resumed.clone());
                async move {
                    let done = second.recover().await.unwrap();
                    let any = !done.is_empty();
                    resumed.lock().unwrap().extend(done);
                    any
                }
            },
        )
        .await;
        let resumed = resumed.lock().unwrap().clone();
        assert_eq!(resumed.len(), 1, "{db}: {resumed:?}");
        assert_eq!(resumed[0].state(), SagaState::Completed, "{db}");
        assert_eq!(
            outbox_ids(&sql, &ot).await,
            ids("t", &STEPS),
            "{db}: each row once"
        );
        assert_eq!(
            (hooks.runs("flight"), hooks.runs("hotel"), hooks.runs("car")),
            (1, 2, 1),
            "{db}: the step in hand ran again, the applied one did not"
        );
        assert!(
            second.recover().await.unwrap().is_empty(),
            "{db}: nothing left"
        );
        cleanup(pool, &[&ot, &st]).await;
    }
    on_each_db!(case);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_step_keeps_its_lease_and_a_live_saga_is_not_taken() {
    async fn case<DB>(db: &str, pool: sqlx::Pool<DB>)
    where
        DB: SagaDatabase + OutboxDatabase,
        sqlx::Pool<DB>: Into<SqlPool>,
    {
        let (outbox, ot, st) = tables(&pool).await;
        let lease = Duration::from_secs(1);
        let hooks = Arc::new(Hooks::default());
        *hooks.pace.lock().unwrap() = Duration::from_millis(1500);
        let first = trip(pool.clone(), &outbox, &st, lease, &hooks);
        let other = trip(
            pool.clone(),
            &outbox,
            &st,
            lease,
            &Arc::new(Hooks::default()),
        );
        let run = tokio::spawn({
            let first = first.clone();
            async move { first.run(Trip::new("slow", None)).await }
        });
        // Recovery passes all through the slow steps (each longer than the lease) take
        // nothing: the lease is renewed while a step runs.
        let mut passes = 0;
        while !run.is_finished() {
            assert!(
                other.recover().await.unwrap().is_empty(),
                "{db}: a live saga was taken"
            );
            passes += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let done = run.await.unwrap().unwrap();
        assert_eq!(done.state(), SagaState::Completed, "{db}");
        assert!(
            passes > 10,
            "{db}: recovery ran while the steps did ({passes})"
        );
        // Resuming a live saga is refused with who holds it; a finished one is returned.
        assert_eq!(other.resume(done.id()).await.unwrap(), done);
        hooks.hold_hotel_early.store(true, Ordering::SeqCst);
        *hooks.pace.lock().unwrap() = Duration::ZERO;
        let held = tokio::spawn({
            let first = first.clone();
            async move { first.run(Trip::new("held", None)).await }
        });
        eventually("the hotel step in hand", WAIT, || async {
            hooks.runs("hotel") == 2
        })
        .await;
        let id = held_id(&pool, &st).await;
        match other.resume(&id).await {
            Err(Error::SagaBusy { owner, .. }) => assert!(!owner.is_empty(), "{db}"),
            other => panic!("{db}: expected SagaBusy, got {other:?}"),
        }
        held.abort();
        let _ = held.await;
        cleanup(pool, &[&ot, &st]).await;
    }
    on_each_db!(case);
}

/// The id of the one `running` saga in `table`.
async fn held_id<DB>(pool: &sqlx::Pool<DB>, table: &str) -> String
where
    DB: SagaDatabase,
    sqlx::Pool<DB>: Into<SqlPool>,
{
    let sql = format!("SELECT id FROM {table} WHERE state = 'running'");
    let rows: Vec<(String,)> = match pool.clone().into() {
        SqlPool::Postgres(p) => sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&p).await,
        SqlPool::MySql(p) => sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&p).await,
        SqlPool::Sqlite(p) => sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&p).await,
        _ => unreachable!(),
    }
    .unwrap();
    assert_eq!(rows.len(), 1, "one running saga: {rows:?}");
    rows[0].0.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_compensation_is_tried_again_by_resume() {
    async fn case<DB>(db: &str, pool: sqlx::Pool<DB>)
    where
        DB: SagaDatabase + OutboxDatabase,
        sqlx::Pool<DB>: Into<SqlPool>,
    {
        let (outbox, ot, st) = tables(&pool).await;
        let sql: SqlPool = pool.clone().into();
        let hooks = Arc::new(Hooks::default());
        hooks.break_flight_undo.store(true, Ordering::SeqCst);
        let saga = trip(pool.clone(), &outbox, &st, Duration::from_secs(30), &hooks);
        let stuck = saga.run(Trip::new("u", Some(2))).await.unwrap();
        assert_eq!(stuck.state(), SagaState::Unresolved, "{db}");
        assert_eq!(
            stuck.applied(),
            ["flight"],
            "{db}: the hotel was undone, the flight not"
        );
        assert_eq!(
            stuck.last_error(),
            Some("compensating flight: the airline is down"),
            "{db}"
        );
        assert_eq!(
            hooks.runs("flight:undo"),
            2,
            "{db}: tried compensation_retry times"
        );
        assert!(
            saga.recover().await.unwrap().is_empty(),
            "{db}: recovery leaves it to a person"
        );

        hooks.break_flight_undo.store(false, Ordering::SeqCst);
        let fixed = saga.resume(stuck.id()).await.unwrap();
        assert_eq!(fixed.state(), SagaState::Compensated, "{db}");
        assert!(fixed.applied().is_empty(), "{db}");
        assert_eq!(
            outbox_ids(&sql, &ot).await,
            ids("u", &["flight", "hotel", "hotel:undo", "flight:undo"]),
            "{db}"
        );
        cleanup(pool, &[&ot, &st]).await;
    }
    on_each_db!(case);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_begun_in_the_callers_transaction_exists_only_if_it_commits() {
    async fn case<DB>(db: &str, pool: sqlx::Pool<DB>)
    where
        DB: SagaDatabase + OutboxDatabase,
        sqlx::Pool<DB>: Into<SqlPool>,
    {
        let (outbox, ot, st) = tables(&pool).await;
        let sql: SqlPool = pool.clone().into();
        let saga = trip(
            pool.clone(),
            &outbox,
            &st,
            Duration::from_secs(30),
            &Arc::default(),
        );
        let trip_of = |key: &str| Trip::new(key, None);

        let mut tx = pool.begin().await.unwrap();
        let gone = saga.begin(&mut tx, &trip_of("rolled")).await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(saga.status(&gone).await.unwrap(), None, "{db}");
        assert!(matches!(
            saga.resume(&gone).await,
            Err(Error::SagaNotFound { .. })
        ));

        let mut tx = pool.begin().await.unwrap();
        let kept = saga.begin(&mut tx, &trip_of("kept")).await.unwrap();
        tx.commit().await.unwrap();
        let waiting = saga.status(&kept).await.unwrap().unwrap();
        assert_eq!(waiting.state(), SagaState::Running, "{db}");
        assert!(waiting.applied().is_empty(), "{db}");
        let done = saga.recover().await.unwrap();
        assert_eq!(done.len(), 1, "{db}: recovery runs a begun saga at once");
        assert_eq!(
            (done[0].id(), done[0].state()),
            (kept.as_str(), SagaState::Completed)
        );
        assert_eq!(outbox_ids(&sql, &ot).await, ids("kept", &STEPS), "{db}");
        cleanup(pool, &[&ot, &st]).await;
    }
    on_each_db!(case);
}

#[tokio::test]
async fn a_changed_definition_bad_input_and_panics_are_refused_clearly() {
    let SqlPool::Sqlite(pool) = crate::support::sqlite().await else {
        unreachable!()
    };
    let (outbox, ot, st) = tables(&pool).await;
    let hooks = Arc::new(Hooks::default());
    let saga = trip(pool.clone(), &outbox, &st, Duration::from_secs(1), &hooks);
    let mut tx = pool.begin().await.unwrap();
    let id = saga.begin(&mut tx, &Trip::new("c", None)).await.unwrap();
    tx.commit().await.unwrap();
    let shorter = DurableSaga::<sqlx::Sqlite, Trip>::named("trip", pool.clone())
        .table(&st)
        .step(
            "flight",
            |_t: Arc<Trip>, tx: SagaTx<sqlx::Sqlite>| async move { Ok(tx) },
        )
        .build()
        .unwrap();
    match shorter.resume(&id).await {
        Err(e @ Error::SagaChanged { .. }) => {
            assert!(
                e.to_string().contains("give a changed saga a new name"),
                "{e}"
            )
        }
        other => panic!("expected SagaChanged, got {other:?}"),
    }
    // Another saga's name does not see it.
    let other = DurableSaga::<sqlx::Sqlite, Trip>::named("cruise", pool.clone())
        .table(&st)
        .step(
            "flight",
            |_t: Arc<Trip>, tx: SagaTx<sqlx::Sqlite>| async move { Ok(tx) },
        )
        .build()
        .unwrap();
    assert!(matches!(
        other.resume(&id).await,
        Err(Error::SagaNotFound { .. })
    ));
    assert!(other.recover().await.unwrap().is_empty());

    // A panicking step is a failure like an error: compensated, the panic's text kept.
    let panics = DurableSaga::<sqlx::Sqlite, Trip>::named("panics", pool.clone())
        .table(&st)
        .step(
            "boom",
            |_t: Arc<Trip>, _tx: SagaTx<sqlx::Sqlite>| async move { panic!("index out of bounds") },
        )
        .build()
        .unwrap();
    let r = panics.run(Trip::new("p", None)).await.unwrap();
    assert_eq!(r.state(), SagaState::Compensated);
    assert_eq!(r.last_error(), Some("panicked: index out of bounds"));

    // Builder refusals say what to do.
    let refused = |b: acemq_sql::saga::DurableSagaBuilder<sqlx::Sqlite, Trip>| {
        b.build().map(|_| ()).unwrap_err().to_string()
    };
    let named = |n: &str| DurableSaga::<sqlx::Sqlite, Trip>::named(n, pool.clone());
    let noop = |_t: Arc<Trip>, tx: SagaTx<sqlx::Sqlite>| async move { Ok(tx) };
    assert!(refused(named("x")).contains("add at least one"));
    assert!(refused(named("")).contains("needs a name"));
    assert!(refused(named("x").step("a", noop).step("a", noop)).contains("already has a step"));
    assert!(refused(named("x").compensate_with(noop)).contains("before any step"));
    assert!(
        refused(named("x").step("a", noop).table("x; drop table y")).contains("invalid table name")
    );
    cleanup(pool, &[&ot, &st]).await;
}
