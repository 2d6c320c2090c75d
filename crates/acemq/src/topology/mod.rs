//! Topology: the names AceMQ derives (`{q}.dlq`, `{q}.parked`, `{q}.retry.{delay}`), the
//! declarations of exchanges, queues and bindings, and the declarative [`Topology`] builder.
//!
//! ```
//! use std::time::Duration;
//! use acemq::topology::{dead_letter_queue, retry_queue};
//! assert_eq!(dead_letter_queue("orders.new"), "orders.new.dlq");
//! assert_eq!(retry_queue("orders.new", Duration::from_secs(160)), "orders.new.retry.160s");
//! ```

mod decl;
mod define;
mod names;

pub use crate::retry::render_delay;
pub use decl::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl, QueueType};
pub use define::{Topology, TopologyBuilder, TopologyError};
pub use names::{
    DEAD_LETTER_EXCHANGE, RETRY_EXCHANGE, dead_letter_queue, dead_letter_queue_decl, parked_queue,
    parked_queue_decl, retry_queue, rung_arguments, rung_decl, source_dead_letter_arguments,
};
pub(crate) use names::{NameTooLong, SHORT_STRING_MAX, check_short};
