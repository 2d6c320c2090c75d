//! The scheduler's "now", in epoch milliseconds: the wall clock (a due time is an instant
//! every member agrees on), plus whatever time tokio's clock skipped while paused.
//!
//! In a running service the two clocks move together and this is the wall clock exactly
//! (a wall-clock step shows at once). In a test under `tokio::time::pause`, auto-advanced
//! sleeps and `tokio::time::advance` move the scheduler's now as they move the
//! `memory://` broker's TTLs, so a 30-day schedule runs in milliseconds.

use std::time::SystemTime;

/// A clock anchored where the scheduler started.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    tokio_at: tokio::time::Instant,
    std_at: std::time::Instant,
}

impl Clock {
    /// Anchors now (inside the runtime whose clock the scheduler follows).
    pub(crate) fn new() -> Clock {
        Clock {
            tokio_at: tokio::time::Instant::now(),
            std_at: std::time::Instant::now(),
        }
    }

    /// Nanoseconds since the Unix epoch.
    fn now_ns(&self) -> i128 {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let skipped = nanos(self.tokio_at.elapsed()) - nanos(self.std_at.elapsed());
        i128::try_from(wall).unwrap_or(i128::MAX) + skipped
    }

    /// Milliseconds since the Unix epoch, rounded down (what has fully passed).
    pub(crate) fn now_ms(&self) -> i64 {
        i64::try_from(self.now_ns().div_euclid(1_000_000)).unwrap_or(i64::MAX)
    }

    /// The epoch millisecond `delay` from now, rounded up: a message due then is never
    /// delivered before `delay` has passed.
    pub(crate) fn after_ms(&self, delay: std::time::Duration) -> i64 {
        let due = self.now_ns().saturating_add(nanos(delay));
        i64::try_from(due.saturating_add(999_999).div_euclid(1_000_000)).unwrap_or(i64::MAX)
    }
}

fn nanos(d: std::time::Duration) -> i128 {
    i128::try_from(d.as_nanos()).unwrap_or(i128::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn paused_time_moves_the_schedulers_now() {
        let clock = Clock::new();
        let before = clock.now_ms();
        tokio::time::advance(Duration::from_secs(30 * 86_400)).await;
        let after = clock.now_ms();
        let moved = after - before;
        assert!(
            (30 * 86_400_000..30 * 86_400_000 + 5_000).contains(&moved),
            "{moved}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_time_is_rounded_up_and_now_down() {
        let clock = Clock::new();
        let due = clock.after_ms(Duration::from_millis(1_500));
        tokio::time::advance(Duration::from_micros(1_499_900)).await;
        assert!(clock.now_ms() < due);
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(clock.now_ms() >= due);
    }

    #[tokio::test]
    async fn running_time_is_the_wall_clock() {
        let clock = Clock::new();
        let wall = crate::envelope::now_millis();
        assert!((clock.now_ms() - wall).abs() < 1_000);
    }
}
