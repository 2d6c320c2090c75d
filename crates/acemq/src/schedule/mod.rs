//! Delayed and scheduled messages on the family's broker ladder ([`Scheduler`]).
//!
//! This module owns the scheduler: the family's wire (`wire`: the exchange
//! `acemq.schedule`, five TTL rungs from 1 h to 1 s, the control queue
//! `acemq.schedule.due`, the `x-schedule-*` headers), scheduling (`after`, `at`), the
//! control-queue consumer that hops a message down the rungs and delivers it when due
//! (`control`, a consumer kind on the one delivery path), cancellation (`cancel`), and
//! what it reports (`watch`: counters, metrics, the backlog, the `scheduler` health
//! component). `docs/scheduling.md` explains the ladder, the accuracy, the failure rule,
//! cancellation, and what changes when other members share the broker.
//!
//! What it does better than the family, on the same wire:
//!
//! - **on time**: a message is never delivered before its due time (the last sub-second
//!   is waited in the consumer), and arrives within a few hundred milliseconds after it;
//! - **identity kept**: the delivered message has the id, type, correlation, causation and
//!   trace context it was scheduled with, so an idempotent consumer drops a duplicate
//!   delivery and traces join (a message another member scheduled gets the family's fresh
//!   `ScheduledMessage` envelope);
//! - **one failure rule** (see `control`), **metrics and health**, and **cancellation**.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
//! use std::time::Duration;
//! use acemq::topology::Topology;
//! let mq = acemq::Connection::connect("memory://doc-scheduler").await?;
//! mq.declare(&Topology::define().queue("reminders").build()?).await?;
//! let scheduler = mq.scheduler().await?;
//! let id = scheduler.after(Duration::ZERO, "", "reminders", &"call Ada").await?;
//! assert!(!id.is_empty());
//! scheduler.close().await;
//! # Ok(()) }
//! ```

mod cancel;
mod clock;
mod control;
mod watch;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use cancel::{
    CANCELLED_KEPT_AFTER_DUE_MS, CANCELLED_KEPT_UNSEEN_MS, CancelError, CancelStore,
    MemoryCancelStore,
};
pub use control::DEFAULT_UNDELIVERABLE_TRIES;
pub use watch::{
    DEFAULT_BACKLOG_CHECK, HEALTH_COMPONENT, SCHEDULE_BACKLOG, SCHEDULE_CANCELLED_TOTAL,
    SCHEDULE_DELIVERED_TOTAL, SCHEDULE_HOPS_TOTAL, SCHEDULE_LATENESS, SCHEDULE_SCHEDULED_TOTAL,
    SchedulerStats,
};
pub use wire::{
    CARRIED_ENVELOPE_PREFIX, CARRIED_TRACEPARENT, CARRIED_TRACESTATE, CONTENT_TYPE, CONTROL_QUEUE,
    DEAD_LETTER_QUEUE, DEFAULT_CONTENT_TYPE, DUE_AT, EXCHANGE, HOP_CONTENT_TYPE, HOP_TYPE,
    RUNGS_MS, Route, TARGET_EXCHANGE, TARGET_ROUTING_KEY, route, rung_arguments, rung_name,
    topology,
};

use crate::codec::{Encoder, Json, RawBytes};
use crate::consume::{Consumer, ConsumerOptions};
use crate::engine::Engine;
use crate::error::Error;
use crate::observe::metrics::PublishOutcome;
use crate::publish::{Publisher, SendOptions};
use crate::topology::{Topology, dead_letter_queue_decl};
use clock::Clock;
use watch::Counters;

/// The control consumer's prefetch (Java's).
pub const DEFAULT_PREFETCH: u16 = 50;

/// When a scheduled message is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum When {
    /// After this long from now (zero: now).
    After(Duration),
    /// At this instant (the past: now).
    At(OffsetDateTime),
}

impl From<Duration> for When {
    fn from(d: Duration) -> When {
        When::After(d)
    }
}

impl From<OffsetDateTime> for When {
    fn from(t: OffsetDateTime) -> When {
        When::At(t)
    }
}

/// How a [`Scheduler`] runs.
///
/// ```
/// use std::sync::Arc;
/// use acemq::schedule::{MemoryCancelStore, SchedulerOptions};
/// let o = SchedulerOptions::default()
///     .prefetch(100)
///     .cancellations(Arc::new(MemoryCancelStore::default()));
/// assert!(o.delivers());
/// assert!(!SchedulerOptions::declare_only().delivers());
/// ```
#[derive(Clone)]
pub struct SchedulerOptions {
    deliver: bool,
    prefetch: u16,
    undeliverable_tries: u32,
    backlog_check: Option<Duration>,
    cancellations: Option<Arc<dyn CancelStore>>,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            deliver: true,
            prefetch: DEFAULT_PREFETCH,
            undeliverable_tries: DEFAULT_UNDELIVERABLE_TRIES,
            backlog_check: Some(DEFAULT_BACKLOG_CHECK),
            cancellations: None,
        }
    }
}

impl std::fmt::Debug for SchedulerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerOptions")
            .field("deliver", &self.deliver)
            .field("prefetch", &self.prefetch)
            .field("undeliverable_tries", &self.undeliverable_tries)
            .field("backlog_check", &self.backlog_check)
            .field("cancellations", &self.cancellations.is_some())
            .finish()
    }
}

impl SchedulerOptions {
    /// Declares the ladder and schedules, but consumes nothing: another process (of any
    /// member) delivers. The backlog check still runs, so health says when none does.
    pub fn declare_only() -> Self {
        SchedulerOptions {
            deliver: false,
            ..Self::default()
        }
    }
    /// Whether this scheduler consumes the control queue and delivers.
    pub fn delivers(&self) -> bool {
        self.deliver
    }
    /// The control consumer's prefetch (default 50); as many messages are handled at once.
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }
    /// Tries of a delivery that routes nowhere before it goes to `acemq.schedule.due.dlq`
    /// (default [`DEFAULT_UNDELIVERABLE_TRIES`]).
    pub fn undeliverable_tries(mut self, tries: u32) -> Self {
        self.undeliverable_tries = tries;
        self
    }
    /// How often the control queue's backlog is looked at (default
    /// [`DEFAULT_BACKLOG_CHECK`]); `None`: never (no backlog gauge, health always Up).
    pub fn backlog_check(mut self, every: Option<Duration>) -> Self {
        self.backlog_check = every;
        self
    }
    /// The store [`Scheduler::cancel`] writes to and the deliveries check (e.g.
    /// `acemq_sql::SqlCancelStore`).
    pub fn cancellations(mut self, store: Arc<dyn CancelStore>) -> Self {
        self.cancellations = Some(store);
        self
    }
}

/// What the scheduler's tasks share.
pub(crate) struct Inner {
    engine: Arc<Engine>,
    clock: Clock,
    origin: String,
    counters: Counters,
    cancellations: Option<Arc<dyn CancelStore>>,
}

/// Delivers messages later: after a delay or at an instant, on the family's broker ladder
/// (`docs/scheduling.md`). Made by [`crate::Connection::scheduler`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// use std::time::Duration;
/// use acemq::topology::Topology;
/// let mq = acemq::Connection::connect("memory://doc-scheduler-after").await?;
/// mq.declare(&Topology::define().queue("invoices").build()?).await?;
/// let s = mq.scheduler().await?;
/// s.after(Duration::from_secs(90), "", "invoices", &serde_json::json!({"n": 7})).await?;
/// assert_eq!(s.stats().scheduled, 1);
/// assert_eq!(s.stats().hops, 1); // waiting on acemq.schedule.1m
/// # Ok(()) }
/// ```
pub struct Scheduler {
    inner: Arc<Inner>,
    consumer: Option<Consumer>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("delivers", &self.consumer.is_some())
            .field("stats", &self.stats())
            .finish()
    }
}

/// Declares the ladder (and `acemq.schedule.due.dlq` when delivering), starts the control
/// consumer and the backlog check (what [`crate::Connection::scheduler_with`] does).
pub(crate) async fn start(
    engine: &Arc<Engine>,
    options: SchedulerOptions,
) -> Result<Scheduler, Error> {
    if engine.lifecycle.is_closed() {
        return Err(Error::Closed);
    }
    if options.prefetch == 0 {
        return Err(Error::InvalidArgument(
            "a scheduler's prefetch must be at least 1".into(),
        ));
    }
    if options.undeliverable_tries == 0 {
        return Err(Error::InvalidArgument(
            "undeliverable_tries must be at least 1".into(),
        ));
    }
    engine.declare(&topology()).await?;
    let transport = crate::observe::transport_name(engine.transport.kind());
    let inner = Arc::new(Inner {
        engine: engine.clone(),
        clock: Clock::new(),
        origin: engine.origin.clone(),
        counters: Counters::new(transport),
        cancellations: options.cancellations.clone(),
    });
    let consumer = if options.deliver {
        let consumer_options = ConsumerOptions::default()
            .prefetch(options.prefetch)
            .concurrency(usize::from(options.prefetch));
        let own = Topology::define()
            .queue_decl(dead_letter_queue_decl(CONTROL_QUEUE))
            .build()?;
        let handler_inner = inner.clone();
        let consumer = crate::consume::start_kind(
            engine,
            CONTROL_QUEUE,
            RawBytes,
            consumer_options,
            control::ControlRule {
                tries: options.undeliverable_tries,
            },
            &own,
            move |m: crate::consume::Message<Bytes>| control::on_due(handler_inner.clone(), m),
        )
        .await?;
        Some(consumer)
    } else {
        None
    };
    let stop = CancellationToken::new();
    watch::start(&inner, &options, stop.clone());
    Ok(Scheduler {
        inner,
        consumer,
        stop,
    })
}

impl Scheduler {
    /// Schedules `payload` (JSON) to be published to `exchange` with `routing_key` after
    /// `delay` (zero: now). Returns the message's id, which the delivered message carries.
    pub async fn after<T>(
        &self,
        delay: Duration,
        exchange: &str,
        routing_key: &str,
        payload: &T,
    ) -> Result<String, Error>
    where
        T: serde::Serialize + ?Sized + 'static,
    {
        self.schedule_with(
            When::After(delay),
            exchange,
            routing_key,
            Json,
            payload,
            SendOptions::new(),
        )
        .await
    }

    /// Schedules `payload` (JSON) for `when` (the past: now). Returns the message's id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use acemq::topology::Topology;
    /// let mq = acemq::Connection::connect("memory://doc-scheduler-at").await?;
    /// mq.declare(&Topology::define().queue("renewals").build()?).await?;
    /// let s = mq.scheduler().await?;
    /// let monday = time::macros::datetime!(2030-01-07 09:00 UTC);
    /// s.at(monday, "", "renewals", &"policy-7").await?;
    /// assert_eq!(s.stats().hops, 1); // on acemq.schedule.1h, for many hours
    /// # Ok(()) }
    /// ```
    pub async fn at<T>(
        &self,
        when: OffsetDateTime,
        exchange: &str,
        routing_key: &str,
        payload: &T,
    ) -> Result<String, Error>
    where
        T: serde::Serialize + ?Sized + 'static,
    {
        self.schedule_with(
            When::At(when),
            exchange,
            routing_key,
            Json,
            payload,
            SendOptions::new(),
        )
        .await
    }

    /// Schedules with another codec and envelope options (its own id, type, correlation,
    /// headers). The payload is encoded once, now, and travels as those bytes; the
    /// connection's publish interceptors see it as they see any publish.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// use std::time::Duration;
    /// use acemq::codec::Text;
    /// use acemq::publish::SendOptions;
    /// use acemq::schedule::When;
    /// use acemq::topology::Topology;
    /// let mq = acemq::Connection::connect("memory://doc-scheduler-with").await?;
    /// mq.declare(&Topology::define().queue("texts").build()?).await?;
    /// let s = mq.scheduler().await?;
    /// let id = s
    ///     .schedule_with(When::After(Duration::from_secs(5)), "", "texts", Text, "hi",
    ///                    SendOptions::new().message_id("reminder-1"))
    ///     .await?;
    /// assert_eq!(id, "reminder-1");
    /// # Ok(()) }
    /// ```
    pub async fn schedule_with<T, E>(
        &self,
        when: When,
        exchange: &str,
        routing_key: &str,
        encoder: E,
        payload: &T,
        options: SendOptions,
    ) -> Result<String, Error>
    where
        T: ?Sized + 'static,
        E: Encoder<T>,
    {
        let engine = &self.inner.engine;
        if engine.lifecycle.is_closed() {
            return Err(Error::Closed);
        }
        if engine.publishing_paused() {
            return Err(Error::PublishingPaused);
        }
        if exchange.is_empty() && routing_key.is_empty() {
            return Err(Error::InvalidArgument(
                "a message scheduled to the default exchange needs a routing key (the queue's name)"
                    .into(),
            ));
        }
        let now = self.inner.clock.now_ms();
        let due_at = match when {
            When::After(delay) => self.inner.clock.after_ms(delay),
            When::At(t) => i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX),
        };
        let publisher = Publisher::new(
            engine.clone(),
            exchange.to_owned(),
            routing_key.to_owned(),
            encoder,
        );
        let (original, span) = publisher.build_message(payload, options)?;
        let id = original.properties.message_id.clone().unwrap_or_default();
        let first = match route(due_at.saturating_sub(now)) {
            Route::Deliver => original,
            Route::Soon(_) => wire::scheduled(original, due_at, CONTROL_QUEUE, &self.inner.origin),
            Route::Rung(rung) => wire::scheduled(original, due_at, &rung, &self.inner.origin),
        };
        let delivered_now = first.exchange != EXCHANGE;
        let hop = first.routing_key != CONTROL_QUEUE && !delivered_now;
        let published = engine.publish_landed(first).instrument(span.clone()).await;
        let outcome = match &published {
            Ok(()) => PublishOutcome::Confirmed,
            Err(Error::Unroutable { .. }) => PublishOutcome::Unroutable,
            Err(_) => PublishOutcome::Failed,
        };
        crate::observe::trace::record_publish_outcome(&span, outcome);
        published?;
        self.inner.counters.scheduled();
        if delivered_now {
            self.inner.counters.delivered(Duration::ZERO);
        } else if hop {
            self.inner.counters.hopped();
        }
        Ok(id)
    }

    /// Cancels the scheduled message `id` (what [`after`](Self::after) returned): it is
    /// not delivered when it falls due. Needs a store
    /// ([`SchedulerOptions::cancellations`]) shared by the schedulers that deliver;
    /// effective only where a Rust scheduler with that store delivers.
    pub async fn cancel(&self, id: &str) -> Result<(), Error> {
        let Some(store) = &self.inner.cancellations else {
            return Err(Error::Config(
                "this scheduler has no cancellation store: start it with SchedulerOptions::cancellations (e.g. acemq_sql::SqlCancelStore)".into(),
            ));
        };
        store
            .cancel(id, self.inner.clock.now_ms())
            .await
            .map_err(Error::from)
    }

    /// What this scheduler did so far.
    pub fn stats(&self) -> SchedulerStats {
        self.inner.counters.snapshot()
    }

    /// The control-queue consumer, when this scheduler delivers.
    pub fn consumer(&self) -> Option<&Consumer> {
        self.consumer.as_ref()
    }

    /// Stops delivering (running hops and deliveries finish; held control messages go
    /// back to the queue) and the backlog check. Scheduled messages stay on the broker.
    pub async fn close(&self) {
        self.stop.cancel();
        if let Some(c) = &self.consumer {
            c.close().await;
        }
        self.inner.engine.unregister_health(HEALTH_COMPONENT);
    }
}
