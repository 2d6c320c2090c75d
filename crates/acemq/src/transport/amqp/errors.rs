//! lapin errors to [`TransportError`], by AMQP reply code.
//!
//! A channel or connection closed by the broker carries a reply code and the broker's text
//! (`NOT_FOUND - no queue 'x' in vhost '/'`); the code decides the variant and the text is
//! kept verbatim, so a 406 names the argument that differs. Local state errors (an operation
//! on a channel or connection that is already closed) become [`TransportError::Closed`],
//! socket failures [`TransportError::Io`], which keeps the lapin error as its `source()`.

use lapin::ErrorKind;

use crate::transport::TransportError;

/// AMQP reply codes the transport distinguishes.
pub(crate) mod code {
    /// 403 ACCESS_REFUSED.
    pub(crate) const ACCESS_REFUSED: u16 = 403;
    /// 404 NOT_FOUND.
    pub(crate) const NOT_FOUND: u16 = 404;
    /// 405 RESOURCE_LOCKED.
    pub(crate) const RESOURCE_LOCKED: u16 = 405;
    /// 406 PRECONDITION_FAILED.
    pub(crate) const PRECONDITION_FAILED: u16 = 406;
    /// 320 CONNECTION_FORCED (the broker or an operator closed the connection).
    pub(crate) const CONNECTION_FORCED: u16 = 320;
}

/// Maps a reply code and the broker's text to a [`TransportError`].
pub(crate) fn from_reply(reply_code: u16, detail: String) -> TransportError {
    match reply_code {
        code::NOT_FOUND => TransportError::NotFound { detail },
        code::PRECONDITION_FAILED => TransportError::PreconditionFailed { detail },
        code::ACCESS_REFUSED => TransportError::AccessRefused { detail },
        code::RESOURCE_LOCKED => TransportError::ResourceLocked { detail },
        code::CONNECTION_FORCED => TransportError::Closed { detail },
        code => TransportError::Protocol { code, detail },
    }
}

/// Maps a lapin error to a [`TransportError`].
pub(crate) fn from_lapin(error: lapin::Error) -> TransportError {
    match error.kind() {
        ErrorKind::ProtocolError(amqp) => {
            from_reply(amqp.get_id(), amqp.get_message().as_str().to_owned())
        }
        ErrorKind::InvalidChannelState(..)
        | ErrorKind::InvalidConnectionState(_)
        | ErrorKind::InvalidChannel(_) => TransportError::Closed {
            detail: error.to_string(),
        },
        // Sockets, a missing heartbeat, a runtime shut down, and anything else lapin reports.
        _ => TransportError::io(error),
    }
}

/// The exchange a broker error text names (`... exchange 'orders' ...`), if any.
///
/// Used to tell which of the publishes rejected together by one channel close caused it.
pub(crate) fn named_exchange(detail: &str) -> Option<&str> {
    let start = detail.find("exchange '")? + "exchange '".len();
    let rest = &detail[start..];
    let end = rest.find('\'')?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_codes_pick_the_variant_and_keep_the_text() {
        let e = from_reply(
            406,
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl'".into(),
        );
        assert!(e.is_precondition_failed());
        assert!(e.to_string().contains("x-message-ttl"));
        assert!(from_reply(404, "NOT_FOUND".into()).is_not_found());
        assert!(matches!(
            from_reply(403, String::new()),
            TransportError::AccessRefused { .. }
        ));
        assert!(matches!(
            from_reply(405, String::new()),
            TransportError::ResourceLocked { .. }
        ));
        assert!(matches!(
            from_reply(320, String::new()),
            TransportError::Closed { .. }
        ));
        assert!(matches!(
            from_reply(541, String::new()),
            TransportError::Protocol { code: 541, .. }
        ));
    }

    #[test]
    fn an_io_failure_keeps_the_lapin_error_as_its_source() {
        use std::error::Error as _;
        let lapin_error = lapin::Error::from(ErrorKind::MissingHeartbeatError);
        let text = lapin_error.to_string();
        let e = from_lapin(lapin_error);
        assert!(
            matches!(&e, TransportError::Io { detail, .. } if *detail == text),
            "{e:?}"
        );
        let source = e.source().expect("a source");
        assert!(source.is::<lapin::Error>(), "{source:?}");
        assert_eq!(e.kind(), crate::transport::ErrorKind::Transient);
    }

    #[test]
    fn the_exchange_named_by_a_broker_text_is_found() {
        assert_eq!(
            named_exchange("NOT_FOUND - no exchange 'orders.x' in vhost '/'"),
            Some("orders.x")
        );
        assert_eq!(
            named_exchange("NOT_FOUND - no queue 'q' in vhost '/'"),
            None
        );
    }
}
