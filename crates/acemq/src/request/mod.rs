//! Request/reply over RabbitMQ, wire-compatible with the rest of the family.
//!
//! This module owns both halves of a request/reply exchange:
//!
//! - [`Requester`] (`mq.requester()`): one private reply queue per requester,
//!   `acemq.reply.{uuid}` (classic, durable, `x-expires` = 600000 ms, as the Java member
//!   declares it), consumed with acks and a prefetch of [`REPLY_PREFETCH`].
//!   [`Requester::request`] publishes through the connection's normal confirmed path (so
//!   the envelope — id, type, origin, first-seen, `traceparent` — is written as on any
//!   publish) with a fresh UUID in `x-acemq-correlation` and the reply queue in **both**
//!   the `acemq-reply-to` header and the AMQP `reply_to` property, and waits for the reply
//!   whose `x-acemq-correlation` matches. A publish that fails before the reply comes
//!   (unroutable, nacked, in doubt) fails the request; a reply that comes before the
//!   request's confirm answers at once (it proves the request arrived; the confirm is still
//!   awaited, in a task, for the publish metric and span). A reply that matches nothing
//!   (its request timed out, or was dropped) is acked, counted as *unmatched* and dropped.
//! - [`Responder`] (`mq.respond(queue, options, handler)`): a consumer like any other (it
//!   is built on the consume machinery, so retries, dead letters, drain, recovery and
//!   health apply), whose handler returns the answer. A handler failure that is final
//!   (fatal, parked, dead-lettered, or the last attempt its retry policy allows; with no
//!   policy, the first) goes back to the requester as a *fault reply*: an empty body with
//!   the reason in the `acemq-error` header, as Go and Ruby write it; the requester
//!   returns [`RequestError::Failed`] at once instead of timing out, and the request lands
//!   in `{queue}.dlq` (or `.parked`). A failure the policy retries is retried. The reply address is read from the
//!   `acemq-reply-to` header first and the `reply_to` property second; the reply goes
//!   through the default exchange with the request's `x-acemq-correlation` and
//!   `x-acemq-causation` = the request's id, mandatory and confirmed, and transient
//!   (delivery mode 1): a reply is worth nothing once its requester gave up, and a
//!   persistent one would be written to disk by the broker (the reply queue is durable). A request with no
//!   reply address is acked without running the handler and counted *unanswerable*.
//!
//! Observability: `acemq.request.duration` (histogram, seconds) and `acemq.request.total`
//! (`outcome` = `answered` | `timed_out`) with `routing.key`, `message.type` and
//! `transport`; a CLIENT span `{destination} request` around the publish and the wait.
//!
//! Recovery: the reply queue is recorded with the transport's topology (declared again
//! after a reconnect), and the requester subscribes to it again once the connection is
//! back (declaring it first, in case it expired meanwhile). A request in flight across a
//! loss gets its reply or times out: every wait is bounded by its timeout. Meanwhile the
//! requester's health component, `requester:{reply queue}`, is Degraded with the reason
//! (Up otherwise; details `pending`, `answered`, `timedOut`, `unmatched`); it leaves health
//! when the requester is closed.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use acemq::consume::{ConsumerOptions, Message};
//! use acemq::topology::QueueDecl;
//! let mq = acemq::Connection::connect("memory://doc-request").await?;
//! mq.transport().declare_queue(&QueueDecl::classic("prices")).await?;
//! let _responder = mq
//!     .respond("prices", ConsumerOptions::default(), |m: Message<String>| async move {
//!         Ok(format!("price of {}: 42", m.payload()))
//!     })
//!     .await?;
//! let requester = mq.requester().await?;
//! let answer: String = requester
//!     .request("", "prices", &"tea".to_owned(), Duration::from_secs(5))
//!     .await?;
//! assert_eq!(answer, "price of tea: 42");
//! # Ok(()) }
//! ```

mod observe;
mod replies;
mod requester;
mod responder;

use std::time::Duration;

pub use observe::RequestOutcome;
pub use requester::{Requester, RequesterStats};
pub(crate) use responder::start as responder_start;
pub use responder::{Responder, ResponderStats};

/// The reply queue's name prefix: `acemq.reply.{uuid}`.
pub const REPLY_QUEUE_PREFIX: &str = "acemq.reply.";

/// The reply queue's `x-expires`, in milliseconds (10 minutes, as the Java member).
pub const REPLY_QUEUE_EXPIRES_MS: i64 = 600_000;

/// The reply queue's prefetch window (as the Java member).
pub const REPLY_PREFETCH: u16 = 100;

/// Why a request did not produce an answer.
///
/// ```
/// use std::time::Duration;
/// use acemq::request::RequestError;
/// let e = RequestError::TimedOut {
///     destination: "prices".into(),
///     correlation_id: "c-1".into(),
///     timeout: Duration::from_secs(5),
/// };
/// assert!(e.to_string().contains("may still be processed"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No reply within the timeout. The request was sent and may still be processed:
    /// resend it only if its handler is idempotent. A reply arriving later is dropped
    /// (counted as unmatched).
    #[error(
        "no reply to the request sent to {destination} (correlation {correlation_id}) within {timeout:?}; the request may still be processed, and a late reply will be dropped: resend it only if its handler is idempotent"
    )]
    TimedOut {
        /// The exchange, or the routing key when the exchange is the default one.
        destination: String,
        /// The request's `x-acemq-correlation`.
        correlation_id: String,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// The responder's handler failed on this request, for good (it was not retried, or
    /// its retries ran out), and answered with a fault reply saying why. The request is in
    /// the responder queue's `.dlq` (or `.parked`), where it can be looked at and replayed.
    #[error(
        "the responder of {destination} failed on request {correlation_id}: {reason}; the request is in that queue's .dlq"
    )]
    Failed {
        /// The exchange, or the routing key when the exchange is the default one.
        destination: String,
        /// The request's `x-acemq-correlation`.
        correlation_id: String,
        /// The responder's reason (`acemq-error`).
        reason: String,
    },
    /// The request could not be published (see the inner error for whether it is in doubt
    /// and what to do).
    #[error("the request was not sent: {0}")]
    Publish(#[source] crate::Error),
    /// A reply came but its body does not decode as the expected type.
    #[error(
        "the reply to request {correlation_id} does not decode as the expected answer type: {source}; check that requester and responder agree on the type"
    )]
    Reply {
        /// The request's `x-acemq-correlation`.
        correlation_id: String,
        /// The decoding error.
        #[source]
        source: crate::Error,
    },
    /// The requester (or its connection) was closed before the reply came.
    #[error("the requester was closed before the reply came; the request may still be processed")]
    Closed,
}

impl RequestError {
    /// Whether this is a timeout (the request may still be processed).
    pub fn is_timeout(&self) -> bool {
        matches!(self, RequestError::TimedOut { .. })
    }

    /// What kind of failure this is, as [`Error::kind`](crate::Error::kind) sorts its own:
    /// a timeout is [`InDoubt`](crate::error::ErrorKind::InDoubt) (the request may still
    /// be processed), a fault reply [`Refused`](crate::error::ErrorKind::Refused), a reply
    /// that does not decode [`Invalid`](crate::error::ErrorKind::Invalid), a publish
    /// failure its own kind, a closed requester
    /// [`Closed`](crate::error::ErrorKind::Closed).
    ///
    /// ```
    /// use acemq::error::ErrorKind;
    /// use acemq::request::RequestError;
    /// assert_eq!(RequestError::Closed.kind(), ErrorKind::Closed);
    /// let failed = RequestError::Failed {
    ///     destination: "prices".into(),
    ///     correlation_id: "c-1".into(),
    ///     reason: "no price for tea".into(),
    /// };
    /// assert_eq!(failed.kind(), ErrorKind::Refused);
    /// ```
    pub fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            RequestError::TimedOut { .. } => ErrorKind::InDoubt,
            RequestError::Failed { .. } => ErrorKind::Refused,
            RequestError::Publish(e) => e.kind(),
            RequestError::Reply { .. } => ErrorKind::Invalid,
            RequestError::Closed => ErrorKind::Closed,
        }
    }
}

/// A short name for a type, as the Java member writes a class's simple name into
/// `x-acemq-type`: the last path segment, without generic arguments (`my_app::Quote` →
/// `Quote`, `Vec<u8>` → `Vec`); `fallback` when that leaves nothing readable (`()`).
pub(crate) fn simple_type_name<T: ?Sized>(fallback: &'static str) -> &'static str {
    let full = std::any::type_name::<T>();
    let head = full.split_once('<').map_or(full, |(head, _)| head);
    let last = head.rsplit_once(':').map_or(head, |(_, last)| last);
    if last.starts_with(|c: char| c.is_alphabetic()) {
        last
    } else {
        fallback
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Quote;

    #[test]
    fn simple_type_names_are_the_last_segment() {
        assert_eq!(simple_type_name::<Quote>("Reply"), "Quote");
        assert_eq!(simple_type_name::<String>("Reply"), "String");
        assert_eq!(simple_type_name::<Vec<u8>>("Reply"), "Vec");
        assert_eq!(simple_type_name::<serde_json::Value>("Reply"), "Value");
        assert_eq!(simple_type_name::<()>("Reply"), "Reply");
        assert_eq!(simple_type_name::<str>("Request"), "str");
    }
}
