//! The names AceMQ derives from a queue name, and the declarations that go with them
//! (`docs/wire.md` §4). These tables are exact: a second declarer whose arguments differ by
//! one entry fails with `PRECONDITION_FAILED`, so every library in the family produces the
//! same names and the same arguments.

use std::time::Duration;

use crate::headers::{HeaderValue, Headers};
use crate::retry::render_delay;
use crate::topology::QueueDecl;

/// The direct, durable exchange that dead-letters a source queue into `{q}.dlq` and that
/// binds `{q}.dlq` and `{q}.parked` by their own names.
///
/// ```
/// assert_eq!(acemq::topology::DEAD_LETTER_EXCHANGE, "acemq.dlx");
/// ```
pub const DEAD_LETTER_EXCHANGE: &str = "acemq.dlx";

/// The direct, durable exchange a rung queue dead-letters into when its time-to-live
/// expires; each source queue `{q}` is bound to it with key `{q}`.
///
/// ```
/// assert_eq!(acemq::topology::RETRY_EXCHANGE, "acemq.retry");
/// ```
pub const RETRY_EXCHANGE: &str = "acemq.retry";

/// AMQP's short-string limit, in bytes: exchange and queue names, routing keys, consumer
/// tags and header keys are at most this long. The one definition both the topology
/// builder and the transports check against.
pub(crate) const SHORT_STRING_MAX: usize = 255;

/// A name longer than [`SHORT_STRING_MAX`] bytes ([`check_short`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NameTooLong {
    /// The name refused.
    pub(crate) name: String,
}

/// Checks a name against AMQP's short-string limit ([`SHORT_STRING_MAX`] bytes).
pub(crate) fn check_short(name: &str) -> Result<(), NameTooLong> {
    if name.len() > SHORT_STRING_MAX {
        return Err(NameTooLong {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// `x-message-ttl`
const MESSAGE_TTL: &str = "x-message-ttl";
/// `x-dead-letter-exchange`
const DLX: &str = "x-dead-letter-exchange";
/// `x-dead-letter-routing-key`
const DLK: &str = "x-dead-letter-routing-key";

/// The dead-letter queue of `queue`: `{queue}.dlq`. Messages whose attempts or age are
/// exhausted, and messages a handler refused as fatal, end up here.
///
/// ```
/// assert_eq!(acemq::topology::dead_letter_queue("orders.new"), "orders.new.dlq");
/// ```
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dlq")
}

/// The parking queue of `queue`: `{queue}.parked`. Messages that could not be decoded end
/// up here with their original bytes.
///
/// ```
/// assert_eq!(acemq::topology::parked_queue("orders.new"), "orders.new.parked");
/// ```
pub fn parked_queue(queue: &str) -> String {
    format!("{queue}.parked")
}

/// The rung queue holding broker waits of `delay` for `queue`:
/// `{queue}.retry.{render_delay(delay)}`.
///
/// ```
/// use std::time::Duration;
/// use acemq::topology::retry_queue;
/// assert_eq!(retry_queue("orders.new", Duration::from_secs(90)), "orders.new.retry.90s");
/// assert_eq!(retry_queue("orders.new", Duration::from_secs(300)), "orders.new.retry.5m");
/// ```
pub fn retry_queue(queue: &str, delay: Duration) -> String {
    format!("{queue}.retry.{}", render_delay(delay))
}

/// The exact arguments of the rung queue for `queue` and `delay`: `x-message-ttl` = the
/// delay in whole milliseconds, `x-dead-letter-exchange` = [`RETRY_EXCHANGE`] and
/// `x-dead-letter-routing-key` = `queue`. Nothing else.
///
/// The time-to-live is a 64-bit integer ([`HeaderValue::I64`], AMQP type `l`, what the
/// Java library sends): RabbitMQ compares integer arguments by value across integer
/// widths, and a 32-bit value would overflow at about 24.8 days. The contract lists the
/// three arguments in the order above; a [`Headers`] table is ordered by name, which
/// RabbitMQ does not compare.
///
/// ```
/// use std::time::Duration;
/// use acemq::headers::HeaderValue;
/// use acemq::topology::rung_arguments;
/// let args = rung_arguments("orders.new", Duration::from_secs(90));
/// assert_eq!(args.len(), 3);
/// assert_eq!(args["x-message-ttl"], HeaderValue::I64(90_000));
/// assert_eq!(args["x-dead-letter-exchange"].as_str(), Some("acemq.retry"));
/// assert_eq!(args["x-dead-letter-routing-key"].as_str(), Some("orders.new"));
/// ```
pub fn rung_arguments(queue: &str, delay: Duration) -> Headers {
    let ttl = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    let mut args = Headers::new();
    args.insert(MESSAGE_TTL.into(), HeaderValue::I64(ttl));
    args.insert(DLX.into(), HeaderValue::from(RETRY_EXCHANGE));
    args.insert(DLK.into(), HeaderValue::from(queue));
    args
}

/// The exact dead-letter arguments of a source queue declared "with dead letter":
/// `x-dead-letter-exchange` = [`DEAD_LETTER_EXCHANGE`] and `x-dead-letter-routing-key` =
/// `{queue}.dlq`. The broker's native dead-lettering (TTL expiry, length overflow, rejects
/// by other consumers) then lands in the same `{queue}.dlq` the library republishes to.
///
/// ```
/// use acemq::topology::source_dead_letter_arguments;
/// let args = source_dead_letter_arguments("orders.new");
/// assert_eq!(args.len(), 2);
/// assert_eq!(args["x-dead-letter-exchange"].as_str(), Some("acemq.dlx"));
/// assert_eq!(args["x-dead-letter-routing-key"].as_str(), Some("orders.new.dlq"));
/// ```
pub fn source_dead_letter_arguments(queue: &str) -> Headers {
    let mut args = Headers::new();
    args.insert(DLX.into(), HeaderValue::from(DEAD_LETTER_EXCHANGE));
    args.insert(DLK.into(), HeaderValue::from(dead_letter_queue(queue)));
    args
}

/// The declaration of the rung queue for `queue` and `delay`: named by [`retry_queue`],
/// classic, durable, with exactly the [`rung_arguments`].
///
/// ```
/// use std::time::Duration;
/// use acemq::topology::{rung_decl, QueueType};
/// let q = rung_decl("orders.new", Duration::from_secs(40));
/// assert_eq!(q.name, "orders.new.retry.40s");
/// assert_eq!(q.queue_type(), QueueType::Classic);
/// assert!(q.durable);
/// assert_eq!(q.arguments.len(), 3);
/// ```
pub fn rung_decl(queue: &str, delay: Duration) -> QueueDecl {
    let mut decl = QueueDecl::classic(retry_queue(queue, delay));
    decl.arguments = rung_arguments(queue, delay);
    decl
}

/// The declaration of `{queue}.dlq`: classic, durable, no arguments.
///
/// ```
/// use acemq::topology::dead_letter_queue_decl;
/// let q = dead_letter_queue_decl("orders.new");
/// assert_eq!(q.name, "orders.new.dlq");
/// assert!(q.durable && q.arguments.is_empty());
/// ```
pub fn dead_letter_queue_decl(queue: &str) -> QueueDecl {
    QueueDecl::classic(dead_letter_queue(queue))
}

/// The declaration of `{queue}.parked`: classic, durable, no arguments.
///
/// ```
/// use acemq::topology::parked_queue_decl;
/// let q = parked_queue_decl("orders.new");
/// assert_eq!(q.name, "orders.new.parked");
/// assert!(q.durable && q.arguments.is_empty());
/// ```
pub fn parked_queue_decl(queue: &str) -> QueueDecl {
    QueueDecl::classic(parked_queue(queue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rung_ttl_does_not_overflow() {
        let args = rung_arguments("q", Duration::MAX);
        assert_eq!(args["x-message-ttl"], HeaderValue::I64(i64::MAX));
        let args = rung_arguments("q", Duration::from_secs(40 * 86_400));
        assert_eq!(args["x-message-ttl"], HeaderValue::I64(40 * 86_400 * 1_000));
    }
}
