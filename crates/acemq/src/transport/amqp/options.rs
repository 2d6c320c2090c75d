//! What an AMQP transport is configured with: its name, timeouts, the addresses of a
//! cluster, the heartbeat, recovery, and how publishing behaves while it recovers.

use std::time::Duration;

use crate::transport::recovery::RecoveryPolicy;

/// Options for [`AmqpTransport::connect_with`](super::AmqpTransport::connect_with).
///
/// ```
/// use std::time::Duration;
/// use acemq::transport::amqp::AmqpOptions;
/// use acemq::transport::recovery::RecoveryPolicy;
/// let o = AmqpOptions::default()
///     .connection_name("orders-service")
///     .confirm_timeout(Duration::from_secs(10))
///     .heartbeat(10)
///     .address("amqp://guest:guest@rabbit-2:5672/%2f")
///     .recovery(RecoveryPolicy::default().max_attempts(20));
/// assert_eq!(o.confirm_timeout, Duration::from_secs(10));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AmqpOptions {
    /// The `connection_name` client property, shown by `rabbitmqctl list_connections` and
    /// the management UI. The two connections are named `{name} (publish)` and
    /// `{name} (consume)`. Default `acemq`.
    pub connection_name: String,
    /// How long a publish waits for its confirm before it is reported in doubt
    /// ([`TransportError::ConfirmTimeout`](crate::transport::TransportError::ConfirmTimeout)). Default 30 s.
    pub confirm_timeout: Duration,
    /// More addresses of the same cluster, dialled in turn after the URL's (failover).
    pub addresses: Vec<String>,
    /// The heartbeat to ask for, in seconds (`None`: the broker's, 60 s on RabbitMQ). A lost
    /// network with no close is noticed after about two heartbeats.
    pub heartbeat: Option<u16>,
    /// How a lost connection is redialled (default: up to 50 ms doubling to 1.5 s, fully jittered, forever).
    pub recovery: RecoveryPolicy,
    /// How long connecting retries an unreachable broker before it fails (default 30 s).
    /// Refused credentials or an unknown vhost fail at once.
    pub connect_timeout: Duration,
    /// Where the user name and password come from (default: the URL).
    pub credentials: Credentials,
    /// TLS settings for `amqps://` (a private CA, a client certificate, the server name).
    pub tls: TlsOptions,
    /// How long a publish waits for a connection that is recovering before it is refused
    /// with [`TransportError::NotConnected`](crate::transport::TransportError::NotConnected) (nothing sent). Default zero: refused at once.
    pub publish_wait: Duration,
}

impl Default for AmqpOptions {
    fn default() -> Self {
        AmqpOptions {
            connection_name: "acemq".to_owned(),
            confirm_timeout: Duration::from_secs(30),
            addresses: Vec::new(),
            heartbeat: None,
            recovery: RecoveryPolicy::default(),
            connect_timeout: Duration::from_secs(30),
            publish_wait: Duration::ZERO,
            credentials: Credentials::FromUrl,
            tls: TlsOptions::default(),
        }
    }
}

impl AmqpOptions {
    /// Sets the connection name.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// Sets the confirm timeout.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Adds an address to fail over to.
    pub fn address(mut self, url: impl Into<String>) -> Self {
        self.addresses.push(url.into());
        self
    }

    /// Sets the heartbeat, in seconds.
    pub fn heartbeat(mut self, seconds: u16) -> Self {
        self.heartbeat = Some(seconds);
        self
    }

    /// Sets the recovery policy ([`RecoveryPolicy::disabled`] turns recovery off).
    pub fn recovery(mut self, policy: RecoveryPolicy) -> Self {
        self.recovery = policy;
        self
    }

    /// Sets how long connecting retries an unreachable broker.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets where the credentials come from.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    /// Sets the TLS options.
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = tls;
        self
    }

    /// Sets how long a publish waits for a recovering connection.
    pub fn publish_wait(mut self, wait: Duration) -> Self {
        self.publish_wait = wait;
        self
    }
}

/// Where the user name and password come from. Read on every dial (so a rotated file or
/// variable is picked up by the next recovery) and never printed: `Debug` shows only
/// the source.
///
/// ```
/// use acemq::transport::amqp::Credentials;
/// let c = Credentials::user_password("orders", "s3cret");
/// assert!(!format!("{c:?}").contains("s3cret"));
/// let from_env = Credentials::environment("RABBIT_USER", "RABBIT_PASSWORD");
/// # drop(from_env);
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Credentials {
    /// The URL's own `user:password@` (default; RabbitMQ's `guest` when it has none).
    #[default]
    FromUrl,
    /// Given in code.
    Static {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
    /// Read from two environment variables.
    Environment {
        /// The variable holding the user name.
        user_var: String,
        /// The variable holding the password.
        password_var: String,
    },
    /// Read from a file holding `password` (with `user` given here) or `user:password`;
    /// trailing whitespace is trimmed.
    File {
        /// The file.
        path: std::path::PathBuf,
        /// The user name when the file holds only the password.
        user: Option<String>,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::FromUrl => f.write_str("Credentials::FromUrl"),
            Credentials::Static { user, .. } => write!(f, "Credentials::Static({user}, ***)"),
            Credentials::Environment {
                user_var,
                password_var,
            } => write!(f, "Credentials::Environment({user_var}, {password_var})"),
            Credentials::File { path, .. } => write!(f, "Credentials::File({})", path.display()),
        }
    }
}

impl Credentials {
    /// Given in code.
    pub fn user_password(user: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials::Static {
            user: user.into(),
            password: password.into(),
        }
    }

    /// Read from two environment variables on every dial.
    pub fn environment(user_var: impl Into<String>, password_var: impl Into<String>) -> Self {
        Credentials::Environment {
            user_var: user_var.into(),
            password_var: password_var.into(),
        }
    }

    /// Read from a file on every dial (`user:password`, or the password alone with `user`).
    pub fn file(path: impl Into<std::path::PathBuf>, user: Option<String>) -> Self {
        Credentials::File {
            path: path.into(),
            user,
        }
    }

    /// The user and password to use, `None` to keep the URL's. The error says which
    /// source failed, never the secret.
    pub(crate) fn resolve(&self) -> Result<Option<(String, String)>, String> {
        match self {
            Credentials::FromUrl => Ok(None),
            Credentials::Static { user, password } => Ok(Some((user.clone(), password.clone()))),
            Credentials::Environment {
                user_var,
                password_var,
            } => {
                let get = |v: &str| {
                    std::env::var(v).map_err(|_| {
                        format!("the environment variable {v} is not set (credentials)")
                    })
                };
                Ok(Some((get(user_var)?, get(password_var)?)))
            }
            Credentials::File { path, user } => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!("cannot read the credentials file {}: {e}", path.display())
                })?;
                let text = text.trim_end();
                match (user, text.split_once(':')) {
                    (Some(u), _) => Ok(Some((u.clone(), text.to_owned()))),
                    (None, Some((u, p))) => Ok(Some((u.to_owned(), p.to_owned()))),
                    (None, None) => Err(format!(
                        "the credentials file {} holds no user (write user:password, or give the user)",
                        path.display()
                    )),
                }
            }
        }
    }
}

/// TLS for `amqps://`: certificates are always verified; these add a private CA, a client
/// certificate (for the EXTERNAL mechanism, add `?auth_mechanism=external` to the URL) and
/// the name the server's certificate is verified against (default: the URL's host).
///
/// A handshake that fails (a CA that is not trusted, a certificate for another name, an
/// X.509 v1 certificate, a client certificate the server refuses) fails the connect at once
/// with [`TransportError::Tls`](crate::transport::TransportError::Tls), naming the cause.
///
/// ```
/// use acemq::transport::amqp::{AmqpOptions, TlsOptions};
/// let tls = TlsOptions::default()
///     .ca_bundle_pem("-----BEGIN CERTIFICATE-----\n...")
///     .client_certificate_pem("-----BEGIN CERTIFICATE-----\n...", "-----BEGIN PRIVATE KEY-----\n...")
///     // Connecting to amqps://10.0.0.7:5671 (or a load balancer) whose certificate names
///     // rabbit.internal:
///     .server_name("rabbit.internal");
/// assert!(!format!("{tls:?}").contains("PRIVATE KEY"));
/// let options = AmqpOptions::default().tls(tls);
/// # drop(options);
/// ```
#[derive(Clone, Default)]
pub struct TlsOptions {
    pub(crate) ca_bundle: Option<String>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) server_name: Option<String>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca_bundle", &self.ca_bundle.is_some())
            .field("client_certificate", &self.client.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsOptions {
    /// Trusts the CA certificates of this PEM bundle (besides the system's).
    ///
    /// ```no_run
    /// # fn demo() -> std::io::Result<()> {
    /// use acemq::transport::amqp::TlsOptions;
    /// let tls = TlsOptions::default().ca_bundle_pem(std::fs::read_to_string("/etc/rabbitmq/ca.pem")?);
    /// # drop(tls); Ok(()) }
    /// ```
    pub fn ca_bundle_pem(mut self, pem: impl Into<String>) -> Self {
        self.ca_bundle = Some(pem.into());
        self
    }

    /// Presents this client certificate (PEM, optionally followed by its chain) with its
    /// private key (PEM: PKCS#8, PKCS#1 or SEC1).
    ///
    /// ```no_run
    /// # fn demo() -> std::io::Result<()> {
    /// use acemq::transport::amqp::TlsOptions;
    /// let tls = TlsOptions::default()
    ///     .client_certificate_pem(std::fs::read("client.pem")?, std::fs::read("client.key")?);
    /// # drop(tls); Ok(()) }
    /// ```
    pub fn client_certificate_pem(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some((certificate.into(), key.into()));
        self
    }

    /// Verifies the server's certificate against this DNS name (also sent as SNI) instead
    /// of the URL's host: for connecting by IP address, or through a load balancer or a
    /// tunnel whose address is not on the certificate. The TCP connection still goes to the
    /// URL's host and port.
    ///
    /// ```
    /// use acemq::transport::amqp::TlsOptions;
    /// let tls = TlsOptions::default().server_name("rabbit.internal");
    /// assert!(format!("{tls:?}").contains("rabbit.internal"));
    /// ```
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }
}
