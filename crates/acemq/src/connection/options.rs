//! [`ConnectionOptions`]: how a connection is set up (its name, the confirm window,
//! recovery, and RabbitMQ's settings), in code or from the environment.

#[cfg(feature = "amqp")]
use std::time::Duration;

use super::DEFAULT_MAX_OUTSTANDING_CONFIRMS;
use crate::envelope::DEFAULT_CLIENT_NAME;
#[cfg(feature = "amqp")]
use crate::error::Error;
use crate::transport::TransportOptions;
use crate::transport::recovery::RecoveryPolicy;

/// How a connection is set up: its name, the confirm window, recovery, and (feature `amqp`)
/// RabbitMQ's settings.
///
/// One name serves everywhere: it is stamped in `x-acemq-origin` as `{name}@{hostname}` and
/// shown by `rabbitmqctl list_connections` / the management UI as the connection name
/// (`{name} (publish)` and `{name} (consume)`).
///
/// Defaults: name `acemq`; 1,000 outstanding confirms; recovery on, redialling after up to
/// 50 ms doubling to 1.5 s, fully jittered, forever (see [`RecoveryPolicy`] for why); connecting retries an unreachable broker for 30 s; a publish
/// while the connection is recovering is refused at once with an error of kind
/// [`ErrorKind::Transient`](crate::error::ErrorKind) (nothing was sent, safe to send again)
/// unless [`ConnectionOptions::publish_wait`] gives it time; confirms wait 30 s, then the
/// publish is in doubt; certificates are always verified.
///
/// ```
/// use std::time::Duration;
/// use acemq::connection::ConnectionOptions;
/// use acemq::transport::recovery::RecoveryPolicy;
/// let o = ConnectionOptions::default()
///     .name("orders-service")
///     .heartbeat(10)
///     .address("amqp://guest:guest@rabbit-2:5672/%2f")
///     .recovery(RecoveryPolicy::default().delays(Duration::from_millis(500), Duration::from_secs(10)))
///     .publish_wait(Duration::from_secs(5));
/// assert_eq!(o.client(), "orders-service");
/// ```
#[derive(Clone, Debug)]
pub struct ConnectionOptions {
    client_name: String,
    max_outstanding_confirms: usize,
    transport: TransportOptions,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            client_name: DEFAULT_CLIENT_NAME.into(),
            max_outstanding_confirms: DEFAULT_MAX_OUTSTANDING_CONFIRMS,
            transport: TransportOptions::default(),
        }
    }
}

impl ConnectionOptions {
    /// The name: in `x-acemq-origin` and as the broker connection's name (default `acemq`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        #[cfg(feature = "amqp")]
        {
            self.transport.amqp.connection_name = self.client_name.clone();
        }
        self
    }

    /// The window of publishes awaiting their confirm (default 1000, at least 1).
    pub fn max_outstanding_confirms(mut self, n: usize) -> Self {
        self.max_outstanding_confirms = n.max(1);
        self
    }

    /// How a lost connection is redialled ([`RecoveryPolicy::disabled`] turns it off).
    pub fn recovery(mut self, policy: RecoveryPolicy) -> Self {
        self.transport = self.transport.recovery(policy);
        self
    }

    /// The configured client name.
    pub fn client(&self) -> &str {
        &self.client_name
    }

    /// The configured window of publishes awaiting their confirm.
    pub fn max_outstanding(&self) -> usize {
        self.max_outstanding_confirms
    }

    /// The transport's options (recovery, and RabbitMQ's settings).
    pub fn transport_options(&self) -> &TransportOptions {
        &self.transport
    }
}

#[cfg(feature = "amqp")]
impl ConnectionOptions {
    /// The heartbeat to ask RabbitMQ for, in seconds (a network cut with no close is noticed
    /// after about two).
    pub fn heartbeat(mut self, seconds: u16) -> Self {
        self.transport.amqp = self.transport.amqp.heartbeat(seconds);
        self
    }

    /// Another node of the same cluster, dialled in turn when the current one is lost.
    pub fn address(mut self, url: impl Into<String>) -> Self {
        self.transport.amqp = self.transport.amqp.address(url);
        self
    }

    /// How long connecting retries an unreachable broker (default 30 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.transport.amqp = self.transport.amqp.connect_timeout(timeout);
        self
    }

    /// How long a publish waits for a recovering connection before it is refused (default:
    /// not at all).
    pub fn publish_wait(mut self, wait: Duration) -> Self {
        self.transport.amqp = self.transport.amqp.publish_wait(wait);
        self
    }

    /// How long a publish waits for its confirm before it is in doubt (default 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.transport.amqp = self.transport.amqp.confirm_timeout(timeout);
        self
    }

    /// Where the user name and password come from (default: the URL).
    pub fn credentials(mut self, credentials: crate::transport::amqp::Credentials) -> Self {
        self.transport.amqp = self.transport.amqp.credentials(credentials);
        self
    }

    /// TLS for `amqps://` (a private CA bundle, a client certificate, the server name to
    /// verify).
    ///
    /// ```
    /// use acemq::connection::ConnectionOptions;
    /// use acemq::transport::amqp::TlsOptions;
    /// let o = ConnectionOptions::default().tls(TlsOptions::default().server_name("rabbit.internal"));
    /// # drop(o);
    /// ```
    pub fn tls(mut self, tls: crate::transport::amqp::TlsOptions) -> Self {
        self.transport.amqp = self.transport.amqp.tls(tls);
        self
    }

    /// The options from the environment, and the URL from `ACEMQ_URL`: `ACEMQ_NAME`,
    /// `ACEMQ_HEARTBEAT` (seconds), `ACEMQ_ADDRESSES` (more URLs, comma-separated),
    /// `ACEMQ_CONNECT_TIMEOUT` (seconds), `ACEMQ_USER` with `ACEMQ_PASSWORD` or
    /// `ACEMQ_PASSWORD_FILE`, `ACEMQ_TLS_CA_FILE`, `ACEMQ_TLS_CERT_FILE` with
    /// `ACEMQ_TLS_KEY_FILE`, `ACEMQ_TLS_SERVER_NAME` (the name the broker's certificate is
    /// verified against, when it is not the URL's host). A variable that is set but unusable is an error naming it
    /// (never its value).
    ///
    /// ```
    /// let e = acemq::connection::ConnectionOptions::from_env_vars(|_| None).unwrap_err();
    /// assert!(e.to_string().contains("ACEMQ_URL"));
    /// ```
    pub fn from_env() -> Result<(String, ConnectionOptions), Error> {
        Self::from_env_vars(|k| std::env::var(k).ok())
    }

    /// [`ConnectionOptions::from_env`] reading variables through `var` (for tests).
    pub fn from_env_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<(String, ConnectionOptions), Error> {
        use crate::transport::amqp::{Credentials, TlsOptions};
        let config = |m: String| Error::Config(m);
        let url = var("ACEMQ_URL").filter(|u| !u.is_empty()).ok_or_else(|| {
            config("ACEMQ_URL is not set (e.g. amqp://user:password@host:5672/%2f)".into())
        })?;
        let mut o = ConnectionOptions::default();
        if let Some(name) = var("ACEMQ_NAME") {
            o = o.name(name);
        }
        let seconds = |k: &str| -> Result<Option<u64>, Error> {
            var(k)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| config(format!("{k} must be a whole number of seconds")))
                })
                .transpose()
        };
        if let Some(h) = seconds("ACEMQ_HEARTBEAT")? {
            let h = u16::try_from(h).map_err(|_| config("ACEMQ_HEARTBEAT is too large".into()))?;
            o = o.heartbeat(h);
        }
        if let Some(t) = seconds("ACEMQ_CONNECT_TIMEOUT")? {
            o = o.connect_timeout(Duration::from_secs(t));
        }
        for a in var("ACEMQ_ADDRESSES").unwrap_or_default().split(',') {
            if !a.trim().is_empty() {
                o = o.address(a.trim());
            }
        }
        match (
            var("ACEMQ_USER"),
            var("ACEMQ_PASSWORD"),
            var("ACEMQ_PASSWORD_FILE"),
        ) {
            (Some(u), Some(p), _) => o = o.credentials(Credentials::user_password(u, p)),
            (user, None, Some(file)) => o = o.credentials(Credentials::file(file, user)),
            (None, None, None) => {}
            _ => {
                return Err(config(
                    "set ACEMQ_USER with ACEMQ_PASSWORD or ACEMQ_PASSWORD_FILE".into(),
                ));
            }
        }
        let read = |k: &str| -> Result<Option<Vec<u8>>, Error> {
            var(k)
                .map(|path| {
                    std::fs::read(&path)
                        .map_err(|e| config(format!("{k}: cannot read {path}: {e}")))
                })
                .transpose()
        };
        let mut tls = TlsOptions::default();
        let mut any_tls = false;
        if let Some(ca) = read("ACEMQ_TLS_CA_FILE")? {
            tls = tls.ca_bundle_pem(String::from_utf8_lossy(&ca).into_owned());
            any_tls = true;
        }
        match (read("ACEMQ_TLS_CERT_FILE")?, read("ACEMQ_TLS_KEY_FILE")?) {
            (Some(cert), Some(key)) => {
                tls = tls.client_certificate_pem(cert, key);
                any_tls = true;
            }
            (None, None) => {}
            _ => {
                return Err(config(
                    "set both ACEMQ_TLS_CERT_FILE and ACEMQ_TLS_KEY_FILE, or neither".into(),
                ));
            }
        }
        if let Some(name) = var("ACEMQ_TLS_SERVER_NAME").filter(|n| !n.trim().is_empty()) {
            tls = tls.server_name(name.trim());
            any_tls = true;
        }
        if any_tls {
            o = o.tls(tls);
        }
        Ok((url, o))
    }
}
