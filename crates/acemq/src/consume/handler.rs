//! What a handler is ([`Handler`]: any `Fn(Message<T>) -> impl Future<Output = Result<R,
//! HandlerError>>`) and what it returns when it does not succeed ([`HandlerError`]).

use std::future::Future;

use super::message::Message;
pub use crate::handler_error::HandlerError;
pub(crate) use crate::handler_error::Kind;

/// A message handler: what every consumer kind runs for a delivery (a plain consumer, an
/// ordered partition, a stream reader: `R = ()`; a responder: `R` is the reply). Every
/// closure or `fn` taking a [`Message<T>`] and returning a future of `Result<R,
/// HandlerError>` is one; implement it by hand for a handler that is a struct.
///
/// ```
/// use acemq::consume::{Handler, HandlerError, Message};
/// struct Audit { prefix: String }
/// impl Handler<String> for Audit {
///     type Future = std::future::Ready<Result<(), HandlerError>>;
///     fn call(&self, m: Message<String>) -> Self::Future {
///         println!("{}{}", self.prefix, m.payload());
///         std::future::ready(Ok(()))
///     }
/// }
/// fn takes<H: Handler<String>>(_: H) {}
/// takes(Audit { prefix: "audit: ".into() });
/// takes(|m: Message<String>| async move { let _ = m.payload(); Ok(()) });
/// ```
pub trait Handler<T, R = ()>: Send + Sync + 'static {
    /// The future one call returns.
    type Future: Future<Output = Result<R, HandlerError>> + Send + 'static;
    /// Handles one message.
    fn call(&self, message: Message<T>) -> Self::Future;
}

impl<T, R, F, Fut> Handler<T, R> for F
where
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, HandlerError>> + Send + 'static,
{
    type Future = Fut;
    fn call(&self, message: Message<T>) -> Fut {
        self(message)
    }
}
