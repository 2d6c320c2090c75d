//! The forward path: the steps in order, in the caller's task, with a guard that hands the
//! completed steps to a detached compensation task if the caller drops the future.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use super::compensate::{self, Failed};
use super::{Action, Inner, SagaResult, StepFailure};
use crate::util::panic_text;

/// Calls a step or a compensation once; an error or a panic (while making the future or
/// while polling it) is a [`StepFailure`].
pub(super) async fn call<T>(action: &Action<T>, subject: Arc<T>) -> Result<(), StepFailure> {
    let future = match std::panic::catch_unwind(AssertUnwindSafe(|| action(subject))) {
        Ok(future) => future,
        Err(panic) => return Err(StepFailure::Panicked(panic_text(&*panic))),
    };
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(StepFailure::Failed(e)),
        Err(panic) => Err(StepFailure::Panicked(panic_text(&*panic))),
    }
}

/// Armed while the steps run: dropped armed (the caller dropped the future, or something
/// unwound), it compensates the completed steps on a task of its own.
struct Abandon<T: Send + Sync + 'static> {
    saga: Arc<Inner<T>>,
    subject: Arc<T>,
    completed: Vec<usize>,
    at: usize,
    armed: bool,
}

impl<T: Send + Sync + 'static> Drop for Abandon<T> {
    fn drop(&mut self) {
        if self.armed {
            let failed = Failed {
                at: self.at,
                failure: StepFailure::Abandoned,
                completed: std::mem::take(&mut self.completed),
            };
            compensate::detach(self.saga.clone(), self.subject.clone(), failed);
        }
    }
}

pub(super) async fn forward<T: Send + Sync + 'static>(
    saga: Arc<Inner<T>>,
    subject: Arc<T>,
) -> SagaResult {
    let mut guard = Abandon {
        saga: saga.clone(),
        subject: subject.clone(),
        completed: Vec::with_capacity(saga.steps.len()),
        at: 0,
        armed: true,
    };
    for (i, step) in saga.steps.iter().enumerate() {
        guard.at = i;
        match call(&step.action, subject.clone()).await {
            Ok(()) => {
                tracing::debug!(saga = %saga.name, step = %step.name, "saga step completed");
                guard.completed.push(i);
            }
            Err(failure) => {
                tracing::warn!(
                    saga = %saga.name, step = %step.name, error = %failure,
                    "saga step failed; compensating the completed steps"
                );
                guard.armed = false;
                let failed = Failed {
                    at: i,
                    failure,
                    completed: std::mem::take(&mut guard.completed),
                };
                return compensate::attached(saga.clone(), subject.clone(), failed).await;
            }
        }
    }
    guard.armed = false;
    let result = SagaResult {
        saga: saga.name.clone(),
        failed_at: None,
        failure: None,
        completed: saga.steps.iter().map(|s| s.name.clone()).collect(),
        unresolved: Vec::new(),
        unresolved_why: Vec::new(),
    };
    compensate::report(&result);
    result
}
