//! What makes a topology impossible to declare as built: [`TopologyError`], the name
//! checks, and the description of how two declarations of one name differ.

use std::collections::BTreeSet;

use crate::headers::{HeaderName, HeaderValue, Headers};
#[cfg(doc)]
use crate::topology::TopologyBuilder;
use crate::topology::{ExchangeDecl, ExchangeKind, QueueDecl};

/// The prefix RabbitMQ reserves for its own exchanges and queues.
const RESERVED_PREFIX: &str = "amq.";

/// A topology that cannot be declared as built. Returned by [`TopologyBuilder::build`].
///
/// ```
/// use acemq::topology::{Topology, TopologyError};
/// let err = Topology::define().queue("orders").classic_queue("orders", Default::default())
///     .build().unwrap_err();
/// assert!(matches!(err, TopologyError::ConflictingQueue { .. }));
/// assert!(err.to_string().contains("x-queue-type"));
/// ```
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// A name was empty where one is required.
    #[error(
        "{what} name is empty; give it a name (only a queue passed to queue_decl may be server-named)"
    )]
    EmptyName {
        /// What was unnamed: `"exchange"`, `"queue"`, `"binding queue"`.
        what: &'static str,
    },
    /// A name uses the `amq.` prefix RabbitMQ reserves for itself.
    #[error(
        "{what} {name:?} starts with \"amq.\", which RabbitMQ reserves and refuses to declare; choose another name"
    )]
    ReservedName {
        /// `"exchange"` or `"queue"`.
        what: &'static str,
        /// The refused name.
        name: String,
    },
    /// A name is longer than AMQP can carry.
    #[error(
        "{what} name {name:?} is {len} bytes long; AMQP names are at most 255 bytes, use a shorter name"
    )]
    NameTooLong {
        /// `"exchange"` or `"queue"`.
        what: &'static str,
        /// The refused name.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The same exchange name was declared twice, differently.
    #[error(
        "exchange {name:?} is declared twice with different settings ({difference}); the broker would refuse the second declaration with PRECONDITION_FAILED, so declare it one way"
    )]
    ConflictingExchange {
        /// The exchange.
        name: String,
        /// What differs, first declaration against second.
        difference: String,
    },
    /// The same queue name was declared twice, differently.
    #[error(
        "queue {name:?} is declared twice with different settings ({difference}); the broker would refuse the second declaration with PRECONDITION_FAILED, so declare it one way"
    )]
    ConflictingQueue {
        /// The queue.
        name: String,
        /// What differs, first declaration against second.
        difference: String,
    },
    /// [`TopologyBuilder::classic_queue_with_dead_letter`] was given its own dead-letter
    /// argument.
    #[error(
        "queue {queue:?} is declared with dead letter, so AceMQ sets its dead-letter arguments (x-dead-letter-exchange: acemq.dlx, x-dead-letter-routing-key: {queue}.dlq); remove {argument:?} from the arguments, or use classic_queue to route dead letters yourself"
    )]
    DeadLetterArgumentAlreadySet {
        /// The queue.
        queue: String,
        /// The refused argument.
        argument: String,
    },
    /// A classic queue was given an `x-queue-type` argument.
    #[error(
        "classic queue {queue:?} was given an x-queue-type argument; a classic queue carries none (remove it, or use queue() for a quorum queue)"
    )]
    QueueTypeArgument {
        /// The queue.
        queue: String,
    },
    /// A quorum queue declaration is exclusive, auto-delete or transient.
    #[error(
        "queue {queue:?} is quorum but also exclusive, auto-delete or non-durable, which RabbitMQ refuses; build it with QueueDecl::classic, or keep it durable and shared"
    )]
    QuorumNotDurable {
        /// The queue.
        queue: String,
    },
    /// A binding names the default exchange.
    #[error(
        "queue {queue:?} cannot be bound to the default exchange (\"\"): every queue is already bound to it by its own name; bind to a named exchange"
    )]
    DefaultExchangeBinding {
        /// The queue.
        queue: String,
    },
    /// A headers binding targets an exchange this topology declares with another type.
    #[error(
        "queue {queue:?} has a headers binding to exchange {exchange:?}, which this topology declares as {}; header matching only happens on a headers exchange, declare it with ExchangeKind::Headers or use bind()",
        .kind.as_str()
    )]
    HeadersBindingToNonHeadersExchange {
        /// The queue.
        queue: String,
        /// The exchange.
        exchange: String,
        /// The exchange's declared type.
        kind: ExchangeKind,
    },
}

/// Empty, reserved and over-long names.
pub(super) fn check_name(what: &'static str, name: &str) -> Result<(), TopologyError> {
    if name.is_empty() {
        return Err(TopologyError::EmptyName { what });
    }
    if name.starts_with(RESERVED_PREFIX) {
        return Err(TopologyError::ReservedName {
            what,
            name: name.to_owned(),
        });
    }
    // The transports apply the same check, so the 255-byte limit has one definition.
    if crate::topology::check_short(name).is_err() {
        return Err(TopologyError::NameTooLong {
            what,
            name: name.to_owned(),
            len: name.len(),
        });
    }
    Ok(())
}

/// What differs between two declarations of one exchange.
pub(super) fn exchange_difference(first: &ExchangeDecl, second: &ExchangeDecl) -> String {
    let mut parts = Vec::new();
    if first.kind != second.kind {
        parts.push(format!(
            "type {} vs {}",
            first.kind.as_str(),
            second.kind.as_str()
        ));
    }
    flag(&mut parts, "durable", first.durable, second.durable);
    flag(
        &mut parts,
        "auto_delete",
        first.auto_delete,
        second.auto_delete,
    );
    parts.extend(argument_differences(&first.arguments, &second.arguments));
    parts.join("; ")
}

/// Notes a flag that differs: `"{name} {first} vs {second}"`.
fn flag(parts: &mut Vec<String>, name: &str, first: bool, second: bool) {
    if first != second {
        parts.push(format!("{name} {first} vs {second}"));
    }
}

/// What differs between two declarations of one queue.
pub(super) fn queue_difference(first: &QueueDecl, second: &QueueDecl) -> String {
    let mut parts = Vec::new();
    flag(&mut parts, "durable", first.durable, second.durable);
    flag(&mut parts, "exclusive", first.exclusive, second.exclusive);
    flag(
        &mut parts,
        "auto_delete",
        first.auto_delete,
        second.auto_delete,
    );
    parts.extend(argument_differences(&first.arguments, &second.arguments));
    parts.join("; ")
}

/// One entry per argument whose presence or value differs.
fn argument_differences(first: &Headers, second: &Headers) -> Vec<String> {
    let keys: BTreeSet<&HeaderName> = first.keys().chain(second.keys()).collect();
    keys.into_iter()
        .filter_map(|key| {
            let (a, b) = (first.get(key), second.get(key));
            (a != b).then(|| {
                format!(
                    "argument {key} {} vs {}",
                    describe_value(a),
                    describe_value(b)
                )
            })
        })
        .collect()
}

/// An argument value for an error message.
fn describe_value(value: Option<&HeaderValue>) -> String {
    match value {
        None => "absent".to_owned(),
        Some(HeaderValue::Str(s)) => format!("{s:?}"),
        Some(other) => match other.as_i64() {
            Some(n) => n.to_string(),
            None => format!("{other:?}"),
        },
    }
}
