//! The router: [`connect`] picks the transport a URL names, with the [`TransportOptions`]
//! both transports take, and [`redact`] keeps a URL's credentials out of every text.
//!
//! It is the one place in `transport` that knows both implementations; the vocabulary and
//! the trait in `transport/mod.rs` know neither. Its errors are the transport's own
//! ([`TransportError::Config`] for a URL or build that cannot be used); the library's
//! [`Error`](crate::error::Error) converts them with `From`.

use std::sync::Arc;

use super::recovery::RecoveryPolicy;
use super::{Transport, TransportError, memory};

/// Opens the transport a URL names: `amqp://` and `amqps://` reach RabbitMQ (feature `amqp`,
/// on by default), `memory://name` the in-process broker called `name` (every transport
/// opened on one name shares its queues).
///
/// A URL with another scheme, `memory://` without a name, or `amqp://` in a build without
/// the `amqp` feature is a [`TransportError::Config`] (its text never shows the URL's
/// credentials); a broker that cannot be reached is one of the connection errors
/// ([`TransportError::Unreachable`], [`TransportError::AccessRefused`], …).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// use acemq::transport::TransportError;
/// let t = acemq::transport::connect("memory://doc-connect").await?;
/// assert_eq!(t.kind(), "memory");
/// t.close().await?;
/// let e = acemq::transport::connect("http://user:secret@host/").await.err().unwrap();
/// assert!(matches!(e, TransportError::Config { .. }), "{e:?}");
/// assert!(!e.to_string().contains("secret"), "{e}");
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn Transport>, TransportError> {
    connect_with(url, TransportOptions::default()).await
}

/// What [`connect_with`] sets up besides the URL: recovery for every transport, and the
/// RabbitMQ settings (feature `amqp`).
///
/// ```
/// use acemq::transport::TransportOptions;
/// use acemq::transport::recovery::RecoveryPolicy;
/// let o = TransportOptions::default().recovery(RecoveryPolicy::disabled());
/// assert!(!o.recovery_policy().enabled());
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct TransportOptions {
    recovery: RecoveryPolicy,
    /// RabbitMQ's settings (name, heartbeat, addresses, credentials, TLS, timeouts); its
    /// own recovery policy is replaced by [`TransportOptions::recovery`].
    #[cfg(feature = "amqp")]
    pub amqp: super::amqp::AmqpOptions,
}

impl TransportOptions {
    /// How a lost connection is redialled (both transports).
    pub fn recovery(mut self, policy: RecoveryPolicy) -> Self {
        self.recovery = policy;
        self
    }

    /// The recovery policy.
    pub fn recovery_policy(&self) -> &RecoveryPolicy {
        &self.recovery
    }
}

/// [`connect`] with options.
pub async fn connect_with(
    url: &str,
    options: TransportOptions,
) -> Result<Arc<dyn Transport>, TransportError> {
    if let Some(name) = url.strip_prefix("memory://") {
        if name.is_empty() {
            return Err(config(
                "memory:// needs a broker name, e.g. memory://orders".into(),
            ));
        }
        return Ok(Arc::new(
            memory::MemoryTransport::connect(name).with_recovery(options.recovery),
        ));
    }
    if url.starts_with("amqp://") || url.starts_with("amqps://") {
        return connect_amqp(url, options).await;
    }
    Err(config(format!(
        "unsupported URL {:?}: use amqp://, amqps:// or memory://name",
        redact(url)
    )))
}

fn config(detail: String) -> TransportError {
    TransportError::Config { detail }
}

#[cfg(feature = "amqp")]
async fn connect_amqp(
    url: &str,
    options: TransportOptions,
) -> Result<Arc<dyn Transport>, TransportError> {
    let amqp = options.amqp.recovery(options.recovery);
    Ok(Arc::new(
        super::amqp::AmqpTransport::connect_with(url, amqp).await?,
    ))
}

#[cfg(not(feature = "amqp"))]
async fn connect_amqp(
    url: &str,
    _options: TransportOptions,
) -> Result<Arc<dyn Transport>, TransportError> {
    Err(config(format!(
        "{:?} needs the RabbitMQ transport, which this build left out: enable acemq's `amqp` feature (on by default; it is off with default-features = false)",
        redact(url)
    )))
}

/// The address without its credentials (`amqp://***@host:5672/vhost`).
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted() {
        assert_eq!(redact("amqp://u:p@h:5672/v"), "amqp://***@h:5672/v");
        assert_eq!(redact("memory://x"), "memory://x");
        assert_eq!(
            redact("amqp://user:secret@host:5672/%2f"),
            "amqp://***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://host"), "amqp://host");
    }

    #[tokio::test]
    async fn schemes_pick_the_transport_or_say_what_is_accepted() {
        let t = connect("memory://transport-connect").await.expect("memory");
        assert_eq!(t.kind(), "memory");
        let e = connect("memory://").await.err().expect("no name");
        assert!(
            matches!(e, TransportError::Config { ref detail } if detail.contains("memory://orders")),
            "{e}"
        );
        let e = connect("http://user:secret@host/")
            .await
            .err()
            .expect("http");
        let text = e.to_string();
        assert!(
            text.contains("amqp://, amqps:// or memory://name"),
            "{text}"
        );
        assert!(
            !text.contains("secret") && text.contains("***@host"),
            "{text}"
        );
    }

    #[cfg(not(feature = "amqp"))]
    #[tokio::test]
    async fn amqp_without_the_feature_names_the_feature() {
        let e = connect("amqp://guest:pw@localhost/")
            .await
            .err()
            .expect("config");
        let text = e.to_string();
        assert!(matches!(e, TransportError::Config { .. }), "{e:?}");
        assert!(
            text.contains("`amqp` feature") && !text.contains("pw"),
            "{text}"
        );
    }
}
