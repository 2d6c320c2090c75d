//! The in-process idempotency store.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{ClaimOutcome, DEFAULT_CLAIM_TIMEOUT, DEFAULT_RETENTION, IdempotencyStore, StoreError};
use crate::transport::BoxFuture;

/// The default cap on remembered ids: 100,000.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

const MIN_DURATION: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Claimed,
    Confirmed,
}

#[derive(Debug)]
struct Entry {
    state: State,
    /// When it was claimed (or confirmed: confirming restarts the retention).
    recorded_at: Instant,
    /// Key into `Inner::by_age`.
    seq: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Oldest first: (recorded_at, seq) -> key.
    by_age: BTreeMap<(Instant, u64), String>,
    next_seq: u64,
    evictions: u64,
}

impl Inner {
    fn record(&mut self, key: &str, state: State, now: Instant) {
        if let Some(old) = self.entries.remove(key) {
            self.by_age.remove(&(old.recorded_at, old.seq));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_age.insert((now, seq), key.to_owned());
        self.entries.insert(
            key.to_owned(),
            Entry {
                state,
                recorded_at: now,
                seq,
            },
        );
    }

    fn remove(&mut self, key: &str) {
        if let Some(old) = self.entries.remove(key) {
            self.by_age.remove(&(old.recorded_at, old.seq));
        }
    }

    fn evict_oldest(&mut self) {
        if let Some((_, key)) = self.by_age.pop_first() {
            self.entries.remove(&key);
            self.evictions += 1;
        }
    }
}

/// An idempotency store in this process's memory: fast, per process, forgotten on restart.
///
/// It deduplicates what one running consumer sees, which is most redeliveries; it cannot
/// deduplicate across instances or across a deploy (use a shared store for that, e.g. the
/// `acemq-sql` crate's). See the [module documentation](crate::idempotency) for what
/// "effectively once" does and does not promise.
///
/// * **Retention** (`new(retention)`, [`for_one_day`](Self::for_one_day)): how long an
///   entry is remembered, counted from its claim and restarted by its confirm. Aged entries
///   are evicted on each claim.
/// * **Max entries** ([`max_entries`](Self::max_entries), default [`DEFAULT_MAX_ENTRIES`]):
///   when full, the oldest entry is evicted (counted by [`evictions`](Self::evictions)),
///   even if it was still claimed.
/// * **Claim timeout** ([`claim_timeout`](Self::claim_timeout), default
///   [`DEFAULT_CLAIM_TIMEOUT`]): an unconfirmed claim older than this may be taken over.
///   It is never longer than the retention: a larger value is clamped to the retention.
///
/// Durations below one millisecond are raised to one millisecond. Time is read from
/// [`tokio::time::Instant`], so tests with a paused clock can advance it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::idempotency::StoreError> {
/// use acemq::idempotency::{ClaimOutcome, IdempotencyStore, InMemoryIdempotencyStore};
/// use std::time::Duration;
/// let store = InMemoryIdempotencyStore::new(Duration::from_secs(3600))
///     .max_entries(10_000)
///     .claim_timeout(Duration::from_secs(60));
/// assert!(store.claim("m-1").await?);
/// assert_eq!(store.try_claim("m-1").await?, ClaimOutcome::InProgress);
/// store.release("m-1").await?;
/// assert!(store.claim("m-1").await?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct InMemoryIdempotencyStore {
    inner: Mutex<Inner>,
    retention: Duration,
    claim_timeout: Duration,
    max_entries: usize,
}

impl InMemoryIdempotencyStore {
    /// A store that remembers ids for 24 hours.
    pub fn for_one_day() -> Self {
        Self::new(DEFAULT_RETENTION)
    }

    /// A store that remembers ids for `retention` (at least 1 ms), with the default claim
    /// timeout (clamped to the retention) and at most [`DEFAULT_MAX_ENTRIES`] entries.
    pub fn new(retention: Duration) -> Self {
        let retention = retention.max(MIN_DURATION);
        InMemoryIdempotencyStore {
            inner: Mutex::new(Inner::default()),
            retention,
            claim_timeout: DEFAULT_CLAIM_TIMEOUT.min(retention),
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }

    /// At most `n` entries (at least 1); the oldest is evicted when full.
    pub fn max_entries(mut self, n: usize) -> Self {
        self.max_entries = n.max(1);
        self
    }

    /// How long an unconfirmed claim is honoured before it may be taken over; clamped to
    /// between 1 ms and the retention. Set it comfortably above your slowest handler.
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout.clamp(MIN_DURATION, self.retention);
        self
    }

    /// The retention.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The effective claim timeout.
    pub fn get_claim_timeout(&self) -> Duration {
        self.claim_timeout
    }

    /// How many ids are remembered now (aged ones included until the next claim evicts
    /// them).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many entries were evicted because the store was full.
    pub fn evictions(&self) -> u64 {
        self.lock().evictions
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than losing the store, so a poisoned lock is used as it is.
        crate::util::lock(&self.inner)
    }

    fn check_key(key: &str) -> Result<(), StoreError> {
        if key.is_empty() {
            return Err(StoreError::Invalid(
                "the idempotency key (the envelope id) is empty; a message without an id cannot be deduplicated".into(),
            ));
        }
        Ok(())
    }

    fn claim_now(&self, key: &str) -> Result<ClaimOutcome, StoreError> {
        Self::check_key(key)?;
        let now = Instant::now();
        let mut inner = self.lock();
        // Evict what has aged past the retention, oldest first.
        while let Some(((at, _), _)) = inner.by_age.first_key_value() {
            if now.saturating_duration_since(*at) >= self.retention {
                if let Some((_, k)) = inner.by_age.pop_first() {
                    inner.entries.remove(&k);
                }
            } else {
                break;
            }
        }
        match inner.entries.get(key) {
            Some(e) if e.state == State::Confirmed => return Ok(ClaimOutcome::Duplicate),
            Some(e) if now.saturating_duration_since(e.recorded_at) < self.claim_timeout => {
                return Ok(ClaimOutcome::InProgress);
            }
            Some(_) => {
                // An expired lease: take it over.
                inner.record(key, State::Claimed, now);
                return Ok(ClaimOutcome::Claimed);
            }
            None => {}
        }
        while inner.entries.len() >= self.max_entries {
            inner.evict_oldest();
        }
        inner.record(key, State::Claimed, now);
        Ok(ClaimOutcome::Claimed)
    }
}

impl IdempotencyStore for InMemoryIdempotencyStore {
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.claim_now(key)? == ClaimOutcome::Claimed) })
    }

    fn confirm<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            Self::check_key(key)?;
            let now = Instant::now();
            let mut inner = self.lock();
            if !inner.entries.contains_key(key) {
                while inner.entries.len() >= self.max_entries {
                    inner.evict_oldest();
                }
            }
            inner.record(key, State::Confirmed, now);
            Ok(())
        })
    }

    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            if inner
                .entries
                .get(key)
                .is_some_and(|e| e.state == State::Claimed)
            {
                inner.remove(key);
            }
            Ok(())
        })
    }

    fn is_confirmed<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let inner = self.lock();
            Ok(inner.entries.get(key).is_some_and(|e| {
                e.state == State::Confirmed
                    && now.saturating_duration_since(e.recorded_at) < self.retention
            }))
        })
    }

    fn try_claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        Box::pin(async move { self.claim_now(key) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn three_states_and_release() {
        let s = InMemoryIdempotencyStore::for_one_day();
        assert_eq!(s.try_claim("a").await.unwrap(), ClaimOutcome::Claimed);
        assert_eq!(s.try_claim("a").await.unwrap(), ClaimOutcome::InProgress);
        s.release("a").await.unwrap();
        assert_eq!(s.try_claim("a").await.unwrap(), ClaimOutcome::Claimed);
        s.confirm("a").await.unwrap();
        assert_eq!(s.try_claim("a").await.unwrap(), ClaimOutcome::Duplicate);
        s.release("a").await.unwrap(); // a confirmed entry is not released
        assert!(s.is_confirmed("a").await.unwrap());
        assert!(s.try_claim("").await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_is_a_lease_and_a_confirmation_is_not() {
        let s = InMemoryIdempotencyStore::new(Duration::from_secs(3600))
            .claim_timeout(Duration::from_secs(60));
        assert!(s.claim("a").await.unwrap());
        assert!(s.claim("b").await.unwrap());
        s.confirm("b").await.unwrap();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(s.try_claim("a").await.unwrap(), ClaimOutcome::InProgress);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(s.try_claim("a").await.unwrap(), ClaimOutcome::Claimed);
        assert_eq!(s.try_claim("a").await.unwrap(), ClaimOutcome::InProgress);
        assert_eq!(s.try_claim("b").await.unwrap(), ClaimOutcome::Duplicate);
        // Retention ends: the confirmation is forgotten.
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(!s.is_confirmed("b").await.unwrap());
        assert_eq!(s.try_claim("b").await.unwrap(), ClaimOutcome::Claimed);
    }

    #[tokio::test(start_paused = true)]
    async fn claim_timeout_is_clamped_to_retention() {
        let s = InMemoryIdempotencyStore::new(Duration::from_secs(10))
            .claim_timeout(Duration::from_secs(600));
        assert_eq!(s.get_claim_timeout(), Duration::from_secs(10));
        let s = InMemoryIdempotencyStore::new(Duration::from_secs(10));
        assert_eq!(s.get_claim_timeout(), Duration::from_secs(10));
        let s = InMemoryIdempotencyStore::for_one_day().claim_timeout(Duration::ZERO);
        assert_eq!(s.get_claim_timeout(), Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn full_store_evicts_the_oldest() {
        let s = InMemoryIdempotencyStore::for_one_day().max_entries(2);
        assert!(s.claim("a").await.unwrap());
        tokio::time::advance(Duration::from_millis(1)).await;
        s.confirm("b").await.unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(s.claim("c").await.unwrap());
        assert_eq!(s.len(), 2);
        assert_eq!(s.evictions(), 1);
        assert!(s.claim("a").await.unwrap(), "a was evicted");
        assert!(!s.is_confirmed("b").await.unwrap(), "then b was evicted");
    }
}
