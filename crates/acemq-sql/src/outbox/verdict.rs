//! How the relay reads a failed publish: whether it spends one of the row's attempts (the
//! broker refused it), leaves them unchanged (the broker was unavailable, or the outcome is
//! in doubt), or stops the relay (the connection was closed by its owner).

use acemq::error::ErrorKind;

/// What a failed publish means for its row (see [`OutboxRelay`](super::OutboxRelay)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The broker refused the row, or the row cannot be published: spends an attempt.
    Attempt,
    /// The broker was unavailable, or the outcome is in doubt: attempts unchanged.
    Unavailable,
    /// The connection was closed by its owner: the relay stops.
    Closed,
}

/// Whether a publish failed because of the connection itself (down, recovering, blocked,
/// closed under it), whatever its status says yet: the rest of the batch would fail too.
pub(super) fn connection_trouble(e: &acemq::Error) -> bool {
    use acemq::transport::TransportError as T;
    matches!(
        e,
        acemq::Error::Blocked { .. }
            | acemq::Error::Transport(
                T::NotConnected { .. } | T::Closed { .. } | T::Io { .. } | T::Blocked { .. }
            )
    )
}

pub(super) fn verdict(kind: ErrorKind) -> Verdict {
    match kind {
        ErrorKind::Refused | ErrorKind::Invalid => Verdict::Attempt,
        ErrorKind::Closed => Verdict::Closed,
        // Transient, InDoubt, and any kind added later: never the row's fault.
        _ => Verdict::Unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refused_and_invalid_spend_an_attempt() {
        assert_eq!(verdict(ErrorKind::Refused), Verdict::Attempt);
        assert_eq!(verdict(ErrorKind::Invalid), Verdict::Attempt);
        assert_eq!(verdict(ErrorKind::Transient), Verdict::Unavailable);
        assert_eq!(verdict(ErrorKind::InDoubt), Verdict::Unavailable);
        assert_eq!(verdict(ErrorKind::Closed), Verdict::Closed);
        let unroutable = acemq::Error::Unroutable {
            exchange: String::new(),
            routing_key: "q".into(),
            message_id: "m".into(),
            reply_text: "NO_ROUTE".into(),
        };
        assert_eq!(verdict(unroutable.kind()), Verdict::Attempt);
        let nack = acemq::Error::Nacked {
            message_id: "m".into(),
        };
        assert_eq!(
            verdict(nack.kind()),
            Verdict::Unavailable,
            "a nack is transient"
        );
        let lost: acemq::Error = acemq::transport::TransportError::ConfirmLost {
            detail: "gone".into(),
            source: None,
        }
        .into();
        assert_eq!(verdict(lost.kind()), Verdict::Unavailable);
        let down: acemq::Error = acemq::transport::TransportError::NotConnected {
            detail: "recovering".into(),
        }
        .into();
        assert_eq!(verdict(down.kind()), Verdict::Unavailable);
        assert!(connection_trouble(&down));
        assert!(connection_trouble(&acemq::Error::Blocked {
            reason: "disk".into()
        }));
        assert!(
            !connection_trouble(&lost),
            "a lost confirm is the row's publish"
        );
        assert!(!connection_trouble(&nack));
    }
}
