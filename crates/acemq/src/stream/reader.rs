//! The typed stream reader: subscribes with `x-stream-offset`, runs the handler one entry
//! at a time in offset order, acks each entry (a stream's acks only open the prefetch
//! window), and subscribes again after a lost connection from the reader's
//! [`StreamPosition`].

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::position::StreamPosition;
use super::{DEFAULT_STREAM_PREFETCH, STREAM_OFFSET, StreamOffset, offset_of};
use crate::codec::Decoder;
use crate::consume::HandlerError;
use crate::consume::resubscribe::resubscribe;
use crate::engine::Engine;
use crate::error::Error;
use crate::headers::Headers;
use crate::lifecycle::{ConsumerControl, ConsumerProgress, ReportsProgress};
use crate::transport::{ConsumeSpec, Delivery, Properties, Subscription};

/// One entry read from a stream.
#[derive(Debug)]
#[non_exhaustive]
pub struct StreamEntry<T> {
    /// The decoded payload.
    pub payload: T,
    /// Its offset in the stream.
    pub offset: u64,
    /// Its properties and headers as delivered.
    pub properties: Properties,
}

/// Builds a stream reader; obtained from [`Connection::stream`](crate::Connection::stream).
///
/// ```no_run
/// # async fn demo(mq: acemq::Connection) -> Result<(), acemq::Error> {
/// let reader = mq
///     .stream::<String>("audit")
///     .from_offset(1_000)
///     .prefetch(50)
///     .skip_failures()
///     .consume(|entry| async move { println!("{}", entry.payload); Ok(()) })
///     .await?;
/// # Ok(()) }
/// ```
pub struct StreamReader<T, D> {
    engine: Arc<Engine>,
    stream: String,
    decoder: D,
    start: StreamOffset,
    prefetch: u16,
    skip_failures: bool,
    _payload: PhantomData<fn() -> T>,
}

impl<T, D> std::fmt::Debug for StreamReader<T, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamReader")
            .field("stream", &self.stream)
            .field("start", &self.start)
            .field("prefetch", &self.prefetch)
            .field("skip_failures", &self.skip_failures)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static, D: Decoder<T>> StreamReader<T, D> {
    pub(crate) fn new(engine: Arc<Engine>, stream: &str, decoder: D) -> Self {
        StreamReader {
            engine,
            stream: stream.to_owned(),
            decoder,
            start: StreamOffset::Next,
            prefetch: DEFAULT_STREAM_PREFETCH,
            skip_failures: false,
            _payload: PhantomData,
        }
    }

    /// Starts at the oldest entry the stream holds.
    pub fn from_first(self) -> Self {
        self.from(StreamOffset::First)
    }

    /// Starts at the last chunk written.
    pub fn from_last(self) -> Self {
        self.from(StreamOffset::Last)
    }

    /// Reads only entries written from now on (the default).
    pub fn from_next(self) -> Self {
        self.from(StreamOffset::Next)
    }

    /// Starts at offset `n`.
    pub fn from_offset(self, n: u64) -> Self {
        self.from(StreamOffset::Offset(n))
    }

    /// Starts at the first chunk written at or after `time` (whole seconds).
    pub fn from_timestamp(self, time: SystemTime) -> Self {
        self.from(StreamOffset::Timestamp(time))
    }

    /// Starts with the entries of the last `period` (e.g. the last 10 minutes).
    pub fn from_last_duration(self, period: Duration) -> Self {
        self.from(StreamOffset::Interval(period))
    }

    /// Starts at `offset`.
    pub fn from(mut self, offset: StreamOffset) -> Self {
        self.start = offset;
        self
    }

    /// Entries in flight from the broker (default [`DEFAULT_STREAM_PREFETCH`]; at least 1).
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// A failing handler (or an entry that does not decode) is counted in
    /// [`StreamConsumer::skipped`] and the reader goes on; by default it stops there.
    pub fn skip_failures(mut self) -> Self {
        self.skip_failures = true;
        self
    }

    /// Starts reading. Refused on `memory://` (no streams), with prefetch 0, or on a closed
    /// connection.
    pub async fn consume<F, Fut>(self, handler: F) -> Result<StreamConsumer, Error>
    where
        F: Fn(StreamEntry<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        if self.engine.lifecycle.is_closed() {
            return Err(Error::Closed);
        }
        if self.prefetch == 0 {
            return Err(Error::InvalidArgument(
                "a stream reader's prefetch must be at least 1 (the broker closes the channel without one)".into(),
            ));
        }
        let spec = ConsumeSpec {
            queue: self.stream.clone(),
            prefetch: self.prefetch,
            consumer_tag: format!("acemq-stream.{}.{}", self.stream, uuid::Uuid::new_v4()),
            exclusive: false,
            arguments: offset_argument(self.start),
        };
        let subscription = self.engine.transport.consume(spec.clone()).await?;
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        let (done_tx, done) = watch::channel(false);
        let control = Arc::new(ConsumerControl::new(
            Arc::from(self.stream.as_str()),
            stop.clone(),
            stop.clone(),
            done.clone(),
            shared.clone(),
        ));
        control.subscribed(Some(subscription.probe()));
        self.engine.lifecycle.register(control.clone());
        let run = Run {
            engine: self.engine.clone(),
            spec,
            floor: match self.start {
                StreamOffset::Offset(n) => n,
                _ => 0,
            },
            decoder: self.decoder,
            handler,
            skip_failures: self.skip_failures,
            shared: shared.clone(),
            control,
            stop: stop.clone(),
            _payload: PhantomData,
        };
        tokio::spawn(async move {
            run.run(subscription).await;
            done_tx.send_replace(true);
        });
        Ok(StreamConsumer {
            stream: self.stream,
            shared,
            stop,
            done,
        })
    }
}

fn offset_argument(offset: StreamOffset) -> Headers {
    Headers::from([(STREAM_OFFSET.to_owned(), offset.argument())])
}

/// A running stream reader.
#[derive(Debug)]
pub struct StreamConsumer {
    stream: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
    done: watch::Receiver<bool>,
}

impl StreamConsumer {
    /// The stream it reads.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The offset of the last entry the handler finished with (`None` before the first).
    pub fn last_handled_offset(&self) -> Option<u64> {
        self.shared.lock().last_handled
    }

    /// Entries handled successfully.
    pub fn handled(&self) -> u64 {
        self.shared.handled.load(Ordering::Relaxed)
    }

    /// Entries skipped after a failure (with [`StreamReader::skip_failures`]).
    pub fn skipped(&self) -> u64 {
        self.shared.skipped.load(Ordering::Relaxed)
    }

    /// Subscriptions made again after the broker ended one (a lost connection).
    pub fn resubscriptions(&self) -> u64 {
        self.shared.resubscribed.load(Ordering::Relaxed)
    }

    /// Whether it is still reading.
    pub fn is_active(&self) -> bool {
        !*self.done.borrow()
    }

    /// Why it stopped on its own (a handler failure, without `skip_failures`).
    pub fn failure(&self) -> Option<String> {
        self.shared.lock().failure.clone()
    }

    /// Waits until it has stopped (on a failure, [`StreamConsumer::stop`] or the
    /// connection's close).
    pub async fn stopped(&self) {
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Stops reading (the entry being handled finishes first) and waits for it.
    pub async fn stop(&self) {
        self.stop.cancel();
        self.stopped().await;
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    active: AtomicBool,
    handled: AtomicU64,
    skipped: AtomicU64,
    resubscribed: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    position: StreamPosition,
    last_handled: Option<u64>,
    failure: Option<String>,
    last_delivery: Option<SystemTime>,
    last_settlement: Option<SystemTime>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ReportsProgress for Shared {
    fn progress(&self) -> ConsumerProgress {
        let st = self.lock();
        let in_hand = usize::from(self.active.load(Ordering::Relaxed));
        ConsumerProgress {
            last_delivery: st.last_delivery,
            last_settlement: st.last_settlement,
            in_hand,
            running: in_hand,
            held: 0,
            moves_failing: 0,
            set_aside_failed: 0,
            stalled: None,
            stall_after: crate::consume::DEFAULT_STALL_AFTER,
            store: None,
        }
    }
}

struct Run<T, D, F> {
    engine: Arc<Engine>,
    spec: ConsumeSpec,
    /// Entries below this offset are already handled (or before the asked start).
    floor: u64,
    decoder: D,
    handler: F,
    skip_failures: bool,
    shared: Arc<Shared>,
    control: Arc<ConsumerControl>,
    stop: CancellationToken,
    _payload: PhantomData<fn() -> T>,
}

impl<T, D, F, Fut> Run<T, D, F>
where
    T: Send + 'static,
    D: Decoder<T>,
    F: Fn(StreamEntry<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn run(mut self, mut sub: Box<dyn Subscription>) {
        loop {
            let next = tokio::select! {
                biased;
                _ = self.stop.cancelled() => break,
                next = sub.next() => next,
            };
            match next {
                Some(Ok(d)) => {
                    if let Err(reason) = self.entry(d).await {
                        self.shared.lock().failure = Some(reason.clone());
                        self.control.ended(Some(reason));
                        break;
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(stream = %self.spec.queue, error = %e, "stream subscription error")
                }
                None if sub.cancelled_by_us() || self.stop.is_cancelled() => break,
                None => match self.again().await {
                    Some(s) => sub = s,
                    None => break,
                },
            }
        }
        let _ = sub.close().await;
    }

    /// Subscribes again from the position (after the broker ended the subscription).
    async fn again(&mut self) -> Option<Box<dyn Subscription>> {
        let from = {
            let mut st = self.shared.lock();
            let from = st.position.resume_from();
            st.position.forget_unsettled();
            from
        };
        if let Some(from) = from {
            self.spec.arguments = offset_argument(StreamOffset::Offset(from));
            self.floor = from;
        }
        tracing::info!(stream = %self.spec.queue, resume_from = ?from, "stream subscription ended; reading again from the reader's position");
        let stream = self.spec.queue.clone();
        let sub = resubscribe(&self.engine.transport, &self.spec, &self.stop, |reason| {
            tracing::debug!(%stream, %reason, "stream reader waiting to subscribe again");
        })
        .await;
        if let Some(s) = &sub {
            self.shared.resubscribed.fetch_add(1, Ordering::Relaxed);
            self.control.subscribed(Some(s.probe()));
        }
        sub
    }

    /// Handles one entry; `Err(reason)` stops the reader.
    async fn entry(&self, d: Delivery) -> Result<(), String> {
        let Some(offset) = offset_of(&d.properties.headers) else {
            return Err(format!(
                "a delivery from {:?} carries no x-stream-offset header: is it a stream?",
                self.spec.queue
            ));
        };
        if offset < self.floor {
            // A chunk starts before the asked offset, or the entry was handled before a
            // reconnect: not handed to the handler again.
            let _ = d.acker.ack().await;
            return Ok(());
        }
        {
            let mut st = self.shared.lock();
            st.position.delivered(offset);
            st.last_delivery = Some(SystemTime::now());
        }
        self.shared.active.store(true, Ordering::Relaxed);
        let outcome = self.handle(&d, offset).await;
        self.shared.active.store(false, Ordering::Relaxed);
        match outcome {
            Ok(()) => {
                self.shared.handled.fetch_add(1, Ordering::Relaxed);
                self.settle(&d, offset, true).await;
                Ok(())
            }
            Err(reason) if self.skip_failures => {
                tracing::warn!(stream = %self.spec.queue, offset, %reason, "stream entry skipped");
                self.shared.skipped.fetch_add(1, Ordering::Relaxed);
                self.settle(&d, offset, false).await;
                Ok(())
            }
            Err(reason) => {
                tracing::error!(stream = %self.spec.queue, offset, %reason, "stream reader stopped at a failing entry");
                Err(format!(
                    "the stream reader of {:?} stopped at offset {offset}: {reason}",
                    self.spec.queue
                ))
            }
        }
    }

    async fn handle(&self, d: &Delivery, offset: u64) -> Result<(), String> {
        let content_type = d.properties.content_type.as_deref();
        if !self.decoder.accepts(content_type) {
            return Err(format!(
                "content type {:?} is not one this reader's codec reads",
                content_type.unwrap_or("")
            ));
        }
        let payload = self
            .decoder
            .decode(content_type, &d.body)
            .map_err(|e| e.to_string())?;
        let entry = StreamEntry {
            payload,
            offset,
            properties: d.properties.clone(),
        };
        match AssertUnwindSafe((self.handler)(entry)).catch_unwind().await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the handler panicked".into()),
        }
    }

    /// Acks (a stream's ack only frees the prefetch window) and moves the position on.
    async fn settle(&self, d: &Delivery, offset: u64, handled: bool) {
        if let Err(e) = d.acker.ack().await {
            tracing::debug!(offset, error = %e, "stream ack not sent (the channel is gone)");
        }
        let mut st = self.shared.lock();
        st.position.settled(offset);
        st.last_settlement = Some(SystemTime::now());
        if handled || st.last_handled.is_some_and(|l| l < offset) {
            st.last_handled = Some(offset);
        }
    }
}
