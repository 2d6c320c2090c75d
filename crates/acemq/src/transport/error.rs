//! [`TransportError`]: what went wrong between the engine and a broker, and [`ErrorKind`],
//! what a caller can do about it (re-exported as `acemq::error::ErrorKind`, where the
//! library's own [`Error`](crate::error::Error) sorts itself into the same kinds).
//!
//! A failure that came from below (a socket, lapin) keeps that error as its
//! [`source()`](std::error::Error::source), not only its text, so a caller can walk the chain
//! or downcast it. Errors stay [`Clone`]: the source is shared behind an [`Arc`].

use std::sync::Arc;

use crate::topology::{NameTooLong, SHORT_STRING_MAX};

/// What a caller can do about an error: [`Error::kind`] and [`TransportError::kind`].
///
/// | kind | means | what to do | variants |
/// |---|---|---|---|
/// | [`InDoubt`](ErrorKind::InDoubt) | the publish was written; the broker may or may not have it | publish again with the **same message id** (consumers deduplicate) or reconcile; never assume it is lost, never assume it arrived | [`TransportError::ConfirmTimeout`], [`TransportError::ConfirmLost`] |
/// | [`Transient`](ErrorKind::Transient) | nothing was done (or it will be redone by the broker); retrying later can succeed | retry with backoff; HTTP 503 | [`Error::Blocked`] (and [`TransportError::Blocked`]), [`Error::PublishingPaused`], [`Error::Nacked`], [`TransportError::Closed`], [`TransportError::Io`], [`TransportError::AckNotSent`] (the broker redelivers), [`TransportError::Protocol`] 506 and 541 |
/// | [`Refused`](ErrorKind::Refused) | the broker said no to what was asked | do not retry as is: fix the topology, binding or permissions | [`Error::Unroutable`], [`TransportError::NotFound`], [`TransportError::PreconditionFailed`], [`TransportError::AccessRefused`], [`TransportError::ResourceLocked`], [`TransportError::Tls`] (a TLS handshake the certificates or `TlsOptions` must fix; never retried by connecting), every other [`TransportError::Protocol`] code |
/// | [`Invalid`](ErrorKind::Invalid) | the caller's input cannot be used | fix the call; HTTP 400 | [`Error::ReservedHeader`], [`Error::Encode`], [`Error::Decode`], [`Error::Retry`], [`Error::Topology`], [`Error::InvalidArgument`], [`Error::Config`], [`TransportError::Config`], [`TransportError::InvalidName`], [`TransportError::Unsupported`] |
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
///
/// [`Error::kind`]: crate::error::Error::kind
/// [`Error::Blocked`]: crate::error::Error::Blocked
/// [`Error::PublishingPaused`]: crate::error::Error::PublishingPaused
/// [`Error::Nacked`]: crate::error::Error::Nacked
/// [`Error::Unroutable`]: crate::error::Error::Unroutable
/// [`Error::ReservedHeader`]: crate::error::Error::ReservedHeader
/// [`Error::Encode`]: crate::error::Error::Encode
/// [`Error::Decode`]: crate::error::Error::Decode
/// [`Error::Retry`]: crate::error::Error::Retry
/// [`Error::Topology`]: crate::error::Error::Topology
/// [`Error::InvalidArgument`]: crate::error::Error::InvalidArgument
/// [`Error::Config`]: crate::error::Error::Config
/// [`Error::Closed`]: crate::error::Error::Closed
/// [`Error::Cancelled`]: crate::error::Error::Cancelled
/// [`Error::Batch`]: crate::error::Error::Batch
/// [`Error::ConsumerTopology`]: crate::error::Error::ConsumerTopology
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

/// The underlying error a [`TransportError`] keeps as its source.
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong between the engine and the broker.
///
/// [`TransportError::kind`] sorts every variant into an [`ErrorKind`]; the table is on
/// [`ErrorKind`].
///
/// ```
/// use acemq::error::ErrorKind;
/// use acemq::transport::TransportError;
/// let e = TransportError::PreconditionFailed { detail: "inequivalent arg 'x-message-ttl'".into() };
/// assert!(e.is_precondition_failed());
/// assert_eq!(e.kind(), ErrorKind::Refused);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TransportError {
    /// 404: the exchange or queue does not exist.
    NotFound {
        /// The broker's text.
        detail: String,
    },
    /// 406: it exists with different arguments or flags (or another precondition).
    PreconditionFailed {
        /// The broker's text, naming the difference.
        detail: String,
    },
    /// 403: the credentials may not do this.
    AccessRefused {
        /// The broker's text.
        detail: String,
    },
    /// 405: an exclusive queue of another connection.
    ResourceLocked {
        /// The broker's text.
        detail: String,
    },
    /// The publishing connection is blocked by a resource alarm; nothing was sent.
    ///
    /// Above the transport this surfaces as [`Error::Blocked`](crate::error::Error::Blocked)
    /// (the conversion into [`Error`](crate::error::Error) maps it), so a caller matches one
    /// variant.
    Blocked {
        /// The broker's reason ("low on memory").
        reason: String,
    },
    /// A settlement reached nothing (already settled, or the channel is gone): expect a
    /// redelivery.
    AckNotSent,
    /// The connection or channel is closed. For a publish this is said only when the
    /// message was not handed to the broker (or was discarded by a channel close); a publish
    /// that was written and then lost its connection is [`TransportError::ConfirmLost`].
    Closed {
        /// What closed it.
        detail: String,
    },
    /// A name over AMQP's 255-byte limit, or otherwise unusable.
    InvalidName {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The broker did not confirm in time; the publish is in doubt (it may still land).
    ConfirmTimeout {
        /// The wait, in milliseconds.
        millis: u64,
    },
    /// The publish was written, then its channel or connection went away before the broker
    /// confirmed it: the publish is in doubt (the broker may or may not have it).
    ConfirmLost {
        /// What was lost.
        detail: String,
        /// The underlying failure, when there is one.
        source: Option<Source>,
    },
    /// The connection is down or recovering; nothing was sent, so sending again is safe.
    NotConnected {
        /// What is going on.
        detail: String,
    },
    /// No address answered within the connect budget.
    Unreachable {
        /// The address tried last, without credentials.
        address: String,
        /// The budget, in milliseconds.
        waited_ms: u64,
        /// The last error.
        detail: String,
    },
    /// The configuration cannot be used (a malformed URL, credentials that cannot be read).
    Config {
        /// What is wrong (never a secret).
        detail: String,
    },
    /// Not supported by this transport.
    Unsupported(String),
    /// Any other AMQP error, with its reply code.
    Protocol {
        /// Reply code.
        code: u16,
        /// Text.
        detail: String,
    },
    /// The TLS handshake with the broker failed: its certificate is not trusted or not for
    /// the name verified, or it refused the client certificate. Retrying cannot help (the
    /// certificates or [`TlsOptions`](crate::transport::amqp::TlsOptions) must change), so
    /// connecting fails at once instead of retrying until the connect timeout.
    ///
    /// ```
    /// use acemq::error::ErrorKind;
    /// use acemq::transport::{TlsFailure, TransportError};
    /// let e = TransportError::Tls {
    ///     address: "127.0.0.1:5671".into(),
    ///     failure: TlsFailure::UnknownCa,
    ///     detail: "invalid peer certificate: UnknownIssuer".into(),
    /// };
    /// assert!(e.to_string().starts_with(
    ///     "TLS handshake with 127.0.0.1:5671 failed: the server's certificate is not signed by a trusted CA"
    /// ));
    /// assert_eq!(e.kind(), ErrorKind::Refused);
    /// ```
    Tls {
        /// The broker's `host:port`.
        address: String,
        /// What went wrong.
        failure: TlsFailure,
        /// The TLS library's own text.
        detail: String,
    },
    /// A network or I/O failure (or another failure of the client library underneath).
    Io {
        /// What failed, as text.
        detail: String,
        /// The underlying error.
        source: Source,
    },
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::NotFound { detail } => write!(f, "not found: {detail}"),
            TransportError::PreconditionFailed { detail } => {
                write!(f, "precondition failed: {detail}")
            }
            TransportError::AccessRefused { detail } => write!(
                f,
                "access refused: {detail}; check the user's permissions on the vhost"
            ),
            TransportError::ResourceLocked { detail } => write!(f, "resource locked: {detail}"),
            TransportError::Blocked { reason } => write!(
                f,
                "the broker has blocked this connection: {reason}; nothing was sent, try again once it unblocks"
            ),
            TransportError::AckNotSent => f.write_str(
                "the settlement was not sent (delivery already settled or its channel closed); the broker will redeliver the message",
            ),
            TransportError::Closed { detail } => {
                write!(f, "connection or channel closed: {detail}")
            }
            TransportError::InvalidName { name, reason } => {
                write!(f, "invalid name {name:?}: {reason}")
            }
            TransportError::ConfirmTimeout { millis } => write!(
                f,
                "no confirm within {millis} ms; the publish is in doubt and may still arrive"
            ),
            TransportError::ConfirmLost { detail, .. } => write!(
                f,
                "the connection was lost after the publish was written and before its confirm: {detail}; the publish is in doubt and may have arrived"
            ),
            TransportError::NotConnected { detail } => write!(
                f,
                "not connected: {detail}; nothing was sent, it is safe to send again"
            ),
            TransportError::Unreachable {
                address,
                waited_ms,
                detail,
            } => write!(
                f,
                "could not reach the broker at {address} within {waited_ms} ms: {detail}"
            ),
            TransportError::Config { detail } => write!(f, "invalid configuration: {detail}"),
            TransportError::Unsupported(what) => write!(f, "not supported: {what}"),
            TransportError::Protocol { code, detail } => write!(f, "AMQP error {code}: {detail}"),
            TransportError::Io { detail, .. } => write!(f, "I/O error: {detail}"),
            TransportError::Tls {
                address,
                failure,
                detail,
            } => write!(f, "TLS handshake with {address} failed: {failure} ({detail})"),
        }
    }
}

/// Written by hand rather than derived: the source is the underlying error itself (so it
/// can be downcast), not the [`Arc`] that shares it.
impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TransportError::Io { source, .. } => Some(&**source),
            TransportError::ConfirmLost {
                source: Some(source),
                ..
            } => Some(&**source),
            _ => None,
        }
    }
}

impl TransportError {
    /// 406 PRECONDITION_FAILED.
    pub fn is_precondition_failed(&self) -> bool {
        matches!(self, TransportError::PreconditionFailed { .. })
    }

    /// 404 NOT_FOUND.
    pub fn is_not_found(&self) -> bool {
        matches!(self, TransportError::NotFound { .. })
    }

    /// A [`TransportError::Io`] keeping `source` as its [`source()`](std::error::Error::source);
    /// the detail is its text.
    ///
    /// ```
    /// use std::error::Error as _;
    /// use acemq::transport::TransportError;
    /// let e = TransportError::io(std::io::Error::other("connection reset"));
    /// assert_eq!(e.to_string(), "I/O error: connection reset");
    /// assert!(e.source().is_some_and(|s| s.is::<std::io::Error>()));
    /// ```
    pub fn io(source: impl std::error::Error + Send + Sync + 'static) -> TransportError {
        TransportError::Io {
            detail: source.to_string(),
            source: Arc::new(source),
        }
    }

    /// What a caller can do about it; the table is on [`ErrorKind`].
    ///
    /// ```
    /// use acemq::error::ErrorKind;
    /// use acemq::transport::TransportError;
    /// assert_eq!(TransportError::ConfirmTimeout { millis: 30_000 }.kind(), ErrorKind::InDoubt);
    /// assert_eq!(TransportError::Blocked { reason: "low on memory".into() }.kind(), ErrorKind::Transient);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            TransportError::NotFound { .. }
            | TransportError::PreconditionFailed { .. }
            | TransportError::AccessRefused { .. }
            | TransportError::ResourceLocked { .. }
            | TransportError::Tls { .. } => ErrorKind::Refused,
            TransportError::Blocked { .. }
            | TransportError::AckNotSent
            | TransportError::Closed { .. }
            | TransportError::NotConnected { .. }
            | TransportError::Unreachable { .. }
            | TransportError::Io { .. } => ErrorKind::Transient,
            TransportError::InvalidName { .. }
            | TransportError::Unsupported(_)
            | TransportError::Config { .. } => ErrorKind::Invalid,
            TransportError::ConfirmTimeout { .. } | TransportError::ConfirmLost { .. } => {
                ErrorKind::InDoubt
            }
            TransportError::Protocol { code, .. } => protocol_kind(*code),
        }
    }
}

/// Why a TLS handshake failed ([`TransportError::Tls`]).
///
/// ```
/// use acemq::transport::TlsFailure;
/// assert_ne!(TlsFailure::UnknownCa, TlsFailure::NameMismatch);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server's certificate is not signed by a CA this client trusts.
    UnknownCa,
    /// The server's certificate is not valid for the name verified (connecting by IP, or
    /// through a load balancer, with a certificate for another name).
    NameMismatch,
    /// The server's certificate has expired or is not valid yet.
    Expired,
    /// The server's certificate cannot be used: an X.509 v1 certificate (no extensions), or
    /// one that does not parse.
    UnsupportedCertificate,
    /// The server refused the client certificate, or required one that was not presented.
    ClientCertificateRefused,
    /// The other end does not speak TLS (an `amqps://` URL on a plain AMQP port).
    NotTls,
    /// Another TLS failure; the detail says which.
    Other,
}

/// The cause and what to do about it, in words.
impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsFailure::UnknownCa => f.write_str(
                "the server's certificate is not signed by a trusted CA (add the CA with TlsOptions::ca_bundle_pem, or install it in the system's trust store)",
            ),
            TlsFailure::NameMismatch => f.write_str(
                "the server's certificate is not valid for the name verified, the URL's host unless TlsOptions::server_name gives another (connecting by IP or through a load balancer: set the name on the certificate with TlsOptions::server_name)",
            ),
            TlsFailure::Expired => f.write_str(
                "the server's certificate has expired or is not valid yet (renew it, or check the clocks)",
            ),
            TlsFailure::UnsupportedCertificate => f.write_str(
                "the server's certificate cannot be used; an X.509 v1 certificate (no extensions, so no subjectAltName) is refused: issue an X.509 v3 certificate with a subjectAltName",
            ),
            TlsFailure::ClientCertificateRefused => f.write_str(
                "the server refused the client certificate or required one (present a certificate signed by a CA the server trusts with TlsOptions::client_certificate_pem)",
            ),
            TlsFailure::NotTls => f.write_str(
                "the other end did not answer in TLS; is the port a TLS listener? (amqps:// is usually 5671, amqp:// 5672)",
            ),
            TlsFailure::Other => f.write_str("the TLS library refused the connection"),
        }
    }
}

/// 506 RESOURCE_ERROR and 541 INTERNAL_ERROR are the broker's own trouble (retry later);
/// every other reply code is the broker saying no to what was asked.
fn protocol_kind(code: u16) -> ErrorKind {
    match code {
        506 | 541 => ErrorKind::Transient,
        _ => ErrorKind::Refused,
    }
}

/// A name over AMQP's short-string limit is an [`TransportError::InvalidName`] that shows
/// its first 64 characters and says how long it is.
impl From<NameTooLong> for TransportError {
    fn from(e: NameTooLong) -> Self {
        TransportError::InvalidName {
            name: e.name.chars().take(64).collect::<String>() + "...",
            reason: format!(
                "{} bytes; AMQP names are at most {SHORT_STRING_MAX} bytes",
                e.name.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// Every variant, with the kind it must have.
    fn table() -> Vec<(TransportError, ErrorKind)> {
        let d = || String::from("d");
        vec![
            (TransportError::NotFound { detail: d() }, ErrorKind::Refused),
            (
                TransportError::PreconditionFailed { detail: d() },
                ErrorKind::Refused,
            ),
            (
                TransportError::AccessRefused { detail: d() },
                ErrorKind::Refused,
            ),
            (
                TransportError::ResourceLocked { detail: d() },
                ErrorKind::Refused,
            ),
            (
                TransportError::Blocked { reason: d() },
                ErrorKind::Transient,
            ),
            (TransportError::AckNotSent, ErrorKind::Transient),
            (TransportError::Closed { detail: d() }, ErrorKind::Transient),
            (
                TransportError::InvalidName {
                    name: d(),
                    reason: d(),
                },
                ErrorKind::Invalid,
            ),
            (
                TransportError::ConfirmTimeout { millis: 1 },
                ErrorKind::InDoubt,
            ),
            (
                TransportError::ConfirmLost {
                    detail: d(),
                    source: None,
                },
                ErrorKind::InDoubt,
            ),
            (TransportError::Unsupported(d()), ErrorKind::Invalid),
            (TransportError::Config { detail: d() }, ErrorKind::Invalid),
            (
                TransportError::NotConnected { detail: d() },
                ErrorKind::Transient,
            ),
            (
                TransportError::Unreachable {
                    address: d(),
                    waited_ms: 1,
                    detail: d(),
                },
                ErrorKind::Transient,
            ),
            (
                TransportError::Protocol {
                    code: 530,
                    detail: d(),
                },
                ErrorKind::Refused,
            ),
            (
                TransportError::Protocol {
                    code: 541,
                    detail: d(),
                },
                ErrorKind::Transient,
            ),
            (
                TransportError::Protocol {
                    code: 506,
                    detail: d(),
                },
                ErrorKind::Transient,
            ),
            (
                TransportError::io(std::io::Error::other("reset")),
                ErrorKind::Transient,
            ),
            (
                TransportError::Tls {
                    address: d(),
                    failure: TlsFailure::NameMismatch,
                    detail: d(),
                },
                ErrorKind::Refused,
            ),
        ]
    }

    #[test]
    fn every_variant_has_its_kind() {
        for (e, kind) in table() {
            assert_eq!(e.kind(), kind, "{e:?}");
        }
    }

    #[test]
    fn io_keeps_its_source_through_a_clone() {
        let e = TransportError::io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset by peer",
        ));
        let e = e.clone();
        let source = e.source().expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the io::Error itself");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        assert_eq!(e.to_string(), "I/O error: reset by peer");
    }

    #[test]
    fn a_lost_confirm_keeps_its_source() {
        let e = TransportError::ConfirmLost {
            detail: "connection reset".into(),
            source: Some(Arc::new(std::io::Error::other("reset"))),
        };
        assert!(e.source().is_some());
        assert!(e.to_string().contains("in doubt"), "{e}");
    }
}
