//! The broker: one named, process-global `memory://` broker and its state.
//!
//! This module owns the registry of brokers (a name is a broker for the life of the
//! process, so a reconnect sees the same queues and messages), the [`MemoryBroker`]
//! handle (the `block` / `unblock` switches and inspection for tests), and the topology
//! half of the broker state: exchanges and their bindings, queue declaration and
//! deletion, passive checks and the exclusive-queue rules, with RabbitMQ's error texts.
//! Delivery, settlement and dead-lettering live in `dispatch`.
//!
//! Everything sits behind one `std::sync::Mutex` per broker, held for a few
//! microseconds and never across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use tokio::sync::watch;

use super::bindings::{Binding, Bindings};
use super::dispatch::Channel;
use super::hash::FastMap;
use super::queue::{Queue, queue_ref};
use super::routing;
use crate::headers::Headers;
use crate::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl, check_short};
use crate::transport::{QueueInfo, TransportError, TransportStatus};

/// One in-process broker, shared by every [`super::MemoryTransport`] connected to its
/// name.
///
/// ```
/// use acemq::transport::memory::{MemoryBroker, MemoryTransport};
/// let t = MemoryTransport::connect("doc-broker");
/// let b = MemoryBroker::named("doc-broker");
/// assert!(std::sync::Arc::ptr_eq(&t.broker(), &b));
/// assert_eq!(b.name(), "doc-broker");
/// ```
pub struct MemoryBroker {
    name: String,
    state: Mutex<State>,
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// An exchange and its bindings.
#[derive(Debug)]
pub(crate) struct Exchange {
    pub kind: ExchangeKind,
    pub durable: bool,
    pub auto_delete: bool,
    /// `amq.*`: predeclared, cannot be deleted.
    pub builtin: bool,
    pub bindings: Bindings,
}

/// Everything a broker holds, behind its one mutex.
///
/// Its methods are split by concern, one file each: the topology half here (exchanges,
/// bindings, queue declaration and deletion), publish, delivery and settlement in
/// `dispatch`, consume / get / cancel / close in `channel`, the expiry sweep in `expiry`,
/// and `x-expires` in `unused`.
#[derive(Debug)]
pub(crate) struct State {
    /// The broker itself, for the expiry tasks.
    pub me: Weak<MemoryBroker>,
    pub exchanges: FastMap<String, Exchange>,
    pub queues: FastMap<String, Queue>,
    /// Channels: one per subscription, one per connection for basic.get.
    pub channels: FastMap<u64, Channel>,
    /// Status senders of the open connections.
    pub connections: FastMap<u64, Arc<watch::Sender<TransportStatus>>>,
    pub blocked: Option<String>,
    /// While set, new connections are refused (a broker that is down, for recovery tests).
    pub down: bool,
    /// Faults injected by tests.
    pub faults: Faults,
    /// Settlements received, by kind (read by `MemoryBroker::settlements`).
    pub settlements: super::inspect::SettlementCounts,
    next_id: u64,
}

/// Faults a test injected; each counts down as it is applied.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Acks that are answered as sent but requeue the message instead.
    pub lose_acks: u32,
    /// Publishes whose message is routed but whose confirm is lost (in doubt).
    pub lose_confirms: u32,
    /// How long confirms are held back.
    pub confirm_delay: Option<std::time::Duration>,
}

fn registry() -> &'static Mutex<HashMap<String, Arc<MemoryBroker>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<MemoryBroker>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(crate) fn not_found_queue(name: &str) -> TransportError {
    TransportError::NotFound {
        detail: format!("no {}", queue_ref(name)),
    }
}

pub(crate) fn not_found_exchange(name: &str) -> TransportError {
    TransportError::NotFound {
        detail: format!("no exchange '{name}' in vhost '/'"),
    }
}

fn default_exchange_refused() -> TransportError {
    TransportError::AccessRefused {
        detail: "operation not permitted on the default exchange".into(),
    }
}

/// 22 characters of URL-safe base64 for 16 random bytes, as in `amq.gen-…`.
fn random_suffix() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bits = uuid::Uuid::new_v4().as_u128();
    (0..22)
        .map(|i| char::from(ALPHABET[((bits >> (i * 6)) & 63) as usize]))
        .collect()
}

impl MemoryBroker {
    /// The broker registered under `name`, created (empty, with the `amq.*` exchanges)
    /// on first use. It lives for the rest of the process.
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// let a = MemoryBroker::named("doc-named");
    /// let b = MemoryBroker::named("doc-named");
    /// assert!(std::sync::Arc::ptr_eq(&a, &b));
    /// ```
    pub fn named(name: &str) -> Arc<MemoryBroker> {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new_cyclic(|me| MemoryBroker {
                    name: name.to_owned(),
                    state: Mutex::new(State::new(me.clone())),
                })
            })
            .clone()
    }

    /// The broker's name (the part after `memory://`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raises a resource alarm: until [`MemoryBroker::unblock`], every publish on a
    /// transport of this broker fails at once with `TransportError::Blocked`, and their
    /// status reports the reason. Consumers keep draining.
    ///
    /// ```
    /// use acemq::transport::{Transport, memory::MemoryTransport};
    /// let t = MemoryTransport::connect("doc-block");
    /// t.broker().block("low on memory");
    /// assert_eq!(t.status().blocked.as_deref(), Some("low on memory"));
    /// t.broker().unblock();
    /// assert_eq!(t.status().blocked, None);
    /// ```
    pub fn block(&self, reason: &str) {
        let mut st = self.lock();
        st.blocked = Some(reason.to_owned());
        for tx in st.connections.values() {
            tx.send_modify(|s| s.blocked = Some(reason.to_owned()));
        }
    }

    /// Clears the resource alarm raised by [`MemoryBroker::block`].
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// let b = MemoryBroker::named("doc-unblock");
    /// b.block("disk");
    /// b.unblock();
    /// assert_eq!(b.blocked(), None);
    /// ```
    pub fn unblock(&self) {
        let mut st = self.lock();
        st.blocked = None;
        for tx in st.connections.values() {
            tx.send_modify(|s| s.blocked = None);
        }
    }

    /// The current block reason, if blocked.
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// assert_eq!(MemoryBroker::named("doc-blocked").blocked(), None);
    /// ```
    pub fn blocked(&self) -> Option<String> {
        self.lock().blocked.clone()
    }
}

pub(crate) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl State {
    fn new(me: Weak<MemoryBroker>) -> State {
        let mut exchanges = FastMap::default();
        for (name, kind) in [
            ("amq.direct", ExchangeKind::Direct),
            ("amq.fanout", ExchangeKind::Fanout),
            ("amq.topic", ExchangeKind::Topic),
            ("amq.headers", ExchangeKind::Headers),
            ("amq.match", ExchangeKind::Headers),
        ] {
            exchanges.insert(
                name.to_owned(),
                Exchange {
                    kind,
                    durable: true,
                    auto_delete: false,
                    builtin: true,
                    bindings: Bindings::default(),
                },
            );
        }
        State {
            me,
            exchanges,
            queues: FastMap::default(),
            channels: FastMap::default(),
            connections: FastMap::default(),
            blocked: None,
            down: false,
            faults: Faults::default(),
            settlements: Default::default(),
            next_id: 1,
        }
    }

    /// A fresh id for a connection, channel or queue incarnation.
    pub(crate) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The queue, if `conn` may use it (RESOURCE_LOCKED for another connection's
    /// exclusive queue).
    pub(crate) fn accessible_queue(&self, name: &str, conn: u64) -> Result<&Queue, TransportError> {
        check_short(name)?;
        let q = self.queues.get(name).ok_or_else(|| not_found_queue(name))?;
        match q.exclusive_owner {
            Some(owner) if owner != conn => Err(locked(name)),
            _ => Ok(q),
        }
    }

    pub(crate) fn info(q: &Queue) -> QueueInfo {
        QueueInfo {
            name: q.name.to_string(),
            message_count: count(q.ready.len()),
            consumer_count: count(q.consumers.len()),
        }
    }

    pub(crate) fn declare_exchange(&mut self, decl: &ExchangeDecl) -> Result<(), TransportError> {
        check_short(&decl.name)?;
        if decl.name.is_empty() {
            return Err(default_exchange_refused());
        }
        if decl.arguments.contains_key("alternate-exchange") {
            return Err(TransportError::Unsupported(format!(
                "the memory:// broker does not implement alternate exchanges (declared on exchange '{}')",
                decl.name
            )));
        }
        let xref = format!("exchange '{}' in vhost '/'", decl.name);
        if let Some(x) = self.exchanges.get(&decl.name) {
            let diff = |what: &str, received: &str, current: &str| {
                Err(TransportError::PreconditionFailed {
                    detail: format!(
                        "inequivalent arg '{what}' for {xref}: received '{received}' but current is '{current}'"
                    ),
                })
            };
            if x.kind != decl.kind {
                return diff("type", decl.kind.as_str(), x.kind.as_str());
            }
            if x.durable != decl.durable {
                return diff("durable", &decl.durable.to_string(), &x.durable.to_string());
            }
            if x.auto_delete != decl.auto_delete {
                return diff(
                    "auto_delete",
                    &decl.auto_delete.to_string(),
                    &x.auto_delete.to_string(),
                );
            }
            return Ok(());
        }
        if decl.name.starts_with("amq.") {
            return Err(TransportError::AccessRefused {
                detail: format!(
                    "exchange name '{}' contains reserved prefix 'amq.*'",
                    decl.name
                ),
            });
        }
        self.exchanges.insert(
            decl.name.clone(),
            Exchange {
                kind: decl.kind,
                durable: decl.durable,
                auto_delete: decl.auto_delete,
                builtin: false,
                bindings: Bindings::default(),
            },
        );
        Ok(())
    }

    pub(crate) fn inspect_exchange(&self, name: &str) -> Result<(), TransportError> {
        check_short(name)?;
        if name.is_empty() || self.exchanges.contains_key(name) {
            Ok(())
        } else {
            Err(not_found_exchange(name))
        }
    }

    pub(crate) fn delete_exchange(&mut self, name: &str) -> Result<(), TransportError> {
        check_short(name)?;
        if name.is_empty() {
            return Err(default_exchange_refused());
        }
        match self.exchanges.get(name) {
            // Deleting a missing exchange is not an error in RabbitMQ 3.10.
            None => Ok(()),
            Some(x) if x.builtin => Err(TransportError::AccessRefused {
                detail: format!("deletion of system exchange '{name}' in vhost '/' not allowed"),
            }),
            Some(_) => {
                self.exchanges.remove(name);
                Ok(())
            }
        }
    }

    pub(crate) fn declare_queue(
        &mut self,
        conn: u64,
        decl: &QueueDecl,
    ) -> Result<QueueInfo, TransportError> {
        let name = if decl.name.is_empty() {
            format!("amq.gen-{}", random_suffix())
        } else {
            check_short(&decl.name)?;
            if decl.name.starts_with("amq.") {
                return Err(TransportError::AccessRefused {
                    detail: format!(
                        "queue name '{}' contains reserved prefix 'amq.*'",
                        decl.name
                    ),
                });
            }
            decl.name.clone()
        };
        let checked = super::args::check_declaration(&name, decl)?;
        if let Some(q) = self.queues.get_mut(&name) {
            let mine = q.exclusive_owner == Some(conn);
            if q.exclusive_owner.is_some() && !mine || decl.exclusive != q.exclusive_owner.is_some()
            {
                return Err(locked(&name));
            }
            q.check_equivalent(decl)?;
            q.last_used = tokio::time::Instant::now();
            return Ok(State::info(q));
        }
        let id = self.next_id();
        let owner = decl.exclusive.then_some(conn);
        let q = Queue::new(id, name.clone(), decl, checked, owner);
        let info = State::info(&q);
        let expires = q.expires;
        self.queues.insert(name.clone(), q);
        if let Some(ms) = expires {
            self.start_unused_expiry(&name, id, ms);
        }
        Ok(info)
    }

    /// Deletes a queue: its ready messages go, its consumers are cancelled (their
    /// subscriptions end), its bindings go (and auto-delete exchanges left without
    /// bindings). Returns the ready count.
    pub(crate) fn remove_queue(&mut self, name: &str) -> u32 {
        let Some(q) = self.queues.remove(name) else {
            return 0;
        };
        if let Some(t) = &q.timer {
            t.handle.abort();
        }
        for c in &q.consumers {
            if let Some(ch) = self.channels.get_mut(c) {
                // Dropping the sender ends the subscription, as a broker basic.cancel.
                ch.consumer = None;
            }
        }
        let mut emptied = Vec::new();
        for (xname, x) in &mut self.exchanges {
            let removed = x.bindings.retain(|b| b.queue != name);
            if removed && x.bindings.is_empty() && x.auto_delete {
                emptied.push(xname.clone());
            }
        }
        for x in emptied {
            self.exchanges.remove(&x);
        }
        count(q.ready.len())
    }

    pub(crate) fn bind(&mut self, conn: u64, decl: &BindingDecl) -> Result<(), TransportError> {
        let (binding, exchange) = self.binding(conn, decl)?;
        if exchange.kind == ExchangeKind::Headers {
            routing::x_match(&binding.args)?;
        }
        exchange.bindings.add(binding);
        Ok(())
    }

    pub(crate) fn unbind(&mut self, conn: u64, decl: &BindingDecl) -> Result<(), TransportError> {
        let (binding, exchange) = self.binding(conn, decl)?;
        let emptied = exchange.bindings.retain(|b| *b != binding)
            && exchange.bindings.is_empty()
            && exchange.auto_delete;
        if emptied {
            self.exchanges.remove(&decl.exchange);
        }
        Ok(())
    }

    fn binding(
        &mut self,
        conn: u64,
        decl: &BindingDecl,
    ) -> Result<(Binding, &mut Exchange), TransportError> {
        check_short(&decl.exchange)?;
        check_short(&decl.routing_key)?;
        if decl.exchange.is_empty() {
            return Err(default_exchange_refused());
        }
        self.accessible_queue(&decl.queue, conn)?;
        let exchange = self
            .exchanges
            .get_mut(&decl.exchange)
            .ok_or_else(|| not_found_exchange(&decl.exchange))?;
        let binding = Binding {
            queue: decl.queue.clone(),
            key: decl.routing_key.clone(),
            args: decl.arguments.clone(),
        };
        Ok((binding, exchange))
    }

    /// The queues a publish to `exchange` reaches, each once, in binding order.
    pub(crate) fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        headers: &Headers,
    ) -> Result<Vec<String>, TransportError> {
        if exchange.is_empty() {
            return Ok(if self.queues.contains_key(routing_key) {
                vec![routing_key.to_owned()]
            } else {
                Vec::new()
            });
        }
        let x = self
            .exchanges
            .get(exchange)
            .ok_or_else(|| not_found_exchange(exchange))?;
        let mut out: Vec<String> = Vec::new();
        let mut add = |b: &Binding| {
            if !out.contains(&b.queue) {
                out.push(b.queue.clone());
            }
        };
        if x.kind == ExchangeKind::Direct {
            // A direct exchange matches the key exactly: only those bindings.
            x.bindings.with_key(routing_key).for_each(&mut add);
        } else {
            x.bindings
                .iter()
                .filter(|b| routing::binding_matches(x.kind, &b.key, &b.args, routing_key, headers))
                .for_each(&mut add);
        }
        Ok(out)
    }
}

pub(crate) fn locked(name: &str) -> TransportError {
    TransportError::ResourceLocked {
        detail: format!(
            "cannot obtain exclusive access to locked {}. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
            queue_ref(name)
        ),
    }
}
