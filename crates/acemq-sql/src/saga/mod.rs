//! Durable sagas: steps that each commit in a database transaction together with the
//! saga's own log entry, so a saga interrupted anywhere (a crash, a SIGKILL, a dropped
//! future, a lost database) is resumed from its log and ends **completed or compensated,
//! never half-applied**. Rust only: no other member of the family has a saga that survives
//! a crash (`docs/patterns.md`, § Sagas).
//!
//! This module owns the saga table (default [`DEFAULT_TABLE`], `acemq_sagas`), the
//! definition ([`DurableSaga::named`] → [`DurableSagaBuilder`]), running one
//! ([`DurableSaga::run`], or [`DurableSaga::begin`] in the caller's transaction), and
//! resuming the ones a process left behind ([`DurableSaga::recover`],
//! [`DurableSaga::spawn_recovery`], [`DurableSaga::resume`]).
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use acemq_sql::outbox::Outbox;
//! use acemq_sql::saga::{DurableSaga, SagaState, SagaTx};
//! use sqlx::Sqlite;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Order { id: u32, card_ok: bool }
//!
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! let outbox = Outbox::new(pool.clone());
//! outbox.create_table_if_absent().await?;
//! let (o1, o2, o3) = (outbox.clone(), outbox.clone(), outbox.clone());
//!
//! let booking = DurableSaga::<Sqlite, Order>::named("booking", pool.clone())
//!     .step("reserve", move |o: Arc<Order>, mut tx: SagaTx<Sqlite>| {
//!         let outbox = o1.clone();
//!         async move {
//!             outbox.enqueue(&mut tx, "", "stock", &format!("reserve {}", o.id)).await?;
//!             Ok(tx) // committed with the saga's log entry
//!         }
//!     })
//!     .compensate_with(move |o: Arc<Order>, mut tx: SagaTx<Sqlite>| {
//!         let outbox = o2.clone();
//!         async move {
//!             outbox.enqueue(&mut tx, "", "stock", &format!("release {}", o.id)).await?;
//!             Ok(tx)
//!         }
//!     })
//!     .step("charge", move |o: Arc<Order>, tx: SagaTx<Sqlite>| {
//!         let _outbox = o3.clone();
//!         async move {
//!             if !o.card_ok {
//!                 return Err("card declined".into()); // this step's transaction rolls back
//!             }
//!             Ok(tx)
//!         }
//!     })
//!     .build()?;
//! booking.create_table_if_absent().await?;
//!
//! let done = booking.run(Order { id: 7, card_ok: false }).await?;
//! assert_eq!(done.state(), SagaState::Compensated);
//! assert_eq!(done.failed_step(), Some("charge"));
//! assert_eq!(done.last_error(), Some("card declined"));
//! assert_eq!(outbox.pending_count().await?, 2); // "reserve 7", then "release 7"
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! **How it is kept.** One row per saga: its name, the names of its steps, the subject as
//! JSON, the state ([`SagaState`]), how many steps are applied, and who runs it until when
//! (a lease). [`run`](DurableSaga::run) inserts the row, then runs each step in a
//! transaction of its own, begun on the saga's pool and handed to the step
//! ([`SagaTx`]): what the step writes there (business rows, [`Outbox`](crate::outbox::Outbox)
//! messages, idempotency confirmations) commits in one commit with the log entry that says
//! the step is applied. A compensation is the same in reverse. Every log statement is
//! guarded by the row's id, owner, state and applied count, so a process that lost its
//! lease changes nothing.
//!
//! **Where an interruption leaves it.** A step that had not committed left nothing (its
//! transaction rolled back with the process); the saga is `running` with the steps before
//! it applied, and is resumed by running that step again. A saga interrupted while
//! compensating is resumed compensating. [`recover`](DurableSaga::recover) takes over every
//! saga of this name whose lease ran out (the default lease is [`DEFAULT_LEASE`], renewed
//! every third of it while a step runs) and drives it to an end;
//! [`spawn_recovery`](DurableSaga::spawn_recovery) does that on a timer.
//!
//! **What a step must do.** Write its effects in the transaction it is given, and return
//! it. An effect outside the database (an HTTP call) may run twice after a crash, as with
//! any at-least-once step: key it by something in the subject, which is the same on every
//! run. A step's error
//! starts the compensation, except a database failure that is not the step's fault: a
//! deadlock or serialization failure reruns the step (a few times), and a lost connection
//! leaves the saga to recovery ([`Error::SagaInterrupted`]) instead of compensating it.
//! A panic is caught and counts as the step's error.
//!
//! **Compensation** runs most recent first; the failing step is not compensated; a step
//! without compensation is skipped; each compensation is tried
//! [`DurableSagaBuilder::compensation_retry`] times (3, from 100 ms doubling). A saga
//! whose compensation still fails is [`SagaState::Unresolved`], with the reason, until a
//! person fixes what blocked it and calls [`resume`](DurableSaga::resume), which tries the
//! compensations again.
//!
//! **A definition that changed** (steps added, removed, renamed) since a saga began is
//! refused for that saga ([`Error::SagaChanged`]): give a changed saga a new name and keep
//! the old one recovering until its sagas are done.
//!
//! Metrics: `acemq.saga.total{saga,outcome}`, `acemq.saga.compensating.total{saga}`,
//! `acemq.saga.unresolved.total{saga}`, as the in-process [`acemq::saga::Saga`].

mod drive;
mod sql;

pub use sql::SagaDatabase;
#[doc(hidden)]
pub use sql::{Arg, SagaRow};

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use acemq::saga::{SagaError, StepError};
use acemq::transport::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::{Error, TableName, now_millis};
use sql::{Statements, statements};

/// The default saga table: `acemq_sagas`.
pub const DEFAULT_TABLE: &str = "acemq_sagas";
/// The default lease a process holds on a saga it runs: 30 s (renewed every 10 s while a
/// step runs). A saga whose process died is resumed by recovery this long after.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The transaction a step or compensation writes in, and returns to have it committed with
/// the saga's log entry.
pub type SagaTx<DB> = sqlx::Transaction<'static, DB>;

type Action<DB, T> = Box<
    dyn Fn(Arc<T>, SagaTx<DB>) -> BoxFuture<'static, Result<SagaTx<DB>, StepError>> + Send + Sync,
>;

fn erase<DB, T, F, Fut>(f: F) -> Action<DB, T>
where
    DB: SagaDatabase,
    F: Fn(Arc<T>, SagaTx<DB>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<SagaTx<DB>, StepError>> + Send + 'static,
{
    Box::new(move |subject, tx| Box::pin(f(subject, tx)))
}

/// Where a saga is.
///
/// ```
/// use acemq_sql::saga::SagaState;
/// assert_eq!(SagaState::Compensated.as_str(), "compensated");
/// assert!(SagaState::Completed.is_final() && !SagaState::Running.is_final());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SagaState {
    /// Steps are being applied.
    Running,
    /// A step failed; the applied steps are being compensated.
    Compensating,
    /// Every step is applied.
    Completed,
    /// A step failed and every applied step was compensated (or had no compensation).
    Compensated,
    /// A compensation failed every attempt: a person has to look
    /// ([`SagaStatus::last_error`]), then [`DurableSaga::resume`] tries again.
    Unresolved,
}

impl SagaState {
    /// The state as stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            SagaState::Running => "running",
            SagaState::Compensating => "compensating",
            SagaState::Completed => "completed",
            SagaState::Compensated => "compensated",
            SagaState::Unresolved => "unresolved",
        }
    }

    /// Whether nothing more happens to the saga by itself (completed, compensated or
    /// unresolved).
    pub fn is_final(self) -> bool {
        !matches!(self, SagaState::Running | SagaState::Compensating)
    }

    fn parse(s: &str) -> Option<SagaState> {
        Some(match s {
            "running" => SagaState::Running,
            "compensating" => SagaState::Compensating,
            "completed" => SagaState::Completed,
            "compensated" => SagaState::Compensated,
            "unresolved" => SagaState::Unresolved,
            _ => return None,
        })
    }

    /// The `outcome` tag of `acemq.saga.total`, for a final state.
    fn outcome(self) -> Option<&'static str> {
        match self {
            SagaState::Completed => Some("completed"),
            SagaState::Compensated => Some("compensated"),
            SagaState::Unresolved => Some("unresolved"),
            SagaState::Running | SagaState::Compensating => None,
        }
    }
}

impl fmt::Display for SagaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A saga as its log row says: what [`DurableSaga::run`] returns when the saga ended, and
/// [`DurableSaga::status`] at any time.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SagaStatus {
    id: String,
    saga: String,
    state: SagaState,
    applied: Vec<String>,
    failed_step: Option<String>,
    last_error: Option<String>,
    created_at_millis: i64,
    updated_at_millis: i64,
}

impl SagaStatus {
    /// The saga's id (a UUID), stable across resumptions.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The saga's name.
    pub fn saga(&self) -> &str {
        &self.saga
    }
    /// Where it is.
    pub fn state(&self) -> SagaState {
        self.state
    }
    /// The steps whose effects are committed and not compensated, in order: all of them
    /// when completed, none when compensated.
    pub fn applied(&self) -> &[String] {
        &self.applied
    }
    /// The step that failed, once one has.
    pub fn failed_step(&self) -> Option<&str> {
        self.failed_step.as_deref()
    }
    /// Why: the failing step's error, or (unresolved) the last compensation's.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }
    /// When the saga began, in epoch milliseconds.
    pub fn created_at_millis(&self) -> i64 {
        self.created_at_millis
    }
    /// When its row last changed, in epoch milliseconds.
    pub fn updated_at_millis(&self) -> i64 {
        self.updated_at_millis
    }
}

struct Step<DB: SagaDatabase, T> {
    name: String,
    action: Action<DB, T>,
    compensation: Option<Action<DB, T>>,
}

pub(crate) struct Inner<DB: SagaDatabase, T> {
    name: String,
    steps: Vec<Step<DB, T>>,
    step_names: Vec<String>,
    pool: sqlx::Pool<DB>,
    table: TableName,
    sql: Statements,
    owner: String,
    lease: Duration,
    attempts: u32,
    backoff: Duration,
}

/// A durable saga definition: cheap to clone, run as often as you like. See the
/// [module docs](self).
pub struct DurableSaga<DB: SagaDatabase, T> {
    inner: Arc<Inner<DB, T>>,
}

impl<DB: SagaDatabase, T> Clone for DurableSaga<DB, T> {
    fn clone(&self) -> Self {
        DurableSaga {
            inner: self.inner.clone(),
        }
    }
}

impl<DB: SagaDatabase, T> fmt::Debug for DurableSaga<DB, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableSaga")
            .field("name", &self.inner.name)
            .field("steps", &self.inner.step_names)
            .field("table", &self.inner.table.as_str())
            .field("lease", &self.inner.lease)
            .finish()
    }
}

/// Builds a [`DurableSaga`]: steps in order, each optionally followed by its compensation.
pub struct DurableSagaBuilder<DB: SagaDatabase, T> {
    name: String,
    pool: sqlx::Pool<DB>,
    table: Result<TableName, Error>,
    steps: Vec<Step<DB, T>>,
    refused: Option<SagaError>,
    lease: Duration,
    attempts: u32,
    backoff: Duration,
}

impl<DB: SagaDatabase, T> fmt::Debug for DurableSagaBuilder<DB, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableSagaBuilder")
            .field("name", &self.name)
            .field(
                "steps",
                &self.steps.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<DB, T> DurableSaga<DB, T>
where
    DB: SagaDatabase,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Starts a definition named `name` (it tags the rows, logs and metrics; recovery
    /// resumes only the sagas of its own name), kept in `pool`'s database, in the table
    /// [`DEFAULT_TABLE`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), acemq_sql::Error> {
    /// use std::sync::Arc;
    /// use acemq_sql::saga::{DurableSaga, SagaTx};
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let saga = DurableSaga::<sqlx::Sqlite, u32>::named("greet", pool)
    ///     .step("hello", |_n: Arc<u32>, tx: SagaTx<sqlx::Sqlite>| async move { Ok(tx) })
    ///     .build()?;
    /// assert_eq!(saga.name(), "greet");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))]
    /// # fn main() {}
    /// ```
    pub fn named(name: impl Into<String>, pool: sqlx::Pool<DB>) -> DurableSagaBuilder<DB, T> {
        DurableSagaBuilder {
            name: name.into(),
            pool,
            table: Ok(TableName::trusted(DEFAULT_TABLE)),
            steps: Vec::new(),
            refused: None,
            lease: DEFAULT_LEASE,
            attempts: 3,
            backoff: Duration::from_millis(100),
        }
    }

    /// The saga's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }

    /// The DDL for the saga table and its index, in the pool's dialect: statements
    /// separated by `;` and a newline. Put it in a migration.
    pub fn create_table_sql(&self) -> String {
        crate::pool::ddl_text(&self.inner.sql.ddl)
    }

    /// Runs [`create_table_sql`](Self::create_table_sql) (`IF NOT EXISTS`). For
    /// development and tests.
    pub async fn create_table_if_absent(&self) -> Result<(), Error> {
        crate::pool::run_ddl(&DB::sql_pool(&self.inner.pool), &self.inner.sql.ddl).await
    }

    /// Records a new saga for `subject` and runs it to its end: every step applied
    /// ([`SagaState::Completed`]) or, after a step failed, the applied ones compensated
    /// ([`SagaState::Compensated`], or [`SagaState::Unresolved`] when a compensation kept
    /// failing). An `Err` means the saga did not reach an end here
    /// ([`Error::SagaInterrupted`], [`Error::SagaTakenOver`]); it is in the log and
    /// recovery finishes it. Dropping the returned future is the same: the step in hand
    /// rolls back and recovery resumes the saga after its lease.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(saga: acemq_sql::saga::DurableSaga<sqlx::Sqlite, u32>) -> Result<(), acemq_sql::Error> {
    /// use acemq_sql::saga::SagaState;
    /// let status = saga.run(42).await?;
    /// match status.state() {
    ///     SagaState::Completed => println!("saga {} done", status.id()),
    ///     SagaState::Unresolved => eprintln!("reconcile: {:?}", status.last_error()),
    ///     other => println!("{other}: failed at {:?}", status.failed_step()),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run(&self, subject: T) -> Result<SagaStatus, Error> {
        let subject_json = encode_subject(&subject)?;
        let id = uuid::Uuid::new_v4().to_string();
        let now = now_millis();
        let inner = &self.inner;
        let args = || {
            vec![
                Arg::Text(id.clone()),
                Arg::Text(inner.name.clone()),
                Arg::Text(steps_json(&inner.step_names)),
                Arg::Text(subject_json.clone()),
                Arg::Text(SagaState::Running.as_str().into()),
                Arg::Text(inner.owner.clone()),
                Arg::Int(now.saturating_add(crate::millis(inner.lease))),
                Arg::Int(now),
                Arg::Int(now),
            ]
        };
        crate::pool::retry_contention(|| async {
            let mut conn = inner.pool.acquire().await?;
            DB::execute(&mut conn, inner.sql.insert.clone(), args()).await?;
            Ok(())
        })
        .await
        .map_err(|e| drive::interrupted(&id, e))?;
        drive::drive(inner, &id, Arc::new(subject), SagaState::Running, 0).await
    }

    /// Records a new saga for `subject` in the caller's transaction, which it neither
    /// commits nor closes, and returns its id: the saga exists exactly when that
    /// transaction commits (with whatever else the caller wrote), and runs when
    /// [`resume`](Self::resume) or recovery picks it up — at once, since it has no lease.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(saga: acemq_sql::saga::DurableSaga<sqlx::Postgres, u32>, pool: sqlx::PgPool) -> Result<(), acemq_sql::Error> {
    /// let mut tx = pool.begin().await?;
    /// // ... the order row, in the same transaction ...
    /// let id = saga.begin(&mut tx, &42).await?;
    /// tx.commit().await?;
    /// let status = saga.resume(&id).await?;
    /// # let _ = status; Ok(()) }
    /// ```
    pub async fn begin(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        subject: &T,
    ) -> Result<String, Error> {
        let inner = &self.inner;
        let id = uuid::Uuid::new_v4().to_string();
        let now = now_millis();
        let args = vec![
            Arg::Text(id.clone()),
            Arg::Text(inner.name.clone()),
            Arg::Text(steps_json(&inner.step_names)),
            Arg::Text(encode_subject(subject)?),
            Arg::Text(SagaState::Running.as_str().into()),
            Arg::NoText,
            Arg::Int(0),
            Arg::Int(now),
            Arg::Int(now),
        ];
        DB::execute(&mut **tx, inner.sql.insert.clone(), args).await?;
        Ok(id)
    }

    /// Takes the saga `id` over and drives it to its end, as [`run`](Self::run) would
    /// have: a `running` or `compensating` saga whose lease ran out (or that was
    /// [`begin`](Self::begin)-ed), or an unresolved one (its compensations are tried
    /// again). A saga already at its end is returned as it is. One held by a live process
    /// is [`Error::SagaBusy`]; an unknown id [`Error::SagaNotFound`].
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(saga: acemq_sql::saga::DurableSaga<sqlx::Sqlite, u32>) -> Result<(), acemq_sql::Error> {
    /// match saga.resume("3f0c…").await {
    ///     Ok(status) => println!("{}", status.state()),
    ///     Err(acemq_sql::Error::SagaBusy { owner, .. }) => println!("{owner} runs it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn resume(&self, id: &str) -> Result<SagaStatus, Error> {
        drive::resume(&self.inner, id).await
    }

    /// Resumes every saga of this name whose lease ran out, one after the other, and
    /// returns how each ended. A saga that could not be driven to its end (the database
    /// went, another process took it) is logged and left for the next pass.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(saga: acemq_sql::saga::DurableSaga<sqlx::Sqlite, u32>) -> Result<(), acemq_sql::Error> {
    /// for status in saga.recover().await? {
    ///     println!("resumed {}: {}", status.id(), status.state());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn recover(&self) -> Result<Vec<SagaStatus>, Error> {
        drive::recover(&self.inner).await
    }

    /// Runs [`recover`](Self::recover) now and then every `every`, on a task of its own,
    /// until [`SagaRecovery::stop`] (or the handle is dropped).
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(saga: acemq_sql::saga::DurableSaga<sqlx::Sqlite, u32>) -> Result<(), acemq_sql::Error> {
    /// let recovery = saga.spawn_recovery(std::time::Duration::from_secs(10));
    /// // ... serve ...
    /// recovery.stop().await;
    /// # Ok(()) }
    /// ```
    pub fn spawn_recovery(&self, every: Duration) -> SagaRecovery {
        let stop = CancellationToken::new();
        let saga = self.clone();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                match saga.recover().await {
                    Ok(done) if !done.is_empty() => {
                        tracing::info!(saga = %saga.inner.name, resumed = done.len(), "saga recovery pass")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(saga = %saga.inner.name, error = %e, "saga recovery pass failed; trying again later")
                    }
                }
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
        SagaRecovery { stop, task }
    }

    /// The saga `id` as its row says, or `None`.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(saga: acemq_sql::saga::DurableSaga<sqlx::Sqlite, u32>) -> Result<(), acemq_sql::Error> {
    /// if let Some(s) = saga.status("3f0c…").await? {
    ///     println!("{}: applied {:?}", s.state(), s.applied());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn status(&self, id: &str) -> Result<Option<SagaStatus>, Error> {
        drive::status(&self.inner, id).await
    }
}

/// The task [`DurableSaga::spawn_recovery`] started. Dropping it stops the task too.
#[derive(Debug)]
pub struct SagaRecovery {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl SagaRecovery {
    /// Stops the task after the pass in hand (a saga being resumed is driven to its end or
    /// interrupted, as any run).
    pub async fn stop(mut self) {
        self.stop.cancel();
        let _ = (&mut self.task).await;
    }
}

impl Drop for SagaRecovery {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl<DB, T> DurableSagaBuilder<DB, T>
where
    DB: SagaDatabase,
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Adds a step: it receives the subject and a transaction, writes its effects there,
    /// and returns the transaction (committed with the log entry) or an error (rolled
    /// back; compensation starts).
    pub fn step<F, Fut>(mut self, name: impl Into<String>, action: F) -> Self
    where
        F: Fn(Arc<T>, SagaTx<DB>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<SagaTx<DB>, StepError>> + Send + 'static,
    {
        let name = name.into();
        if self.refused.is_none() {
            if name.is_empty() {
                self.refused = Some(SagaError::EmptyStepName {
                    saga: self.name.clone(),
                    position: self.steps.len() + 1,
                });
            } else if self.steps.iter().any(|s| s.name == name) {
                self.refused = Some(SagaError::DuplicateStep {
                    saga: self.name.clone(),
                    step: name.clone(),
                });
            }
        }
        self.steps.push(Step {
            name,
            action: erase(action),
            compensation: None,
        });
        self
    }

    /// The compensation of the step just added: it undoes that step's effects, in a
    /// transaction of its own committed with the log entry. Tried again when it fails, so
    /// write it to be safe to run twice.
    pub fn compensate_with<F, Fut>(mut self, undo: F) -> Self
    where
        F: Fn(Arc<T>, SagaTx<DB>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<SagaTx<DB>, StepError>> + Send + 'static,
    {
        let saga = self.name.clone();
        match self.steps.last_mut() {
            None => {
                self.refused
                    .get_or_insert(SagaError::CompensationBeforeStep { saga });
            }
            Some(step) if step.compensation.is_some() => {
                let step = step.name.clone();
                self.refused
                    .get_or_insert(SagaError::DuplicateCompensation { saga, step });
            }
            Some(step) => step.compensation = Some(erase(undo)),
        }
        self
    }

    /// Keeps the sagas in another table (validated, see [`TableName`]).
    pub fn table(mut self, table: &str) -> Self {
        self.table = TableName::parse(table);
        self
    }

    /// How long a process holds a saga it runs before another may take it over (default
    /// [`DEFAULT_LEASE`]; renewed every third of it while a step runs, so a slow step
    /// keeps it). After a crash, recovery resumes the saga this long after its last
    /// renewal. At least 1 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_secs(1));
        self
    }

    /// Tries each compensation up to `attempts` times (0 counts as 1), `backoff` after the
    /// first failure, doubling, at most [`acemq::saga::MAX_COMPENSATION_BACKOFF`].
    pub fn compensation_retry(mut self, attempts: u32, backoff: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.backoff = backoff;
        self
    }

    /// The definition, or what is wrong with it.
    pub fn build(self) -> Result<DurableSaga<DB, T>, Error> {
        if self.name.is_empty() {
            return Err(SagaError::EmptySagaName.into());
        }
        if let Some(refused) = self.refused {
            return Err(refused.into());
        }
        if self.steps.is_empty() {
            return Err(SagaError::NoSteps { saga: self.name }.into());
        }
        if self.name.chars().count() > 255 {
            return Err(Error::InvalidArgument(format!(
                "saga name of {} characters; the saga table's saga column holds at most 255",
                self.name.chars().count()
            )));
        }
        let table = self.table?;
        let step_names = self.steps.iter().map(|s| s.name.clone()).collect();
        Ok(DurableSaga {
            inner: Arc::new(Inner {
                sql: statements(DB::DIALECT, &table),
                name: self.name,
                steps: self.steps,
                step_names,
                pool: self.pool,
                table,
                owner: crate::default_owner(),
                lease: self.lease,
                attempts: self.attempts,
                backoff: self.backoff,
            }),
        })
    }
}

fn encode_subject<T: Serialize>(subject: &T) -> Result<String, Error> {
    serde_json::to_string(subject).map_err(|e| {
        Error::InvalidArgument(format!(
            "a durable saga keeps its subject as JSON, and this one could not be encoded: {e}"
        ))
    })
}

fn steps_json(names: &[String]) -> String {
    serde_json::to_string(names).unwrap_or_else(|_| "[]".into())
}
