//! Queues: the record the broker keeps for one queue and its TTL bookkeeping.
//!
//! This module owns what a queue *is* (flags, arguments, ready messages in FIFO order,
//! the consumers attached, the expiry timer's state), what a stored message is, and how
//! a message's expiry instant is computed from `x-message-ttl` and the `expiration`
//! property, including head-only expiry. Declaration checks live in `args`; delivery and
//! dead-lettering in `dispatch` and `deadletter`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::headers::Headers;
use crate::topology::QueueDecl;

use super::args::{Checked, precondition};
use crate::transport::{Properties, TransportError};

/// One published message, shared by every queue it was routed to.
#[derive(Debug)]
pub(crate) struct Message {
    /// The exchange it was published (or dead-lettered) to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// Properties and headers, shared with every delivery of it.
    pub properties: Arc<Properties>,
    /// Body.
    pub body: Bytes,
}

/// A message waiting in a queue.
#[derive(Debug, Clone)]
pub(crate) struct Ready {
    pub msg: Arc<Message>,
    /// It was delivered before and came back.
    pub redelivered: bool,
    /// How many times it came back (quorum queues report it as `x-delivery-count`).
    pub returns: u32,
    /// When it expires, if it has a TTL. Kept across requeues, as RabbitMQ keeps it.
    pub expires_at: Option<Instant>,
}

/// The queue types the memory broker knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Classic,
    Quorum,
}

/// The expiry timer task of a queue.
#[derive(Debug)]
pub(crate) struct Timer {
    /// The instant the task sleeps until.
    pub deadline: Instant,
    /// The task, to tell whether it still runs (its runtime may have shut down).
    pub handle: JoinHandle<()>,
}

/// One queue of a memory broker.
#[derive(Debug)]
pub(crate) struct Queue {
    /// Incarnation id: a queue deleted and declared again is a different queue.
    pub id: u64,
    /// Shared with the unacked records that remember where a delivery came from.
    pub name: Arc<str>,
    pub durable: bool,
    /// The connection owning an exclusive queue.
    pub exclusive_owner: Option<u64>,
    pub auto_delete: bool,
    pub arguments: Headers,
    pub kind: Kind,
    /// `x-message-ttl` in milliseconds.
    pub ttl: Option<u64>,
    /// `x-expires` in milliseconds: deleted once unused (no consumer, no get, no
    /// redeclaration) that long.
    pub expires: Option<u64>,
    /// The last time the queue was used, for `x-expires`.
    pub last_used: Instant,
    /// `x-dead-letter-exchange`.
    pub dlx: Option<String>,
    /// `x-dead-letter-routing-key`.
    pub dlrk: Option<String>,
    /// Ready messages, head first.
    pub ready: VecDeque<Ready>,
    /// Channel ids of the consumers, in attach order.
    pub consumers: Vec<u64>,
    /// Round-robin cursor into `consumers`.
    pub rr: usize,
    /// A consumer was attached at least once (auto-delete needs it).
    pub had_consumer: bool,
    /// The single consumer is exclusive.
    pub exclusive_consumer: bool,
    /// Wakes the expiry task when the head changes to an earlier expiry.
    pub notify: Arc<Notify>,
    pub timer: Option<Timer>,
}

/// `queue 'q' in vhost '/'`, as RabbitMQ names a queue in its errors.
pub(crate) fn queue_ref(name: &str) -> String {
    format!("queue '{name}' in vhost '/'")
}

impl Queue {
    /// A new, empty queue.
    pub(crate) fn new(
        id: u64,
        name: String,
        decl: &QueueDecl,
        checked: Checked,
        owner: Option<u64>,
    ) -> Queue {
        Queue {
            id,
            name: Arc::from(name),
            durable: decl.durable,
            exclusive_owner: owner,
            auto_delete: decl.auto_delete,
            arguments: decl.arguments.clone(),
            kind: checked.kind,
            ttl: checked.ttl,
            expires: checked.expires,
            last_used: Instant::now(),
            dlx: checked.dlx,
            dlrk: checked.dlrk,
            ready: VecDeque::new(),
            consumers: Vec::new(),
            rr: 0,
            had_consumer: false,
            exclusive_consumer: false,
            notify: Arc::new(Notify::new()),
            timer: None,
        }
    }

    /// The instant a message entering this queue now expires: the lower of the queue's
    /// `x-message-ttl` and the message's `expiration`. `None` when neither is set (or the
    /// sum overflows the clock, which is never in practice).
    pub(crate) fn expiry_for(&self, msg: &Message, now: Instant) -> Option<Instant> {
        let ttl = effective_ttl(self.ttl, message_ttl(&msg.properties))?;
        now.checked_add(Duration::from_millis(ttl))
    }

    /// The head's expiry instant, if it has one.
    pub(crate) fn head_expiry(&self) -> Option<Instant> {
        self.ready.front().and_then(|r| r.expires_at)
    }

    /// Removes the expired messages at the head (and only at the head: a message that
    /// has expired behind a live one waits, as in RabbitMQ). Returns them in order.
    pub(crate) fn take_expired_head(&mut self, now: Instant) -> Vec<Ready> {
        let mut out = Vec::new();
        while let Some(at) = self.head_expiry() {
            if at > now {
                break;
            }
            if let Some(r) = self.ready.pop_front() {
                out.push(r);
            }
        }
        out
    }

    /// Detaches a consumer's channel.
    pub(crate) fn remove_consumer(&mut self, channel: u64) {
        if let Some(i) = self.consumers.iter().position(|c| *c == channel) {
            self.consumers.remove(i);
            if self.rr > i {
                self.rr -= 1;
            }
            if self.rr >= self.consumers.len() {
                self.rr = 0;
            }
        }
        if self.consumers.is_empty() {
            self.exclusive_consumer = false;
        }
        self.last_used = Instant::now();
    }
}

/// The `expiration` property in milliseconds. Only call on a property already validated
/// by [`parse_expiration`]; an unreadable one counts as absent.
pub(crate) fn message_ttl(p: &Properties) -> Option<u64> {
    p.expiration.as_deref().and_then(|e| e.parse().ok())
}

/// Validates the `expiration` property as RabbitMQ does at publish time (a decimal,
/// non-negative number of milliseconds; otherwise PRECONDITION_FAILED).
pub(crate) fn parse_expiration(p: &Properties) -> Result<Option<u64>, TransportError> {
    match p.expiration.as_deref() {
        None => Ok(None),
        Some(e) => match e.parse::<u64>() {
            Ok(ms) if e.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(ms)),
            _ => Err(precondition(format!(
                "invalid expiration '{e}': expected a non-negative integer number of milliseconds"
            ))),
        },
    }
}

/// The lower of two optional TTLs.
pub(crate) fn effective_ttl(queue: Option<u64>, message: Option<u64>) -> Option<u64> {
    match (queue, message) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(expiration: Option<&str>) -> Arc<Message> {
        Arc::new(Message {
            exchange: String::new(),
            routing_key: "q".into(),
            properties: Arc::new(Properties {
                expiration: expiration.map(str::to_owned),
                ..Default::default()
            }),
            body: Bytes::new(),
        })
    }

    fn queue(decl: &QueueDecl) -> Queue {
        let checked = crate::transport::memory::args::check_declaration("q", decl).unwrap();
        Queue::new(1, "q".into(), decl, checked, None)
    }

    #[test]
    fn effective_ttl_is_the_lower_one() {
        assert_eq!(effective_ttl(None, None), None);
        assert_eq!(effective_ttl(Some(5), None), Some(5));
        assert_eq!(effective_ttl(None, Some(7)), Some(7));
        assert_eq!(effective_ttl(Some(5), Some(7)), Some(5));
        assert_eq!(effective_ttl(Some(9), Some(7)), Some(7));
    }

    #[test]
    fn expiry_is_computed_from_both_ttls() {
        let now = Instant::now();
        let q = queue(&QueueDecl::classic("q").argument("x-message-ttl", 1000));
        assert_eq!(
            q.expiry_for(&msg(None), now),
            Some(now + Duration::from_millis(1000))
        );
        assert_eq!(
            q.expiry_for(&msg(Some("200")), now),
            Some(now + Duration::from_millis(200))
        );
        let plain = queue(&QueueDecl::classic("q"));
        assert_eq!(plain.expiry_for(&msg(None), now), None);
        assert_eq!(
            plain.expiry_for(&msg(Some("30")), now),
            Some(now + Duration::from_millis(30))
        );
    }

    #[test]
    fn only_the_head_expires() {
        let now = Instant::now();
        let mut q = queue(&QueueDecl::classic("q"));
        let r = |ms: u64, body: &'static str| Ready {
            msg: Arc::new(Message {
                exchange: String::new(),
                routing_key: "q".into(),
                properties: Arc::default(),
                body: Bytes::from_static(body.as_bytes()),
            }),
            redelivered: false,
            returns: 0,
            expires_at: Some(now + Duration::from_millis(ms)),
        };
        q.ready.push_back(r(100, "a"));
        q.ready.push_back(r(10_000, "long"));
        q.ready.push_back(r(50, "short"));
        assert!(q.take_expired_head(now).is_empty());
        let gone = q.take_expired_head(now + Duration::from_millis(200));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].msg.body, "a");
        // "short" expired long ago but sits behind "long".
        assert!(q.take_expired_head(now + Duration::from_secs(5)).is_empty());
        assert_eq!(q.ready.len(), 2);
        let gone = q.take_expired_head(now + Duration::from_secs(11));
        assert_eq!(gone.len(), 2);
        assert_eq!(gone[1].msg.body, "short");
    }

    #[test]
    fn expiration_property_must_be_a_decimal() {
        let p = |e: &str| Properties {
            expiration: Some(e.into()),
            ..Default::default()
        };
        assert_eq!(parse_expiration(&p("1500")).ok(), Some(Some(1500)));
        assert!(parse_expiration(&p("-1")).is_err());
        assert!(parse_expiration(&p("1.5")).is_err());
        assert!(parse_expiration(&p("+1")).is_err());
        assert_eq!(parse_expiration(&Properties::default()).ok(), Some(None));
    }
}
