//! What a handler reports when it does not succeed ([`HandlerError`], public as
//! `acemq::consume::HandlerError`): a leaf, so that interceptors and layers, which sit
//! beside the delivery path, can name it without importing the path.

use std::fmt;

/// A handler's failure, and what it asks for.
///
/// Any error converts with `?` and means "retry" (the policy decides when, and when to
/// give up). [`HandlerError::fatal`] means "unprocessable": straight to `{q}.dlq`.
///
/// ```
/// use acemq::consume::HandlerError;
/// fn parse(s: &str) -> Result<u32, HandlerError> {
///     let n: u32 = s.parse()?;                 // a ParseIntError: retried
///     if n == 0 {
///         return Err(HandlerError::fatal("zero is not an order number")); // to .dlq now
///     }
///     Ok(n)
/// }
/// assert!(parse("x").unwrap_err().is_retry());
/// assert!(!parse("0").unwrap_err().is_retry());
/// ```
pub struct HandlerError {
    pub(crate) kind: Kind,
    pub(crate) reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Retry,
    Fatal,
    Park,
    DeadLetter,
    Release,
}

impl HandlerError {
    /// Retry under the consumer's policy (what `?` produces).
    pub fn retry(reason: impl fmt::Display) -> Self {
        Self::new(Kind::Retry, reason)
    }
    /// The message can never be processed: republish it to `{q}.dlq` now
    /// (outcome `rejected`).
    pub fn fatal(reason: impl fmt::Display) -> Self {
        Self::new(Kind::Fatal, reason)
    }
    /// Set the message aside in `{q}.parked` (outcome `parked`), e.g. a payload that
    /// decoded but is not valid for this version of the code.
    pub fn park(reason: impl fmt::Display) -> Self {
        Self::new(Kind::Park, reason)
    }
    /// Republish it to `{q}.dlq` now (outcome `dead_lettered`).
    pub fn dead_letter(reason: impl fmt::Display) -> Self {
        Self::new(Kind::DeadLetter, reason)
    }
    /// Hand it back to the broker with requeue, spending no attempt (outcome `released`),
    /// e.g. when this instance cannot handle it right now.
    pub fn release() -> Self {
        Self::new(Kind::Release, "released by the handler")
    }
    /// Whether this asks for an ordinary retry.
    pub fn is_retry(&self) -> bool {
        self.kind == Kind::Retry
    }
    /// The reason text.
    pub fn reason(&self) -> &str {
        &self.reason
    }
    fn new(kind: Kind, reason: impl fmt::Display) -> Self {
        HandlerError {
            kind,
            reason: reason.to_string(),
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HandlerError({:?}: {})", self.kind, self.reason)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::retry(e)
    }
}
