//! Inspection: what tests (and curious operators) can read from a memory broker without
//! going through a transport.
//!
//! This module owns the read-only half of the [`MemoryBroker`] API: queue and exchange
//! names, ready / unacked / consumer counts, a non-destructive [`MessageSnapshot`] view
//! of a queue, an exchange's bindings, and the [`SettlementCounts`] the broker has
//! received. Every call takes the broker lock briefly.

use bytes::Bytes;

use super::broker::{MemoryBroker, count};
use crate::headers::Headers;
use crate::transport::{Properties, Settlement};

/// The settlements a memory broker has received since it was created, by kind, as
/// [`MemoryBroker::settlements`] reports them. Only settlements of a delivery the broker
/// knew count (one refused as "ack not sent" does not).
///
/// ```
/// # async fn demo() -> Result<(), acemq::transport::TransportError> {
/// use acemq::topology::QueueDecl;
/// use acemq::transport::{Outbound, Properties, Settlement, Transport, memory::MemoryTransport};
/// let t = MemoryTransport::connect("doc-settlements");
/// t.declare_queue(&QueueDecl::classic("q")).await?;
/// t.publish(Outbound::new("", "q", Properties::default(), "hi")).await?.await?;
/// let d = t.get("q").await?.expect("a message");
/// d.acker.settle(Settlement::Ack { multiple: true }).await?;
/// let s = t.broker().settlements();
/// assert_eq!((s.multiple_acks, s.acked_by_multiple, s.single_acks), (1, 1, 0));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SettlementCounts {
    /// `basic.ack` with `multiple = false`.
    pub single_acks: u64,
    /// `basic.ack` with `multiple = true`.
    pub multiple_acks: u64,
    /// Deliveries acknowledged by those `multiple` acks, together.
    pub acked_by_multiple: u64,
    /// `basic.nack` (single or multiple), requeue or not.
    pub nacks: u64,
    /// `basic.reject`, requeue or not.
    pub rejects: u64,
}

impl SettlementCounts {
    /// Counts one settlement that covered `deliveries` deliveries.
    pub(crate) fn record(&mut self, settlement: Settlement, deliveries: usize) {
        match settlement {
            Settlement::Ack { multiple: false } => self.single_acks += 1,
            Settlement::Ack { multiple: true } => {
                self.multiple_acks += 1;
                self.acked_by_multiple += deliveries as u64;
            }
            Settlement::Nack { .. } => self.nacks += 1,
            Settlement::Reject { .. } => self.rejects += 1,
        }
    }
}

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
                    properties: Properties::clone(&r.msg.properties),
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

    /// The settlements this broker has received so far, by kind (see
    /// [`SettlementCounts`]).
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// assert_eq!(MemoryBroker::named("doc-no-settlements").settlements().multiple_acks, 0);
    /// ```
    pub fn settlements(&self) -> SettlementCounts {
        self.lock().settlements
    }
}
