//! How a consumer behaves: [`ConsumerOptions`].

use std::sync::Arc;
use std::time::Duration;

use super::decide::{DEFAULT_RETRY_DELAY_WITHOUT_POLICY, Rules};
use super::stats::{DEFAULT_STALL_AFTER, Stats};
use crate::idempotency::IdempotencyStore;
use crate::retry::RetryPolicy;

/// How long a delivery whose id is claimed elsewhere waits before it is republished.
pub const DEFAULT_IN_PROGRESS_DELAY: Duration = Duration::from_secs(5);

/// How often a consumer asks the broker about its queue by default
/// ([`ConsumerOptions::broker_check`]).
pub const DEFAULT_BROKER_CHECK: Duration = Duration::from_secs(30);
/// How long ready messages may go undelivered before a consumer counts as stalled by
/// default ([`ConsumerOptions::ready_stall_after`]).
pub const DEFAULT_READY_STALL_AFTER: Duration = Duration::from_secs(60);

/// The default prefetch window.
pub const DEFAULT_PREFETCH: u16 = 50;

/// How a consumer behaves.
///
/// ```
/// use acemq::consume::ConsumerOptions;
/// use acemq::retry::RetryPolicy;
/// use std::time::Duration;
/// let o = ConsumerOptions::default()
///     .prefetch(20)
///     .concurrency(4)
///     .retry(RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(60)).unwrap())
///     .in_progress_delay(Duration::from_secs(2));
/// assert_eq!(o.prefetch_window(), 20);
/// assert_eq!(o.retry_policy().unwrap().max_attempts(), 5);
/// ```
#[derive(Clone)]
pub struct ConsumerOptions {
    /// `None`: the consumer kind's default.
    prefetch: Option<u16>,
    pub(super) concurrency: usize,
    retry: Option<RetryPolicy>,
    retry_delay_without_policy: Duration,
    pub(super) idempotency: Option<Arc<dyn IdempotencyStore>>,
    in_progress_delay: Duration,
    stall_after: Duration,
    pub(super) broker_check: Option<Duration>,
    pub(super) ready_stall_after: Duration,
}

impl std::fmt::Debug for ConsumerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerOptions")
            .field("prefetch", &self.prefetch)
            .field("concurrency", &self.concurrency)
            .field("retry", &self.retry)
            .field(
                "retry_delay_without_policy",
                &self.retry_delay_without_policy,
            )
            .field("idempotent", &self.idempotency.is_some())
            .field("in_progress_delay", &self.in_progress_delay)
            .field("stall_after", &self.stall_after)
            .field("broker_check", &self.broker_check)
            .field("ready_stall_after", &self.ready_stall_after)
            .finish()
    }
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            prefetch: None,
            concurrency: 1,
            retry: None,
            retry_delay_without_policy: DEFAULT_RETRY_DELAY_WITHOUT_POLICY,
            idempotency: None,
            in_progress_delay: DEFAULT_IN_PROGRESS_DELAY,
            stall_after: DEFAULT_STALL_AFTER,
            broker_check: Some(DEFAULT_BROKER_CHECK),
            ready_stall_after: DEFAULT_READY_STALL_AFTER,
        }
    }
}

impl ConsumerOptions {
    /// The window of unacked deliveries (at least 1). The default is the consumer kind's:
    /// 50 for a consumer or a responder, the builder's (Java's 20) for each ordered
    /// partition, the reader's (100) for a stream.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = Some(n);
        self
    }
    /// Handlers running at once (default 1; real parallel tasks when more).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }
    /// The retry policy. Without one, a failing message is retried every 5 s, forever.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }
    /// The delay between attempts when there is no policy (default 5 s).
    pub fn retry_delay_without_policy(mut self, delay: Duration) -> Self {
        self.retry_delay_without_policy = delay;
        self
    }
    /// Deduplicates by envelope id through `store`: the handler runs only after a claim;
    /// a confirmed id is acked without running it; an id another consumer is still
    /// working on waits [`ConsumerOptions::in_progress_delay`] and is republished to
    /// the queue with its attempt unchanged. See [`crate::idempotency`].
    pub fn idempotent(mut self, store: impl IdempotencyStore) -> Self {
        self.idempotency = Some(Arc::new(store));
        self
    }
    /// How long a delivery whose id is claimed elsewhere waits before it is republished
    /// (default 5 s; keep it well under the store's claim timeout).
    pub fn in_progress_delay(mut self, delay: Duration) -> Self {
        self.in_progress_delay = delay;
        self
    }
    /// How long a consumer may hold deliveries without settling any before health calls
    /// it *stalled* (default 5 minutes; at least 1 ms). A stalled consumer is reported
    /// `Degraded` under the `consumers` component with the reason (`stalled.{queue}`),
    /// never `Down`: a handler stuck on a dependency is not fixed by a restart. Set it
    /// above your slowest handler plus its longest wait.
    ///
    /// ```
    /// use acemq::consume::ConsumerOptions;
    /// use std::time::Duration;
    /// let o = ConsumerOptions::default().stall_after(Duration::from_secs(60));
    /// assert_eq!(o.stall_threshold(), Duration::from_secs(60));
    /// assert_eq!(ConsumerOptions::default().stall_threshold(), acemq::consume::DEFAULT_STALL_AFTER);
    /// ```
    pub fn stall_after(mut self, quiet: Duration) -> Self {
        self.stall_after = quiet.max(Duration::from_millis(1));
        self
    }
    /// The configured [`ConsumerOptions::stall_after`].
    pub fn stall_threshold(&self) -> Duration {
        self.stall_after
    }
    /// How often the consumer asks the broker about its queue (default every 30 s;
    /// `None` turns the check off): one passive declare on a side channel reads the
    /// queue's consumer count and ready count. A queue the broker says has no consumer
    /// while this consumer's subscription is open is **subscribed again** (logged,
    /// counted in `acemq.consumer.resubscribed.total`, shown in health until it is
    /// back); a queue with ready messages and no delivery to this consumer for
    /// [`ConsumerOptions::ready_stall_after`] makes it `Degraded` with the reason.
    ///
    /// ```
    /// use acemq::consume::ConsumerOptions;
    /// use std::time::Duration;
    /// let o = ConsumerOptions::default().broker_check(Some(Duration::from_secs(10)));
    /// assert_eq!(o.broker_check_interval(), Some(Duration::from_secs(10)));
    /// assert_eq!(ConsumerOptions::default().broker_check(None).broker_check_interval(), None);
    /// ```
    pub fn broker_check(mut self, every: Option<Duration>) -> Self {
        self.broker_check = every.map(|d| d.max(Duration::from_millis(10)));
        self
    }
    /// The configured [`ConsumerOptions::broker_check`].
    pub fn broker_check_interval(&self) -> Option<Duration> {
        self.broker_check
    }
    /// How long a queue may have ready messages while nothing is delivered to this
    /// consumer before health calls it stalled (default 60 s; read by the broker check,
    /// so noticed within one check interval after). Not while consuming is paused.
    ///
    /// ```
    /// use acemq::consume::ConsumerOptions;
    /// use std::time::Duration;
    /// let o = ConsumerOptions::default().ready_stall_after(Duration::from_secs(120));
    /// assert_eq!(o.ready_stall_threshold(), Duration::from_secs(120));
    /// ```
    pub fn ready_stall_after(mut self, quiet: Duration) -> Self {
        self.ready_stall_after = quiet;
        self
    }
    /// The configured [`ConsumerOptions::ready_stall_after`].
    pub fn ready_stall_threshold(&self) -> Duration {
        self.ready_stall_after
    }
    /// The prefetch window of a plain consumer with these options.
    pub fn prefetch_window(&self) -> u16 {
        self.prefetch_or(DEFAULT_PREFETCH)
    }
    /// The configured policy.
    pub fn retry_policy(&self) -> Option<&RetryPolicy> {
        self.retry.as_ref()
    }

    /// The stats (counters and progress) of a consumer with these options.
    /// The prefetch window, `default` when none was set.
    pub(crate) fn prefetch_or(&self, default: u16) -> u16 {
        self.prefetch.unwrap_or(default)
    }

    /// The in-place rule of a consumer kind whose order a republish would break, ending
    /// in `last`; `parks` when undecodable bodies go to `{q}.parked`.
    pub(crate) fn in_place(&self, last: super::Final, parks: bool) -> super::InPlace {
        super::InPlace {
            policy: self.retry.clone(),
            last,
            in_progress_delay: self.in_progress_delay,
            parks,
        }
    }

    /// Refuses options an in-place consumer kind (`what`) cannot honour.
    pub(crate) fn check_in_place(&self, what: &str) -> Result<(), crate::error::Error> {
        if self.concurrency != 1 {
            return Err(crate::error::Error::InvalidArgument(format!(
                "{what} runs one handler at a time to keep its order: concurrency must be 1, got {}",
                self.concurrency
            )));
        }
        if self.prefetch == Some(0) {
            return Err(crate::error::Error::InvalidArgument(
                "prefetch must be at least 1".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn idempotency_store(&self) -> Option<Arc<dyn IdempotencyStore>> {
        self.idempotency.clone()
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats::new(self.stall_after, self.idempotency.is_some())
    }

    /// The settlement rules these options give.
    pub(super) fn rules(&self) -> Rules {
        Rules {
            policy: self.retry.clone(),
            no_policy_delay: self.retry_delay_without_policy,
            in_progress_delay: self.in_progress_delay,
        }
    }
}
