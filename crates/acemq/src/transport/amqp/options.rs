//! What an AMQP transport is configured with: its name, timeouts, the addresses of a
//! cluster, the heartbeat, recovery, and how publishing behaves while it recovers.

use std::time::Duration;

use crate::transport::recovery::RecoveryPolicy;

/// Options for [`AmqpTransport::connect_with`].
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
    /// How a lost connection is redialled (default: 1 s doubling to 30 s, forever).
    pub recovery: RecoveryPolicy,
    /// How long connecting retries an unreachable broker before it fails (default 30 s).
    /// Refused credentials or an unknown vhost fail at once.
    pub connect_timeout: Duration,
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

    /// Sets how long a publish waits for a recovering connection.
    pub fn publish_wait(mut self, wait: Duration) -> Self {
        self.publish_wait = wait;
        self
    }
}
