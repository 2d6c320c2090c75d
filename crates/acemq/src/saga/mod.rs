//! Sagas: named async steps run in order, each with an optional compensation that undoes
//! it; when a step fails, the steps that completed are compensated in reverse order.
//!
//! This module owns the in-process saga of the AceMQ family: the builder
//! ([`Saga::named`] → [`SagaBuilder`]) and its refusals ([`SagaError`]), running it
//! ([`Saga::run`] → [`SagaResult`]), and the compensation phase: each compensation retried
//! under a bounded policy ([`SagaOptions`]), the phase bounded by a deadline, run on a task
//! of its own so that **dropping the future returned by `run` never skips a
//! compensation**, and reported through metrics (`acemq.saga.*`) and `tracing` events.
//! Nothing is published and no header is set: like every member's saga it has no wire
//! contract. `docs/patterns.md` (§ Sagas) compares it with the other members.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::Mutex;
//! use acemq::saga::Saga;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), acemq::saga::SagaError> {
//! struct Order { id: u32, log: Mutex<Vec<String>> }
//! impl Order {
//!     fn note(&self, what: &str) { self.log.lock().unwrap().push(format!("{what} {}", self.id)) }
//! }
//!
//! let booking = Saga::<Order>::named("booking")
//!     .step("reserve-stock", |o: Arc<Order>| async move { o.note("reserve"); Ok(()) })
//!     .compensate_with(|o: Arc<Order>| async move { o.note("release"); Ok(()) })
//!     .step("charge", |o: Arc<Order>| async move { o.note("charge"); Err("card declined".into()) })
//!     .compensate_with(|o: Arc<Order>| async move { o.note("refund"); Ok(()) })
//!     .build()?;
//!
//! let order = Arc::new(Order { id: 7, log: Mutex::default() });
//! let result = booking.run(order.clone()).await;
//! assert_eq!(result.failed_at(), Some("charge"));
//! assert_eq!(result.completed(), ["reserve-stock"]);
//! assert!(!result.has_unresolved());
//! // The failing step is not compensated; the completed one is.
//! assert_eq!(*order.log.lock().unwrap(), ["reserve 7", "charge 7", "release 7"]);
//! # Ok(()) }
//! ```
//!
//! **Why steps take an `Arc<T>`.** A step is `Fn(Arc<T>) -> impl Future<Output =
//! Result<(), StepError>>` and its future must be `Send + 'static`: when the caller drops
//! the saga's future, the compensations run on a detached tokio task, which must own the
//! subject, so the subject is shared, never borrowed. [`Saga::run`] takes a `T` or an
//! `Arc<T>`. A step's error is a [`StepError`] (a boxed error), so `?` works on any error
//! type and `Err("text".into())` is enough.
//!
//! **Semantics** (the family's): steps in order; on failure the *completed* steps are
//! compensated, most recent first; the failing step is not compensated; a step without a
//! compensation is skipped; a failing compensation does not stop the others and lands in
//! [`SagaResult::unresolved`]. A panic in a step or compensation is a failure, caught.
//!
//! **Beyond the family**: compensations are retried ([`SagaOptions::compensation_retry`],
//! 3 attempts from 100 ms, doubling) before being declared unresolved; the compensation
//! phase always runs on its own task, bounded by [`SagaOptions::compensation_deadline`]
//! (30 s), and finishes even when nobody awaits it (then its result goes to the log, the
//! metrics and [`SagaOptions::on_detached`]). A step interrupted by the drop counts as not
//! completed and is not compensated. Not durable: a crash or a runtime shutdown mid-saga
//! leaves it half-applied.
//!
//! Metrics: `acemq.saga.total{saga,outcome=completed|compensated|unresolved}`,
//! `acemq.saga.compensating.total{saga}`, `acemq.saga.unresolved.total{saga}` (one per
//! unresolved step). Events: `info` when a saga completes or is fully compensated, `warn`
//! when a step fails, a compensation attempt fails or a future is dropped mid-run, `error`
//! for each unresolved step.

mod compensate;
mod options;
mod result;
mod run;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

pub use options::{MAX_COMPENSATION_BACKOFF, SagaOptions};
pub use result::{SagaResult, StepFailure};

/// The error a step or a compensation returns: any error, boxed (`?` converts into it).
///
/// ```
/// let e: acemq::saga::StepError = "out of stock".into();
/// assert_eq!(e.to_string(), "out of stock");
/// ```
pub type StepError = Box<dyn std::error::Error + Send + Sync>;

type Action<T> = Box<dyn Fn(Arc<T>) -> BoxFuture<'static, Result<(), StepError>> + Send + Sync>;

fn erase<T, F, Fut>(f: F) -> Action<T>
where
    F: Fn(Arc<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), StepError>> + Send + 'static,
{
    Box::new(move |subject| f(subject).boxed())
}

/// A saga the builder refused, saying what to do instead.
///
/// ```
/// use std::sync::Arc;
/// use acemq::saga::{Saga, SagaError};
/// let e = Saga::<()>::named("booking").build().unwrap_err();
/// assert!(matches!(e, SagaError::NoSteps { .. }));
/// assert!(e.to_string().contains("add at least one"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SagaError {
    /// `build()` with no step.
    #[error("saga {saga:?} has no steps: add at least one with .step(name, action) before build()")]
    NoSteps {
        /// The saga.
        saga: String,
    },
    /// Two steps with one name.
    #[error(
        "saga {saga:?} already has a step called {step:?}: names identify a step in the compensation report, give each step its own"
    )]
    DuplicateStep {
        /// The saga.
        saga: String,
        /// The name used twice.
        step: String,
    },
    /// `compensate_with` before any `step`.
    #[error(
        "saga {saga:?}: compensate_with was called before any step; call .step(name, action) first, then .compensate_with(undo) right after it"
    )]
    CompensationBeforeStep {
        /// The saga.
        saga: String,
    },
    /// A second `compensate_with` for one step.
    #[error(
        "saga {saga:?}: step {step:?} already has a compensation; a step has at most one (did you forget a .step(..) between the two compensate_with calls?)"
    )]
    DuplicateCompensation {
        /// The saga.
        saga: String,
        /// The step.
        step: String,
    },
    /// `Saga::named("")`.
    #[error(
        "a saga needs a name (it tags its logs and metrics): pass a non-empty name to Saga::named"
    )]
    EmptySagaName,
    /// A step named `""`.
    #[error(
        "saga {saga:?}: step number {position} has an empty name; give every step a non-empty name"
    )]
    EmptyStepName {
        /// The saga.
        saga: String,
        /// The step's position, from 1.
        position: usize,
    },
}

struct Step<T> {
    name: String,
    action: Action<T>,
    compensation: Option<Action<T>>,
}

struct Inner<T> {
    name: String,
    steps: Vec<Step<T>>,
    options: SagaOptions,
}

/// A built saga: cheap to clone, run as many times as you like, each run with its own
/// subject.
///
/// ```
/// use std::sync::Arc;
/// use acemq::saga::Saga;
/// let saga = Saga::<String>::named("greet")
///     .step("hello", |who: Arc<String>| async move { println!("hello {who}"); Ok(()) })
///     .build()
///     .unwrap();
/// assert_eq!(saga.name(), "greet");
/// assert_eq!(saga.step_names().collect::<Vec<_>>(), ["hello"]);
/// ```
pub struct Saga<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for Saga<T> {
    fn clone(&self) -> Self {
        Saga {
            inner: self.inner.clone(),
        }
    }
}

impl<T> fmt::Debug for Saga<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Saga")
            .field("name", &self.inner.name)
            .field("steps", &self.step_names().collect::<Vec<_>>())
            .field("options", &self.inner.options)
            .finish()
    }
}

impl<T> Saga<T> {
    /// Starts a builder for a saga called `name` (it tags logs, metrics and results).
    ///
    /// ```
    /// use std::sync::Arc;
    /// let saga = acemq::saga::Saga::<u64>::named("transfer")
    ///     .step("debit", |_amount: Arc<u64>| async { Ok(()) })
    ///     .build();
    /// assert!(saga.is_ok());
    /// ```
    pub fn named(name: impl Into<String>) -> SagaBuilder<T> {
        let name = name.into();
        let refused = name.is_empty().then_some(SagaError::EmptySagaName);
        SagaBuilder {
            name,
            steps: Vec::new(),
            options: SagaOptions::default(),
            refused,
        }
    }

    /// The saga's name.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// let saga = acemq::saga::Saga::<()>::named("n").step("s", |_: Arc<()>| async { Ok(()) }).build().unwrap();
    /// assert_eq!(saga.name(), "n");
    /// ```
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The step names, in order.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// let saga = acemq::saga::Saga::<()>::named("n")
    ///     .step("a", |_: Arc<()>| async { Ok(()) })
    ///     .step("b", |_: Arc<()>| async { Ok(()) })
    ///     .build().unwrap();
    /// assert_eq!(saga.step_names().collect::<Vec<_>>(), ["a", "b"]);
    /// ```
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.inner.steps.iter().map(|s| s.name.as_str())
    }
}

impl<T: Send + Sync + 'static> Saga<T> {
    /// Runs the steps on `subject` (a `T` or an `Arc<T>`), compensating in reverse if one
    /// fails. Never fails for a step failure: the [`SagaResult`] says what happened.
    ///
    /// The future is `Send + 'static` (spawn it if you like) and cancellation-safe: if it is
    /// dropped mid-run, the step running is cancelled (and not compensated) and the
    /// completed steps are compensated on a detached tokio task, under the same retry
    /// policy and deadline, reported to [`SagaOptions::on_detached`], the log and the
    /// metrics. Must be polled inside a tokio runtime.
    ///
    /// ```
    /// use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let saga = acemq::saga::Saga::<u32>::named("double")
    ///     .step("check", |n: Arc<u32>| async move {
    ///         if *n > 10 { return Err(format!("{n} is too big").into()) }
    ///         Ok(())
    ///     })
    ///     .build()
    ///     .unwrap();
    /// assert!(saga.run(3).await.is_complete());
    /// assert_eq!(saga.run(Arc::new(11)).await.failed_at(), Some("check"));
    /// # }
    /// ```
    pub fn run(
        &self,
        subject: impl Into<Arc<T>>,
    ) -> impl Future<Output = SagaResult> + Send + 'static {
        run::forward(self.inner.clone(), subject.into())
    }
}

/// Collects the steps of a [`Saga`]; made by [`Saga::named`]. A refusal is remembered and
/// returned by [`build`](SagaBuilder::build), so the calls chain.
///
/// ```
/// use std::sync::Arc;
/// use acemq::saga::{Saga, SagaError, SagaOptions};
/// let e = Saga::<()>::named("s")
///     .options(SagaOptions::default())
///     .compensate_with(|_: Arc<()>| async { Ok(()) })
///     .step("a", |_: Arc<()>| async { Ok(()) })
///     .build()
///     .unwrap_err();
/// assert!(matches!(e, SagaError::CompensationBeforeStep { .. }));
/// ```
pub struct SagaBuilder<T> {
    name: String,
    steps: Vec<Step<T>>,
    options: SagaOptions,
    refused: Option<SagaError>,
}

impl<T> fmt::Debug for SagaBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SagaBuilder")
            .field("name", &self.name)
            .field("steps", &self.steps.len())
            .field("refused", &self.refused)
            .finish()
    }
}

impl<T> SagaBuilder<T> {
    fn refuse(&mut self, error: SagaError) {
        self.refused.get_or_insert(error);
    }

    /// Adds a step, with no compensation until [`compensate_with`](Self::compensate_with)
    /// gives it one. No compensation is right for a step that changes nothing, and a
    /// mistake for one that does.
    ///
    /// ```
    /// use std::sync::Arc;
    /// let b = acemq::saga::Saga::<()>::named("s")
    ///     .step("read-config", |_: Arc<()>| async { Ok(()) });
    /// assert!(b.build().is_ok());
    /// ```
    pub fn step<F, Fut>(mut self, name: impl Into<String>, action: F) -> Self
    where
        F: Fn(Arc<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        let name = name.into();
        if name.is_empty() {
            let position = self.steps.len() + 1;
            let saga = self.name.clone();
            self.refuse(SagaError::EmptyStepName { saga, position });
        } else if self.steps.iter().any(|s| s.name == name) {
            let saga = self.name.clone();
            self.refuse(SagaError::DuplicateStep {
                saga,
                step: name.clone(),
            });
        }
        self.steps.push(Step {
            name,
            action: erase(action),
            compensation: None,
        });
        self
    }

    /// Gives the step added last its compensation: what undoes it. Retried (see
    /// [`SagaOptions::compensation_retry`]), so it must be safe to run more than once.
    ///
    /// ```
    /// use std::sync::Arc;
    /// let b = acemq::saga::Saga::<()>::named("s")
    ///     .step("reserve", |_: Arc<()>| async { Ok(()) })
    ///     .compensate_with(|_: Arc<()>| async { Ok(()) });
    /// assert!(b.build().is_ok());
    /// ```
    pub fn compensate_with<F, Fut>(mut self, compensation: F) -> Self
    where
        F: Fn(Arc<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        let saga = self.name.clone();
        match self.steps.last_mut() {
            None => self.refuse(SagaError::CompensationBeforeStep { saga }),
            Some(last) if last.compensation.is_some() => {
                let step = last.name.clone();
                self.refuse(SagaError::DuplicateCompensation { saga, step });
            }
            Some(last) => last.compensation = Some(erase(compensation)),
        }
        self
    }

    /// How the saga compensates (retries, deadline, the detached hook).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use acemq::saga::{Saga, SagaOptions};
    /// let saga = Saga::<()>::named("s")
    ///     .options(SagaOptions::default().compensation_deadline(std::time::Duration::from_secs(5)))
    ///     .step("a", |_: Arc<()>| async { Ok(()) })
    ///     .build();
    /// assert!(saga.is_ok());
    /// ```
    pub fn options(mut self, options: SagaOptions) -> Self {
        self.options = options;
        self
    }

    /// The saga, or the first refusal: no steps, an empty or duplicate name,
    /// `compensate_with` before any step or twice for one.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use acemq::saga::{Saga, SagaError};
    /// let e = Saga::<()>::named("s")
    ///     .step("a", |_: Arc<()>| async { Ok(()) })
    ///     .step("a", |_: Arc<()>| async { Ok(()) })
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(e, SagaError::DuplicateStep { saga: "s".into(), step: "a".into() });
    /// ```
    pub fn build(self) -> Result<Saga<T>, SagaError> {
        if let Some(e) = self.refused {
            return Err(e);
        }
        if self.steps.is_empty() {
            return Err(SagaError::NoSteps { saga: self.name });
        }
        Ok(Saga {
            inner: Arc::new(Inner {
                name: self.name,
                steps: self.steps,
                options: self.options,
            }),
        })
    }
}
