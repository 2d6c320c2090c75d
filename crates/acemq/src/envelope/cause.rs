//! What a handler's publishes inherit from the message being handled: its correlation id
//! and, as their causation, its message id (the family's `causing`). The delivery path
//! sets it around the handler ([`scope`]); the publish path reads it ([`current`]) for
//! every field the caller did not set.

use std::future::Future;
use std::sync::Arc;

use super::Envelope;

tokio::task_local! {
    static CAUSE: Cause;
}

/// The message being handled, as its handler's publishes see it: its envelope, shared (a
/// delivery whose handler publishes nothing copies no id).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cause(pub(crate) Arc<Envelope>);

impl Cause {
    /// The incoming correlation id, carried on.
    pub(crate) fn correlation_id(&self) -> &str {
        self.0.correlation_id()
    }

    /// The incoming message id: the causation of what the handler publishes.
    pub(crate) fn message_id(&self) -> &str {
        self.0.id()
    }
}

/// Runs `fut` (a handler) with `cause` as what its publishes inherit. Not an `async fn`,
/// which would hold `fut` twice (see `observe::trace::scope`).
pub(crate) fn scope<F: Future>(cause: Cause, fut: F) -> impl Future<Output = F::Output> {
    CAUSE.scope(cause, fut)
}

/// The message being handled by the current task, if any.
pub(crate) fn current() -> Option<Cause> {
    CAUSE.try_with(Cause::clone).ok()
}
