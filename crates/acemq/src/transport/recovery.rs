//! Connection recovery shared by the transports: the policy (how long to wait between
//! redials, when to give up), the events a connection reports while it recovers, and the
//! record of what a connection declared (so it can be declared again, in the same order).
//!
//! A transport that recovers ([`crate::transport::amqp`], [`crate::transport::memory`])
//! notices the loss of a connection, reports [`RecoveryEvent::Lost`], redials with
//! jittered exponential backoff ([`RecoveryEvent::Retrying`] before each attempt), declares
//! again every exchange, queue and binding it declared, and reports
//! [`RecoveryEvent::Recovered`]. Consumers re-subscribe once the transport says it is
//! connected again. Every event is logged with `tracing` and counted in
//! `acemq.connection.recovery.total` (tag `event`).
//!
//! ```
//! use std::time::Duration;
//! use acemq::transport::recovery::RecoveryPolicy;
//! let p = RecoveryPolicy::default();
//! assert_eq!(p.initial_delay(), Duration::from_millis(50));
//! assert_eq!(p.max_delay(), Duration::from_millis(1500));
//! // The third redial waits anything up to 200 ms (full jitter).
//! assert!(p.delay(3) <= Duration::from_millis(200));
//! assert!(!RecoveryPolicy::disabled().enabled());
//! ```

use std::sync::Mutex;
use std::time::Duration;

use rand::RngExt;
use tokio::sync::broadcast;
use tracing::{info, warn};

/// The counter every recovery event is counted in (tags `event`, `transport`); named with
/// the family's other metrics in [`crate::observe::metrics`].
pub use crate::observe::metrics::RECOVERY_TOTAL;
use crate::topology::{BindingDecl, ExchangeDecl, QueueDecl};

/// The first redial delay's upper bound by default.
pub const DEFAULT_INITIAL_DELAY: Duration = Duration::from_millis(50);
/// The longest redial delay by default.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(1500);

/// How a lost connection is redialled.
///
/// The delay before redial `n` (from 1) is drawn at random between zero and
/// `initial × 2^(n-1)` capped at `max` ("full jitter", so a fleet of clients does not
/// redial in step). The defaults: 50 ms doubling to 1.5 s, forever.
///
/// **Why so short.** The family's 1 s doubling to 30 s had grown to 8–16 s by the time a
/// restarted broker (stop, a few seconds, start) took connections again, so a restart cost
/// anything from 1 to 16 s. With a cap of 1.5 s a connection is serving again within
/// 2 s of the broker accepting connections, every time. The price is load while a broker
/// is away: each client redials on average every 0.75 s once the cap is reached, so 1,000
/// clients make some 1,300 attempts a second against a node that refuses them (cheap for
/// RabbitMQ while its listener is closed, a TCP reset each). A fleet much larger than that,
/// or one behind a load balancer that accepts TCP before the node is up, should raise the
/// cap (`delays(..)`), trading a slower return for fewer attempts; full jitter keeps the
/// attempts spread out either way.
///
/// ```
/// use std::time::Duration;
/// use acemq::transport::recovery::RecoveryPolicy;
/// let p = RecoveryPolicy::default()
///     .delays(Duration::from_millis(100), Duration::from_secs(5))
///     .max_attempts(10);
/// assert_eq!(p.attempt_limit(), Some(10));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPolicy {
    enabled: bool,
    initial: Duration,
    max: Duration,
    max_attempts: Option<u32>,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            enabled: true,
            initial: DEFAULT_INITIAL_DELAY,
            max: DEFAULT_MAX_DELAY,
            max_attempts: None,
        }
    }
}

impl RecoveryPolicy {
    /// No recovery: a lost connection stays lost (health shows it Down).
    pub fn disabled() -> Self {
        RecoveryPolicy {
            enabled: false,
            ..RecoveryPolicy::default()
        }
    }

    /// The first delay and the cap (the cap is raised to the first delay if below it).
    pub fn delays(mut self, initial: Duration, max: Duration) -> Self {
        self.initial = initial;
        self.max = max.max(initial);
        self
    }

    /// Gives up after `n` failed redials in a row (default: never).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n.max(1));
        self
    }

    /// Whether a lost connection is redialled.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The delay before the first redial.
    pub fn initial_delay(&self) -> Duration {
        self.initial
    }

    /// The longest delay between redials.
    pub fn max_delay(&self) -> Duration {
        self.max
    }

    /// Redials before giving up (`None`: never give up).
    pub fn attempt_limit(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The un-jittered delay before redial `attempt` (from 1).
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(30);
        self.initial
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The jittered delay before redial `attempt`: anywhere from zero to
    /// [`Self::base_delay`] (full jitter).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.base_delay(attempt);
        let spread = u64::try_from(base.as_micros()).unwrap_or(u64::MAX);
        if spread == 0 {
            return base;
        }
        Duration::from_micros(rand::rng().random_range(0..=spread))
    }

    /// Whether redial `attempt` (from 1) is past the limit.
    pub fn exhausted(&self, attempt: u32) -> bool {
        self.max_attempts.is_some_and(|max| attempt > max)
    }
}

/// Which of a transport's connections an event is about. The AMQP transport has two (a
/// blocked connection stalls every write, acks included, so publishing has its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Side {
    /// The publishing connection.
    Publish,
    /// The consuming connection (consumers, settlements, `basic.get`, topology).
    Consume,
}

impl Side {
    /// `"publish"` or `"consume"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Publish => "publish",
            Side::Consume => "consume",
        }
    }
}

/// What a connection reports while it loses, recovers, or is blocked.
///
/// ```
/// use acemq::transport::recovery::{RecoveryEvent, Side};
/// let e = RecoveryEvent::Lost { side: Side::Consume, reason: "CONNECTION_FORCED".into() };
/// assert_eq!(e.name(), "lost");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryEvent {
    /// The connection was lost (socket error, missed heartbeats, broker close).
    Lost {
        /// Which connection.
        side: Side,
        /// What ended it.
        reason: String,
    },
    /// A redial is about to be tried after `delay`.
    Retrying {
        /// Which connection.
        side: Side,
        /// The redial's number, from 1.
        attempt: u32,
        /// The wait before it.
        delay: Duration,
        /// Why the previous attempt failed (empty before the first).
        last_error: String,
    },
    /// The connection is back, with its topology declared again.
    Recovered {
        /// Which connection.
        side: Side,
        /// Redials it took.
        attempts: u32,
        /// Time from the loss to recovery.
        after: Duration,
        /// The address it reached (without credentials).
        address: String,
    },
    /// Recovery stopped: the policy's attempts are used up, or the broker refused the
    /// credentials. The connection stays Down.
    GaveUp {
        /// Which connection.
        side: Side,
        /// Why.
        reason: String,
    },
    /// The broker blocked publishing (a resource alarm).
    Blocked {
        /// The broker's reason.
        reason: String,
    },
    /// The broker unblocked publishing.
    Unblocked,
}

impl RecoveryEvent {
    /// The event's name: `lost`, `retrying`, `recovered`, `gave_up`, `blocked`, `unblocked`.
    pub fn name(&self) -> &'static str {
        match self {
            RecoveryEvent::Lost { .. } => "lost",
            RecoveryEvent::Retrying { .. } => "retrying",
            RecoveryEvent::Recovered { .. } => "recovered",
            RecoveryEvent::GaveUp { .. } => "gave_up",
            RecoveryEvent::Blocked { .. } => "blocked",
            RecoveryEvent::Unblocked => "unblocked",
        }
    }
}

/// Sends recovery events to every subscriber, logs and counts them.
#[derive(Debug)]
pub(crate) struct Events {
    tx: broadcast::Sender<RecoveryEvent>,
    /// The family's transport name, the counter's `transport` label.
    transport: &'static str,
}

impl Events {
    /// The events of a transport named `transport` (`rabbitmq`, `memory`).
    pub(crate) fn new(transport: &'static str) -> Self {
        Events {
            tx: broadcast::channel(256).0,
            transport,
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<RecoveryEvent> {
        self.tx.subscribe()
    }

    pub(crate) fn emit(&self, event: RecoveryEvent) {
        match &event {
            RecoveryEvent::Lost { side, reason } => {
                warn!(side = side.as_str(), %reason, "connection lost; recovering")
            }
            RecoveryEvent::Retrying {
                side,
                attempt,
                delay,
                last_error,
            } => info!(
                side = side.as_str(),
                attempt,
                delay_ms = delay.as_millis() as u64,
                %last_error,
                "redialling"
            ),
            RecoveryEvent::Recovered {
                side,
                attempts,
                after,
                address,
            } => info!(
                side = side.as_str(),
                attempts,
                after_ms = after.as_millis() as u64,
                %address,
                "connection recovered"
            ),
            RecoveryEvent::GaveUp { side, reason } => {
                warn!(side = side.as_str(), %reason, "gave up recovering the connection")
            }
            RecoveryEvent::Blocked { reason } => warn!(%reason, "the broker blocked publishing"),
            RecoveryEvent::Unblocked => info!("the broker unblocked publishing"),
        }
        metrics::counter!(RECOVERY_TOTAL, "event" => event.name(), "transport" => self.transport)
            .increment(1);
        let _ = self.tx.send(event);
    }
}

/// One declaration a connection made.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Declared {
    Exchange(ExchangeDecl),
    Queue(QueueDecl),
    Binding(BindingDecl),
}

impl Declared {
    fn same_target(&self, other: &Declared) -> bool {
        match (self, other) {
            (Declared::Exchange(a), Declared::Exchange(b)) => a.name == b.name,
            (Declared::Queue(a), Declared::Queue(b)) => a.name == b.name,
            (Declared::Binding(a), Declared::Binding(b)) => a == b,
            _ => false,
        }
    }
}

/// What a connection declared, in the order it first declared it, to declare again after a
/// recovery. A redeclaration replaces the entry in place; a delete or unbind removes it.
/// Server-named queues are not kept (they come back with a new name). Indexed by target,
/// so recording the topology of 1,000 consumers stays linear.
#[derive(Debug, Default)]
pub(crate) struct DeclaredTopology {
    items: Mutex<Items>,
}

#[derive(Debug, Default)]
struct Items {
    list: Vec<Declared>,
    /// The targets in `list` ([`Declared::target`]): a declaration whose target is new is
    /// appended without a search.
    targets: std::collections::HashSet<Target>,
}

/// What a declaration is of: an exchange or queue name, or a binding's queue, exchange and
/// key (two bindings that differ only in their arguments share one; `same_target` tells).
type Target = (u8, String, String, String);

impl Declared {
    fn target(&self) -> Target {
        match self {
            Declared::Exchange(e) => (0, e.name.clone(), String::new(), String::new()),
            Declared::Queue(q) => (1, q.name.clone(), String::new(), String::new()),
            Declared::Binding(b) => (
                2,
                b.queue.clone(),
                b.exchange.clone(),
                b.routing_key.clone(),
            ),
        }
    }
}

impl Items {
    fn retain(&mut self, keep: impl FnMut(&Declared) -> bool) {
        let before = self.list.len();
        self.list.retain(keep);
        if self.list.len() != before {
            self.targets = self.list.iter().map(Declared::target).collect();
        }
    }
}

impl DeclaredTopology {
    fn lock(&self) -> std::sync::MutexGuard<'_, Items> {
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, d: Declared) {
        if let Declared::Queue(q) = &d
            && q.name.is_empty()
        {
            return;
        }
        let mut items = self.lock();
        if !items.targets.insert(d.target())
            && let Some(slot) = items.list.iter_mut().find(|x| x.same_target(&d))
        {
            *slot = d;
            return;
        }
        items.list.push(d);
    }

    pub(crate) fn forget_queue(&self, name: &str) {
        self.lock().retain(|d| match d {
            Declared::Queue(q) => q.name != name,
            Declared::Binding(b) => b.queue != name,
            Declared::Exchange(_) => true,
        });
    }

    pub(crate) fn forget_exchange(&self, name: &str) {
        self.lock().retain(|d| match d {
            Declared::Exchange(e) => e.name != name,
            Declared::Binding(b) => b.exchange != name,
            Declared::Queue(_) => true,
        });
    }

    pub(crate) fn forget_binding(&self, b: &BindingDecl) {
        self.lock()
            .retain(|d| !matches!(d, Declared::Binding(x) if x == b));
    }

    pub(crate) fn snapshot(&self) -> Vec<Declared> {
        self.lock().list.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_the_initial_one_up_to_the_cap() {
        let p = RecoveryPolicy::default();
        let base: Vec<u128> = (1..=8).map(|n| p.base_delay(n).as_millis()).collect();
        assert_eq!(base, vec![50, 100, 200, 400, 800, 1500, 1500, 1500]);
        assert_eq!(p.base_delay(u32::MAX), Duration::from_millis(1500));
        for n in 1..=10 {
            let d = p.delay(n);
            assert!(d <= p.base_delay(n), "{n}: {d:?}");
        }
        // Full jitter: the draws spread over the whole range, not its upper half.
        let draws: Vec<Duration> = (0..200).map(|_| p.delay(8)).collect();
        assert!(draws.iter().any(|d| *d < Duration::from_millis(750)));
        assert!(draws.iter().any(|d| *d >= Duration::from_millis(750)));
    }

    #[test]
    fn attempts_are_exhausted_only_past_the_limit() {
        assert!(!RecoveryPolicy::default().exhausted(1_000_000));
        let p = RecoveryPolicy::default().max_attempts(3);
        assert!(!p.exhausted(3));
        assert!(p.exhausted(4));
    }

    #[test]
    fn the_record_keeps_first_declaration_order_and_forgets_deletions() {
        use crate::topology::{ExchangeKind, Topology};
        let t = Topology::define()
            .exchange("orders", ExchangeKind::Topic)
            .queue("orders.new")
            .bind("orders.new", "orders", "order.*")
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let record = DeclaredTopology::default();
        for e in t.exchanges() {
            record.record(Declared::Exchange(e.clone()));
        }
        for q in t.queues() {
            record.record(Declared::Queue(q.clone()));
        }
        for b in t.bindings() {
            record.record(Declared::Binding(b.clone()));
        }
        // Declared again: replaced in place, not appended.
        record.record(Declared::Exchange(t.exchanges()[0].clone()));
        let names: Vec<&str> = vec!["exchange", "queue", "binding"];
        let snap = record.snapshot();
        assert_eq!(snap.len(), 3);
        let kinds: Vec<&str> = snap
            .iter()
            .map(|d| match d {
                Declared::Exchange(_) => "exchange",
                Declared::Queue(_) => "queue",
                Declared::Binding(_) => "binding",
            })
            .collect();
        assert_eq!(kinds, names);
        record.forget_queue("orders.new");
        assert_eq!(record.snapshot().len(), 1);
        record.forget_exchange("orders");
        assert!(record.snapshot().is_empty());
    }
}
