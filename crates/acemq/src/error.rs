//! The library's error type: one enum, every variant saying what to do about it.

use crate::transport::TransportError;

/// Everything that can go wrong in AceMQ.
///
/// ```
/// use acemq::Error;
/// let e = Error::PublishingPaused;
/// assert!(e.is_refused());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker or the connection failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
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
    /// Nothing was sent: the connection is blocked by a resource alarm.
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
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
