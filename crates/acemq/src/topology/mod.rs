//! Topology: the names AceMQ derives (`{q}.dlq`, `{q}.parked`, `{q}.retry.{delay}`), the
//! declarations of exchanges, queues and bindings, and the declarative [`Topology`] builder.

mod decl;

pub use decl::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl, QueueType};

/// Placeholder until the builder lands.
#[derive(Debug, Default)]
pub struct Topology {
    exchanges: Vec<ExchangeDecl>,
    queues: Vec<QueueDecl>,
    bindings: Vec<BindingDecl>,
}
impl Topology {
    /// Exchanges.
    pub fn exchanges(&self) -> &[ExchangeDecl] {
        &self.exchanges
    }
    /// Queues.
    pub fn queues(&self) -> &[QueueDecl] {
        &self.queues
    }
    /// Bindings.
    pub fn bindings(&self) -> &[BindingDecl] {
        &self.bindings
    }
}
