//! How a saga compensates: the retry policy of each compensation, the deadline of the
//! compensation phase, and the hook told about a saga whose caller went away.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::SagaResult;

/// The longest wait between two attempts of one compensation, however many there are.
pub const MAX_COMPENSATION_BACKOFF: Duration = Duration::from_secs(10);

type DetachedHook = Arc<dyn Fn(&SagaResult) + Send + Sync>;

/// How a [`Saga`](super::Saga) compensates. The defaults: each compensation tried 3 times,
/// 100 ms then 200 ms apart (doubling, at most [`MAX_COMPENSATION_BACKOFF`]), the whole
/// compensation phase bounded by 30 s.
///
/// ```
/// use std::time::Duration;
/// use acemq::saga::SagaOptions;
/// let o = SagaOptions::default()
///     .compensation_retry(5, Duration::from_millis(50))
///     .compensation_deadline(Duration::from_secs(10))
///     .on_detached(|result| eprintln!("abandoned saga finished: {result}"));
/// assert_eq!(o.attempts(), 5);
/// assert_eq!(o.backoff(), Duration::from_millis(50));
/// assert_eq!(o.deadline(), Duration::from_secs(10));
/// assert_eq!(SagaOptions::default().attempts(), 3);
/// ```
#[derive(Clone)]
pub struct SagaOptions {
    attempts: u32,
    backoff: Duration,
    deadline: Duration,
    on_detached: Option<DetachedHook>,
}

impl Default for SagaOptions {
    fn default() -> Self {
        SagaOptions {
            attempts: 3,
            backoff: Duration::from_millis(100),
            deadline: Duration::from_secs(30),
            on_detached: None,
        }
    }
}

impl SagaOptions {
    /// Tries each compensation up to `attempts` times (0 counts as 1), waiting `backoff`
    /// after the first failure and twice as long after each next one (at most
    /// [`MAX_COMPENSATION_BACKOFF`]). A compensation that fails every attempt is
    /// unresolved. Compensations are retried, so write them to be safe to run twice
    /// (refund by payment id, release by reservation id).
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = acemq::saga::SagaOptions::default().compensation_retry(0, Duration::ZERO);
    /// assert_eq!(o.attempts(), 1); // once, no retry: what the other members do
    /// ```
    pub fn compensation_retry(mut self, attempts: u32, backoff: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.backoff = backoff;
        self
    }

    /// Bounds the compensation phase, counted from when it starts: a compensation still
    /// running or not yet started when it passes is unresolved. It applies whether the
    /// caller awaits the saga or has dropped its future (then it is the detached task's own
    /// deadline, so an abandoned saga cannot hold resources forever).
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = acemq::saga::SagaOptions::default().compensation_deadline(Duration::from_secs(5));
    /// assert_eq!(o.deadline(), Duration::from_secs(5));
    /// ```
    pub fn compensation_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Called with the result of a saga whose future was dropped before it finished, once
    /// its compensations have run on their own task (nobody is awaiting that result any
    /// more). The result is also logged and counted in the metrics; this is where to alert
    /// on [`SagaResult::unresolved`]. A panic in the hook is caught and logged.
    ///
    /// ```
    /// let o = acemq::saga::SagaOptions::default().on_detached(|result| {
    ///     if result.has_unresolved() {
    ///         eprintln!("a person must reconcile {:?}", result.unresolved());
    ///     }
    /// });
    /// # let _ = o;
    /// ```
    pub fn on_detached(mut self, hook: impl Fn(&SagaResult) + Send + Sync + 'static) -> Self {
        self.on_detached = Some(Arc::new(hook));
        self
    }

    /// How many times each compensation is tried.
    ///
    /// ```
    /// assert_eq!(acemq::saga::SagaOptions::default().attempts(), 3);
    /// ```
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The wait after a compensation's first failed attempt (doubling after that).
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(acemq::saga::SagaOptions::default().backoff(), Duration::from_millis(100));
    /// ```
    pub fn backoff(&self) -> Duration {
        self.backoff
    }

    /// The bound on the compensation phase.
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(acemq::saga::SagaOptions::default().deadline(), Duration::from_secs(30));
    /// ```
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The wait before attempt `attempt + 1` after attempt `attempt` (1-based) failed.
    pub(super) fn backoff_after(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(MAX_COMPENSATION_BACKOFF)
    }

    pub(super) fn detached_hook(&self) -> Option<&DetachedHook> {
        self.on_detached.as_ref()
    }
}

impl fmt::Debug for SagaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SagaOptions")
            .field("attempts", &self.attempts)
            .field("backoff", &self.backoff)
            .field("deadline", &self.deadline)
            .field("on_detached", &self.on_detached.is_some())
            .finish()
    }
}
