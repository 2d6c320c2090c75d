//! Where a stream reader is: which delivered offsets are not settled yet and the newest
//! settled one, so that after a reconnect it resumes at the oldest delivered-but-unsettled
//! offset, or just after the newest settled one (the rule every member converged on after
//! losing or repeating entries across reconnects).

use std::collections::BTreeSet;

/// A stream reader's position.
///
/// ```
/// use acemq::stream::position::StreamPosition;
/// let mut p = StreamPosition::default();
/// assert_eq!(p.resume_from(), None);
/// p.delivered(10);
/// p.delivered(11);
/// p.settled(10);
/// assert_eq!(p.resume_from(), Some(11)); // 11 was delivered, never settled
/// p.settled(11);
/// assert_eq!(p.resume_from(), Some(12)); // just after the newest settled
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamPosition {
    unsettled: BTreeSet<u64>,
    newest_settled: Option<u64>,
}

impl StreamPosition {
    /// An entry was handed over by the broker.
    pub fn delivered(&mut self, offset: u64) {
        self.unsettled.insert(offset);
    }

    /// An entry was finished with (handled, or skipped).
    pub fn settled(&mut self, offset: u64) {
        self.unsettled.remove(&offset);
        self.newest_settled = Some(self.newest_settled.map_or(offset, |n| n.max(offset)));
    }

    /// The newest settled offset.
    pub fn newest_settled(&self) -> Option<u64> {
        self.newest_settled
    }

    /// How many delivered entries are not settled.
    pub fn unsettled(&self) -> usize {
        self.unsettled.len()
    }

    /// Where to start again: the oldest unsettled offset, else one past the newest settled
    /// one; `None` before anything was delivered (start where the reader was asked to).
    pub fn resume_from(&self) -> Option<u64> {
        self.unsettled
            .first()
            .copied()
            .or_else(|| self.newest_settled.map(|n| n.saturating_add(1)))
    }

    /// Forgets the unsettled entries (the broker delivers them again after a resume).
    pub fn forget_unsettled(&mut self) {
        self.unsettled.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resumes_at_the_oldest_unsettled_even_after_newer_ones_settled() {
        let mut p = StreamPosition::default();
        for o in 0..5 {
            p.delivered(o);
        }
        p.settled(0);
        p.settled(3);
        assert_eq!(p.resume_from(), Some(1));
        assert_eq!(p.unsettled(), 3);
        for o in [1, 2, 4] {
            p.settled(o);
        }
        assert_eq!(p.resume_from(), Some(5));
        assert_eq!(p.newest_settled(), Some(4));
    }
}
