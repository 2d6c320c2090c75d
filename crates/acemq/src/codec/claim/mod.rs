//! The claim-check codec (feature `claim-check`): a payload at or above a threshold is put
//! in a [`ClaimCheckStore`] and only its key travels, in the family's framing.
//!
//! This module owns the framing, the codec and the store trait; [`store`] holds the
//! in-memory and filesystem stores. Bodies, byte for byte the Java member's
//! (`docs/encryption.md`):
//!
//! ```text
//! AC 01 00 {inner codec's bytes}   inline (below the threshold)
//! AC 01 01 {key, UTF-8}            stored: the bytes are in the store under that key
//! ```
//!
//! A body without that 3-byte prefix is handed to the inner codec as it is (a publisher
//! without claim check). The content type stays the inner codec's. The default threshold
//! is 64 KiB and the comparison is "at or above" (Java, .NET, Go): exactly 64 KiB is stored,
//! one byte less travels inline; 0 stores everything. The codec sets no header: the
//! envelope's `x-acemq-claim` ([`crate::envelope::CLAIM`]) is the application's own
//! pointer, which AceMQ carries and never interprets. The codec never deletes from the
//! store (another consumer, a replay, may need the payload again).
//!
//! A stored key the store does not have is an [`Error::Decode`] naming the key, so the
//! consumer parks the message in `{q}.parked` with that reason.
//!
//! The codec traits are synchronous and the store is async: the codec drives the store's
//! future with `tokio::task::block_in_place` on a multi-thread runtime, and with a local
//! executor elsewhere (a current-thread runtime, no runtime). A store of your own that
//! needs tokio's timers or sockets therefore needs the multi-thread runtime; the stores
//! here work with both.

use std::future::Future;
use std::sync::Arc;

use ::bytes::{BufMut, Bytes, BytesMut};

use super::{Decoder, Encoder};
use crate::error::Error;
use crate::transport::BoxFuture;

pub mod store;

pub use store::{FilesystemClaimCheckStore, InMemoryClaimCheckStore};

/// The default threshold: payloads of 64 KiB or more are stored.
pub const DEFAULT_THRESHOLD: usize = 64 * 1024;

/// The prefix of an inline body.
pub const INLINE: [u8; 3] = [0xAC, 0x01, 0x00];
/// The prefix of a stored body (the key follows).
pub const STORED: [u8; 3] = [0xAC, 0x01, 0x01];

/// Why a claim check failed. Converts into [`Error::Encode`] (storing) or
/// [`Error::Decode`] (fetching), so a consumer parks the message with this text.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimCheckError {
    /// The store has nothing under the key the body carries.
    #[error(
        "the claim-checked payload {key:?} is not in the store: it was deleted or written to another store; restore it and replay the message"
    )]
    Missing {
        /// The key.
        key: String,
    },
    /// The key is not one this store issues (the filesystem store takes UUIDs only).
    #[error("{key:?} is not a claim-check key this store issued ({why})")]
    InvalidKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// The store failed (I/O).
    #[error("the claim-check store failed: {0}")]
    Store(String),
}

impl From<ClaimCheckError> for Error {
    fn from(e: ClaimCheckError) -> Self {
        Error::Decode {
            reason: e.to_string(),
        }
    }
}

/// Where claim-checked payloads live. [`InMemoryClaimCheckStore`] and
/// [`FilesystemClaimCheckStore`] come with the crate; any shared store (S3, a database)
/// can implement it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use acemq::codec::claim::{ClaimCheckStore, InMemoryClaimCheckStore};
/// let store = InMemoryClaimCheckStore::new();
/// let key = store.put(bytes::Bytes::from_static(b"big")).await.unwrap();
/// assert_eq!(store.get(&key).await.unwrap().as_deref(), Some(&b"big"[..]));
/// # }
/// ```
pub trait ClaimCheckStore: Send + Sync + 'static {
    /// Stores a payload; returns its key (UTF-8, at most a few hundred bytes).
    fn put(&self, content: Bytes) -> BoxFuture<'_, Result<String, ClaimCheckError>>;
    /// The payload under `key`; `None` when there is none.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, ClaimCheckError>>;
    /// Removes a payload (the codec never calls it; for housekeeping).
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), ClaimCheckError>>;
}

/// A claim-check codec around another codec.
///
/// ```
/// use std::sync::Arc;
/// use acemq::codec::{Decoder, Encoder, Text};
/// use acemq::codec::claim::{ClaimCheck, InMemoryClaimCheckStore, key_of};
/// let codec = ClaimCheck::wrapping(Text, Arc::new(InMemoryClaimCheckStore::new())).threshold(4);
/// let small = Encoder::<str>::encode(&codec, "abc").unwrap();
/// assert_eq!(&small[..], b"\xAC\x01\x00abc");
/// let big = Encoder::<str>::encode(&codec, "abcd").unwrap();
/// assert!(key_of(&big).is_some());
/// let back: String = codec.decode(Some("text/plain"), &big).unwrap();
/// assert_eq!(back, "abcd");
/// ```
#[derive(Clone)]
pub struct ClaimCheck<C> {
    inner: C,
    store: Arc<dyn ClaimCheckStore>,
    threshold: usize,
}

impl<C: std::fmt::Debug> std::fmt::Debug for ClaimCheck<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimCheck")
            .field("inner", &self.inner)
            .field("threshold", &self.threshold)
            .finish_non_exhaustive()
    }
}

impl<C> ClaimCheck<C> {
    /// Wraps `inner`, storing payloads of [`DEFAULT_THRESHOLD`] bytes or more in `store`.
    pub fn wrapping(inner: C, store: Arc<dyn ClaimCheckStore>) -> Self {
        ClaimCheck {
            inner,
            store,
            threshold: DEFAULT_THRESHOLD,
        }
    }

    /// Stores payloads of `bytes` or more (0: every payload).
    pub fn threshold(mut self, bytes: usize) -> Self {
        self.threshold = bytes;
        self
    }
}

impl<T: ?Sized, C: Encoder<T>> Encoder<T> for ClaimCheck<C> {
    fn content_type(&self) -> &str {
        self.inner.content_type()
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        let plain = self.inner.encode(value)?;
        if plain.len() < self.threshold {
            let mut out = BytesMut::with_capacity(INLINE.len() + plain.len());
            out.put_slice(&INLINE);
            out.put_slice(&plain);
            return Ok(out.freeze());
        }
        let key = drive(self.store.put(plain)).map_err(|e| Error::Encode {
            content_type: self.inner.content_type().to_owned(),
            reason: e.to_string(),
        })?;
        let mut out = BytesMut::with_capacity(STORED.len() + key.len());
        out.put_slice(&STORED);
        out.put_slice(key.as_bytes());
        Ok(out.freeze())
    }
}

impl<T, C: Decoder<T>> Decoder<T> for ClaimCheck<C> {
    fn accepts(&self, content_type: Option<&str>) -> bool {
        self.inner.accepts(content_type)
    }
    fn expects(&self) -> &str {
        self.inner.expects()
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if let Some(inline) = body.strip_prefix(&INLINE) {
            return self.inner.decode(content_type, inline);
        }
        let Some(key) = key_of(body) else {
            if body.starts_with(&STORED) {
                return Err(ClaimCheckError::InvalidKey {
                    key: String::from_utf8_lossy(&body[STORED.len()..]).into_owned(),
                    why: "not UTF-8, or empty".into(),
                }
                .into());
            }
            return self.inner.decode(content_type, body);
        };
        let fetched = drive(self.store.get(key))?.ok_or_else(|| ClaimCheckError::Missing {
            key: key.to_owned(),
        })?;
        self.inner.decode(content_type, &fetched)
    }
}

/// The store key a claim-checked body carries (`None` for an inline or unframed body).
///
/// ```
/// use acemq::codec::claim::key_of;
/// assert_eq!(key_of(b"\xAC\x01\x01abc"), Some("abc"));
/// assert_eq!(key_of(b"\xAC\x01\x00abc"), None);
/// assert_eq!(key_of(b"{}"), None);
/// ```
pub fn key_of(body: &[u8]) -> Option<&str> {
    body.strip_prefix(&STORED)
        .and_then(|k| std::str::from_utf8(k).ok())
        .filter(|k| !k.is_empty())
}

/// Whether a body is a claim check: it carries a store key (`AC 01 01 {key}`). An inline
/// body (`AC 01 00 …`) is not one, as in the other members.
///
/// ```
/// assert!(acemq::codec::claim::is_claim_check(b"\xAC\x01\x01k"));
/// assert!(!acemq::codec::claim::is_claim_check(b"\xAC\x01\x00x"));
/// assert!(!acemq::codec::claim::is_claim_check(b"x"));
/// ```
pub fn is_claim_check(body: &[u8]) -> bool {
    key_of(body).is_some()
}

/// Runs a store's future to completion from the synchronous codec (see the module docs).
fn drive<F: Future>(future: F) -> F::Output {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(future))
        }
        _ => futures::executor::block_on(future),
    }
}

#[cfg(test)]
mod tests;
