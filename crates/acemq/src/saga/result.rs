//! What a saga did ([`SagaResult`]) and why a step or compensation failed ([`StepFailure`]).

use std::fmt;

use super::StepError;

/// Why a step (or one attempt of a compensation) did not succeed.
///
/// ```
/// use acemq::saga::StepFailure;
/// let f = StepFailure::Panicked("index out of bounds".into());
/// assert_eq!(f.to_string(), "panicked: index out of bounds");
/// assert_eq!(StepFailure::Failed("card declined".into()).to_string(), "card declined");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepFailure {
    /// It returned an error.
    #[error("{0}")]
    Failed(StepError),
    /// It panicked; the panic's message. Caught, never re-raised.
    #[error("panicked: {0}")]
    Panicked(String),
    /// The future returned by [`Saga::run`](super::Saga::run) was dropped while this step
    /// ran: the step was cancelled, counts as not completed, and is not compensated.
    #[error("abandoned: the saga's future was dropped while this step ran")]
    Abandoned,
    /// The task running the compensations ended before it reported (its runtime shut
    /// down); what it did not confirm is listed as unresolved.
    #[error("lost: the saga's compensation task ended before it reported ({0})")]
    Lost(String),
    /// The compensation deadline ([`SagaOptions::compensation_deadline`]) passed before
    /// this compensation succeeded (while it ran, or before it could start).
    ///
    /// [`SagaOptions::compensation_deadline`]: super::SagaOptions::compensation_deadline
    #[error("the compensation deadline passed")]
    DeadlinePassed,
}

/// What a saga did. Returned, never an error: a failed saga is an outcome the caller acts
/// on, and [`unresolved`](SagaResult::unresolved) is the part that matters.
///
/// ```
/// use std::sync::Arc;
/// use acemq::saga::Saga;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), acemq::saga::SagaError> {
/// let saga = Saga::<u32>::named("doc")
///     .step("one", |_n: Arc<u32>| async { Ok(()) })
///     .step("two", |_n: Arc<u32>| async { Err("no".into()) })
///     .build()?;
/// let r = saga.run(1).await;
/// assert!(!r.is_complete() && r.compensated());
/// assert_eq!(r.failed_at(), Some("two"));
/// assert_eq!(r.failure().map(|f| f.to_string()).as_deref(), Some("no"));
/// assert_eq!(r.completed(), ["one"]);
/// assert!(!r.has_unresolved());
/// assert_eq!(r.to_string(), "SagaResult{doc failed at two (no), compensated [one]}");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SagaResult {
    pub(super) saga: String,
    pub(super) failed_at: Option<String>,
    pub(super) failure: Option<StepFailure>,
    pub(super) completed: Vec<String>,
    pub(super) unresolved: Vec<String>,
    /// Why each of `unresolved` was left (its last attempt's failure), in the same order.
    pub(super) unresolved_why: Vec<StepFailure>,
}

impl SagaResult {
    /// The saga's name.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let saga = acemq::saga::Saga::<()>::named("doc")
    ///     .step("only", |_: Arc<()>| async { Ok(()) }).build().unwrap();
    /// assert_eq!(saga.run(()).await.saga(), "doc");
    /// # }
    /// ```
    pub fn saga(&self) -> &str {
        &self.saga
    }

    /// Whether every step ran.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let saga = acemq::saga::Saga::<()>::named("doc")
    ///     .step("only", |_: Arc<()>| async { Ok(()) }).build().unwrap();
    /// let r = saga.run(()).await;
    /// assert!(r.is_complete() && !r.compensated());
    /// assert_eq!(r.to_string(), "SagaResult{doc completed: only}");
    /// # }
    /// ```
    pub fn is_complete(&self) -> bool {
        self.failed_at.is_none()
    }

    /// Whether a step failed and the completed steps were compensated, as Java's
    /// `compensated()`: true even when some compensation failed, so check
    /// [`has_unresolved`](SagaResult::has_unresolved) too.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let saga = acemq::saga::Saga::<()>::named("doc")
    ///     .step("only", |_: Arc<()>| async { Err("no".into()) }).build().unwrap();
    /// assert!(saga.run(()).await.compensated());
    /// # }
    /// ```
    pub fn compensated(&self) -> bool {
        self.failed_at.is_some()
    }

    /// The step that failed (or was running when the saga's future was dropped).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let saga = acemq::saga::Saga::<()>::named("doc")
    ///     .step("only", |_: Arc<()>| async { Err("no".into()) }).build().unwrap();
    /// assert_eq!(saga.run(()).await.failed_at(), Some("only"));
    /// # }
    /// ```
    pub fn failed_at(&self) -> Option<&str> {
        self.failed_at.as_deref()
    }

    /// Why that step failed.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use acemq::saga::StepFailure;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let saga = acemq::saga::Saga::<()>::named("doc")
    ///     .step("only", |_: Arc<()>| async { panic!("boom") }).build().unwrap();
    /// let r = saga.run(()).await;
    /// assert!(matches!(r.failure(), Some(StepFailure::Panicked(m)) if m == "boom"));
    /// # }
    /// ```
    pub fn failure(&self) -> Option<&StepFailure> {
        self.failure.as_ref()
    }

    /// The steps that completed, in the order they ran (all of them when the saga is
    /// complete; the failing step is not among them).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let saga = acemq::saga::Saga::<()>::named("doc")
    ///     .step("a", |_: Arc<()>| async { Ok(()) })
    ///     .step("b", |_: Arc<()>| async { Ok(()) }).build().unwrap();
    /// assert_eq!(saga.run(()).await.completed(), ["a", "b"]);
    /// # }
    /// ```
    pub fn completed(&self) -> &[String] {
        &self.completed
    }

    /// The steps whose compensation did not succeed within its attempts and the deadline,
    /// in the order compensation was attempted (most recent step first). **This is the list
    /// to alert on**: effects that happened, were meant to be undone, and were not; a person
    /// has to reconcile them.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use acemq::saga::{Saga, SagaOptions};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let saga = Saga::<()>::named("doc")
    ///     .step("a", |_: Arc<()>| async { Ok(()) })
    ///     .compensate_with(|_: Arc<()>| async { Err("still broken".into()) })
    ///     .step("b", |_: Arc<()>| async { Err("no".into()) })
    ///     .build().unwrap();
    /// let r = saga.run(()).await;
    /// assert_eq!(r.unresolved(), ["a"]);
    /// assert!(r.to_string().contains("UNRESOLVED [a]"));
    /// # }
    /// ```
    pub fn unresolved(&self) -> &[String] {
        &self.unresolved
    }

    /// Why an unresolved step was left: the failure of its compensation's last attempt, or
    /// [`StepFailure::DeadlinePassed`]. `None` for a step that is not unresolved.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use acemq::saga::{Saga, SagaOptions};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let saga = Saga::<()>::named("doc")
    ///     .step("a", |_: Arc<()>| async { Ok(()) })
    ///     .compensate_with(|_: Arc<()>| async { Err("inventory down".into()) })
    ///     .step("b", |_: Arc<()>| async { Err("no".into()) })
    ///     .build().unwrap();
    /// let r = saga.run(()).await;
    /// assert_eq!(r.unresolved_reason("a").map(|f| f.to_string()).as_deref(), Some("inventory down"));
    /// assert!(r.unresolved_reason("b").is_none());
    /// # }
    /// ```
    pub fn unresolved_reason(&self, step: &str) -> Option<&StepFailure> {
        let i = self.unresolved.iter().position(|s| s == step)?;
        self.unresolved_why.get(i)
    }

    /// Whether anything was left in a state nobody intended.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let saga = acemq::saga::Saga::<()>::named("doc")
    ///     .step("a", |_: Arc<()>| async { Ok(()) }).build().unwrap();
    /// assert!(!saga.run(()).await.has_unresolved());
    /// # }
    /// ```
    pub fn has_unresolved(&self) -> bool {
        !self.unresolved.is_empty()
    }

    /// The `outcome` tag of `acemq.saga.total`.
    pub(super) fn outcome(&self) -> &'static str {
        if self.is_complete() {
            "completed"
        } else if self.has_unresolved() {
            "unresolved"
        } else {
            "compensated"
        }
    }
}

/// Java's `SagaResult.toString` shape, with the failure's text added:
/// `SagaResult{booking completed: a -> b}` or
/// `SagaResult{booking failed at c (why), compensated [a, b], UNRESOLVED [a]}`.
impl fmt::Display for SagaResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.failed_at {
            None => write!(
                f,
                "SagaResult{{{} completed: {}}}",
                self.saga,
                self.completed.join(" -> ")
            ),
            Some(at) => {
                write!(f, "SagaResult{{{} failed at {at}", self.saga)?;
                if let Some(why) = &self.failure {
                    write!(f, " ({why})")?;
                }
                write!(f, ", compensated [{}]", self.completed.join(", "))?;
                if !self.unresolved.is_empty() {
                    write!(f, ", UNRESOLVED [{}]", self.unresolved.join(", "))?;
                }
                f.write_str("}")
            }
        }
    }
}
