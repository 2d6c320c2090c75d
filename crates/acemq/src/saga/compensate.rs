//! The compensation phase: the completed steps undone most recent first, each retried
//! under the saga's policy, the whole phase bounded by its deadline, always on a task of
//! its own so that nobody dropping a future can stop it halfway; and the reporting
//! (metrics, events, the detached hook).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::run::call;
use super::{Inner, SagaResult, Step, StepFailure};
use crate::observe::metrics::{
    SAGA_COMPENSATING_TOTAL, SAGA_TOTAL, SAGA_UNRESOLVED_TOTAL, TAG_OUTCOME, TAG_SAGA,
};
use crate::util::panic_text;

/// Where the forward path stopped: the step that failed (or was running when the future
/// was dropped), why, and the indexes of the steps that completed, in order.
pub(super) struct Failed {
    pub(super) at: usize,
    pub(super) failure: StepFailure,
    pub(super) completed: Vec<usize>,
}

/// Compensates on a task of its own and waits for it; if this future is dropped the task
/// carries on and reports to the detached hook.
pub(super) async fn attached<T: Send + Sync + 'static>(
    saga: Arc<Inner<T>>,
    subject: Arc<T>,
    failed: Failed,
) -> SagaResult {
    let fallback = lost(&saga, &failed);
    let (tx, rx) = oneshot::channel::<SagaResult>();
    let task_saga = saga.clone();
    tokio::spawn(async move {
        let result = compensate(&task_saga, &subject, failed).await;
        report(&result);
        if let Err(result) = tx.send(result) {
            tell_detached(&task_saga, &result);
        }
    });
    match rx.await {
        Ok(result) => result,
        Err(_) => {
            tracing::error!(saga = %saga.name, "saga compensation task ended before reporting");
            report(&fallback);
            fallback
        }
    }
}

/// The caller dropped the saga's future mid-run: compensates the completed steps on a
/// detached task (or, with no runtime to run on, declares them unresolved).
pub(super) fn detach<T: Send + Sync + 'static>(
    saga: Arc<Inner<T>>,
    subject: Arc<T>,
    failed: Failed,
) {
    let step = saga.steps.get(failed.at).map(|s| s.name.as_str());
    tracing::warn!(
        saga = %saga.name, step = step.unwrap_or(""), completed = failed.completed.len(),
        "saga future dropped mid-run; compensating the completed steps on a task of its own"
    );
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                let result = compensate(&saga, &subject, failed).await;
                report(&result);
                tell_detached(&saga, &result);
            });
        }
        Err(_) => {
            tracing::error!(
                saga = %saga.name,
                "saga future dropped outside a tokio runtime: nothing to compensate on"
            );
            let result = lost(&saga, &failed);
            report(&result);
            tell_detached(&saga, &result);
        }
    }
}

const LOST: &str = "no tokio runtime ran the compensations to their end";

/// What to report when the compensations could not run or did not report: every completed
/// step with a compensation is unresolved, since nobody confirmed it was undone.
fn lost<T>(saga: &Inner<T>, failed: &Failed) -> SagaResult {
    let unresolved: Vec<String> = failed
        .completed
        .iter()
        .rev()
        .filter_map(|&i| saga.steps.get(i))
        .filter(|s| s.compensation.is_some())
        .map(|s| s.name.clone())
        .collect();
    SagaResult {
        saga: saga.name.clone(),
        failed_at: saga.steps.get(failed.at).map(|s| s.name.clone()),
        failure: Some(StepFailure::Lost(LOST.to_owned())),
        completed: names(saga, &failed.completed),
        unresolved: unresolved.clone(),
        unresolved_why: unresolved
            .iter()
            .map(|_| StepFailure::Lost(LOST.to_owned()))
            .collect(),
    }
}

fn names<T>(saga: &Inner<T>, indexes: &[usize]) -> Vec<String> {
    indexes
        .iter()
        .filter_map(|&i| saga.steps.get(i))
        .map(|s| s.name.clone())
        .collect()
}

async fn compensate<T>(saga: &Inner<T>, subject: &Arc<T>, failed: Failed) -> SagaResult {
    metrics::counter!(SAGA_COMPENSATING_TOTAL, TAG_SAGA => saga.name.clone()).increment(1);
    let deadline = Instant::now() + saga.options.deadline();
    let mut unresolved = Vec::new();
    let mut unresolved_why = Vec::new();
    for &i in failed.completed.iter().rev() {
        let Some(step) = saga.steps.get(i) else {
            continue;
        };
        if step.compensation.is_none() {
            tracing::debug!(saga = %saga.name, step = %step.name, "saga step has no compensation");
            continue;
        }
        if let Err(why) = undo(saga, step, subject, deadline).await {
            unresolved.push(step.name.clone());
            unresolved_why.push(why);
        }
    }
    SagaResult {
        saga: saga.name.clone(),
        failed_at: saga.steps.get(failed.at).map(|s| s.name.clone()),
        failure: Some(failed.failure),
        completed: names(saga, &failed.completed),
        unresolved,
        unresolved_why,
    }
}

/// One step's compensation under the retry policy and the deadline: `Err` with the last
/// failure when it did not succeed.
async fn undo<T>(
    saga: &Inner<T>,
    step: &Step<T>,
    subject: &Arc<T>,
    deadline: Instant,
) -> Result<(), StepFailure> {
    let Some(compensation) = &step.compensation else {
        return Ok(());
    };
    let mut last = StepFailure::DeadlinePassed;
    let attempts = saga.options.attempts();
    for attempt in 1..=attempts {
        if Instant::now() >= deadline {
            last = StepFailure::DeadlinePassed;
            break;
        }
        match timeout_at(deadline, call(compensation, subject.clone())).await {
            Ok(Ok(())) => {
                tracing::debug!(saga = %saga.name, step = %step.name, attempt, "saga step compensated");
                return Ok(());
            }
            Ok(Err(failure)) => {
                tracing::warn!(
                    saga = %saga.name, step = %step.name, attempt, attempts, error = %failure,
                    "saga compensation attempt failed"
                );
                last = failure;
            }
            Err(_) => {
                last = StepFailure::DeadlinePassed;
                break;
            }
        }
        if attempt < attempts {
            let next = Instant::now() + saga.options.backoff_after(attempt);
            sleep_until(next.min(deadline)).await;
        }
    }
    tracing::error!(
        saga = %saga.name, step = %step.name, attempts, error = %last,
        deadline = ?saga.options.deadline(),
        "saga compensation UNRESOLVED: it failed every attempt or ran out of time; a person must reconcile this step"
    );
    Err(last)
}

/// Counts and logs a finished saga.
pub(super) fn report(result: &SagaResult) {
    let saga = result.saga.clone();
    metrics::counter!(SAGA_TOTAL, TAG_SAGA => saga.clone(), TAG_OUTCOME => result.outcome())
        .increment(1);
    if result.has_unresolved() {
        metrics::counter!(SAGA_UNRESOLVED_TOTAL, TAG_SAGA => saga)
            .increment(result.unresolved.len() as u64);
        tracing::error!(saga = %result.saga, unresolved = ?result.unresolved, %result, "saga left steps unresolved");
    } else if result.is_complete() {
        tracing::info!(saga = %result.saga, "saga completed");
    } else {
        tracing::info!(saga = %result.saga, %result, "saga compensated");
    }
}

fn tell_detached<T>(saga: &Inner<T>, result: &SagaResult) {
    if let Some(hook) = saga.options.detached_hook()
        && let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| hook(result)))
    {
        tracing::error!(saga = %saga.name, panic = %panic_text(&*panic), "saga on_detached hook panicked");
    }
}
