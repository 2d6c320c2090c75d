//! The library's error type: one enum, every variant saying what to do about it, and
//! [`ErrorKind`], the one question a caller asks before writing a retry or an HTTP status.

use crate::transport::TransportError;

/// What a caller can do about an error: [`Error::kind`] and [`TransportError::kind`].
///
/// | kind | means | what to do | variants |
/// |---|---|---|---|
/// | [`InDoubt`](ErrorKind::InDoubt) | the publish was written; the broker may or may not have it | publish again with the **same message id** (consumers deduplicate) or reconcile; never assume it is lost, never assume it arrived | [`TransportError::ConfirmTimeout`], [`TransportError::ConfirmLost`] |
/// | [`Transient`](ErrorKind::Transient) | nothing was done (or it will be redone by the broker); retrying later can succeed | retry with backoff; HTTP 503 | [`Error::Blocked`] (and [`TransportError::Blocked`]), [`Error::PublishingPaused`], [`Error::Nacked`], [`TransportError::Closed`], [`TransportError::Io`], [`TransportError::AckNotSent`] (the broker redelivers), [`TransportError::Protocol`] 506 and 541 |
/// | [`Refused`](ErrorKind::Refused) | the broker said no to what was asked | do not retry as is: fix the topology, binding or permissions | [`Error::Unroutable`], [`TransportError::NotFound`], [`TransportError::PreconditionFailed`], [`TransportError::AccessRefused`], [`TransportError::ResourceLocked`], [`TransportError::Tls`] (a TLS handshake the certificates or `TlsOptions` must fix; never retried by connecting), every other [`TransportError::Protocol`] code |
/// | [`Invalid`](ErrorKind::Invalid) | the caller's input cannot be used | fix the call; HTTP 400 | [`Error::ReservedHeader`], [`Error::Encode`], [`Error::Decode`], [`Error::Retry`], [`Error::Topology`], [`Error::InvalidArgument`], [`Error::Config`], [`TransportError::InvalidName`], [`TransportError::Unsupported`] |
/// | [`Closed`](ErrorKind::Closed) | the AceMQ connection (or the consumer) was closed by its owner | stop; reconnect only if that was not meant | [`Error::Closed`], [`Error::Cancelled`] |
///
/// Two variants take the kind of what they carry: [`Error::Batch`] that of its first
/// failure, [`Error::ConsumerTopology`] that of the broker's answer.
///
/// A nack ([`Error::Nacked`]) is *transient*: RabbitMQ nacks a publish it would not take
/// responsibility for (a full queue with `x-overflow=reject-publish`, an internal error), and
/// publishing it again later can succeed.
///
/// ```
/// use acemq::Error;
/// use acemq::error::ErrorKind;
/// use acemq::transport::TransportError;
///
/// fn status(e: &Error) -> u16 {
///     match e.kind() {
///         ErrorKind::Invalid => 400,
///         ErrorKind::Refused => 422,
///         ErrorKind::InDoubt => 202, // accepted, outcome unknown: reconcile by message id
///         _ => 503,
///     }
/// }
/// assert_eq!(status(&Error::Config("bad URL".into())), 400);
/// assert_eq!(status(&TransportError::ConfirmTimeout { millis: 30_000 }.into()), 202);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The broker may or may not have it: a confirm timeout, or the connection lost after
    /// the publish was written.
    InDoubt,
    /// Retrying later can succeed: the connection is down or blocked, a channel closed,
    /// publishing paused, a nack.
    Transient,
    /// The broker said no: unroutable, access refused, precondition failed, not found.
    Refused,
    /// The caller's input: a bad name, an encode failure, an invalid argument or
    /// configuration, a reserved header.
    Invalid,
    /// The AceMQ connection was closed by its owner (or the operation was cancelled by a
    /// close).
    Closed,
}

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
    /// Never holds [`TransportError::Blocked`]: converting one into an [`Error`] gives
    /// [`Error::Blocked`], the one blocked variant a caller matches.
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
    /// A connection URL or option could not be used.
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
    /// The operation was cancelled by the caller.
    #[error("cancelled by the caller")]
    Cancelled,
    /// The connection is closed.
    #[error("the AceMQ connection is closed")]
    Closed,
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
            Error::Cancelled | Error::Closed => ErrorKind::Closed,
        }
    }
}

impl From<TransportError> for Error {
    /// Wraps a transport error; a [`TransportError::Blocked`] becomes [`Error::Blocked`].
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Blocked { reason } => Error::Blocked { reason },
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

    #[test]
    fn a_transport_error_keeps_its_source_through_the_library_error() {
        use std::error::Error as _;
        let e = Error::from(TransportError::io(std::io::Error::other("reset")));
        let source = e.source().expect("the io error");
        assert!(source.is::<std::io::Error>(), "{source:?}");
    }
}
