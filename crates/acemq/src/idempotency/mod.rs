//! Idempotent consuming: remembering which messages were handled, so a redelivery is not
//! handled twice.
//!
#![doc = include_str!("../../docs/idempotency.md")]

#[cfg(feature = "testing")]
pub mod conformance;
mod in_hand;
mod memory;

use std::sync::Arc;
use std::time::Duration;

use crate::transport::BoxFuture;

pub(crate) use in_hand::InHand;
pub use memory::{DEFAULT_MAX_ENTRIES, InMemoryIdempotencyStore};

pub use crate::health::progress::IDEMPOTENCY as HEALTH_COMPONENT;

/// How long an unconfirmed claim is honoured before another consumer may take it over:
/// five minutes, the same figure every AceMQ library uses.
pub const DEFAULT_CLAIM_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How long a confirmed message is remembered by default: one day.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// What a claim attempt found.
///
/// ```
/// use acemq::idempotency::ClaimOutcome;
/// assert_ne!(ClaimOutcome::Claimed, ClaimOutcome::InProgress);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// We hold it now: run the handler, then confirm or release.
    Claimed,
    /// It was handled and confirmed: accept it without running the handler.
    Duplicate,
    /// A live, unconfirmed claim is held by someone (maybe a crashed consumer whose lease
    /// has not run out yet): neither run nor accept it; put it back and look again later.
    InProgress,
}

/// Why a store could not answer.
///
/// ```
/// use acemq::idempotency::StoreError;
/// let e = StoreError::Unavailable("connection refused".into());
/// assert!(e.to_string().contains("connection refused"));
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backing store could not be reached or refused the statement. Nothing can be
    /// concluded about the message. A consumer treats it as its own outage, not the
    /// message's failure: the delivery waits (250 ms doubling to 30 s) and is put back
    /// with its attempt unchanged, and health reports the store `Degraded`.
    #[error("idempotency store unavailable: {0}; the message's state is unknown, retry it later")]
    Unavailable(String),
    /// A key, table name or option was not acceptable. A consumer whose message id is not
    /// an acceptable key dead-letters the message as unprocessable.
    #[error("invalid idempotency store input: {0}")]
    Invalid(String),
}

/// Remembers which messages were claimed and confirmed, by envelope id.
///
/// A claim is atomic: of two callers racing for the same key, one gets `true`. A claim is
/// a lease: an unconfirmed claim older than the store's claim timeout may be taken over. A
/// confirmed key is never claimed again while it is retained.
///
/// Implement [`claim`](Self::claim), [`confirm`](Self::confirm),
/// [`release`](Self::release) and [`is_confirmed`](Self::is_confirmed); override
/// [`try_claim`](Self::try_claim) when the store can answer all three outcomes in one
/// call (both shipped stores do).
///
/// ```
/// use acemq::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
/// use std::sync::Arc;
/// let store: Arc<dyn IdempotencyStore> = Arc::new(InMemoryIdempotencyStore::for_one_day());
/// # let _ = store;
/// ```
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `key`: `true` when we hold it now (it was free, or its lease had expired and
    /// we took it over), `false` when someone holds it or it was confirmed.
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Records that `key` was handled: it is a duplicate from now on, for the retention.
    fn confirm<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Gives up this store's unconfirmed claim on `key`, so a retry can claim it. Does
    /// nothing to a confirmed key or to someone else's claim.
    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Whether `key` was confirmed (and is still retained).
    fn is_confirmed<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Claims `key` and says which of the three outcomes it found. The default calls
    /// [`claim`](Self::claim), then [`is_confirmed`](Self::is_confirmed) to tell a
    /// duplicate from a message still being handled; a race between the two resolves to
    /// `InProgress`, which only delays the message.
    fn try_claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        Box::pin(async move {
            if self.claim(key).await? {
                Ok(ClaimOutcome::Claimed)
            } else if self.is_confirmed(key).await? {
                Ok(ClaimOutcome::Duplicate)
            } else {
                Ok(ClaimOutcome::InProgress)
            }
        })
    }
}

impl<S: IdempotencyStore + ?Sized> IdempotencyStore for Arc<S> {
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).claim(key)
    }
    fn confirm<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).confirm(key)
    }
    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).release(key)
    }
    fn is_confirmed<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).is_confirmed(key)
    }
    fn try_claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        (**self).try_claim(key)
    }
}
