//! What a handler receives.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::envelope::{Envelope, application_headers};
use crate::headers::Headers;
use crate::transport::Properties;

/// One delivered, decoded message.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// use acemq::consume::{ConsumerOptions, Message};
/// use acemq::topology::QueueDecl;
/// let mq = acemq::Connection::connect("memory://doc-message").await?;
/// mq.transport().declare_queue(&QueueDecl::classic("greetings")).await?;
/// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
/// let _c = mq.consume("greetings", ConsumerOptions::default(), move |m: Message<String>| {
///     let tx = tx.clone();
///     async move {
///         tx.send((m.payload().clone(), m.attempt(), m.queue().to_owned())).ok();
///         Ok(())
///     }
/// }).await?;
/// mq.publisher::<String>("", "greetings").send(&"hello".to_owned()).await?;
/// assert_eq!(rx.recv().await, Some(("hello".to_owned(), 1, "greetings".to_owned())));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Message<T> {
    pub(crate) payload: T,
    pub(crate) envelope: Arc<Envelope>,
    /// The application headers, built from `properties` on first use (up front when an
    /// interceptor or a layer reads them): most handlers never ask.
    pub(crate) headers: OnceLock<Arc<Headers>>,
    /// The delivery's properties, shared with it (the content type and the stream offset
    /// are read from them).
    pub(crate) properties: Arc<Properties>,
    pub(crate) queue: Arc<str>,
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) redelivered: bool,
    /// The consumer's closing token; the message's own token is made from it on first use.
    pub(crate) closing: Arc<CancellationToken>,
    /// The message's token, a child of `closing`: made only when a handler asks for it,
    /// since a child token registers itself under the consumer's token (a lock and two
    /// allocations per delivery that most handlers never use).
    pub(crate) cancellation: OnceLock<CancellationToken>,
}

impl<T> Message<T> {
    /// The decoded payload.
    pub fn payload(&self) -> &T {
        &self.payload
    }
    /// Takes the payload.
    pub fn into_payload(self) -> T {
        self.payload
    }
    /// The envelope (id, type, correlation, attempt, first-seen, replay provenance, ...).
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }
    /// Application headers: everything but the reserved `x-acemq-*` ones (the shared
    /// `acemq-*` ones and `traceparent` included).
    pub fn headers(&self) -> &Headers {
        self.shared_headers()
    }

    /// The application headers as the `Arc` interceptors and layers share.
    pub(crate) fn shared_headers(&self) -> &Arc<Headers> {
        self.headers
            .get_or_init(|| Arc::new(application_headers(&self.properties.headers)))
    }
    /// The delivery attempt, from `x-acemq-attempt` (first = 1).
    pub fn attempt(&self) -> i32 {
        self.envelope.attempt()
    }
    /// The queue it was consumed from.
    pub fn queue(&self) -> &str {
        &self.queue
    }
    /// The exchange it was published to (`""` for retry hops and replays).
    pub fn exchange(&self) -> &str {
        &self.exchange
    }
    /// The routing key it was published with.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }
    /// The broker delivered it before and it was not settled.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }
    /// The delivered content type.
    pub fn content_type(&self) -> Option<&str> {
        self.properties.content_type.as_deref()
    }
    /// The entry's offset, when it was read from a stream (`x-stream-offset`).
    pub fn stream_offset(&self) -> Option<u64> {
        crate::headers::stream_offset(&self.properties.headers)
    }
    /// The reply queue of a request.
    pub fn reply_to(&self) -> Option<&str> {
        self.envelope.reply_to()
    }
    /// Cancelled when the consumer or its connection is closing: pass it to what you await
    /// so the message is handed back at once instead of being abandoned.
    ///
    /// It is the message's own token (a child of the consumer's): cancelling it cancels
    /// nothing else.
    pub fn cancellation(&self) -> &CancellationToken {
        self.cancellation.get_or_init(|| self.closing.child_token())
    }
}
