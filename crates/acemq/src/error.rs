//! The library's error type: one enum, every variant saying what to do about it, and
//! [`ErrorKind`], the one question a caller asks before writing a retry or an HTTP status.
//!
//! [`ErrorKind`] is defined with the transport's errors (the ground floor, which sorts its
//! own errors into kinds) and re-exported here, where callers name it.

pub use crate::transport::ErrorKind;
use crate::transport::TransportError;

/// Everything that can go wrong in AceMQ.
///
/// Every error answers [`Error::kind`] (see [`ErrorKind`] for the table).
///
/// ```
/// use acemq::Error;
/// use acemq::error::ErrorKind;
/// let e = Error::PublishingPaused;
/// assert!(e.is_refused());
/// assert_eq!(e.kind(), ErrorKind::Transient);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker or the connection failed.
    ///
    /// Never holds [`TransportError::Blocked`] or [`TransportError::Config`]: converting
    /// one into an [`Error`] gives [`Error::Blocked`] or [`Error::Config`], the one blocked
    /// and the one configuration variant a caller matches.
    #[error(transparent)]
    Transport(TransportError),
    /// A mandatory publish reached no queue.
    #[error(
        "message {message_id} published to exchange {exchange:?} with routing key {routing_key:?} was accepted but could not be routed to any queue ({reply_text}); declare the queue or binding, or publish with allow_unroutable()"
    )]
    Unroutable {
        /// Exchange.
        exchange: String,
        /// Routing key.
        routing_key: String,
        /// Message id.
        message_id: String,
        /// The broker's reply text.
        reply_text: String,
    },
    /// The broker refused responsibility for a publish (basic.nack).
    #[error(
        "message {message_id} was nacked by the broker; it may not have been stored, publish it again"
    )]
    Nacked {
        /// Message id.
        message_id: String,
    },
    /// Nothing was sent: the connection is blocked by a resource alarm. This is how every
    /// publishing refusal for a blocked connection surfaces (a [`TransportError::Blocked`]
    /// converts into it).
    #[error("publish refused: the broker has blocked this connection: {reason}; nothing was sent")]
    Blocked {
        /// The broker's reason.
        reason: String,
    },
    /// Nothing was sent: publishing is paused on this connection.
    #[error(
        "publish refused: publishing is paused on this connection; nothing was sent (resume_publishing() to continue)"
    )]
    PublishingPaused,
    /// An application header uses the engine's reserved `x-acemq-` prefix.
    #[error(
        "header {name:?} uses the reserved prefix x-acemq-; application headers must not start with it (use another name, e.g. without the x-acemq- prefix)"
    )]
    ReservedHeader {
        /// The refused header.
        name: String,
    },
    /// The payload could not be encoded.
    #[error("could not encode the payload as {content_type}: {reason}")]
    Encode {
        /// Target content type.
        content_type: String,
        /// Why.
        reason: String,
    },
    /// The body could not be decoded.
    #[error("could not be decoded: {reason}")]
    Decode {
        /// Why (names the content type).
        reason: String,
    },
    /// A retry policy could not be built.
    #[error(transparent)]
    Retry(#[from] crate::retry::RetryError),
    /// A topology could not be built.
    #[error(transparent)]
    Topology(#[from] crate::topology::TopologyError),
    /// An argument was out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A connection URL or option could not be used (also what a
    /// [`TransportError::Config`] converts into).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Some publishes of a batch failed; the others were confirmed.
    #[error(
        "{failed} of {total} publishes failed (the rest were confirmed); first failure: {first}"
    )]
    Batch {
        /// How many failed.
        failed: usize,
        /// How many were sent.
        total: usize,
        /// The first failure.
        first: Box<Error>,
    },
    /// A consumer could not declare the topology it needs, so it refused to start.
    #[error("consumer for {queue:?} refused to start: could not declare {item}: {source}")]
    ConsumerTopology {
        /// The consumed queue.
        queue: String,
        /// What could not be declared.
        item: String,
        /// The broker's answer.
        source: TransportError,
    },
    /// A scheduler's cancellation store could not record a cancellation
    /// ([`Scheduler::cancel`](crate::schedule::Scheduler::cancel)): unavailable (try
    /// again) or refused the id.
    #[error(transparent)]
    CancelStore(#[from] CancelError),
    /// A saga could not be built ([`crate::saga`]).
    #[error(transparent)]
    Saga(#[from] crate::saga::SagaError),
    /// The operation was cancelled by the caller.
    #[error("cancelled by the caller")]
    Cancelled,
    /// The connection is closed.
    #[error("the AceMQ connection is closed")]
    Closed,
}

/// A scheduler's cancellation store that could not be used ([`crate::schedule::CancelStore`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CancelError {
    /// The store could not be reached or refused the statement: whether the id is
    /// cancelled is unknown. A scheduler does not deliver while it cannot ask (it retries
    /// with backoff).
    #[error("cancellation store unavailable: {0}; retry later")]
    Unavailable(String),
    /// An id or option the store cannot take.
    #[error("invalid cancellation store input: {0}")]
    Invalid(String),
}

impl Error {
    /// Nothing reached the broker because of blocking or pausing (`outcome="refused"`).
    pub fn is_refused(&self) -> bool {
        matches!(
            self,
            Error::Blocked { .. }
                | Error::PublishingPaused
                | Error::Transport(TransportError::Blocked { .. })
        )
    }

    /// The publish reached no queue.
    pub fn is_unroutable(&self) -> bool {
        matches!(self, Error::Unroutable { .. })
    }

    /// What a caller can do about it; the table is on [`ErrorKind`].
    ///
    /// ```
    /// use acemq::Error;
    /// use acemq::error::ErrorKind;
    /// assert_eq!(Error::Closed.kind(), ErrorKind::Closed);
    /// assert_eq!(Error::InvalidArgument("prefetch 0".into()).kind(), ErrorKind::Invalid);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Transport(e) => e.kind(),
            Error::ConsumerTopology { source, .. } => source.kind(),
            Error::Batch { first, .. } => first.kind(),
            Error::Unroutable { .. } => ErrorKind::Refused,
            Error::Nacked { .. } | Error::Blocked { .. } | Error::PublishingPaused => {
                ErrorKind::Transient
            }
            Error::ReservedHeader { .. }
            | Error::Encode { .. }
            | Error::Decode { .. }
            | Error::Retry(_)
            | Error::Topology(_)
            | Error::InvalidArgument(_)
            | Error::Config(_) => ErrorKind::Invalid,
            Error::CancelStore(CancelError::Invalid(_)) => ErrorKind::Invalid,
            Error::CancelStore(_) => ErrorKind::Transient,
            Error::Saga(_) => ErrorKind::Invalid,
            Error::Cancelled | Error::Closed => ErrorKind::Closed,
        }
    }
}

impl From<TransportError> for Error {
    /// Wraps a transport error; a [`TransportError::Blocked`] becomes [`Error::Blocked`] and
    /// a [`TransportError::Config`] becomes [`Error::Config`], the one variant of each a
    /// caller matches.
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Blocked { reason } => Error::Blocked { reason },
            TransportError::Config { detail } => Error::Config(detail),
            other => Error::Transport(other),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::RetryError;
    use crate::topology::TopologyError;

    fn transport(kind_of: TransportError) -> Error {
        Error::from(kind_of)
    }

    /// Every variant of [`Error`], with the kind it must have.
    fn table() -> Vec<(Error, ErrorKind)> {
        let s = || String::from("s");
        let retry = RetryError::ZeroAttempts;
        let topology = TopologyError::EmptyName { what: "queue" };
        vec![
            (
                transport(TransportError::ConfirmTimeout { millis: 1 }),
                ErrorKind::InDoubt,
            ),
            (
                transport(TransportError::NotFound { detail: s() }),
                ErrorKind::Refused,
            ),
            (
                Error::Unroutable {
                    exchange: s(),
                    routing_key: s(),
                    message_id: s(),
                    reply_text: s(),
                },
                ErrorKind::Refused,
            ),
            (Error::Nacked { message_id: s() }, ErrorKind::Transient),
            (Error::Blocked { reason: s() }, ErrorKind::Transient),
            (Error::PublishingPaused, ErrorKind::Transient),
            (Error::ReservedHeader { name: s() }, ErrorKind::Invalid),
            (
                Error::Encode {
                    content_type: s(),
                    reason: s(),
                },
                ErrorKind::Invalid,
            ),
            (Error::Decode { reason: s() }, ErrorKind::Invalid),
            (Error::Retry(retry), ErrorKind::Invalid),
            (Error::Topology(topology), ErrorKind::Invalid),
            (Error::InvalidArgument(s()), ErrorKind::Invalid),
            (Error::Config(s()), ErrorKind::Invalid),
            (
                Error::Batch {
                    failed: 1,
                    total: 2,
                    first: Box::new(transport(TransportError::ConfirmTimeout { millis: 1 })),
                },
                ErrorKind::InDoubt,
            ),
            (
                Error::ConsumerTopology {
                    queue: s(),
                    item: s(),
                    source: TransportError::PreconditionFailed { detail: s() },
                },
                ErrorKind::Refused,
            ),
            (Error::Cancelled, ErrorKind::Closed),
            (Error::Closed, ErrorKind::Closed),
        ]
    }

    #[test]
    fn every_variant_has_its_kind() {
        for (e, kind) in table() {
            assert_eq!(e.kind(), kind, "{e:?}");
        }
    }

    #[test]
    fn a_transport_blocked_surfaces_as_the_one_blocked_variant() {
        let e = Error::from(TransportError::Blocked {
            reason: "low on memory".into(),
        });
        assert!(
            matches!(&e, Error::Blocked { reason } if reason == "low on memory"),
            "{e:?}"
        );
        assert!(e.is_refused());
        assert_eq!(e.kind(), ErrorKind::Transient);
        let other = Error::from(TransportError::AckNotSent);
        assert!(matches!(
            other,
            Error::Transport(TransportError::AckNotSent)
        ));
    }

    #[tokio::test]
    async fn a_transport_config_error_surfaces_as_the_one_config_variant() {
        let e = Error::from(
            crate::transport::connect("memory://")
                .await
                .err()
                .expect("no broker name"),
        );
        assert!(
            matches!(&e, Error::Config(m) if m.contains("memory://orders")),
            "{e:?}"
        );
        assert_eq!(e.kind(), ErrorKind::Invalid);
        assert_eq!(
            e.to_string(),
            "invalid configuration: memory:// needs a broker name, e.g. memory://orders"
        );
    }

    #[test]
    fn a_transport_error_keeps_its_source_through_the_library_error() {
        use std::error::Error as _;
        let e = Error::from(TransportError::io(std::io::Error::other("reset")));
        let source = e.source().expect("the io error");
        assert!(source.is::<std::io::Error>(), "{source:?}");
    }
}
