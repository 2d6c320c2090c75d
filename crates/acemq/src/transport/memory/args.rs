//! Queue arguments: validating a declaration and comparing it with an existing queue.
//!
//! This module owns RabbitMQ 3.10's declaration rules as the memory broker applies them:
//! which arguments are refused as unsupported, the types `x-message-ttl`,
//! `x-dead-letter-exchange` and `x-dead-letter-routing-key` must have, the quorum-queue
//! property rules, and the equivalence check on redeclaration (flags, then the arguments
//! RabbitMQ compares, integers equal across widths) with RabbitMQ's PRECONDITION_FAILED
//! texts.

use crate::headers::HeaderValue;
use crate::topology::QueueDecl;
use crate::transport::TransportError;

use super::queue::{Kind, Queue, queue_ref};

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

/// The refusal of a stream declaration (checked before any argument it carries).
fn no_streams(qref: &str) -> TransportError {
    TransportError::Unsupported(format!(
        "the memory:// broker has no stream queues ({qref}); declare and read streams on RabbitMQ (3.9 or later)"
    ))
}

pub(crate) fn precondition(detail: String) -> TransportError {
    TransportError::PreconditionFailed { detail }
}

/// What a validated declaration says, ready to build a queue from.
#[derive(Debug)]
pub(crate) struct Checked {
    pub kind: Kind,
    pub ttl: Option<u64>,
    /// `x-expires`: milliseconds unused before the queue is deleted.
    pub expires: Option<u64>,
    pub dlx: Option<String>,
    pub dlrk: Option<String>,
}

/// Validates a declaration's arguments and flags as RabbitMQ 3.10 does before it looks
/// for an existing queue.
pub(crate) fn check_declaration(name: &str, decl: &QueueDecl) -> Result<Checked, TransportError> {
    let qref = queue_ref(name);
    if decl
        .arguments
        .get("x-queue-type")
        .and_then(HeaderValue::as_str)
        == Some("stream")
    {
        return Err(no_streams(&qref));
    }
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
            Some("stream") => return Err(no_streams(&qref)),
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
    let expires = match decl.arguments.get("x-expires") {
        None => None,
        Some(v) => match int_arg(v) {
            Some(ms) if ms > 0 => Some(ms.unsigned_abs()),
            Some(0) => {
                return Err(precondition(format!(
                    "invalid arg 'x-expires' for {qref}: {{value_zero,0}}"
                )));
            }
            Some(ms) => {
                return Err(precondition(format!(
                    "invalid arg 'x-expires' for {qref}: {{value_negative,{ms}}}"
                )));
            }
            None => {
                return Err(precondition(format!(
                    "invalid arg 'x-expires' for {qref}: {{unacceptable_type,{}}}",
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
        expires,
        dlx,
        dlrk,
    })
}

impl Queue {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::HeaderValue;

    fn queue(decl: &QueueDecl) -> Queue {
        let checked = check_declaration("q", decl).unwrap();
        Queue::new(1, "q".into(), decl, checked, None)
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
