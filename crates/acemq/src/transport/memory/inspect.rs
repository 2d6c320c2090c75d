//! Inspection: what tests (and curious operators) can read from a memory broker without
//! going through a transport.
//!
//! This module owns the read-only half of the [`MemoryBroker`] API: queue and exchange
//! names, ready / unacked / consumer counts, a non-destructive [`MessageSnapshot`] view
//! of a queue, and an exchange's bindings. Every call takes the broker lock briefly.

use bytes::Bytes;

use super::broker::{MemoryBroker, count};
use crate::headers::Headers;
use crate::transport::Properties;

/// A ready message as [`MemoryBroker::peek`] shows it.
///
/// ```
/// # async fn demo() -> Result<(), acemq::transport::TransportError> {
/// use acemq::topology::QueueDecl;
/// use acemq::transport::{Outbound, Properties, Transport, memory::MemoryTransport};
/// let t = MemoryTransport::connect("doc-peek");
/// t.declare_queue(&QueueDecl::classic("q")).await?;
/// t.publish(Outbound::new("", "q", Properties::default(), "hi")).await?.await?;
/// let seen = t.broker().peek("q").unwrap_or_default();
/// assert_eq!(seen[0].body, "hi");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MessageSnapshot {
    /// The exchange it was published (or dead-lettered) to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// Delivered before and returned.
    pub redelivered: bool,
    /// Properties and headers.
    pub properties: Properties,
    /// Body.
    pub body: Bytes,
}

impl MemoryBroker {
    /// The names of every queue, sorted.
    ///
    /// ```
    /// # async fn demo() -> Result<(), acemq::transport::TransportError> {
    /// use acemq::topology::QueueDecl;
    /// use acemq::transport::{Transport, memory::MemoryTransport};
    /// let t = MemoryTransport::connect("doc-queue-names");
    /// t.declare_queue(&QueueDecl::classic("b")).await?;
    /// t.declare_queue(&QueueDecl::classic("a")).await?;
    /// assert_eq!(t.broker().queue_names(), vec!["a", "b"]);
    /// # Ok(()) }
    /// ```
    pub fn queue_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().queues.keys().cloned().collect();
        v.sort();
        v
    }

    /// The names of every exchange (the default exchange is `""`), sorted.
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// assert!(MemoryBroker::named("doc-x-names").exchange_names().contains(&"amq.topic".to_owned()));
    /// ```
    pub fn exchange_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().exchanges.keys().cloned().collect();
        v.push(String::new());
        v.sort();
        v
    }

    /// Ready messages of a queue (`None` if there is no such queue).
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// assert_eq!(MemoryBroker::named("doc-count").message_count("nope"), None);
    /// ```
    pub fn message_count(&self, queue: &str) -> Option<u32> {
        self.lock().queues.get(queue).map(|q| count(q.ready.len()))
    }

    /// Delivered, unsettled messages taken from a queue (`None` if there is no such queue).
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// assert_eq!(MemoryBroker::named("doc-unacked").unacked_count("nope"), None);
    /// ```
    pub fn unacked_count(&self, queue: &str) -> Option<u32> {
        let st = self.lock();
        let q = st.queues.get(queue)?;
        let n = st
            .channels
            .values()
            .flat_map(|c| c.unacked.iter())
            .filter(|u| u.queue_id == q.id)
            .count();
        Some(count(n))
    }

    /// Consumers attached to a queue (`None` if there is no such queue).
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// assert_eq!(MemoryBroker::named("doc-consumers").consumer_count("nope"), None);
    /// ```
    pub fn consumer_count(&self, queue: &str) -> Option<u32> {
        self.lock()
            .queues
            .get(queue)
            .map(|q| count(q.consumers.len()))
    }

    /// The ready messages of a queue, head first, without taking them (`None` if there
    /// is no such queue). See [`MessageSnapshot`].
    pub fn peek(&self, queue: &str) -> Option<Vec<MessageSnapshot>> {
        let st = self.lock();
        let q = st.queues.get(queue)?;
        Some(
            q.ready
                .iter()
                .map(|r| MessageSnapshot {
                    exchange: r.msg.exchange.clone(),
                    routing_key: r.msg.routing_key.clone(),
                    redelivered: r.redelivered,
                    properties: r.msg.properties.clone(),
                    body: r.msg.body.clone(),
                })
                .collect(),
        )
    }

    /// The bindings of an exchange as `(queue, binding key, arguments)` (`None` if there
    /// is no such exchange; the default exchange has no explicit bindings).
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// assert_eq!(MemoryBroker::named("doc-bindings").bindings("amq.direct"), Some(vec![]));
    /// ```
    pub fn bindings(&self, exchange: &str) -> Option<Vec<(String, String, Headers)>> {
        let st = self.lock();
        st.exchanges.get(exchange).map(|x| {
            x.bindings
                .iter()
                .map(|b| (b.queue.clone(), b.key.clone(), b.args.clone()))
                .collect()
        })
    }
}
