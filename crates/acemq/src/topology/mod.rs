//! Topology: the names AceMQ derives (`{q}.dlq`, `{q}.parked`, `{q}.retry.{delay}`), the
//! declarations of exchanges, queues and bindings, and the declarative [`Topology`] builder.

mod decl;

pub use decl::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl, QueueType};
