//! What a publish takes besides its payload ([`SendOptions`]: envelope fields and AMQP
//! options) and what a confirmed one returns ([`PublishResult`]).

use std::time::Duration;

use crate::headers::Headers;

/// What a confirmed publish returns.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishResult {
    /// The envelope id (also the AMQP `message_id`).
    pub message_id: String,
    /// Reached at least one queue. Known for mandatory publishes (the default); a
    /// publish made with [`Publisher::allow_unroutable`](super::Publisher::allow_unroutable) reports `false` when the broker
    /// could not say.
    pub routed: bool,
    /// From the call to the confirm.
    pub latency: Duration,
}

/// Per-message envelope fields and AMQP options for [`Publisher::send_with`](super::Publisher::send_with).
///
/// ```
/// use acemq::publish::SendOptions;
/// use std::time::Duration;
/// let o = SendOptions::new()
///     .message_id("order-42")
///     .correlation_id("checkout-7")
///     .header("x-tenant", "acme")
///     .expiration(Duration::from_secs(60));
/// # let _ = o;
/// ```
#[derive(Clone, Debug, Default)]
pub struct SendOptions {
    pub(super) message_id: Option<String>,
    pub(super) message_type: Option<String>,
    pub(super) correlation_id: Option<String>,
    pub(super) causation_id: Option<String>,
    pub(super) version: Option<i32>,
    pub(super) claim: Option<String>,
    pub(super) reply_to: Option<String>,
    pub(super) headers: Headers,
    pub(super) persistent: Option<bool>,
    pub(super) expiration: Option<Duration>,
}

impl SendOptions {
    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }
    /// The message id (default: a fresh UUID v4). It is also the idempotency key.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }
    /// The logical type (default: the routing key, or `message`).
    pub fn message_type(mut self, t: impl Into<String>) -> Self {
        self.message_type = Some(t.into());
        self
    }
    /// The correlation id (default: inside a handler, the handled message's correlation id;
    /// elsewhere the message id).
    pub fn correlation_id(mut self, c: impl Into<String>) -> Self {
        self.correlation_id = Some(c.into());
        self
    }
    /// The id of the message that caused this one (default: inside a handler, the handled
    /// message's id; elsewhere none).
    pub fn causation_id(mut self, c: impl Into<String>) -> Self {
        self.causation_id = Some(c.into());
        self
    }
    /// The payload schema version (>= 1, default 1).
    pub fn version(mut self, v: i32) -> Self {
        self.version = Some(v);
        self
    }
    /// A pointer to an external payload (`x-acemq-claim`).
    pub fn claim(mut self, c: impl Into<String>) -> Self {
        self.claim = Some(c.into());
        self
    }
    /// The reply queue (`reply_to` property and `acemq-reply-to` header).
    pub fn reply_to(mut self, q: impl Into<String>) -> Self {
        self.reply_to = Some(q.into());
        self
    }
    /// One application header (must not start with `x-acemq-`).
    pub fn header(
        mut self,
        name: impl Into<String>,
        value: impl Into<crate::headers::HeaderValue>,
    ) -> Self {
        self.headers.insert(name.into().into(), value.into());
        self
    }
    /// Application headers (must not start with `x-acemq-`).
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers.extend(headers);
        self
    }
    /// Delivery mode 2 (true, the default) or 1.
    pub fn persistent(mut self, p: bool) -> Self {
        self.persistent = Some(p);
        self
    }
    /// Per-message TTL (the `expiration` property, whole milliseconds, > 0).
    pub fn expiration(mut self, ttl: Duration) -> Self {
        self.expiration = Some(ttl);
        self
    }
}
