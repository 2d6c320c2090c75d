//! Ordered (partitioned) queues with halting, wire-compatible with the Java member.
//!
//! This module owns [`OrderedQueue`] (the builder [`Connection::ordered`](crate::Connection::ordered)
//! hands out: topology, typed send, consume), the partition arithmetic
//! ([`partition_for`], [`fnv1a32`]), the partition consumers (one task per partition,
//! holding the partition through its lock queue `{name}.p{i}.lock`) and their [`OrderedConsumer`] handle, which also reports
//! to health as `ordered:{name}`.
//!
#![doc = include_str!("../../docs/ordered.md")]

mod partition;
mod run;
mod state;

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use partition::{
    FNV_OFFSET_BASIS, FNV_PRIME, fnv1a32, partition_for, partition_queue, partition_routing_key,
};
pub use run::{STANDBY_RETRY, lock_queue};
pub use state::{Halt, ORDERED_HALTED, ORDERED_TOTAL, OrderedStats, PartitionRole};

use crate::codec::{Decoder, Encoder, Json};
use crate::consume::{ConsumerOptions, Ctx, Final, Handler, Settler};
use crate::engine::Engine;
use crate::error::Error;
use crate::lifecycle::ConsumerControl;
use crate::publish::{PublishResult, Publisher, SendOptions};
use crate::retry::RetryPolicy;
use crate::topology::{ExchangeKind, QueueDecl, Topology};
use state::{OrderedHealth, Shared};

/// Java's default number of partitions.
pub const DEFAULT_PARTITIONS: u32 = 8;
/// Java's default prefetch per partition consumer.
pub const DEFAULT_ORDERED_PREFETCH: u16 = 20;

/// What a partition does when its handler has failed for the last time (at once, or after
/// the in-place retries of [`OnFailure::RetryInPlace`] or of the consumer options' policy).
/// The retry ladder is never used: it would reorder the partition. A message the handler
/// asks to park ([`HandlerError::park`](crate::consume::HandlerError::park)) or to
/// dead-letter goes to `{q}.parked` or `{q}.dlq` whatever this says, as in a plain
/// consumer; a body that does not decode is parked.
///
/// ```
/// use std::time::Duration;
/// use acemq::ordered::OnFailure;
/// assert_eq!(OnFailure::default(), OnFailure::Stop);
/// let _ = OnFailure::RetryInPlace { attempts: 3, delay: Duration::from_secs(1) };
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFailure {
    /// Halt the partition: the message is held (unacked, not requeued), nothing behind it
    /// is handed over, the other partitions carry on; [`OrderedConsumer::resume`] runs it
    /// again from attempt 1. [`HandlerError::fatal`](crate::consume::HandlerError::fatal)
    /// halts at once.
    #[default]
    Stop,
    /// Run the handler up to `attempts` times (the first included), waiting `delay` in
    /// between in the consumer; then halt as [`OnFailure::Stop`]. A failure that is not an
    /// ordinary retry ([`HandlerError::fatal`](crate::consume::HandlerError::fatal)) halts
    /// at once.
    RetryInPlace {
        /// Runs of the handler, the first included (at least 1).
        attempts: u32,
        /// The wait between two runs.
        delay: Duration,
    },
    /// Dead-letter the message to `{name}.p{i}.dlq` with the reason in `x-acemq-error` and
    /// carry on (Java acks and drops it instead; see the module docs).
    Skip,
}

/// The key function of an ordered queue.
type KeyFn<T> = Arc<dyn Fn(&T) -> String + Send + Sync>;

/// An ordered queue: per key, messages are handled in the order they were published;
/// different keys run in parallel, one partition per consumer task. Built with
/// [`Connection::ordered`](crate::Connection::ordered) (JSON) or
/// [`Connection::ordered_with`](crate::Connection::ordered_with) (the codec `C`, which
/// encodes what [`send`](OrderedQueue::send) publishes and decodes what
/// [`consume`](OrderedQueue::consume) hands over).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// use acemq::consume::Message;
/// use acemq::ordered::OnFailure;
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Step { account: String, n: u32 }
///
/// let mq = acemq::Connection::connect("memory://doc-ordered").await?;
/// let ledger = mq
///     .ordered::<Step>("ledger")
///     .partitions(4)
///     .keyed_by(|s| s.account.clone())
///     .on_failure(OnFailure::Stop);
/// ledger.declare().await?;
/// let consumer = ledger.consume(|m: Message<Step>| async move {
///     let _ = m.payload().n; // handled in order per account
///     Ok(())
/// }).await?;
/// ledger.send(&Step { account: "a-1".into(), n: 1 }).await?;
/// assert!(consumer.halted_partitions().is_empty());
/// consumer.close().await;
/// # Ok(()) }
/// ```
pub struct OrderedQueue<T, C = Json> {
    engine: Arc<Engine>,
    name: String,
    codec: Arc<C>,
    partitions: u32,
    prefetch: u16,
    on_failure: OnFailure,
    key: Option<KeyFn<T>>,
    publishers: OnceLock<Vec<Publisher<T>>>,
}

impl<T, C> std::fmt::Debug for OrderedQueue<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderedQueue")
            .field("name", &self.name)
            .field("partitions", &self.partitions)
            .field("prefetch", &self.prefetch)
            .field("on_failure", &self.on_failure)
            .field("keyed", &self.key.is_some())
            .finish_non_exhaustive()
    }
}

impl<T, C> OrderedQueue<T, C> {
    /// A builder with Java's defaults: 8 partitions, prefetch 20, [`OnFailure::Stop`];
    /// `codec` encodes the sends and decodes the deliveries.
    pub(crate) fn new(engine: Arc<Engine>, name: &str, codec: C) -> Self {
        OrderedQueue {
            engine,
            name: name.to_owned(),
            codec: Arc::new(codec),
            partitions: DEFAULT_PARTITIONS,
            prefetch: DEFAULT_ORDERED_PREFETCH,
            on_failure: OnFailure::Stop,
            key: None,
            publishers: OnceLock::new(),
        }
    }

    /// The number of partitions (default 8). Publishers and consumers of one queue must
    /// agree on it; a power of two also keeps Go's arithmetic in agreement (module docs).
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n;
        self.publishers = OnceLock::new();
        self
    }

    /// The ordering key of a message (required to send): messages with one key go to one
    /// partition and are handled in publish order.
    pub fn keyed_by(mut self, key: impl Fn(&T) -> String + Send + Sync + 'static) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// The prefetch window of each partition consumer (default 20).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n;
        self
    }

    /// What a partition does when its handler fails (default [`OnFailure::Stop`]).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// The ordered queue's name (also its exchange's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The partition queues, `{name}.p0` .. `{name}.p{n-1}`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-ordered-queues").await?;
    /// let q = mq.ordered::<String>("orders").partitions(2);
    /// assert_eq!(q.queues(), ["orders.p0", "orders.p1"]);
    /// # Ok(()) }
    /// ```
    pub fn queues(&self) -> Vec<String> {
        (0..self.partitions)
            .map(|i| partition_queue(&self.name, i))
            .collect()
    }

    /// The partition `key` goes to ([`partition_for`]).
    pub fn partition_of(&self, key: &str) -> u32 {
        partition_for(key, self.partitions)
    }

    /// The topology [`OrderedQueue::declare`] declares: the direct exchange `{name}`, the
    /// quorum queues `{name}.p{i}` with no arguments (Java's declaration), each bound with
    /// `p{i}`.
    pub fn topology(&self) -> Result<Topology, Error> {
        self.check()?;
        let mut t = Topology::define().exchange(self.name.clone(), ExchangeKind::Direct);
        for i in 0..self.partitions {
            let q = partition_queue(&self.name, i);
            t = t.queue_decl(QueueDecl::quorum(q.clone())).bind(
                q,
                self.name.clone(),
                partition_routing_key(i),
            );
        }
        Ok(t.build()?)
    }

    /// Declares the exchange, the partition queues and their bindings.
    pub async fn declare(&self) -> Result<(), Error> {
        self.engine.declare(&self.topology()?).await
    }

    fn check(&self) -> Result<(), Error> {
        if self.partitions == 0 || self.partitions > i32::MAX as u32 {
            return Err(Error::InvalidArgument(format!(
                "ordered queue {:?}: partitions must be between 1 and {} (Java's default is 8)",
                self.name,
                i32::MAX
            )));
        }
        if self.name.is_empty() {
            return Err(Error::InvalidArgument(
                "an ordered queue needs a name: it names the exchange and the queues {name}.p{i}"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl<T: 'static, C: Encoder<T>> OrderedQueue<T, C> {
    /// Publishes `payload` to its partition (exchange `{name}`, routing key `p{i}`) through
    /// the connection's publish path (envelope headers, confirms, mandatory) and waits for
    /// the confirm. Fails with [`Error::InvalidArgument`] without [`OrderedQueue::keyed_by`].
    pub async fn send(&self, payload: &T) -> Result<PublishResult, Error> {
        self.send_with(payload, SendOptions::default()).await
    }

    /// [`OrderedQueue::send`] with envelope fields and options.
    pub async fn send_with(
        &self,
        payload: &T,
        options: SendOptions,
    ) -> Result<PublishResult, Error> {
        self.check()?;
        let Some(key) = &self.key else {
            return Err(Error::InvalidArgument(format!(
                "ordered queue {:?} has no key: call .keyed_by(|m| ...) to say which messages must stay in order",
                self.name
            )));
        };
        let p = partition_for(&key(payload), self.partitions);
        let publishers = self.publishers.get_or_init(|| {
            (0..self.partitions)
                .map(|i| {
                    Publisher::new(
                        self.engine.clone(),
                        self.name.clone(),
                        partition_routing_key(i),
                        self.codec.clone(),
                    )
                })
                .collect()
        });
        match publishers.get(p as usize) {
            Some(publisher) => publisher.send_with(payload, options).await,
            None => Err(Error::InvalidArgument(format!(
                "partition {p} of ordered queue {:?} has no publisher",
                self.name
            ))),
        }
    }
}

impl<T: Send + 'static, C: Decoder<T>> OrderedQueue<T, C> {
    /// Consumes every partition, one handler at a time per partition, partitions in
    /// parallel, with default options: [`OrderedQueue::consume_with`].
    pub async fn consume<H: Handler<T>>(&self, handler: H) -> Result<OrderedConsumer, Error> {
        self.consume_with(ConsumerOptions::default(), handler).await
    }

    /// Consumes every partition with `options`, each delivery through the same steps as a
    /// plain consumer's (the connection's interceptors and handler layers, the idempotency
    /// claim of [`ConsumerOptions::idempotent`], the crash-loop guard, spans and the
    /// family's consume metrics per partition queue). What differs is the rule: a failure
    /// is retried in place on the options' [`retry`](ConsumerOptions::retry) policy (every
    /// wait in the consumer; never a rung, which would reorder the partition), then the
    /// queue's [`OnFailure`] step; a message claimed elsewhere, or a store outage, waits
    /// in place without spending an attempt. `prefetch` defaults to the builder's
    /// ([`OrderedQueue::prefetch`]); `concurrency` must be 1.
    ///
    /// Declares each partition's `{q}.dlq` and `{q}.parked` (with `acemq.dlx`), never the
    /// partition queues (call [`OrderedQueue::declare`]). Each partition is taken by
    /// declaring its lock queue ([`lock_queue`], exclusive to this connection) and
    /// consuming it exclusively; a partition another connection holds is on standby and
    /// taken over within seconds of its holder going. Registers `ordered:{name}` with the
    /// connection's health.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use acemq::consume::{ConsumerOptions, Message};
    /// use acemq::idempotency::InMemoryIdempotencyStore;
    /// let mq = acemq::Connection::connect("memory://doc-ordered-with").await?;
    /// let ledger = mq.ordered::<String>("ledger-with").partitions(2).keyed_by(|s| s.clone());
    /// ledger.declare().await?;
    /// let options = ConsumerOptions::default().idempotent(InMemoryIdempotencyStore::for_one_day());
    /// let consumer = ledger
    ///     .consume_with(options, |m: Message<String>| async move { let _ = m.payload(); Ok(()) })
    ///     .await?;
    /// consumer.close().await;
    /// # Ok(()) }
    /// ```
    pub async fn consume_with<H: Handler<T>>(
        &self,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<OrderedConsumer, Error> {
        self.check()?;
        let engine = &self.engine;
        if engine.lifecycle.is_closed() {
            return Err(Error::Closed);
        }
        options.check_in_place("an ordered partition")?;
        let prefetch = options.prefetch_or(self.prefetch);
        if prefetch == 0 {
            return Err(Error::InvalidArgument("prefetch must be at least 1".into()));
        }
        let last = match self.on_failure {
            OnFailure::Skip => Final::DeadLetter {
                prefix: format!("skipped by ordered queue {}", self.name),
            },
            OnFailure::Stop | OnFailure::RetryInPlace { .. } => Final::Halt,
        };
        let mut rule = options.in_place(last, true);
        if let OnFailure::RetryInPlace { attempts, delay } = self.on_failure {
            if rule.policy.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "ordered queue {:?}: say the in-place retries once, either OnFailure::RetryInPlace or ConsumerOptions::retry",
                    self.name
                )));
            }
            rule.policy = Some(RetryPolicy::fixed(attempts.max(1), delay).map_err(|e| {
                Error::InvalidArgument(format!("ordered queue {:?}: {e}", self.name))
            })?);
        }
        if engine.has_health(&state::health_name(&self.name)) {
            return Err(Error::InvalidArgument(format!(
                "ordered queue {:?} is already consumed on this connection; close that consumer first (a second one would break the per-key order)",
                self.name
            )));
        }
        for q in self.queues() {
            engine.declare_for_consumer(&q, None).await?;
        }
        let shared = Arc::new(Shared::new(
            &self.name,
            crate::observe::transport_name(engine.transport.kind()),
            self.partitions,
        ));
        let (stop, closing) = (CancellationToken::new(), CancellationToken::new());
        let (done_tx, done) = watch::channel(false);
        let control = Arc::new(ConsumerControl::new(
            Arc::from(self.name.as_str()),
            stop.clone(),
            closing.clone(),
            done,
            shared.clone(),
        ));
        let decoder: Arc<dyn Decoder<T>> = self.codec.clone();
        let handler = Arc::new(handler);
        let mut cores = Vec::with_capacity(shared.partitions.len());
        let mut partition_stats = Vec::with_capacity(shared.partitions.len());
        for (index, part) in shared.partitions.iter().enumerate() {
            let stats = Arc::new(options.stats());
            partition_stats.push(stats.clone());
            // One count of the partition's deliveries in flight, shared with the waits its
            // settler hands them to.
            let in_flight = Arc::new(AtomicUsize::new(0));
            cores.push(Arc::new(Ctx {
                settler: Settler::new(
                    engine.clone(),
                    Arc::from(part.queue.as_str()),
                    stats,
                    closing.clone(),
                    in_flight.clone(),
                ),
                decoder: decoder.clone(),
                handler: handler.clone(),
                rule: run::PartitionRule {
                    in_place: rule.clone(),
                    shared: shared.clone(),
                    index,
                    stop: stop.clone(),
                },
                idempotency: options.idempotency_store(),
                in_flight,
            }));
        }
        let _ = shared.partition_stats.set(partition_stats);
        engine.lifecycle.register(control.clone());
        engine.register_health(Arc::new(OrderedHealth(shared.clone())));
        let tasks = TaskTracker::new();
        for core in cores {
            tasks.spawn(run::partition(core, prefetch));
        }
        tasks.close();
        let (engine, name) = (engine.clone(), state::health_name(&self.name));
        tokio::spawn(async move {
            tasks.wait().await;
            engine.unregister_health(&name);
            done_tx.send_replace(true);
        });
        Ok(OrderedConsumer { shared, control })
    }
}

/// A running ordered consumer. Consumption goes on until [`OrderedConsumer::close`] or the
/// connection closes; dropping the handle does not stop it.
#[derive(Debug)]
pub struct OrderedConsumer {
    shared: Arc<Shared>,
    control: Arc<ConsumerControl>,
}

impl OrderedConsumer {
    /// The ordered queue's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Partitions halted now, ascending.
    pub fn halted_partitions(&self) -> Vec<u32> {
        self.shared.halted()
    }

    /// Partition `p`'s halt (held message id, reason, since), if it is halted.
    pub fn halt(&self, p: u32) -> Option<Halt> {
        self.shared
            .partitions
            .get(p as usize)
            .and_then(|part| part.halt.borrow().clone())
    }

    /// Lifts partition `p`'s halt: its held message runs again from attempt 1 (if the
    /// connection was lost meanwhile, its redelivery runs). `false` when `p` was not halted
    /// (or is not a partition).
    pub fn resume(&self, p: u32) -> bool {
        self.shared
            .partitions
            .get(p as usize)
            .is_some_and(|part| self.shared.resume(part))
    }

    /// Where each partition stands in this process (index = partition).
    pub fn roles(&self) -> Vec<PartitionRole> {
        self.shared
            .partitions
            .iter()
            .map(|p| crate::util::lock(&p.role).clone())
            .collect()
    }

    /// Partitions whose exclusive consumer this process holds, ascending.
    pub fn active_partitions(&self) -> Vec<u32> {
        self.roles()
            .iter()
            .enumerate()
            .filter(|(_, r)| **r == PartitionRole::Active)
            .filter_map(|(i, _)| u32::try_from(i).ok())
            .collect()
    }

    /// Counts since it started.
    pub fn stats(&self) -> OrderedStats {
        self.shared.stats()
    }

    /// Messages handled and acked.
    pub fn handled(&self) -> u64 {
        self.stats().handled
    }

    /// Messages that failed for good (halted a partition, or were skipped).
    pub fn failed(&self) -> u64 {
        self.stats().failed
    }

    /// Messages skipped to `{name}.p{i}.dlq`.
    pub fn skipped(&self) -> u64 {
        self.stats().skipped
    }

    /// Stops taking deliveries, lets running handlers finish (an in-place retry wait is cut
    /// short), then closes the partitions' channels: held and buffered messages go back to
    /// their queues, in order. Unregisters `ordered:{name}` from health.
    pub async fn close(&self) {
        self.control.stop.cancel();
        self.control.closing.cancel();
        let mut done = self.control.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}
