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
//! The arithmetic is pinned by the family's `contract-fixtures.json` (`docs/wire.md` §5), so
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

use std::time::Duration;

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
}

/// A duration in whole milliseconds, saturating.
fn millis_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

mod schedule;

pub use schedule::render_delay;

#[cfg(test)]
mod tests;
