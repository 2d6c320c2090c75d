//! Declarations: the data a transport needs to declare an exchange, a queue or a binding.

use crate::headers::{HeaderValue, Headers};

/// The four AMQP exchange types.
///
/// ```
/// use acemq::topology::ExchangeKind;
/// assert_eq!(ExchangeKind::Topic.as_str(), "topic");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExchangeKind {
    /// Routes to queues whose binding key equals the routing key.
    Direct,
    /// Routes to every bound queue.
    Fanout,
    /// Routes by dotted patterns (`*` one word, `#` zero or more).
    Topic,
    /// Routes by header values (`x-match` = `all` or `any`).
    Headers,
}

impl ExchangeKind {
    /// The AMQP name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
        }
    }

    /// Parses an AMQP exchange type name.
    pub fn parse(name: &str) -> Option<ExchangeKind> {
        match name {
            "direct" => Some(ExchangeKind::Direct),
            "fanout" => Some(ExchangeKind::Fanout),
            "topic" => Some(ExchangeKind::Topic),
            "headers" => Some(ExchangeKind::Headers),
            _ => None,
        }
    }
}

/// An exchange declaration.
///
/// ```
/// use acemq::topology::{ExchangeDecl, ExchangeKind};
/// let e = ExchangeDecl::durable("orders", ExchangeKind::Topic);
/// assert!(e.durable && !e.auto_delete);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeDecl {
    /// Exchange name.
    pub name: String,
    /// Exchange type.
    pub kind: ExchangeKind,
    /// Survives a broker restart.
    pub durable: bool,
    /// Deleted when its last binding goes.
    pub auto_delete: bool,
    /// Extra arguments.
    pub arguments: Headers,
}

impl ExchangeDecl {
    /// A durable exchange with no arguments.
    pub fn durable(name: impl Into<String>, kind: ExchangeKind) -> Self {
        ExchangeDecl {
            name: name.into(),
            kind,
            durable: true,
            auto_delete: false,
            arguments: Headers::new(),
        }
    }
}

/// The queue type, as RabbitMQ's `x-queue-type` argument names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueType {
    /// A classic queue: no `x-queue-type` argument is sent.
    Classic,
    /// A quorum queue: `x-queue-type: quorum`.
    Quorum,
}

/// A queue declaration. Build it with [`QueueDecl::quorum`], [`QueueDecl::classic`] or
/// [`QueueDecl::server_named`]; the constructors apply the family's rules (a durable
/// named queue is quorum by default; exclusive, auto-delete, transient and server-named
/// queues are always classic).
///
/// ```
/// use acemq::topology::{QueueDecl, QueueType};
/// let q = QueueDecl::quorum("orders.new");
/// assert_eq!(q.queue_type(), QueueType::Quorum);
/// assert_eq!(q.arguments["x-queue-type"].as_str(), Some("quorum"));
/// let c = QueueDecl::classic("orders.new.dlq");
/// assert!(!c.arguments.contains_key("x-queue-type"));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct QueueDecl {
    /// Queue name; empty asks the broker for a server-generated name.
    pub name: String,
    /// Survives a broker restart.
    pub durable: bool,
    /// Used by one connection only and deleted when it closes.
    pub exclusive: bool,
    /// Deleted when its last consumer goes.
    pub auto_delete: bool,
    /// Arguments, including `x-queue-type` for a quorum queue.
    pub arguments: Headers,
}

impl QueueDecl {
    /// A durable quorum queue.
    pub fn quorum(name: impl Into<String>) -> Self {
        let mut arguments = Headers::new();
        arguments.insert("x-queue-type".into(), HeaderValue::from("quorum"));
        QueueDecl {
            name: name.into(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments,
        }
    }

    /// A durable classic queue (no `x-queue-type` argument at all).
    pub fn classic(name: impl Into<String>) -> Self {
        QueueDecl {
            name: name.into(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments: Headers::new(),
        }
    }

    /// An exclusive, auto-delete, non-durable classic queue whose name the broker chooses.
    pub fn server_named() -> Self {
        QueueDecl {
            name: String::new(),
            durable: false,
            exclusive: true,
            auto_delete: true,
            arguments: Headers::new(),
        }
    }

    /// Sets one argument. `x-queue-type` is controlled by the constructors and by
    /// [`QueueDecl::exclusive`] / [`QueueDecl::auto_delete`] / [`QueueDecl::transient`].
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.arguments.insert(name.into().into(), value.into());
        self
    }

    /// Makes the queue exclusive; an exclusive queue is always classic.
    pub fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self.force_classic();
        self
    }

    /// Makes the queue auto-delete; an auto-delete queue is always classic.
    pub fn auto_delete(mut self) -> Self {
        self.auto_delete = true;
        self.force_classic();
        self
    }

    /// Makes the queue non-durable; a transient queue is always classic.
    pub fn transient(mut self) -> Self {
        self.durable = false;
        self.force_classic();
        self
    }

    /// The queue type this declaration produces.
    pub fn queue_type(&self) -> QueueType {
        match self
            .arguments
            .get("x-queue-type")
            .and_then(HeaderValue::as_str)
        {
            Some("quorum") => QueueType::Quorum,
            _ => QueueType::Classic,
        }
    }

    fn force_classic(&mut self) {
        self.arguments.remove("x-queue-type");
    }
}

/// A binding of a queue to an exchange.
///
/// ```
/// use acemq::topology::BindingDecl;
/// let b = BindingDecl::new("orders.new", "orders", "order.*");
/// assert_eq!(b.routing_key, "order.*");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BindingDecl {
    /// The bound queue.
    pub queue: String,
    /// The exchange routing into it.
    pub exchange: String,
    /// The binding key (a pattern for topic exchanges; ignored by fanout and headers).
    pub routing_key: String,
    /// Binding arguments (`x-match` and the matched values for a headers exchange).
    pub arguments: Headers,
}

impl BindingDecl {
    /// A binding with no arguments.
    pub fn new(
        queue: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        BindingDecl {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            arguments: Headers::new(),
        }
    }

    /// A headers-exchange binding: `x-match` = `all` (every value must match) or `any`.
    pub fn headers(
        queue: impl Into<String>,
        exchange: impl Into<String>,
        match_all: bool,
        values: Headers,
    ) -> Self {
        let mut arguments = values;
        arguments.insert(
            "x-match".into(),
            HeaderValue::from(if match_all { "all" } else { "any" }),
        );
        BindingDecl {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: String::new(),
            arguments,
        }
    }
}
