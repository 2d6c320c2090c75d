//! Queues: the record the broker keeps for one queue, its declaration rules and its TTL
//! bookkeeping.
//!
//! This module owns what a queue *is* (flags, arguments, ready messages in FIFO order,
//! the consumers attached, the expiry timer's state), how a declaration is validated and
//! compared with an existing queue (RabbitMQ's PRECONDITION_FAILED texts), and how a
//! message's expiry instant is computed from `x-message-ttl` and the `expiration`
//! property. It does not deliver or dead-letter: see `dispatch` and `deadletter`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::headers::{HeaderValue, Headers};
use crate::topology::QueueDecl;
use crate::transport::{Properties, TransportError};

/// One published message, shared by every queue it was routed to.
#[derive(Debug)]
pub(crate) struct Message {
    /// The exchange it was published (or dead-lettered) to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// Properties and headers.
    pub properties: Properties,
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

/// Argument keys RabbitMQ 3.10 compares on redeclaration; others are not compared.
const EQUIVALENCE_KEYS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-delivery-limit",
    "x-dead-letter-strategy",
    "x-queue-master-locator",
    "x-queue-leader-locator",
];

/// Arguments with behaviour the memory broker does not implement: refused, not ignored.
const UNSUPPORTED_KEYS: &[&str] = &[
    "x-max-priority",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-overflow",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
];

/// `queue 'q' in vhost '/'`, as RabbitMQ names a queue in its errors.
pub(crate) fn queue_ref(name: &str) -> String {
    format!("queue '{name}' in vhost '/'")
}

/// An integer argument as RabbitMQ accepts it: any integer field type, not a string.
pub(crate) fn int_arg(v: &HeaderValue) -> Option<i64> {
    match v {
        HeaderValue::I8(x) => Some(i64::from(*x)),
        HeaderValue::U8(x) => Some(i64::from(*x)),
        HeaderValue::I16(x) => Some(i64::from(*x)),
        HeaderValue::U16(x) => Some(i64::from(*x)),
        HeaderValue::I32(x) => Some(i64::from(*x)),
        HeaderValue::U32(x) => Some(i64::from(*x)),
        HeaderValue::I64(x) => Some(*x),
        _ => None,
    }
}

/// RabbitMQ's name for a field type, as it appears in PRECONDITION_FAILED texts.
pub(crate) fn type_name(v: &HeaderValue) -> &'static str {
    match v {
        HeaderValue::Bool(_) => "bool",
        HeaderValue::I8(_) => "byte",
        HeaderValue::U8(_) => "unsignedbyte",
        HeaderValue::I16(_) => "short",
        HeaderValue::U16(_) => "unsignedshort",
        HeaderValue::I32(_) => "signedint",
        HeaderValue::U32(_) => "unsignedint",
        HeaderValue::I64(_) => "long",
        HeaderValue::F32(_) => "float",
        HeaderValue::F64(_) => "double",
        HeaderValue::Decimal { .. } => "decimal",
        HeaderValue::Str(_) => "longstr",
        HeaderValue::Bytes(_) => "binary",
        HeaderValue::Timestamp(_) => "timestamp",
        HeaderValue::Array(_) => "array",
        HeaderValue::Table(_) => "table",
        HeaderValue::Void => "void",
        #[allow(unreachable_patterns)]
        _ => "unknown",
    }
}

fn display_value(v: &HeaderValue) -> String {
    match v {
        HeaderValue::Str(s) => s.clone(),
        HeaderValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        HeaderValue::Bool(b) => b.to_string(),
        other => match int_arg(other) {
            Some(i) => i.to_string(),
            None => format!("{other:?}"),
        },
    }
}

/// `the value '2000' of type 'signedint'`, or `none`.
pub(crate) fn describe(v: Option<&HeaderValue>) -> String {
    match v {
        None => "none".to_owned(),
        Some(v) => format!(
            "the value '{}' of type '{}'",
            display_value(v),
            type_name(v)
        ),
    }
}

fn precondition(detail: String) -> TransportError {
    TransportError::PreconditionFailed { detail }
}

/// What a validated declaration says, ready to build a queue from.
#[derive(Debug)]
pub(crate) struct Checked {
    pub kind: Kind,
    pub ttl: Option<u64>,
    pub dlx: Option<String>,
    pub dlrk: Option<String>,
}

/// Validates a declaration's arguments and flags as RabbitMQ 3.10 does before it looks
/// for an existing queue.
pub(crate) fn check_declaration(name: &str, decl: &QueueDecl) -> Result<Checked, TransportError> {
    let qref = queue_ref(name);
    for key in UNSUPPORTED_KEYS {
        if decl.arguments.contains_key(*key) {
            return Err(TransportError::Unsupported(format!(
                "the memory:// broker does not implement the queue argument '{key}' (declared on {qref}); it refuses it rather than ignore it"
            )));
        }
    }
    let kind = match decl.arguments.get("x-queue-type") {
        None => Kind::Classic,
        Some(v) => match v.as_str() {
            Some("classic") => Kind::Classic,
            Some("quorum") => Kind::Quorum,
            Some("stream") => {
                return Err(TransportError::Unsupported(format!(
                    "the memory:// broker has no stream queues ({qref})"
                )));
            }
            _ => {
                return Err(precondition(format!(
                    "invalid arg 'x-queue-type' for {qref}: {}",
                    describe(Some(v))
                )));
            }
        },
    };
    let ttl = match decl.arguments.get("x-message-ttl") {
        None => None,
        Some(v) => match int_arg(v) {
            Some(ms) if ms >= 0 => Some(ms.unsigned_abs()),
            Some(ms) => {
                return Err(precondition(format!(
                    "invalid arg 'x-message-ttl' for {qref}: {{value_negative,{ms}}}"
                )));
            }
            None => {
                return Err(precondition(format!(
                    "invalid arg 'x-message-ttl' for {qref}: {{unacceptable_type,{}}}",
                    type_name(v)
                )));
            }
        },
    };
    let string_arg = |key: &str| -> Result<Option<String>, TransportError> {
        match decl.arguments.get(key) {
            None => Ok(None),
            Some(HeaderValue::Str(s)) => Ok(Some(s.clone())),
            Some(HeaderValue::Bytes(b)) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
            Some(v) => Err(precondition(format!(
                "invalid arg '{key}' for {qref}: {{unacceptable_type,{}}}",
                type_name(v)
            ))),
        }
    };
    let dlx = string_arg("x-dead-letter-exchange")?;
    let dlrk = string_arg("x-dead-letter-routing-key")?;
    if dlrk.is_some() && dlx.is_none() {
        return Err(precondition(format!(
            "invalid arg 'x-dead-letter-routing-key' for {qref}: routing_key_but_no_dlx_defined"
        )));
    }
    if kind == Kind::Quorum {
        if !decl.durable {
            return Err(precondition(format!(
                "invalid property 'non-durable' for {qref}"
            )));
        }
        if decl.exclusive {
            return Err(precondition(format!(
                "invalid property 'exclusive-owner' for {qref}"
            )));
        }
        if decl.auto_delete {
            return Err(precondition(format!(
                "invalid property 'auto-delete' for {qref}"
            )));
        }
    }
    Ok(Checked {
        kind,
        ttl,
        dlx,
        dlrk,
    })
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

    /// Compares a redeclaration with this queue: the flags, then the arguments RabbitMQ
    /// compares (integers of any width are equal when their values are).
    pub(crate) fn check_equivalent(&self, decl: &QueueDecl) -> Result<(), TransportError> {
        let qref = queue_ref(&self.name);
        let flag = |what: &str, received: bool, current: bool| {
            precondition(format!(
                "inequivalent arg '{what}' for {qref}: received '{received}' but current is '{current}'"
            ))
        };
        if decl.durable != self.durable {
            return Err(flag("durable", decl.durable, self.durable));
        }
        if decl.auto_delete != self.auto_delete {
            return Err(flag("auto_delete", decl.auto_delete, self.auto_delete));
        }
        for key in EQUIVALENCE_KEYS {
            let received = decl.arguments.get(*key);
            let current = self.arguments.get(*key);
            let same = match (received, current) {
                (None, None) => true,
                (Some(a), Some(b)) => match (int_arg(a), int_arg(b)) {
                    (Some(x), Some(y)) => x == y,
                    _ => super::routing::values_equal(a, b) && type_name(a) == type_name(b),
                },
                _ => false,
            };
            if !same {
                return Err(precondition(format!(
                    "inequivalent arg '{key}' for {qref}: received {} but current is {}",
                    describe(received),
                    describe(current)
                )));
            }
        }
        Ok(())
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
            properties: Properties {
                expiration: expiration.map(str::to_owned),
                ..Default::default()
            },
            body: Bytes::new(),
        })
    }

    fn queue(decl: &QueueDecl) -> Queue {
        let checked = check_declaration("q", decl).unwrap();
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
    fn queue_ttl_reads_any_integer_width_and_refuses_strings() {
        for v in [
            HeaderValue::U8(5),
            HeaderValue::I16(5),
            HeaderValue::U32(5),
            HeaderValue::I64(5),
        ] {
            let q = queue(&QueueDecl::classic("q").argument("x-message-ttl", v));
            assert_eq!(q.ttl, Some(5));
        }
        let bad = QueueDecl::classic("q").argument("x-message-ttl", "5");
        assert!(
            check_declaration("q", &bad)
                .unwrap_err()
                .is_precondition_failed()
        );
        let neg = QueueDecl::classic("q").argument("x-message-ttl", -1);
        assert!(
            check_declaration("q", &neg)
                .unwrap_err()
                .is_precondition_failed()
        );
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
                properties: Properties::default(),
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

    #[test]
    fn redeclaration_names_the_difference() {
        let q = queue(&QueueDecl::classic("q"));
        let e = q
            .check_equivalent(&QueueDecl::classic("q").argument("x-message-ttl", 2000))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "precondition failed: inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'signedint' but current is none"
        );
        let t = queue(&QueueDecl::classic("q").argument("x-message-ttl", HeaderValue::I64(5)));
        assert!(
            t.check_equivalent(&QueueDecl::classic("q").argument("x-message-ttl", 5))
                .is_ok()
        );
        assert!(
            q.check_equivalent(&QueueDecl::classic("q").transient())
                .is_err()
        );
        // Unknown arguments are not compared, as in RabbitMQ.
        assert!(
            q.check_equivalent(&QueueDecl::classic("q").argument("x-custom", 1))
                .is_ok()
        );
        // A quorum redeclaration of a classic queue differs in x-queue-type.
        assert!(q.check_equivalent(&QueueDecl::quorum("q")).is_err());
    }

    #[test]
    fn quorum_queues_must_be_durable_shared_and_kept() {
        let mut d = QueueDecl::quorum("q");
        d.durable = false;
        assert!(
            check_declaration("q", &d)
                .unwrap_err()
                .is_precondition_failed()
        );
        let mut d = QueueDecl::quorum("q");
        d.exclusive = true;
        assert!(
            check_declaration("q", &d)
                .unwrap_err()
                .is_precondition_failed()
        );
        let mut d = QueueDecl::quorum("q");
        d.auto_delete = true;
        assert!(
            check_declaration("q", &d)
                .unwrap_err()
                .is_precondition_failed()
        );
        assert_eq!(
            check_declaration("q", &QueueDecl::quorum("q"))
                .unwrap()
                .kind,
            Kind::Quorum
        );
    }

    #[test]
    fn unsupported_arguments_are_refused() {
        let d = QueueDecl::classic("q").argument("x-max-priority", 10);
        assert!(matches!(
            check_declaration("q", &d),
            Err(TransportError::Unsupported(_))
        ));
    }
}
