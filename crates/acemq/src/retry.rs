//! Retry policies: when, and how often, a failed message is tried again, and where the
//! waiting happens.
//!
//! A [`RetryPolicy`] is a schedule, not a mechanism. It says a fourth attempt should happen
//! roughly eight seconds after the third; it does not say how the waiting happens. A long
//! wait must never be a sleep inside a handler: a sleeping handler holds an unacknowledged
//! delivery and a prefetch slot, and a consumer that restarts halfway through a five-minute
//! backoff loses the whole wait, because the broker redelivers the unacknowledged message
//! at once.
//!
//! So the waiting is split at a threshold ([`DEFAULT_BROKER_WAIT_THRESHOLD`], thirty
//! seconds, the same in every AceMQ library). A wait shorter than the threshold is spent in
//! the consumer; a wait at or above it is spent in the broker, in a `{queue}.retry.{delay}`
//! rung queue whose `x-message-ttl` is the wait and whose dead-letter target is the source
//! queue (see [`crate::topology::rung_decl`]). Jitter applies to consumer waits only: a
//! rung's time-to-live is fixed when the queue is declared, so a jittered broker wait would
//! name a queue that does not exist.
//!
//! Two independent limits end the retries: [`RetryPolicy::max_attempts`] (deliveries in
//! total, including the first) and [`RetryPolicy::max_message_age`] (age measured from the
//! first publish; zero, the default of every factory, means no limit).
//!
//! The arithmetic is pinned by the family's `contract-fixtures.json` (wire contract §5), so
//! the same policy yields the same schedule, the same rungs and the same decisions in the
//! Java, .NET, Go, Python, Ruby and Rust libraries.
//!
//! ```
//! use std::time::Duration;
//! use acemq::retry::RetryPolicy;
//!
//! let policy = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300))?;
//! let secs: Vec<u64> = policy.schedule().iter().map(Duration::as_secs).collect();
//! assert_eq!(secs, [10, 20, 40, 80, 160]);
//! // 10 s and 20 s are waited in the consumer; the rest on rung queues.
//! let rungs: Vec<u64> = policy.broker_rungs().iter().map(Duration::as_secs).collect();
//! assert_eq!(rungs, [40, 80, 160]);
//! # Ok::<(), acemq::retry::RetryError>(())
//! ```

use std::fmt;
use std::time::Duration;

use rand::RngExt;

use crate::topology::render_delay;

/// Waits this long or longer are spent in the broker (on a rung queue) rather than in the
/// consumer.
///
/// Thirty seconds is roughly where the two costs cross: below it, the seconds a restart
/// loses are only seconds and a held prefetch slot is cheap; above it, a consumer that
/// restarts mid-wait loses the wait entirely. The number is part of the cross-language
/// contract, so the same policy needs the same rungs whichever library declares them.
///
/// ```
/// use std::time::Duration;
/// use acemq::retry::{DEFAULT_BROKER_WAIT_THRESHOLD, RetryPolicy};
/// assert_eq!(DEFAULT_BROKER_WAIT_THRESHOLD, Duration::from_secs(30));
/// assert_eq!(RetryPolicy::none().broker_wait_threshold(), DEFAULT_BROKER_WAIT_THRESHOLD);
/// ```
pub const DEFAULT_BROKER_WAIT_THRESHOLD: Duration = Duration::from_secs(30);

/// The jitter factor of [`RetryPolicy::exponential`].
const DEFAULT_EXPONENTIAL_JITTER: f64 = 0.2;

/// The multiplier of [`RetryPolicy::exponential`].
const DEFAULT_MULTIPLIER: f64 = 2.0;

/// The shortest wait a consumer ever sleeps, whatever the schedule and the jitter say.
const CONSUMER_WAIT_FLOOR: Duration = Duration::from_millis(1);

/// How many schedule entries `Display` prints before summarising the rest.
const DISPLAY_SCHEDULE_LIMIT: usize = 10;

/// A retry policy argument that cannot be used. Nothing in this module panics on bad
/// input; every factory and modifier that can be given a bad value returns this instead.
///
/// ```
/// use std::time::Duration;
/// use acemq::retry::{RetryError, RetryPolicy};
/// let err = RetryPolicy::fixed(0, Duration::from_secs(1)).unwrap_err();
/// assert!(matches!(err, RetryError::ZeroAttempts));
/// ```
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError {
    /// `max_attempts` was zero.
    #[error(
        "max_attempts must be at least 1, because it counts the first delivery; use RetryPolicy::none() for a single attempt with no retries"
    )]
    ZeroAttempts,
    /// The exponential multiplier was below one, infinite or NaN.
    #[error(
        "the multiplier must be a finite number of at least 1.0 (got {multiplier}); use 2.0 for doubling, or RetryPolicy::fixed for a constant delay"
    )]
    InvalidMultiplier {
        /// The refused multiplier.
        multiplier: f64,
    },
    /// The jitter factor was outside `[0, 1]` or NaN.
    #[error(
        "the jitter factor must be between 0.0 and 1.0 inclusive (got {factor}); 0.2 spreads each consumer wait by plus or minus 20%, 0.0 turns jitter off"
    )]
    InvalidJitter {
        /// The refused factor.
        factor: f64,
    },
    /// The exponential initial delay was shorter than one millisecond (delays are whole
    /// milliseconds on the wire).
    #[error(
        "the initial delay of an exponential policy must be at least 1 ms (got {initial:?}); a zero delay never grows, use RetryPolicy::fixed(n, Duration::ZERO) for immediate retries"
    )]
    InitialDelayTooShort {
        /// The refused initial delay.
        initial: Duration,
    },
    /// The exponential ceiling was below the initial delay.
    #[error(
        "the maximum delay ({max:?}) must not be shorter than the initial delay ({initial:?}); raise the maximum or lower the initial delay"
    )]
    MaxBelowInitial {
        /// The initial delay.
        initial: Duration,
        /// The refused ceiling.
        max: Duration,
    },
}

/// How the unjittered delays are produced. Normalised so that policies that cannot differ
/// in behaviour compare equal where that is cheap to see (a single attempt has no schedule;
/// an exponential that cannot grow is a fixed delay).
#[derive(Clone, Debug, PartialEq)]
enum Shape {
    /// No delays at all (one attempt).
    Never,
    /// The same delay, in whole milliseconds, every time.
    Fixed(u64),
    /// `delay(0) = initial`, `delay(k) = min(delay(k-1) * multiplier, max)`, in floating
    /// point milliseconds, truncated to whole milliseconds when reported.
    Exponential {
        initial_ms: f64,
        multiplier: f64,
        max_ms: f64,
    },
}

/// Where a retry waits, and for how long: the answer of [`RetryPolicy::next_wait`].
///
/// ```
/// use std::time::Duration;
/// use acemq::retry::{RetryPolicy, Wait};
/// let policy = RetryPolicy::fixed(3, Duration::from_secs(60))?;
/// assert_eq!(
///     policy.next_wait(1, None),
///     Some(Wait { delay: Duration::from_secs(60), in_broker: true })
/// );
/// # Ok::<(), acemq::retry::RetryError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Wait {
    /// How long to wait. Jittered (and at least 1 ms) for a consumer wait; exactly the
    /// scheduled delay for a broker wait, because that delay names the rung queue.
    pub delay: Duration,
    /// `true` when the wait is spent on the rung queue `{q}.retry.{delay}` in the broker,
    /// `false` when the consumer holds the delivery for the duration.
    pub in_broker: bool,
}

/// When, and how often, a failed message should be tried again, and where the waiting
/// happens. See the [module documentation](self) for the reasoning.
///
/// Build one with [`RetryPolicy::none`], [`RetryPolicy::fixed`],
/// [`RetryPolicy::exponential`] or [`RetryPolicy::exponential_with_multiplier`], then
/// adjust it with [`give_up_after`](RetryPolicy::give_up_after),
/// [`with_jitter`](RetryPolicy::with_jitter) and
/// [`wait_in_broker_from`](RetryPolicy::wait_in_broker_from), each of which returns a copy.
///
/// ```
/// use std::time::Duration;
/// use acemq::retry::RetryPolicy;
///
/// let policy = RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(60))?
///     .give_up_after(Duration::from_secs(6 * 3600))
///     .with_jitter(0.3)?;
/// assert_eq!(policy.max_attempts(), 5);
/// assert_eq!(policy.schedule().len(), 4);
/// // After the fifth delivery fails, the message is dead-lettered.
/// assert_eq!(policy.next_wait(5, Some(Duration::ZERO)), None);
/// // Six hours after its first publish it is abandoned whatever the attempt.
/// assert_eq!(policy.next_wait(1, Some(Duration::from_secs(6 * 3600))), None);
/// # Ok::<(), acemq::retry::RetryError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    shape: Shape,
    jitter: f64,
    max_message_age: Duration,
    broker_wait_threshold: Duration,
}

impl RetryPolicy {
    /// A policy that never retries: one attempt, then the dead-letter queue. Its schedule
    /// is empty and its jitter is zero.
    ///
    /// ```
    /// use acemq::retry::RetryPolicy;
    /// let none = RetryPolicy::none();
    /// assert_eq!(none.max_attempts(), 1);
    /// assert!(none.schedule().is_empty());
    /// assert_eq!(none.next_delay(1, None), None);
    /// ```
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            shape: Shape::Never,
            jitter: 0.0,
            max_message_age: Duration::ZERO,
            broker_wait_threshold: DEFAULT_BROKER_WAIT_THRESHOLD,
        }
    }

    /// Retries a fixed number of times with the same delay between each, with no jitter.
    ///
    /// No jitter is the point of asking for a fixed policy: "every thirty seconds" is an
    /// exact statement. Add it back with [`with_jitter`](RetryPolicy::with_jitter) when a
    /// fleet failing in lockstep is the worry. The delay is kept in whole milliseconds
    /// (the wire contract's unit); a zero delay is allowed and is waited as 1 ms.
    ///
    /// `max_attempts` counts every delivery including the first and must be at least 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::fixed(4, Duration::from_secs(30))?;
    /// assert_eq!(p.schedule(), vec![Duration::from_secs(30); 3]);
    /// assert_eq!(p.jitter_factor(), 0.0);
    /// assert_eq!(p.broker_rungs(), vec![Duration::from_secs(30)]);
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    pub fn fixed(max_attempts: u32, delay: Duration) -> Result<Self, RetryError> {
        if max_attempts == 0 {
            return Err(RetryError::ZeroAttempts);
        }
        Ok(RetryPolicy {
            max_attempts,
            shape: if max_attempts == 1 {
                Shape::Never
            } else {
                Shape::Fixed(millis_u64(delay))
            },
            jitter: 0.0,
            max_message_age: Duration::ZERO,
            broker_wait_threshold: DEFAULT_BROKER_WAIT_THRESHOLD,
        })
    }

    /// Retries with a doubling delay, capped at `max`, with 20% jitter on consumer waits.
    ///
    /// Doubling and 20% jitter are the cross-language default: the same policy has to
    /// produce the same numbers in every AceMQ library, because the same message can be
    /// retried by a consumer written in any of them.
    ///
    /// Errors when `max_attempts` is 0, `initial` is shorter than 1 ms, or `max < initial`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(60))?;
    /// let ms: Vec<u128> = p.schedule().iter().map(Duration::as_millis).collect();
    /// assert_eq!(ms, [10_000, 20_000, 40_000, 60_000, 60_000]);
    /// assert_eq!(p.jitter_factor(), 0.2);
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    pub fn exponential(
        max_attempts: u32,
        initial: Duration,
        max: Duration,
    ) -> Result<Self, RetryError> {
        Self::exponential_with_multiplier(max_attempts, initial, DEFAULT_MULTIPLIER, max)
    }

    /// Retries with an exponentially growing delay and an explicit multiplier, capped at
    /// `max`, with 20% jitter on consumer waits.
    ///
    /// Delay `k` is `min(delay(k-1) * multiplier, max)`, computed in floating-point
    /// milliseconds, capped at every step and truncated to whole milliseconds.
    ///
    /// Errors when `max_attempts` is 0, `multiplier` is below 1 or not finite, `initial` is
    /// shorter than 1 ms, or `max < initial`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::exponential_with_multiplier(
    ///     5, Duration::from_millis(100), 1.5, Duration::from_secs(10))?;
    /// let ms: Vec<u128> = p.schedule().iter().map(Duration::as_millis).collect();
    /// assert_eq!(ms, [100, 150, 225, 337]);
    /// assert!(RetryPolicy::exponential_with_multiplier(
    ///     5, Duration::from_secs(1), 0.5, Duration::from_secs(10)).is_err());
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    pub fn exponential_with_multiplier(
        max_attempts: u32,
        initial: Duration,
        multiplier: f64,
        max: Duration,
    ) -> Result<Self, RetryError> {
        if max_attempts == 0 {
            return Err(RetryError::ZeroAttempts);
        }
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(RetryError::InvalidMultiplier { multiplier });
        }
        if initial < Duration::from_millis(1) {
            return Err(RetryError::InitialDelayTooShort { initial });
        }
        if max < initial {
            return Err(RetryError::MaxBelowInitial { initial, max });
        }
        let initial_ms = millis_u64(initial);
        let max_ms = millis_u64(max);
        let shape = if max_attempts == 1 {
            Shape::Never
        } else if multiplier == 1.0 || initial_ms == max_ms {
            Shape::Fixed(initial_ms)
        } else {
            Shape::Exponential {
                initial_ms: initial_ms as f64,
                multiplier,
                max_ms: max_ms as f64,
            }
        };
        Ok(RetryPolicy {
            max_attempts,
            shape,
            jitter: DEFAULT_EXPONENTIAL_JITTER,
            max_message_age: Duration::ZERO,
            broker_wait_threshold: DEFAULT_BROKER_WAIT_THRESHOLD,
        })
    }

    /// Returns a copy that abandons messages whose age (measured from first publish) has
    /// reached `max_message_age`; zero means no limit, which is what every factory starts
    /// with. The limit is reached rather than passed: a message exactly that old is
    /// dead-lettered.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::fixed(5, Duration::from_secs(1))?.give_up_after(Duration::from_secs(120));
    /// assert!(p.next_delay(1, Some(Duration::from_millis(119_999))).is_some());
    /// assert!(p.next_delay(1, Some(Duration::from_secs(120))).is_none());
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    #[must_use]
    pub fn give_up_after(&self, max_message_age: Duration) -> Self {
        RetryPolicy {
            max_message_age,
            ..self.clone()
        }
    }

    /// Returns a copy with a different jitter factor: each consumer wait is spread
    /// uniformly over `[d * (1 - factor), d * (1 + factor)]`. Broker waits are never
    /// jittered. Errors unless `factor` is within `[0, 1]`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::fixed(3, Duration::from_secs(5))?.with_jitter(0.1)?;
    /// assert_eq!(p.jitter_factor(), 0.1);
    /// assert!(p.with_jitter(1.5).is_err());
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    pub fn with_jitter(&self, factor: f64) -> Result<Self, RetryError> {
        if !(0.0..=1.0).contains(&factor) {
            return Err(RetryError::InvalidJitter { factor });
        }
        Ok(RetryPolicy {
            jitter: factor,
            ..self.clone()
        })
    }

    /// Returns a copy that moves the line between waiting in the consumer and waiting in
    /// the broker. Zero means never: every wait is spent in the consumer and no rung queue
    /// is ever needed — the setting for a service that may not declare queues.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::fixed(3, Duration::from_secs(60))?;
    /// assert_eq!(p.broker_rungs().len(), 1);
    /// assert!(p.wait_in_broker_from(Duration::ZERO).broker_rungs().is_empty());
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    #[must_use]
    pub fn wait_in_broker_from(&self, threshold: Duration) -> Self {
        RetryPolicy {
            broker_wait_threshold: threshold,
            ..self.clone()
        }
    }

    /// Total deliveries allowed, including the first.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// How old a message may get before it is abandoned; zero means never.
    pub fn max_message_age(&self) -> Duration {
        self.max_message_age
    }

    /// The fraction of each consumer wait that is randomised.
    pub fn jitter_factor(&self) -> f64 {
        self.jitter
    }

    /// The wait at which the broker takes over from the consumer; zero means never.
    pub fn broker_wait_threshold(&self) -> Duration {
        self.broker_wait_threshold
    }

    /// Whether an (unjittered) wait of this length belongs on a rung queue: the threshold
    /// is non-zero, the delay is non-zero, and the delay is at or above the threshold.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::none();
    /// assert!(!p.waits_in_broker(Duration::from_millis(29_999)));
    /// assert!(p.waits_in_broker(Duration::from_secs(30)));
    /// ```
    pub fn waits_in_broker(&self, delay: Duration) -> bool {
        !self.broker_wait_threshold.is_zero()
            && !delay.is_zero()
            && delay >= self.broker_wait_threshold
    }

    /// The delays this policy uses, without jitter: one per retry (`max_attempts - 1`
    /// entries), in order, in whole milliseconds. Empty when the policy never retries.
    ///
    /// The topology is derived from this list (see [`broker_rungs`](Self::broker_rungs))
    /// instead of being configured separately and drifting away from the policy.
    pub fn schedule(&self) -> Vec<Duration> {
        self.delays().collect()
    }

    /// The delays this policy needs a rung queue for, in the order the schedule reaches
    /// them: the entries of [`schedule`](Self::schedule) that
    /// [wait in the broker](Self::waits_in_broker), with repeats removed (by delay and by
    /// rendered rung name). Empty when every wait is spent in the consumer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(60))?;
    /// assert_eq!(p.broker_rungs(), [Duration::from_secs(40), Duration::from_secs(60)]);
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    pub fn broker_rungs(&self) -> Vec<Duration> {
        let mut rungs: Vec<Duration> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for delay in self.distinct_delays() {
            if !self.waits_in_broker(delay) || rungs.contains(&delay) {
                continue;
            }
            let name = render_delay(delay);
            if names.contains(&name) {
                continue;
            }
            rungs.push(delay);
            names.push(name);
        }
        rungs
    }

    /// How long to wait before the next attempt: [`next_wait`](Self::next_wait) without
    /// the "where". A broker wait is reported exactly as scheduled; a consumer wait is
    /// already jittered.
    ///
    /// `attempt` is the attempt that just failed, starting at 1; `message_age` is how long
    /// ago the message was first published, or `None` when that is not known (which counts
    /// as young enough). `None` is returned when the message should be dead-lettered.
    pub fn next_delay(&self, attempt: u32, message_age: Option<Duration>) -> Option<Duration> {
        self.next_wait(attempt, message_age).map(|w| w.delay)
    }

    /// How long to wait before the next attempt, and where the message spends it, using
    /// the thread-local random number generator for jitter.
    ///
    /// After attempt `a` fails the message is retried only if `a < max_attempts` and the
    /// age limit allows (a non-zero limit abandons a message whose age is at or above it;
    /// an unknown age counts as young). The delay is `schedule[min(a - 1, len - 1)]`; an
    /// `attempt` of 0 is treated as 1. Returns `None` when the message should be
    /// dead-lettered.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300))?;
    /// let first = p.next_wait(1, None).unwrap();
    /// assert!(!first.in_broker);
    /// assert!(first.delay >= Duration::from_secs(8) && first.delay <= Duration::from_secs(12));
    /// let third = p.next_wait(3, None).unwrap();
    /// assert!(third.in_broker);
    /// assert_eq!(third.delay, Duration::from_secs(40));
    /// assert_eq!(p.next_wait(6, None), None);
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    pub fn next_wait(&self, attempt: u32, message_age: Option<Duration>) -> Option<Wait> {
        self.next_wait_with(&mut rand::rng(), attempt, message_age)
    }

    /// [`next_wait`](Self::next_wait) with a caller-supplied random number generator, for
    /// deterministic tests and for callers that keep their own generator.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rand::{SeedableRng, rngs::StdRng};
    /// use acemq::retry::RetryPolicy;
    /// let p = RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(60))?;
    /// let a = p.next_wait_with(&mut StdRng::seed_from_u64(7), 1, None);
    /// let b = p.next_wait_with(&mut StdRng::seed_from_u64(7), 1, None);
    /// assert_eq!(a, b);
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    pub fn next_wait_with<R: rand::Rng + ?Sized>(
        &self,
        rng: &mut R,
        attempt: u32,
        message_age: Option<Duration>,
    ) -> Option<Wait> {
        let attempt = attempt.max(1);
        if attempt >= self.max_attempts || self.too_old(message_age) {
            return None;
        }
        let scheduled = self.delay_at(attempt - 1)?;
        if self.waits_in_broker(scheduled) {
            return Some(Wait {
                delay: scheduled,
                in_broker: true,
            });
        }
        Some(Wait {
            delay: self.jittered(rng, scheduled),
            in_broker: false,
        })
    }

    /// Whether the age limit abandons a message of this age.
    fn too_old(&self, message_age: Option<Duration>) -> bool {
        match message_age {
            Some(age) => !self.max_message_age.is_zero() && age >= self.max_message_age,
            None => false,
        }
    }

    /// A consumer wait: uniformly within `[d(1-f), d(1+f)]`, never below 1 ms.
    fn jittered<R: rand::Rng + ?Sized>(&self, rng: &mut R, delay: Duration) -> Duration {
        let mut waited = delay;
        if self.jitter > 0.0 && !delay.is_zero() {
            // In [0, 1); `random_range` is avoided because it panics on an empty range.
            let unit: f64 = rng.random();
            let factor = 1.0 - self.jitter + 2.0 * self.jitter * unit;
            waited = Duration::try_from_secs_f64(delay.as_secs_f64() * factor).unwrap_or(delay);
        }
        waited.max(CONSUMER_WAIT_FLOOR)
    }

    /// Number of schedule entries (`max_attempts - 1`).
    fn schedule_len(&self) -> u32 {
        match self.shape {
            Shape::Never => 0,
            _ => self.max_attempts.saturating_sub(1),
        }
    }

    /// Schedule entry `index` (0-based), or the last one when `index` is past the end;
    /// `None` when the schedule is empty. Stops iterating as soon as the delay stops
    /// changing, so a late attempt of a long policy is cheap.
    fn delay_at(&self, index: u32) -> Option<Duration> {
        let len = self.schedule_len();
        if len == 0 {
            return None;
        }
        let index = index.min(len - 1);
        match self.shape {
            Shape::Never => None,
            Shape::Fixed(ms) => Some(Duration::from_millis(ms)),
            Shape::Exponential {
                initial_ms,
                multiplier,
                max_ms,
            } => {
                let mut current = initial_ms;
                for _ in 0..index {
                    let next = (current * multiplier).min(max_ms);
                    if next == current {
                        break;
                    }
                    current = next;
                }
                Some(float_millis(current))
            }
        }
    }

    /// The full schedule, lazily.
    fn delays(&self) -> impl Iterator<Item = Duration> + '_ {
        let len = self.schedule_len();
        let mut current = match self.shape {
            Shape::Never => 0.0,
            Shape::Fixed(ms) => ms as f64,
            Shape::Exponential { initial_ms, .. } => initial_ms,
        };
        (0..len).map(move |_| {
            let out = float_millis(current);
            current = self.step(current);
            out
        })
    }

    /// A prefix of the schedule that contains every distinct delay: it stops when the
    /// delay stops changing, however many attempts remain.
    fn distinct_delays(&self) -> impl Iterator<Item = Duration> + '_ {
        let len = self.schedule_len();
        let mut current = match self.shape {
            Shape::Never => 0.0,
            Shape::Fixed(ms) => ms as f64,
            Shape::Exponential { initial_ms, .. } => initial_ms,
        };
        let mut done = false;
        (0..len).map_while(move |_| {
            if done {
                return None;
            }
            let out = float_millis(current);
            let next = self.step(current);
            done = next == current;
            current = next;
            Some(out)
        })
    }

    /// One step of the recurrence.
    fn step(&self, current: f64) -> f64 {
        match self.shape {
            Shape::Exponential {
                multiplier, max_ms, ..
            } => (current * multiplier).min(max_ms),
            _ => current,
        }
    }
}

impl fmt::Display for RetryPolicy {
    /// Like Java's `toString`, e.g.
    /// `RetryPolicy(maxAttempts=5, schedule=[1s, 2s, 4s, 8s], jitter=0.2, brokerWaitThreshold=30s, maxMessageAge=none)`.
    /// Long schedules are summarised after ten entries.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RetryPolicy(maxAttempts={}, schedule=[",
            self.max_attempts
        )?;
        let len = self.schedule_len() as usize;
        for (i, delay) in self.delays().take(DISPLAY_SCHEDULE_LIMIT).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&render_delay(delay))?;
        }
        if len > DISPLAY_SCHEDULE_LIMIT {
            write!(f, ", ... {} more", len - DISPLAY_SCHEDULE_LIMIT)?;
        }
        write!(f, "], jitter={}, brokerWaitThreshold=", self.jitter)?;
        if self.broker_wait_threshold.is_zero() {
            f.write_str("never")?;
        } else {
            f.write_str(&render_delay(self.broker_wait_threshold))?;
        }
        f.write_str(", maxMessageAge=")?;
        if self.max_message_age.is_zero() {
            f.write_str("none")?;
        } else {
            f.write_str(&render_delay(self.max_message_age))?;
        }
        f.write_str(")")
    }
}

/// A duration in whole milliseconds, saturating.
fn millis_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Floating-point milliseconds truncated to a whole-millisecond duration (saturating; a
/// NaN, which the validated inputs cannot produce, would read as zero).
fn float_millis(ms: f64) -> Duration {
    Duration::from_millis(ms as u64)
}

#[cfg(test)]
mod tests;
