//! Driving a saga from where its log says to an end: a forward step in its transaction
//! with the log entry, the failure, each compensation in reverse, the lease kept while a
//! step runs, and taking over the sagas a process left behind.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use acemq::observe::metrics::{
    SAGA_COMPENSATING_TOTAL, SAGA_TOTAL, SAGA_UNRESOLVED_TOTAL, TAG_OUTCOME, TAG_SAGA,
};
use acemq::saga::{MAX_COMPENSATION_BACKOFF, StepError};
use futures::FutureExt;
use serde::de::DeserializeOwned;

use super::sql::{Arg, SagaDatabase, SagaRow};
use super::{Action, Inner, SagaState, SagaStatus, SagaTx};
use crate::pool::is_sqlx_contention as contention;
use crate::{Error, millis, now_millis};

/// How often a step is run again when the database refused its commit on contention.
const CONTENTION_RERUNS: u32 = 5;
/// Sagas taken per query of a recovery pass.
const RECOVERY_BATCH: i64 = 100;
/// The longest text kept in `last_error`.
const LAST_ERROR_MAX_CHARS: usize = 1000;

pub(super) fn interrupted(id: &str, e: Error) -> Error {
    match e {
        Error::Database(source) => Error::SagaInterrupted {
            id: id.to_owned(),
            source: Box::new(source),
        },
        other => other,
    }
}

/// What became of one attempt at a step or compensation.
enum Attempt {
    /// Committed with its log entry.
    Applied,
    /// The step (or compensation) said no, or panicked: its transaction rolled back.
    Refused(String),
}

/// Why a step's error is not the step's: the database went away under it (leave the saga
/// to recovery), or refused on contention (run it again).
enum Blame {
    Step,
    Contention,
    Database,
}

fn blame(e: &StepError) -> Blame {
    let db = e
        .downcast_ref::<sqlx::Error>()
        .or_else(|| match e.downcast_ref::<Error>() {
            Some(Error::Database(db)) => Some(db),
            _ => None,
        });
    match db {
        Some(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => {
            Blame::Database
        }
        Some(db) if contention(db) => Blame::Contention,
        _ => Blame::Step,
    }
}

/// Counts one more rerun after a contention refusal; whether it is within
/// [`CONTENTION_RERUNS`].
fn rerun_allowed(reruns: &mut u32) -> bool {
    *reruns += 1;
    *reruns <= CONTENTION_RERUNS
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".into())
}

fn clip(text: String) -> String {
    if text.chars().count() <= LAST_ERROR_MAX_CHARS {
        text
    } else {
        text.chars().take(LAST_ERROR_MAX_CHARS).collect()
    }
}

/// Calls a step or compensation; a panic (making the future or polling it) is its error.
async fn call<DB: SagaDatabase, T>(
    action: &Action<DB, T>,
    subject: Arc<T>,
    tx: SagaTx<DB>,
) -> Result<SagaTx<DB>, StepError> {
    let future = match std::panic::catch_unwind(AssertUnwindSafe(|| action(subject, tx))) {
        Ok(future) => future,
        Err(panic) => return Err(format!("panicked: {}", panic_text(&*panic)).into()),
    };
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(format!("panicked: {}", panic_text(&*panic)).into()),
    }
}

impl<DB: SagaDatabase, T> Inner<DB, T> {
    fn lease_until(&self) -> i64 {
        now_millis().saturating_add(millis(self.lease))
    }

    fn tag(&self) -> String {
        self.name.clone()
    }

    /// Runs one log statement on a pool connection, again on contention.
    async fn on_pool(&self, sql: &Arc<str>, args: impl Fn() -> Vec<Arg>) -> Result<u64, Error> {
        crate::pool::retry_contention(|| async {
            let mut conn = self.pool.acquire().await?;
            Ok(DB::execute(&mut conn, sql.clone(), args()).await?)
        })
        .await
    }

    /// Runs one guarded log statement that moves the saga `id` on a pool connection: a
    /// database failure interrupts the saga, no row changed means another process has it.
    async fn move_row(
        &self,
        id: &str,
        sql: &Arc<str>,
        args: impl Fn() -> Vec<Arg>,
    ) -> Result<(), Error> {
        match self.on_pool(sql, args).await {
            Ok(0) => Err(Error::SagaTakenOver { id: id.to_owned() }),
            Ok(_) => Ok(()),
            Err(e) => Err(interrupted(id, e)),
        }
    }

    /// Runs `action` (or, with `None`, nothing) in a fresh transaction and commits it with
    /// the guarded log statement `log`, keeping the lease while it runs. Reruns it when
    /// the database refused on contention.
    async fn attempt(
        &self,
        id: &str,
        applied: usize,
        action: Option<&Action<DB, T>>,
        subject: &Arc<T>,
        log: &Arc<str>,
        log_args: impl Fn() -> Vec<Arg>,
    ) -> Result<Attempt, Error> {
        let mut reruns = 0;
        loop {
            let tx = self
                .pool
                .begin()
                .await
                .map_err(|e| interrupted(id, e.into()))?;
            let mut tx = match action {
                None => tx,
                Some(action) => {
                    match self
                        .keep_lease(id, applied, call(action, subject.clone(), tx))
                        .await?
                    {
                        Ok(tx) => tx,
                        Err(e) => match blame(&e) {
                            Blame::Step => return Ok(Attempt::Refused(clip(e.to_string()))),
                            Blame::Contention if rerun_allowed(&mut reruns) => {
                                tracing::debug!(saga = %self.name, id, error = %e, "saga step refused on contention; running it again");
                                continue;
                            }
                            Blame::Contention | Blame::Database => {
                                return Err(Error::SagaInterrupted {
                                    id: id.to_owned(),
                                    source: e,
                                });
                            }
                        },
                    }
                }
            };
            let outcome = match DB::execute(&mut *tx, log.clone(), log_args()).await {
                Ok(1) => tx.commit().await.map(|()| true),
                Ok(_) => Ok(false),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(true) => return Ok(Attempt::Applied),
                Ok(false) => return Err(Error::SagaTakenOver { id: id.to_owned() }),
                Err(e) if contention(&e) && rerun_allowed(&mut reruns) => continue,
                Err(e) => return Err(interrupted(id, e.into())),
            }
        }
    }

    /// Polls `work` while renewing the lease every third of it; a renewal that finds the
    /// saga no longer ours drops `work` (its transaction rolls back).
    async fn keep_lease<F: std::future::Future>(
        &self,
        id: &str,
        applied: usize,
        work: F,
    ) -> Result<F::Output, Error> {
        let every = self.lease / 3;
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return Ok(out),
                () = tokio::time::sleep(every) => {
                    let renewed = self.on_pool(&self.sql.renew, || vec![
                        Arg::Int(self.lease_until()),
                        Arg::Int(now_millis()),
                        Arg::Text(id.to_owned()),
                        Arg::Text(self.owner.clone()),
                        Arg::Int(applied as i64),
                    ]).await;
                    match renewed {
                        Ok(0) => return Err(Error::SagaTakenOver { id: id.to_owned() }),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(saga = %self.name, id, error = %e, "could not renew a saga's lease; carrying on"),
                    }
                }
            }
        }
    }

    fn guard(&self, id: &str, applied: usize) -> [Arg; 3] {
        [
            Arg::Text(id.to_owned()),
            Arg::Text(self.owner.clone()),
            Arg::Int(applied as i64),
        ]
    }
}

/// Drives the saga `id` (ours now, in `state` with `applied` steps applied) to an end.
pub(super) async fn drive<DB: SagaDatabase, T: Send + Sync + 'static>(
    inner: &Inner<DB, T>,
    id: &str,
    subject: Arc<T>,
    mut state: SagaState,
    mut applied: usize,
) -> Result<SagaStatus, Error> {
    let n = inner.steps.len();
    loop {
        match state {
            SagaState::Running if applied < n => {
                let step = &inner.steps[applied];
                let next = if applied + 1 == n {
                    SagaState::Completed
                } else {
                    SagaState::Running
                };
                let outcome = inner
                    .attempt(
                        id,
                        applied,
                        Some(&step.action),
                        &subject,
                        &inner.sql.advance,
                        || {
                            let mut a = vec![
                                Arg::Text(next.as_str().into()),
                                Arg::Int(inner.lease_until()),
                                Arg::Int(now_millis()),
                            ];
                            a.extend(inner.guard(id, applied));
                            a
                        },
                    )
                    .await?;
                match outcome {
                    Attempt::Applied => {
                        tracing::debug!(saga = %inner.name, id, step = %step.name, "saga step applied");
                        applied += 1;
                        state = next;
                    }
                    Attempt::Refused(why) => {
                        tracing::warn!(saga = %inner.name, id, step = %step.name, error = %why, "saga step failed; compensating the applied steps");
                        let next = if applied == 0 {
                            SagaState::Compensated
                        } else {
                            SagaState::Compensating
                        };
                        inner
                            .move_row(id, &inner.sql.fail, || {
                                let mut a = vec![
                                    Arg::Text(next.as_str().into()),
                                    Arg::Text(step.name.clone()),
                                    Arg::Text(why.clone()),
                                    Arg::Int(inner.lease_until()),
                                    Arg::Int(now_millis()),
                                ];
                                a.extend(inner.guard(id, applied));
                                a
                            })
                            .await?;
                        metrics::counter!(SAGA_COMPENSATING_TOTAL, TAG_SAGA => inner.tag())
                            .increment(1);
                        state = next;
                    }
                }
            }
            SagaState::Compensating if applied > 0 => {
                let at = applied - 1;
                let step = &inner.steps[at];
                let next = if at == 0 {
                    SagaState::Compensated
                } else {
                    SagaState::Compensating
                };
                let log_args = || {
                    let mut a = vec![
                        Arg::Text(next.as_str().into()),
                        Arg::Int(inner.lease_until()),
                        Arg::Int(now_millis()),
                    ];
                    a.extend(inner.guard(id, applied));
                    a
                };
                let mut last = String::new();
                let mut compensated = false;
                for attempt in 1..=inner.attempts {
                    match inner
                        .attempt(
                            id,
                            applied,
                            step.compensation.as_ref(),
                            &subject,
                            &inner.sql.undo,
                            log_args,
                        )
                        .await?
                    {
                        Attempt::Applied => {
                            compensated = true;
                            break;
                        }
                        Attempt::Refused(why) => {
                            tracing::warn!(saga = %inner.name, id, step = %step.name, attempt, error = %why, "saga compensation failed");
                            last = why;
                            if attempt < inner.attempts {
                                let pause = backoff_after(inner.backoff, attempt);
                                inner
                                    .keep_lease(id, applied, tokio::time::sleep(pause))
                                    .await?;
                            }
                        }
                    }
                }
                if compensated {
                    applied = at;
                    state = next;
                    continue;
                }
                tracing::error!(saga = %inner.name, id, step = %step.name, error = %last, "saga compensation did not succeed; a person has to reconcile it, then resume the saga");
                inner
                    .move_row(id, &inner.sql.unresolved, || {
                        let mut a = vec![
                            Arg::Text(format!("compensating {}: {last}", step.name)),
                            Arg::Int(now_millis()),
                        ];
                        a.extend(inner.guard(id, applied));
                        a
                    })
                    .await?;
                metrics::counter!(SAGA_UNRESOLVED_TOTAL, TAG_SAGA => inner.tag()).increment(1);
                state = SagaState::Unresolved;
            }
            _ => break,
        }
    }
    if let Some(outcome) = state.outcome() {
        metrics::counter!(SAGA_TOTAL, TAG_SAGA => inner.tag(), TAG_OUTCOME => outcome).increment(1);
        tracing::info!(saga = %inner.name, id, outcome, "saga ended");
    }
    status(inner, id).await?.ok_or_else(|| Error::SagaNotFound {
        saga: inner.name.clone(),
        id: id.to_owned(),
    })
}

fn backoff_after(first: Duration, attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(31);
    first
        .saturating_mul(1u32 << doublings)
        .min(MAX_COMPENSATION_BACKOFF)
}

fn read_status(row: SagaRow, names: &[String]) -> Result<SagaStatus, Error> {
    let corrupt = |reason: String| Error::CorruptRow {
        id: row.id.clone(),
        reason,
    };
    let state = SagaState::parse(&row.state)
        .ok_or_else(|| corrupt(format!("unknown saga state {:?}", row.state)))?;
    let applied = usize::try_from(row.applied)
        .ok()
        .filter(|&a| a <= names.len())
        .ok_or_else(|| corrupt(format!("{} steps applied of {}", row.applied, names.len())))?;
    Ok(SagaStatus {
        applied: names[..applied].to_vec(),
        id: row.id,
        saga: row.saga,
        state,
        failed_step: row.failed_step,
        last_error: row.last_error,
        created_at_millis: row.created_at,
        updated_at_millis: row.updated_at,
    })
}

fn stored_steps(row: &SagaRow) -> Result<Vec<String>, Error> {
    serde_json::from_str(&row.steps).map_err(|e| Error::CorruptRow {
        id: row.id.clone(),
        reason: format!("steps: {e}"),
    })
}

pub(super) async fn status<DB: SagaDatabase, T>(
    inner: &Inner<DB, T>,
    id: &str,
) -> Result<Option<SagaStatus>, Error> {
    let Some(row) = fetch_one(inner, id).await? else {
        return Ok(None);
    };
    let names = stored_steps(&row)?;
    read_status(row, &names).map(Some)
}

async fn fetch_one<DB: SagaDatabase, T>(
    inner: &Inner<DB, T>,
    id: &str,
) -> Result<Option<SagaRow>, Error> {
    let mut conn = inner.pool.acquire().await?;
    let rows = DB::fetch(
        &mut conn,
        inner.sql.by_id.clone(),
        vec![Arg::Text(id.into())],
    )
    .await?;
    Ok(rows.into_iter().next())
}

pub(super) async fn resume<DB: SagaDatabase, T: DeserializeOwned + Send + Sync + 'static>(
    inner: &Inner<DB, T>,
    id: &str,
) -> Result<SagaStatus, Error> {
    let not_found = || Error::SagaNotFound {
        saga: inner.name.clone(),
        id: id.to_owned(),
    };
    let row = fetch_one(inner, id)
        .await?
        .filter(|r| r.saga == inner.name)
        .ok_or_else(not_found)?;
    let stored = stored_steps(&row)?;
    if stored != inner.step_names {
        return Err(Error::SagaChanged {
            id: id.to_owned(),
            stored,
            now: inner.step_names.clone(),
        });
    }
    let status = read_status(row.clone(), &stored)?;
    let sql = match status.state {
        SagaState::Completed | SagaState::Compensated => return Ok(status),
        SagaState::Unresolved => &inner.sql.reopen,
        SagaState::Running | SagaState::Compensating => &inner.sql.claim,
    };
    let now = now_millis();
    let mut args = vec![
        Arg::Text(inner.owner.clone()),
        Arg::Int(inner.lease_until()),
        Arg::Int(now),
        Arg::Text(id.to_owned()),
        Arg::Text(inner.name.clone()),
    ];
    if status.state != SagaState::Unresolved {
        args.push(Arg::Int(now));
    }
    let mut conn = inner.pool.acquire().await?;
    let claimed = DB::execute(&mut conn, sql.clone(), args).await?;
    drop(conn);
    if claimed == 0 {
        // Someone else holds it, or it moved on since it was read: read it again.
        let row = fetch_one(inner, id).await?.ok_or_else(not_found)?;
        let now_status = read_status(row.clone(), &stored)?;
        if now_status.state.is_final() && now_status.state != SagaState::Unresolved {
            return Ok(now_status);
        }
        return Err(Error::SagaBusy {
            id: id.to_owned(),
            owner: row.owner.unwrap_or_default(),
            lease_until_millis: row.lease_until,
        });
    }
    let subject: T = serde_json::from_str(&row.subject).map_err(|e| Error::CorruptRow {
        id: id.to_owned(),
        reason: format!("subject: {e}"),
    })?;
    let state = match status.state {
        SagaState::Unresolved => SagaState::Compensating,
        s => s,
    };
    tracing::info!(saga = %inner.name, id, state = %state, applied = status.applied.len(), "resuming a saga");
    drive(inner, id, Arc::new(subject), state, status.applied.len()).await
}

pub(super) async fn recover<DB: SagaDatabase, T: DeserializeOwned + Send + Sync + 'static>(
    inner: &Inner<DB, T>,
) -> Result<Vec<SagaStatus>, Error> {
    let mut done = Vec::new();
    let mut seen = std::collections::HashSet::new();
    loop {
        let rows = {
            let mut conn = inner.pool.acquire().await?;
            DB::fetch(
                &mut conn,
                inner.sql.due.clone(),
                vec![
                    Arg::Text(inner.name.clone()),
                    Arg::Int(now_millis()),
                    Arg::Int(RECOVERY_BATCH),
                ],
            )
            .await?
        };
        let fresh: Vec<SagaRow> = rows
            .into_iter()
            .filter(|r| seen.insert(r.id.clone()))
            .collect();
        if fresh.is_empty() {
            return Ok(done);
        }
        for row in fresh {
            match resume(inner, &row.id).await {
                Ok(status) => done.push(status),
                Err(Error::SagaBusy { .. }) => {}
                Err(e) => {
                    tracing::warn!(saga = %inner.name, id = %row.id, error = %e, "could not resume a saga; the next recovery pass tries again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compensation_backoff_doubles_to_its_cap() {
        let b = Duration::from_millis(100);
        assert_eq!(backoff_after(b, 1), Duration::from_millis(100));
        assert_eq!(backoff_after(b, 2), Duration::from_millis(200));
        assert_eq!(backoff_after(b, 40), MAX_COMPENSATION_BACKOFF);
    }

    #[test]
    fn a_lost_connection_is_not_the_steps_fault() {
        let io: StepError = Box::new(sqlx::Error::Io(std::io::Error::other("reset")));
        assert!(matches!(blame(&io), Blame::Database));
        let ours: StepError = Box::new(Error::Database(sqlx::Error::PoolTimedOut));
        assert!(matches!(blame(&ours), Blame::Database));
        let business: StepError = "card declined".into();
        assert!(matches!(blame(&business), Blame::Step));
    }
}
