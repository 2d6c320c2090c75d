//! The arithmetic of a [`RetryPolicy`]: its schedule, the rungs it needs, the wait after
//! a failed attempt (with jitter for consumer waits), its `Display`, and how a delay is
//! written ([`render_delay`]: in rung names, which `topology` derives from here, and in
//! `Display`).

use std::fmt;
use std::time::Duration;

use rand::RngExt;

use super::{RetryPolicy, Shape, Wait};

/// The shortest wait a consumer ever sleeps, whatever the schedule and the jitter say.
const CONSUMER_WAIT_FLOOR: Duration = Duration::from_millis(1);

/// How many schedule entries `Display` prints before summarising the rest.
const DISPLAY_SCHEDULE_LIMIT: usize = 10;

impl RetryPolicy {
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
    pub(super) fn delay_at(&self, index: u32) -> Option<Duration> {
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
        let mut current = self.first_ms();
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
        let mut current = self.first_ms();
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

    /// The first entry of the recurrence, in (fractional) milliseconds.
    fn first_ms(&self) -> f64 {
        match self.shape {
            Shape::Never => 0.0,
            Shape::Fixed(ms) => ms as f64,
            Shape::Exponential { initial_ms, .. } => initial_ms,
        }
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

/// Floating-point milliseconds truncated to a whole-millisecond duration (saturating; a
/// NaN, which the validated inputs cannot produce, would read as zero).
fn float_millis(ms: f64) -> Duration {
    Duration::from_millis(ms as u64)
}

/// How a delay appears in a rung name. The delay is taken in whole milliseconds and the
/// first rule that fits applies: a whole number of hours (at least one) gives `{n}h`; else
/// a whole number of minutes gives `{n}m`; else a whole number of seconds gives `{n}s`;
/// else `{n}ms`. So 90 s is `90s` (not `1m30s`), 90 minutes is `90m`, 2 hours is `2h`.
///
/// Sub-second delays: this follows the Java library, the family's reference, and writes
/// `500ms`. The Go, Python and Ruby libraries truncate to whole seconds and write `0s`;
/// the two names are different queues. The case only arises when a policy lowers its
/// broker-wait threshold below one second, which is recorded as a known disagreement in
/// the contract fixtures (`naming.subSecondDisagreement`) and in `docs/wire.md` §11.
///
/// ```
/// use std::time::Duration;
/// use acemq::topology::render_delay;
/// assert_eq!(render_delay(Duration::from_millis(500)), "500ms");
/// assert_eq!(render_delay(Duration::from_secs(90)), "90s");
/// assert_eq!(render_delay(Duration::from_secs(5400)), "90m");
/// assert_eq!(render_delay(Duration::from_secs(7200)), "2h");
/// ```
pub fn render_delay(delay: Duration) -> String {
    const SECOND: u128 = 1_000;
    const MINUTE: u128 = 60 * SECOND;
    const HOUR: u128 = 60 * MINUTE;
    let ms = delay.as_millis();
    if ms >= HOUR && ms.is_multiple_of(HOUR) {
        format!("{}h", ms / HOUR)
    } else if ms >= MINUTE && ms.is_multiple_of(MINUTE) {
        format!("{}m", ms / MINUTE)
    } else if ms >= SECOND && ms.is_multiple_of(SECOND) {
        format!("{}s", ms / SECOND)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_delay_takes_the_first_rule_that_fits() {
        let cases = [
            (0, "0ms"),
            (1, "1ms"),
            (500, "500ms"),
            (1_000, "1s"),
            (1_500, "1500ms"),
            (30_000, "30s"),
            (59_000, "59s"),
            (60_000, "1m"),
            (90_000, "90s"),
            (160_000, "160s"),
            (300_000, "5m"),
            (3_600_000, "1h"),
            (5_400_000, "90m"),
            (7_200_000, "2h"),
            (86_400_000, "24h"),
        ];
        for (ms, want) in cases {
            assert_eq!(render_delay(Duration::from_millis(ms)), want, "{ms} ms");
        }
        // Sub-millisecond parts are dropped, like the milliseconds the rung TTL carries.
        assert_eq!(render_delay(Duration::from_micros(1_000_999)), "1s");
    }
}
