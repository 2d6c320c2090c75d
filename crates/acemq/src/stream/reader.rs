//! The typed stream reader: subscribes with `x-stream-offset` and hands entries, one at a
//! time in offset order, to the one delivery path (`consume::handle`: interceptors,
//! handler layers, the idempotency claim, spans and metrics, as every consumer) under the
//! stream's rule ([`StreamRule`]: a failure is retried in place on the options' policy,
//! then skipped or stops the reader; nothing is ever republished into a log). It acks each
//! entry (a stream's acks only open the prefetch window), subscribes again after a lost
//! connection from the reader's [`StreamPosition`], and commits its last finished offset to
//! an [`OffsetStore`] when it has one.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::offsets::OffsetStore;
use super::position::StreamPosition;
use super::{DEFAULT_STREAM_PREFETCH, STREAM_OFFSET, StreamOffset, offset_of};
use crate::codec::Decoder;
use crate::consume::resubscribe::resubscribe;
use crate::consume::rule::{Begin, Flow, Rule};
use crate::consume::{
    ConsumerOptions, ConsumerStats, Ctx, Decision, Facts, Final, Handler, InPlace, Outcome,
    Settler, Stats, handle,
};
use crate::engine::Engine;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::headers::Headers;
use crate::lifecycle::ConsumerControl;
use crate::transport::{ConsumeSpec, Delivery, Subscription};
use crate::util::lock;

/// Entries finished between two offset commits at most (a commit is also made whenever
/// no entry is waiting, and when the reader stops).
const COMMIT_EVERY: u64 = 100;

/// Builds a stream reader; obtained from [`Connection::stream`](crate::Connection::stream).
/// Handlers receive a [`Message`](crate::consume::Message), as every consumer's do, with
/// the entry's offset in [`Message::stream_offset`](crate::consume::Message::stream_offset).
///
/// ```no_run
/// # async fn demo(mq: acemq::Connection) -> Result<(), acemq::Error> {
/// use acemq::consume::Message;
/// let reader = mq
///     .stream::<String>("audit")
///     .from_offset(1_000)
///     .prefetch(50)
///     .skip_failures()
///     .consume(|m: Message<String>| async move { println!("{}", m.payload()); Ok(()) })
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
    offsets: Option<(Arc<dyn OffsetStore>, String)>,
    _payload: PhantomData<fn() -> T>,
}

impl<T, D> std::fmt::Debug for StreamReader<T, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamReader")
            .field("stream", &self.stream)
            .field("start", &self.start)
            .field("prefetch", &self.prefetch)
            .field("skip_failures", &self.skip_failures)
            .field("offsets", &self.offsets.as_ref().map(|(_, name)| name))
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
            offsets: None,
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

    /// Starts at offset `n`, inclusive: the entry at `n` is the first one handed to the
    /// handler (the broker delivers from the start of `n`'s chunk; what is before `n` is
    /// acked unseen).
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

    /// Starts at `offset` (when no committed offset says otherwise: see
    /// [`StreamReader::offsets`]).
    pub fn from(mut self, offset: StreamOffset) -> Self {
        self.start = offset;
        self
    }

    /// Entries in flight from the broker (default [`DEFAULT_STREAM_PREFETCH`]; at least 1).
    /// Options given to [`StreamReader::consume_with`] with a prefetch win over this.
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// A failing handler (after its in-place retries), or an entry that does not decode,
    /// is counted in [`StreamConsumer::skipped`] and the reader goes on; by default it
    /// stops there.
    pub fn skip_failures(mut self) -> Self {
        self.skip_failures = true;
        self
    }

    /// Commits the offset of each finished entry to `store` under the reader's `name`, and
    /// starts just after the committed one (exclusive: that entry is done) when there is
    /// one, whatever [`StreamReader::from`] says; the start offset applies only to a reader
    /// that never committed.
    ///
    /// ```no_run
    /// # async fn demo(mq: acemq::Connection) -> Result<(), acemq::Error> {
    /// use acemq::consume::Message;
    /// use acemq::stream::MemoryOffsetStore;
    /// let reader = mq
    ///     .stream::<String>("audit")
    ///     .from_first()
    ///     .offsets(MemoryOffsetStore::new(), "indexer")
    ///     .consume(|m: Message<String>| async move { let _ = m.stream_offset(); Ok(()) })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn offsets(mut self, store: impl OffsetStore, name: impl Into<String>) -> Self {
        self.offsets = Some((Arc::new(store), name.into()));
        self
    }

    /// Starts reading with default options ([`StreamReader::consume_with`]).
    pub async fn consume<H: Handler<T>>(self, handler: H) -> Result<StreamConsumer, Error> {
        self.consume_with(ConsumerOptions::default(), handler).await
    }

    /// Starts reading with `options`: the same a plain consumer takes, read the stream's
    /// way. Its [`retry`](ConsumerOptions::retry) policy retries a failing entry in place
    /// (then the entry is skipped or the reader stops), its
    /// [`idempotent`](ConsumerOptions::idempotent) store claims each entry's message id,
    /// and an entry claimed elsewhere waits in place. `concurrency` must be 1 (a stream is
    /// read in order). Refused on `memory://` (no streams), with prefetch 0, or on a closed
    /// connection.
    pub async fn consume_with<H: Handler<T>>(
        self,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<StreamConsumer, Error> {
        if self.engine.lifecycle.is_closed() {
            return Err(Error::Closed);
        }
        options.check_in_place("a stream reader")?;
        let prefetch = options.prefetch_or(self.prefetch);
        if prefetch == 0 {
            return Err(Error::InvalidArgument(
                "a stream reader's prefetch must be at least 1 (the broker closes the channel without one)".into(),
            ));
        }
        let committed = match &self.offsets {
            Some((store, name)) => store.load(&self.stream, name).await.map_err(|e| {
                Error::InvalidArgument(format!(
                    "the offset store of stream reader {name:?} could not be read, so where to start is unknown: {e}"
                ))
            })?,
            None => None,
        };
        let start = match committed {
            Some(done) => StreamOffset::Offset(done.saturating_add(1)),
            None => self.start,
        };
        let spec = ConsumeSpec {
            queue: self.stream.clone(),
            prefetch,
            consumer_tag: format!("acemq-stream.{}.{}", self.stream, uuid::Uuid::new_v4()),
            exclusive: false,
            arguments: offset_argument(start),
        };
        let subscription = self.engine.transport.consume(spec.clone()).await?;
        let shared = Arc::new(Shared::default());
        let stats = Arc::new(options.stats());
        let stop = CancellationToken::new();
        let (done_tx, done) = watch::channel(false);
        let control = Arc::new(ConsumerControl::new(
            Arc::from(self.stream.as_str()),
            stop.clone(),
            stop.clone(),
            done.clone(),
            stats.clone(),
        ));
        control.subscribed(Some(subscription.probe()));
        self.engine.lifecycle.register(control.clone());
        let last = if self.skip_failures {
            Final::Skip
        } else {
            Final::Stop
        };
        // One count of the reader's entries in flight, shared with its settler's waits.
        let in_flight = Arc::new(AtomicUsize::new(0));
        let ctx = Arc::new(Ctx {
            settler: Settler::new(
                self.engine.clone(),
                Arc::from(self.stream.as_str()),
                stats.clone(),
                stop.clone(),
                in_flight.clone(),
            ),
            decoder: Arc::new(self.decoder),
            handler: Arc::new(handler),
            rule: StreamRule {
                in_place: options.in_place(last, false),
                stream: self.stream.clone(),
                floor: AtomicU64::new(match start {
                    StreamOffset::Offset(n) => n,
                    _ => 0,
                }),
                shared: shared.clone(),
            },
            idempotency: options.idempotency_store(),
            in_flight,
        });
        let run = Run {
            ctx,
            spec,
            control,
            stop: stop.clone(),
            offsets: self.offsets,
            committed,
        };
        tokio::spawn(async move {
            run.run(subscription).await;
            done_tx.send_replace(true);
        });
        Ok(StreamConsumer {
            stream: self.stream,
            shared,
            stats,
            stop,
            done,
        })
    }
}

fn offset_argument(offset: StreamOffset) -> Headers {
    Headers::from([(STREAM_OFFSET.into(), offset.argument())])
}

/// A running stream reader.
#[derive(Debug)]
pub struct StreamConsumer {
    stream: String,
    shared: Arc<Shared>,
    stats: Arc<Stats>,
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

    /// The consumer's outcome counts, as a plain consumer's ([`ConsumerStats`]).
    pub fn stats(&self) -> ConsumerStats {
        self.stats.snapshot()
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

    /// Waits until it has stopped (on a failure, [`StreamConsumer::close`] or the
    /// connection's close).
    pub async fn stopped(&self) {
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Stops reading (the entry being handled finishes first, and the last finished
    /// offset is committed) and waits for it.
    pub async fn close(&self) {
        self.stop.cancel();
        self.stopped().await;
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    handled: AtomicU64,
    skipped: AtomicU64,
    resubscribed: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    position: StreamPosition,
    last_handled: Option<u64>,
    failure: Option<String>,
    /// The offset of the entry going through the delivery path now.
    current: Option<u64>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// The stream reader's rule: entries below the reader's floor are acked unseen, the
/// in-place rule decides, and each finished entry moves the position on.
pub(crate) struct StreamRule {
    in_place: InPlace,
    stream: String,
    /// Entries below this offset are already handled (or before the asked start).
    floor: AtomicU64,
    shared: Arc<Shared>,
}

impl Rule for StreamRule {
    fn begin(&self, d: &Delivery, _envelope: &Envelope) -> Begin {
        let Some(offset) = offset_of(&d.properties.headers) else {
            return Begin::Stop(format!(
                "a delivery from {:?} carries no x-stream-offset header: is it a stream?",
                self.stream
            ));
        };
        if offset < self.floor.load(Ordering::SeqCst) {
            // A chunk starts before the asked offset, or the entry was handled before a
            // reconnect: not handed to the handler again.
            return Begin::AckUnseen;
        }
        let mut st = self.shared.lock();
        st.position.delivered(offset);
        st.current = Some(offset);
        Begin::Run
    }

    fn crash_loop(&self, facts: Facts) -> Option<Decision> {
        self.in_place.crash_loop(facts)
    }

    fn decide(&self, outcome: &Outcome, facts: Facts) -> Decision {
        self.in_place.decide(outcome, facts, &mut rand::rng())
    }

    fn decided(&self, decision: &Decision, _envelope: &Envelope) {
        let mut st = self.shared.lock();
        let Some(offset) = st.current.take() else {
            return;
        };
        match decision {
            Decision::Ack | Decision::Duplicate => {
                if *decision == Decision::Ack {
                    self.shared.handled.fetch_add(1, Ordering::Relaxed);
                }
                st.position.settled(offset);
                st.last_handled = Some(st.last_handled.map_or(offset, |l| l.max(offset)));
            }
            Decision::Skip { .. } => {
                self.shared.skipped.fetch_add(1, Ordering::Relaxed);
                st.position.settled(offset);
                st.last_handled = Some(st.last_handled.map_or(offset, |l| l.max(offset)));
            }
            Decision::Stop { reason } => {
                tracing::error!(stream = %self.stream, offset, %reason, "stream reader stopped at a failing entry");
                st.failure = Some(format!(
                    "the stream reader of {:?} stopped at offset {offset}: {reason}",
                    self.stream
                ));
            }
            _ => {}
        }
    }

    fn requeue_on_close(&self) -> bool {
        // Requeueing means nothing on a stream.
        false
    }
}

struct Run<T, H> {
    ctx: Arc<Ctx<T, H, StreamRule>>,
    spec: ConsumeSpec,
    control: Arc<ConsumerControl>,
    stop: CancellationToken,
    offsets: Option<(Arc<dyn OffsetStore>, String)>,
    /// The offset last committed to the store.
    committed: Option<u64>,
}

impl<T: Send + 'static, H: Handler<T>> Run<T, H> {
    async fn run(mut self, mut sub: Box<dyn Subscription>) {
        let mut since_commit = 0u64;
        // A delivery taken while looking whether one was waiting.
        let mut buffered = None;
        loop {
            let next = match buffered.take() {
                Some(next) if !self.stop.is_cancelled() => next,
                Some(_) => break,
                None => tokio::select! {
                    biased;
                    _ = self.stop.cancelled() => break,
                    next = sub.next() => next,
                },
            };
            match next {
                Some(Ok(d)) => {
                    let flow = handle(self.ctx.clone(), d, None, None).await;
                    since_commit += 1;
                    if let Flow::Stop(reason) = flow {
                        if let Some(reason) = reason {
                            let failure = self.ctx.rule.shared.lock().failure.clone();
                            self.control.ended(Some(failure.unwrap_or(reason)));
                        }
                        break;
                    }
                    buffered = sub.next().now_or_never();
                    if since_commit >= COMMIT_EVERY || buffered.is_none() {
                        // Nothing else waiting, or a batch done: commit.
                        self.commit().await;
                        since_commit = 0;
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
        self.commit().await;
        let _ = sub.close().await;
    }

    /// Commits the newest finished offset, when there is a store and it moved on. A failed
    /// commit is logged and made again with the next one (a restart meanwhile reads the
    /// uncommitted entries again).
    async fn commit(&mut self) {
        let Some((store, name)) = &self.offsets else {
            return;
        };
        let done = self.ctx.rule.shared.lock().position.newest_settled();
        let Some(done) = done.filter(|d| self.committed.is_none_or(|c| *d > c)) else {
            return;
        };
        match store.commit(&self.spec.queue, name, done).await {
            Ok(()) => self.committed = Some(done),
            Err(e) => {
                tracing::warn!(stream = %self.spec.queue, reader = %name, offset = done, error = %e, "could not commit the stream offset; it is committed with the next one")
            }
        }
    }

    /// Subscribes again from the position (after the broker ended the subscription).
    async fn again(&mut self) -> Option<Box<dyn Subscription>> {
        let from = {
            let mut st = self.ctx.rule.shared.lock();
            let from = st.position.resume_from();
            st.position.forget_unsettled();
            from
        };
        if let Some(from) = from {
            self.spec.arguments = offset_argument(StreamOffset::Offset(from));
            self.ctx.rule.floor.store(from, Ordering::SeqCst);
        }
        tracing::info!(stream = %self.spec.queue, resume_from = ?from, "stream subscription ended; reading again from the reader's position");
        let stream = self.spec.queue.clone();
        let sub = resubscribe(
            &self.ctx.settler.engine.transport,
            &self.spec,
            &self.stop,
            |reason| {
                tracing::debug!(%stream, %reason, "stream reader waiting to subscribe again");
            },
        )
        .await;
        if let Some(s) = &sub {
            self.ctx
                .rule
                .shared
                .resubscribed
                .fetch_add(1, Ordering::Relaxed);
            self.control.subscribed(Some(s.probe()));
        }
        sub
    }
}
