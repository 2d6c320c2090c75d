//! The declarative [`Topology`] builder, and the topology a consumer declares when it
//! starts ([`Topology::for_consumer`]).

mod validate;

pub use validate::TopologyError;

use crate::headers::Headers;
use crate::retry::RetryPolicy;
use crate::topology::names::{
    DEAD_LETTER_EXCHANGE, RETRY_EXCHANGE, dead_letter_queue, dead_letter_queue_decl, parked_queue,
    parked_queue_decl, rung_decl, source_dead_letter_arguments,
};
use crate::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl, QueueType};
use validate::{check_name, exchange_difference, queue_difference};

/// The prefix of every dead-letter argument (`x-dead-letter-exchange`,
/// `x-dead-letter-routing-key`, `x-dead-letter-strategy`).
const DEAD_LETTER_ARGUMENT_PREFIX: &str = "x-dead-letter-";

/// A set of exchanges, queues and bindings to declare, deduplicated and checked.
///
/// Built with [`Topology::define`]; a consumer derives its own with
/// [`Topology::for_consumer`]. Declaring the same thing twice through the builder yields
/// one declaration; two different declarations of one name are a build error.
///
/// ```
/// use std::time::Duration;
/// use acemq::retry::RetryPolicy;
/// use acemq::topology::{ExchangeKind, QueueType, Topology};
///
/// let policy = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300))?;
/// let topology = Topology::define()
///     .exchange("orders", ExchangeKind::Topic)
///     .queue_with_dead_letter("orders.new")
///     .queue_with_retry("orders.new", &policy)
///     .bind("orders.new", "orders", "order.*")
///     .build()?;
/// assert_eq!(topology.exchanges().len(), 3); // orders, acemq.dlx, acemq.retry
/// assert_eq!(topology.queues().len(), 6); // source, .dlq, .parked, three rungs
/// assert_eq!(topology.bindings().len(), 4);
/// assert_eq!(topology.queue("orders.new").map(|q| q.queue_type()), Some(QueueType::Quorum));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Topology {
    exchanges: Vec<ExchangeDecl>,
    queues: Vec<QueueDecl>,
    bindings: Vec<BindingDecl>,
}

impl Topology {
    /// Starts a declarative topology.
    ///
    /// ```
    /// use acemq::topology::{ExchangeKind, Topology};
    /// let t = Topology::define().exchange("audit", ExchangeKind::Fanout).queue("audit.log")
    ///     .bind("audit.log", "audit", "").build()?;
    /// assert_eq!(t.bindings()[0].exchange, "audit");
    /// # Ok::<(), acemq::topology::TopologyError>(())
    /// ```
    pub fn define() -> TopologyBuilder {
        TopologyBuilder::default()
    }

    /// What a consumer of `queue` declares every time it starts, whatever its options:
    /// [`DEAD_LETTER_EXCHANGE`], `{queue}.dlq`, `{queue}.parked` and their bindings, and,
    /// when `policy` has [broker rungs](RetryPolicy::broker_rungs), [`RETRY_EXCHANGE`], one
    /// rung queue per rung and the binding `{queue}` <- `acemq.retry` with key `{queue}`.
    /// Never the source queue itself: that belongs to whoever owns the topology.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// use acemq::topology::Topology;
    ///
    /// let plain = Topology::for_consumer("orders.new", None);
    /// let names: Vec<&str> = plain.queues().iter().map(|q| q.name.as_str()).collect();
    /// assert_eq!(names, ["orders.new.dlq", "orders.new.parked"]);
    ///
    /// let policy = RetryPolicy::fixed(3, Duration::from_secs(60))?;
    /// let with_rungs = Topology::for_consumer("orders.new", Some(&policy));
    /// assert!(with_rungs.queue("orders.new.retry.1m").is_some());
    /// assert!(with_rungs.queue("orders.new").is_none());
    /// # Ok::<(), acemq::retry::RetryError>(())
    /// ```
    ///
    /// [`DEAD_LETTER_EXCHANGE`]: crate::topology::DEAD_LETTER_EXCHANGE
    /// [`RETRY_EXCHANGE`]: crate::topology::RETRY_EXCHANGE
    pub fn for_consumer(queue: &str, policy: Option<&RetryPolicy>) -> Topology {
        let mut parts = TopologyBuilder::default();
        parts.push_dead_letter_targets(queue);
        if let Some(policy) = policy {
            parts.push_retry(queue, policy);
        }
        // Every item is derived and distinct, so no conflict is possible; only identical
        // repeats would need folding, and there are none.
        Topology {
            exchanges: parts.exchanges,
            queues: parts.queues,
            bindings: parts.bindings,
        }
    }

    /// The exchanges, each once, in the order they were first declared.
    pub fn exchanges(&self) -> &[ExchangeDecl] {
        &self.exchanges
    }

    /// The queues, each once, in the order they were first declared.
    pub fn queues(&self) -> &[QueueDecl] {
        &self.queues
    }

    /// The bindings, each once, in the order they were first declared. Declare exchanges
    /// and queues first.
    pub fn bindings(&self) -> &[BindingDecl] {
        &self.bindings
    }

    /// The exchange declaration with this name, if any.
    pub fn exchange(&self, name: &str) -> Option<&ExchangeDecl> {
        self.exchanges.iter().find(|e| e.name == name)
    }

    /// The queue declaration with this name, if any.
    pub fn queue(&self, name: &str) -> Option<&QueueDecl> {
        self.queues.iter().find(|q| q.name == name)
    }

    /// Whether there is nothing to declare.
    pub fn is_empty(&self) -> bool {
        self.exchanges.is_empty() && self.queues.is_empty() && self.bindings.is_empty()
    }
}

/// Collects declarations for a [`Topology`]; see [`Topology::define`]. Every method takes
/// and returns the builder; problems are reported by [`build`](TopologyBuilder::build).
///
/// ```
/// use acemq::topology::{ExchangeKind, Topology};
/// let t = Topology::define()
///     .exchange("orders", ExchangeKind::Topic)
///     .exchange("orders", ExchangeKind::Topic) // the same declaration again: kept once
///     .build()?;
/// assert_eq!(t.exchanges().len(), 1);
/// # Ok::<(), acemq::topology::TopologyError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a topology builder does nothing until build() is called"]
pub struct TopologyBuilder {
    exchanges: Vec<ExchangeDecl>,
    queues: Vec<QueueDecl>,
    bindings: Vec<BindingDecl>,
    errors: Vec<TopologyError>,
}

impl TopologyBuilder {
    /// Declares a durable exchange of this type, without arguments.
    pub fn exchange(mut self, name: impl Into<String>, kind: ExchangeKind) -> Self {
        self.exchanges.push(ExchangeDecl::durable(name, kind));
        self
    }

    /// Declares any exchange, as given.
    ///
    /// ```
    /// use acemq::topology::{ExchangeDecl, ExchangeKind, Topology};
    /// let mut e = ExchangeDecl::durable("events", ExchangeKind::Fanout);
    /// e.auto_delete = true;
    /// let t = Topology::define().exchange_decl(e).build()?;
    /// assert!(t.exchanges()[0].auto_delete);
    /// # Ok::<(), acemq::topology::TopologyError>(())
    /// ```
    pub fn exchange_decl(mut self, decl: ExchangeDecl) -> Self {
        self.exchanges.push(decl);
        self
    }

    /// Declares a durable quorum queue (the family's default queue type).
    ///
    /// ```
    /// use acemq::topology::{QueueType, Topology};
    /// let t = Topology::define().queue("orders.new").build()?;
    /// assert_eq!(t.queues()[0].queue_type(), QueueType::Quorum);
    /// # Ok::<(), acemq::topology::TopologyError>(())
    /// ```
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.require_queue_name(&name);
        self.queues.push(QueueDecl::quorum(name));
        self
    }

    /// Declares a durable classic queue with these arguments. An `x-queue-type` argument
    /// is refused at build time: a classic queue carries none.
    ///
    /// ```
    /// use acemq::headers::{HeaderValue, Headers};
    /// use acemq::topology::{QueueType, Topology};
    /// let mut args = Headers::new();
    /// args.insert("x-max-length".into(), HeaderValue::I64(10_000));
    /// let t = Topology::define().classic_queue("audit.log", args).build()?;
    /// assert_eq!(t.queues()[0].queue_type(), QueueType::Classic);
    /// # Ok::<(), acemq::topology::TopologyError>(())
    /// ```
    pub fn classic_queue(mut self, name: impl Into<String>, arguments: Headers) -> Self {
        let name = name.into();
        self.require_queue_name(&name);
        if arguments.contains_key("x-queue-type") {
            self.errors.push(TopologyError::QueueTypeArgument {
                queue: name.clone(),
            });
        }
        let mut decl = QueueDecl::classic(name);
        decl.arguments = arguments;
        self.queues.push(decl);
        self
    }

    /// Declares any queue, as given: exclusive, auto-delete, transient or server-named
    /// (an empty name) included.
    ///
    /// ```
    /// use acemq::topology::{QueueDecl, Topology};
    /// let t = Topology::define().queue_decl(QueueDecl::server_named()).build()?;
    /// assert!(t.queues()[0].exclusive);
    /// # Ok::<(), acemq::topology::TopologyError>(())
    /// ```
    pub fn queue_decl(mut self, decl: QueueDecl) -> Self {
        self.queues.push(decl);
        self
    }

    /// Declares a durable quorum source queue whose broker-side dead letters go to
    /// `{name}.dlq`: exactly `x-dead-letter-exchange: acemq.dlx` and
    /// `x-dead-letter-routing-key: {name}.dlq`. Also declares `{name}.dlq` and
    /// `{name}.parked` (classic, durable, no arguments), the direct durable exchange
    /// `acemq.dlx`, and the two bindings keyed by the queues' own names.
    ///
    /// ```
    /// use acemq::topology::Topology;
    /// let t = Topology::define().queue_with_dead_letter("orders.new").build()?;
    /// let q = t.queue("orders.new").unwrap();
    /// assert_eq!(q.arguments["x-dead-letter-routing-key"].as_str(), Some("orders.new.dlq"));
    /// assert!(t.queue("orders.new.parked").is_some());
    /// # Ok::<(), acemq::topology::TopologyError>(())
    /// ```
    pub fn queue_with_dead_letter(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.require_queue_name(&name);
        let mut decl = QueueDecl::quorum(name.as_str());
        decl.arguments.extend(source_dead_letter_arguments(&name));
        self.queues.push(decl);
        self.push_dead_letter_targets(&name);
        self
    }

    /// Like [`queue_with_dead_letter`](Self::queue_with_dead_letter) for a classic
    /// source queue with arguments of its own. Arguments that already set a dead-letter
    /// argument (`x-dead-letter-*`) or a queue type are refused at build time.
    ///
    /// ```
    /// use acemq::headers::{HeaderValue, Headers};
    /// use acemq::topology::{Topology, TopologyError};
    /// let mut args = Headers::new();
    /// args.insert("x-dead-letter-exchange".into(), HeaderValue::from("mine"));
    /// let err = Topology::define().classic_queue_with_dead_letter("legacy", args)
    ///     .build().unwrap_err();
    /// assert!(matches!(err, TopologyError::DeadLetterArgumentAlreadySet { .. }));
    /// ```
    pub fn classic_queue_with_dead_letter(
        mut self,
        name: impl Into<String>,
        arguments: Headers,
    ) -> Self {
        let name = name.into();
        self.require_queue_name(&name);
        for key in arguments.keys() {
            if key.starts_with(DEAD_LETTER_ARGUMENT_PREFIX) {
                self.errors
                    .push(TopologyError::DeadLetterArgumentAlreadySet {
                        queue: name.clone(),
                        argument: key.to_string(),
                    });
            }
        }
        if arguments.contains_key("x-queue-type") {
            self.errors.push(TopologyError::QueueTypeArgument {
                queue: name.clone(),
            });
        }
        let mut decl = QueueDecl::classic(name.as_str());
        decl.arguments = arguments;
        decl.arguments.extend(source_dead_letter_arguments(&name));
        self.queues.push(decl);
        self.push_dead_letter_targets(&name);
        self
    }

    /// Declares what `policy` needs to wait in the broker for the queue `name`: the direct
    /// durable exchange `acemq.retry`, one rung queue `{name}.retry.{delay}` per
    /// [broker rung](RetryPolicy::broker_rungs), and the binding `{name}` <- `acemq.retry`
    /// with key `{name}`. Declares nothing when the policy has no rungs. The source queue
    /// itself is declared separately.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq::retry::RetryPolicy;
    /// use acemq::topology::Topology;
    /// let quick = RetryPolicy::exponential(4, Duration::from_secs(1), Duration::from_secs(10))?;
    /// let t = Topology::define().queue_with_retry("orders.new", &quick).build()?;
    /// assert!(t.is_empty()); // every wait is spent in the consumer
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_with_retry(mut self, name: impl Into<String>, policy: &RetryPolicy) -> Self {
        let name = name.into();
        self.require_queue_name(&name);
        self.push_retry(&name, policy);
        self
    }

    /// Binds `queue` to `exchange` with a routing key.
    pub fn bind(
        mut self,
        queue: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.bindings
            .push(BindingDecl::new(queue, exchange, routing_key));
        self
    }

    /// Binds `queue` to the headers exchange `exchange`, matching `values` with
    /// `x-match: all` (`match_all`) or `x-match: any`.
    ///
    /// ```
    /// use acemq::headers::{HeaderValue, Headers};
    /// use acemq::topology::{ExchangeKind, Topology};
    /// let mut values = Headers::new();
    /// values.insert("region".into(), HeaderValue::from("eu"));
    /// let t = Topology::define()
    ///     .exchange("by-header", ExchangeKind::Headers)
    ///     .queue("eu.orders")
    ///     .bind_headers("eu.orders", "by-header", true, values)
    ///     .build()?;
    /// assert_eq!(t.bindings()[0].arguments["x-match"].as_str(), Some("all"));
    /// # Ok::<(), acemq::topology::TopologyError>(())
    /// ```
    pub fn bind_headers(
        mut self,
        queue: impl Into<String>,
        exchange: impl Into<String>,
        match_all: bool,
        values: Headers,
    ) -> Self {
        self.bindings
            .push(BindingDecl::headers(queue, exchange, match_all, values));
        self
    }

    /// Checks and deduplicates the declarations. Identical repeats are folded into one;
    /// two different declarations of one name, invalid names, and invalid combinations are
    /// a [`TopologyError`] (the first one found).
    pub fn build(self) -> Result<Topology, TopologyError> {
        if let Some(first) = self.errors.into_iter().next() {
            return Err(first);
        }

        let mut exchanges: Vec<ExchangeDecl> = Vec::new();
        for decl in self.exchanges {
            check_name("exchange", &decl.name)?;
            match exchanges.iter().find(|e| e.name == decl.name) {
                Some(existing) if *existing == decl => {}
                Some(existing) => {
                    return Err(TopologyError::ConflictingExchange {
                        name: decl.name.clone(),
                        difference: exchange_difference(existing, &decl),
                    });
                }
                None => exchanges.push(decl),
            }
        }

        let mut queues: Vec<QueueDecl> = Vec::new();
        for decl in self.queues {
            if decl.queue_type() == QueueType::Quorum
                && (decl.exclusive || decl.auto_delete || !decl.durable)
            {
                return Err(TopologyError::QuorumNotDurable { queue: decl.name });
            }
            if decl.name.is_empty() {
                // Server-named: each declaration makes a new queue.
                queues.push(decl);
                continue;
            }
            check_name("queue", &decl.name)?;
            match queues.iter().find(|q| q.name == decl.name) {
                Some(existing) if *existing == decl => {}
                Some(existing) => {
                    return Err(TopologyError::ConflictingQueue {
                        name: decl.name.clone(),
                        difference: queue_difference(existing, &decl),
                    });
                }
                None => queues.push(decl),
            }
        }

        let mut bindings: Vec<BindingDecl> = Vec::new();
        for decl in self.bindings {
            if decl.queue.is_empty() {
                return Err(TopologyError::EmptyName {
                    what: "binding queue",
                });
            }
            if decl.exchange.is_empty() {
                return Err(TopologyError::DefaultExchangeBinding { queue: decl.queue });
            }
            let is_headers_binding = decl.arguments.contains_key("x-match");
            if let Some(exchange) = exchanges.iter().find(|e| e.name == decl.exchange)
                && is_headers_binding
                && exchange.kind != ExchangeKind::Headers
            {
                return Err(TopologyError::HeadersBindingToNonHeadersExchange {
                    queue: decl.queue,
                    exchange: decl.exchange,
                    kind: exchange.kind,
                });
            }
            if !bindings.contains(&decl) {
                bindings.push(decl);
            }
        }

        Ok(Topology {
            exchanges,
            queues,
            bindings,
        })
    }

    /// Only [`queue_decl`](Self::queue_decl) may declare a server-named (empty) queue.
    fn require_queue_name(&mut self, name: &str) {
        if name.is_empty() {
            self.errors.push(TopologyError::EmptyName { what: "queue" });
        }
    }

    /// `acemq.dlx`, `{q}.dlq`, `{q}.parked` and their bindings.
    fn push_dead_letter_targets(&mut self, queue: &str) {
        self.exchanges.push(ExchangeDecl::durable(
            DEAD_LETTER_EXCHANGE,
            ExchangeKind::Direct,
        ));
        let dlq = dead_letter_queue(queue);
        let parked = parked_queue(queue);
        self.queues.push(dead_letter_queue_decl(queue));
        self.queues.push(parked_queue_decl(queue));
        self.bindings.push(BindingDecl::new(
            dlq.as_str(),
            DEAD_LETTER_EXCHANGE,
            dlq.as_str(),
        ));
        self.bindings.push(BindingDecl::new(
            parked.as_str(),
            DEAD_LETTER_EXCHANGE,
            parked.as_str(),
        ));
    }

    /// `acemq.retry`, the rungs and the binding home, when the policy has rungs.
    fn push_retry(&mut self, queue: &str, policy: &RetryPolicy) {
        let rungs = policy.broker_rungs();
        if rungs.is_empty() {
            return;
        }
        self.exchanges
            .push(ExchangeDecl::durable(RETRY_EXCHANGE, ExchangeKind::Direct));
        for delay in rungs {
            self.queues.push(rung_decl(queue, delay));
        }
        self.bindings
            .push(BindingDecl::new(queue, RETRY_EXCHANGE, queue));
    }
}

#[cfg(test)]
mod tests;
