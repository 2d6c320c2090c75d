//! The [`OutboxRelay`]: a background task that claims pending outbox rows, publishes them
//! and records each outcome, telling the broker's refusal of a row (which spends one of its
//! attempts) from the broker being unavailable (which never does: the relay waits for the
//! connection instead).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use acemq::Connection;
use acemq::error::ErrorKind;
use acemq::observe::metrics::{OutboxOutcome, record_outbox};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::verdict::{Verdict, connection_trouble, verdict};
use super::{
    DEFAULT_BATCH_SIZE, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BACKOFF,
    DEFAULT_POLL_INTERVAL, DEFAULT_RETRY_DELAY, Outbox,
};
use crate::{Error, default_owner, now_millis};

/// How long ago a row was enqueued (`created_at_millis`, written by this library's clock):
/// `acemq.outbox.lag` of a row published now. Zero for a clock that went back.
fn lag_since(created_at_millis: i64) -> Duration {
    Duration::from_millis(u64::try_from(now_millis() - created_at_millis).unwrap_or(0))
}

#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    failed: AtomicU64,
    retired: AtomicU64,
    unavailable: AtomicU64,
    in_doubt: AtomicU64,
}

/// How a pass over one batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Every claimed row was handled (published, failed, or deferred while the broker was
    /// otherwise available).
    Done,
    /// The broker became unavailable (down, recovering, blocked): the rest of the batch
    /// was handed back untouched.
    Unavailable,
    /// The AceMQ connection was closed by its owner.
    Closed,
}

#[derive(Clone, Copy, Debug)]
struct Pass {
    /// Rows claimed.
    claimed: usize,
    /// Rows whose outcome was recorded: published, or failed against `max_attempts`.
    handled: usize,
    end: End,
}

#[derive(Clone, Debug)]
struct Worker {
    connection: Connection,
    outbox: Outbox,
    batch_size: u32,
    poll_interval: Duration,
    lease: Duration,
    max_attempts: u32,
    retry_delay: Duration,
    max_backoff: Duration,
    owner: String,
    counters: Arc<Counters>,
}

impl Worker {
    /// Whether the transport says publishes can go through now (connected, not blocked).
    fn available(&self) -> bool {
        let st = self.connection.status();
        st.connected && st.blocked.is_none()
    }

    async fn drain_batch(&self) -> Result<Pass, Error> {
        let token = format!("{}:{}", self.owner, uuid::Uuid::new_v4().simple());
        let rows = self
            .outbox
            .claim_batch(&token, self.batch_size, self.lease)
            .await?;
        let mut pass = Pass {
            claimed: rows.len(),
            handled: 0,
            end: End::Done,
        };
        let transport = acemq::observe::transport_name(self.connection.transport_kind());
        for row in rows {
            let (id, attempts, target, result) = match row {
                Ok(record) => {
                    let r = self.connection.publish_prepared(record.to_outbound()).await;
                    let r = r
                        .map(|_| lag_since(record.created_at_millis))
                        .map_err(|e| (e.kind(), connection_trouble(&e), e.to_string()));
                    let target = (record.exchange, record.routing_key);
                    (record.id, record.attempts, target, r)
                }
                // An unreadable row can never be published: it spends its attempts. Its
                // exchange and routing key are unknown: counted with empty ones.
                Err((id, e)) => (
                    id,
                    0,
                    (String::new(), String::new()),
                    Err((ErrorKind::Invalid, false, e.to_string())),
                ),
            };
            let (exchange, routing_key) = (target.0.as_str(), target.1.as_str());
            let marked = match result {
                Ok(lag) => {
                    let m = self.outbox.mark_published(&id).await;
                    if m.is_ok() {
                        self.counters.published.fetch_add(1, Ordering::Relaxed);
                        record_outbox(
                            transport,
                            exchange,
                            routing_key,
                            OutboxOutcome::Published,
                            lag,
                        );
                        pass.handled += 1;
                    }
                    m
                }
                Err((kind, trouble, reason)) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    record_outbox(
                        transport,
                        exchange,
                        routing_key,
                        OutboxOutcome::Failed,
                        Duration::ZERO,
                    );
                    match verdict(kind) {
                        Verdict::Attempt => {
                            pass.handled += 1;
                            self.spend_attempt(&id, attempts, &reason).await
                        }
                        Verdict::Unavailable => {
                            self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
                            if kind == ErrorKind::InDoubt {
                                self.counters.in_doubt.fetch_add(1, Ordering::Relaxed);
                            }
                            if !trouble && self.available() {
                                // The connection is up: this publish alone failed (a nack,
                                // a lost or late confirm). Try the row again after the retry
                                // delay; go on with the batch.
                                tracing::warn!(message_id = %id, kind = ?kind, error = %reason, "outbox publish failed while the broker was available; the row keeps its attempts and is tried again after the retry delay");
                                self.outbox
                                    .defer(&id, &reason, Some(self.retry_delay))
                                    .await
                            } else {
                                tracing::warn!(message_id = %id, kind = ?kind, error = %reason, "the broker is unavailable; the outbox row keeps its attempts, the rest of the batch is handed back and the relay waits for the connection");
                                pass.end = End::Unavailable;
                                self.outbox.defer(&id, &reason, None).await
                            }
                        }
                        Verdict::Closed => {
                            tracing::info!(message_id = %id, "the AceMQ connection was closed; the outbox relay hands its batch back and stops");
                            pass.end = End::Closed;
                            self.outbox.defer(&id, &reason, None).await
                        }
                    }
                }
            };
            if let Err(e) = marked {
                // The row stays leased until its lease ends, then is published again
                // (at least once).
                tracing::warn!(message_id = %id, error = %e, "could not record the outbox row's outcome; it will be retried after its lease");
            }
            if pass.end != End::Done {
                if let Err(e) = self.outbox.release(&token).await {
                    tracing::warn!(error = %e, "could not hand the rest of the outbox batch back; those rows are claimed again after their lease");
                }
                break;
            }
        }
        Ok(pass)
    }

    /// Records a failure that counts toward `max_attempts` (retiring the row at the last).
    async fn spend_attempt(&self, id: &str, attempts: u32, reason: &str) -> Result<(), Error> {
        tracing::warn!(message_id = %id, attempts = attempts + 1, error = %reason, "outbox publish refused");
        let m = self
            .outbox
            .mark_failed(id, reason, self.max_attempts, self.retry_delay)
            .await;
        if m.is_ok() && attempts + 1 >= self.max_attempts {
            tracing::warn!(message_id = %id, "outbox row retired after {} refused publishes; it is kept in the table", attempts + 1);
            self.counters.retired.fetch_add(1, Ordering::Relaxed);
        }
        m
    }

    /// The pause after the `n`th unavailable pass in a row: the poll interval doubling, at
    /// most `max_backoff`.
    fn backoff(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(20);
        self.poll_interval
            .max(Duration::from_millis(10))
            .saturating_mul(1 << doublings)
            .min(self.max_backoff)
    }

    /// Waits while the transport says the broker is unavailable and will come back by
    /// itself (recovering, or blocked). Returns `false` when asked to stop meanwhile.
    ///
    /// A connection that is down and not recovering (closed, or its recovery gave up) is
    /// not waited for: the next pass finds out which (the backoff paces it).
    async fn wait_available(&self, stop: &mut watch::Receiver<bool>) -> bool {
        let transport = self.connection.transport();
        let mut status = transport.watch_status();
        let mut waited = false;
        loop {
            if *stop.borrow() {
                return false;
            }
            let st = status.borrow_and_update().clone();
            let up = st.connected && st.blocked.is_none();
            if up || (!st.connected && !transport.recovering()) {
                if waited {
                    tracing::info!(
                        connected = st.connected,
                        "the broker is available again; the outbox relay resumes"
                    );
                }
                return true;
            }
            if !waited {
                tracing::info!(connected = st.connected, blocked = ?st.blocked, "the broker is unavailable; the outbox relay waits for the connection (rows keep their attempts)");
                waited = true;
            }
            tokio::select! {
                changed = status.changed() => {
                    if changed.is_err() {
                        // No more status updates: fall back to polling.
                        tokio::select! {
                            _ = tokio::time::sleep(self.max_backoff) => {}
                            _ = stop.changed() => {}
                        }
                        status = transport.watch_status();
                    }
                }
                _ = tokio::time::sleep(self.max_backoff) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Sleeps `d`, or less when asked to stop. Returns `false` when asked to stop.
    async fn pause(&self, d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = stop.changed() => {}
        }
        !*stop.borrow()
    }

    async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut unavailable_passes = 0u32;
        loop {
            if *stop.borrow() || !self.wait_available(&mut stop).await {
                break;
            }
            let pass = match self.drain_batch().await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay could not claim a batch; trying again after the poll interval");
                    Pass {
                        claimed: 0,
                        handled: 0,
                        end: End::Done,
                    }
                }
            };
            if *stop.borrow() {
                break;
            }
            match pass.end {
                End::Closed => break,
                End::Unavailable => {
                    unavailable_passes = unavailable_passes.saturating_add(1);
                    if !self
                        .pause(self.backoff(unavailable_passes), &mut stop)
                        .await
                    {
                        break;
                    }
                }
                End::Done => {
                    unavailable_passes = 0;
                    if pass.claimed > 0 && pass.claimed >= self.batch_size as usize {
                        continue;
                    }
                    if !self.pause(self.poll_interval, &mut stop).await {
                        break;
                    }
                }
            }
        }
    }
}

#[derive(Debug)]
struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Publishes what the outbox holds: claims pending rows under a lease, publishes each with
/// [`Connection::publish_prepared`] (mandatory, confirmed, the stored bytes and message id
/// verbatim), and marks it published, or records the failure.
///
/// # What counts toward `max_attempts`
///
/// Only a failure that is the row's own: the broker **refused** it
/// ([`ErrorKind::Refused`]: unroutable, exchange not found, precondition failed, access
/// refused) or the row **cannot be published** ([`ErrorKind::Invalid`], e.g. a stored row
/// that cannot be read back). Such a failure increments `attempts`, sets `last_error`, and
/// the row is tried again after the retry delay; at `max_attempts` it is retired.
///
/// Broker unavailability never counts: the connection down or recovering, blocked by a
/// resource alarm, a channel closed, a nack ([`ErrorKind::Transient`]; RabbitMQ nacks what
/// it could not take responsibility for, and a later publish can succeed), or a publish
/// whose confirm was lost or timed out ([`ErrorKind::InDoubt`]). The row keeps its
/// `attempts`, gets `last_error`, and stays pending:
///
/// * if only this publish failed (a nack, a lost or late confirm) and the connection is
///   still up and unblocked, the row is tried again after the retry delay and the batch
///   goes on;
/// * if the connection is the trouble (the publish was refused as not connected, blocked
///   or closed under it, or the transport reports it down or blocked), the rest of the
///   batch is handed back untouched (claimable at once, order kept) and the relay pauses (the poll interval, doubling on each such pass, at most
///   [`max_backoff`](Self::max_backoff)), then waits for as long as the transport reports
///   the connection recovering or blocked ([`Connection::status`]) and resumes as soon as
///   it is back. Connection recovery itself is the transport's
///   ([`acemq::transport::recovery`]); the relay needs no restart.
///
/// An in-doubt row is published again with the same message id, so the broker may get it
/// twice; [`in_doubt`](Self::in_doubt) counts these publishes and bounds the duplicates a
/// relay causes this way (consumers deduplicate by message id, see
/// [`acemq::idempotency`]).
///
/// When the AceMQ connection was closed by its owner ([`ErrorKind::Closed`]), the relay
/// hands its batch back and stops ([`is_running`](Self::is_running) turns false).
///
/// Metrics (the `acemq::observe::metrics` table), labelled `exchange`, `routing.key` and
/// `transport` of the row: a row published and marked counts once in
/// `acemq.outbox.total{outcome="published"}` and records `acemq.outbox.lag`, the seconds
/// from its enqueue to its confirm; every failed publish counts once in
/// `acemq.outbox.total{outcome="failed"}` (as [`failed`](Self::failed) does), whether or
/// not it spent an attempt.
///
/// Defaults: batch [`DEFAULT_BATCH_SIZE`], poll [`DEFAULT_POLL_INTERVAL`], lease
/// [`DEFAULT_LEASE`] (keep it well above the time a batch takes to publish), max attempts
/// [`DEFAULT_MAX_ATTEMPTS`], retry delay [`DEFAULT_RETRY_DELAY`], max backoff
/// [`DEFAULT_MAX_BACKOFF`].
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use acemq_sql::outbox::{Outbox, OutboxRelay};
/// use std::time::Duration;
/// let pool = sqlx::SqlitePool::connect("sqlite://app.db").await?;
/// let mq = acemq::Connection::connect("amqp://127.0.0.1").await?;
/// let relay = OutboxRelay::new(mq, Outbox::new(pool))
///     .batch_size(500)
///     .poll_interval(Duration::from_millis(200))
///     .max_attempts(5);
/// relay.start()?;
/// // ...
/// relay.stop().await; // finishes the batch in hand
/// println!("published {}, failed {}", relay.published(), relay.failed());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct OutboxRelay {
    worker: Arc<Worker>,
    running: std::sync::Mutex<Option<Running>>,
}

impl OutboxRelay {
    /// A relay publishing `outbox`'s rows on `connection`.
    pub fn new(connection: Connection, outbox: Outbox) -> Self {
        OutboxRelay {
            worker: Arc::new(Worker {
                connection,
                outbox,
                batch_size: DEFAULT_BATCH_SIZE,
                poll_interval: DEFAULT_POLL_INTERVAL,
                lease: DEFAULT_LEASE,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                retry_delay: DEFAULT_RETRY_DELAY,
                max_backoff: DEFAULT_MAX_BACKOFF,
                owner: default_owner(),
                counters: Arc::default(),
            }),
            running: std::sync::Mutex::new(None),
        }
    }

    fn set(mut self, f: impl FnOnce(&mut Worker)) -> Self {
        f(Arc::make_mut(&mut self.worker));
        self
    }

    /// Rows claimed per batch (at least 1).
    pub fn batch_size(self, n: u32) -> Self {
        self.set(|w| w.batch_size = n.max(1))
    }

    /// The pause between polls when there was less than a full batch.
    pub fn poll_interval(self, d: Duration) -> Self {
        self.set(|w| w.poll_interval = d)
    }

    /// How long claimed rows are reserved for this relay; after it, another relay may
    /// claim (and publish) them again. Keep it well above the time a batch takes.
    pub fn lease(self, d: Duration) -> Self {
        self.set(|w| w.lease = d.max(Duration::from_millis(1)))
    }

    /// Refused publishes after which a row is retired (at least 1). Only the broker's
    /// refusal of the row (or a row that cannot be published) counts; see the type's docs.
    pub fn max_attempts(self, n: u32) -> Self {
        self.set(|w| w.max_attempts = n.max(1))
    }

    /// The wait before a failed row is tried again (a refused one, or one that failed
    /// while the connection was up: a nack, a lost confirm).
    pub fn retry_delay(self, d: Duration) -> Self {
        self.set(|w| w.retry_delay = d)
    }

    /// The longest pause after a pass the broker was unavailable for (the poll interval
    /// doubles up to it); also how often a relay waiting for a recovering connection looks
    /// at its status again. At least 10 ms.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(mq: acemq::Connection, pool: sqlx::SqlitePool) {
    /// use acemq_sql::outbox::{Outbox, OutboxRelay};
    /// let relay = OutboxRelay::new(mq, Outbox::new(pool))
    ///     .max_backoff(std::time::Duration::from_secs(5));
    /// # drop(relay); }
    /// ```
    pub fn max_backoff(self, d: Duration) -> Self {
        self.set(|w| w.max_backoff = d.max(Duration::from_millis(10)))
    }

    /// Starts polling in a Tokio task. Must be called within a Tokio runtime.
    pub fn start(&self) -> Result<(), Error> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidArgument(
                "OutboxRelay::start must be called within a Tokio runtime".into(),
            )
        })?;
        let mut running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if running.as_ref().is_some_and(|r| !r.task.is_finished()) {
            return Err(Error::AlreadyRunning);
        }
        let (stop, rx) = watch::channel(false);
        let task = handle.spawn(self.worker.clone().run(rx));
        *running = Some(Running { stop, task });
        Ok(())
    }

    /// Stops polling: the batch in hand is finished (published and marked) first.
    pub async fn stop(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(r) = running {
            let _ = r.stop.send(true);
            let _ = r.task.await;
        }
    }

    /// Whether the polling task is running.
    pub fn is_running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(|r| !r.task.is_finished())
    }

    /// Claims and publishes one batch now; returns how many rows it handled (published, or
    /// failed against `max_attempts`). Rows the broker was unavailable for are not counted
    /// (they stay pending with their attempts), and a pass that found the broker
    /// unavailable hands the rest of its batch back, so `while drain_once().await? > 0 {}`
    /// ends during an outage. Does not wait for the connection. Usable without
    /// [`start`](Self::start).
    pub async fn drain_once(&self) -> Result<usize, Error> {
        Ok(self.worker.drain_batch().await?.handled)
    }

    /// Rows published and marked so far.
    pub fn published(&self) -> u64 {
        self.worker.counters.published.load(Ordering::Relaxed)
    }

    /// Failed publishes so far, whatever the reason (refused, or the broker unavailable).
    pub fn failed(&self) -> u64 {
        self.worker.counters.failed.load(Ordering::Relaxed)
    }

    /// Failed publishes that did not count toward `max_attempts` so far: the broker was
    /// unavailable (down, recovering, blocked, a nack) or the outcome was in doubt.
    pub fn unavailable(&self) -> u64 {
        self.worker.counters.unavailable.load(Ordering::Relaxed)
    }

    /// Publishes whose outcome was in doubt so far (a lost or timed-out confirm): each row
    /// is published again, so each may reach the broker twice. An upper bound on the
    /// duplicates this relay caused that way.
    pub fn in_doubt(&self) -> u64 {
        self.worker.counters.in_doubt.load(Ordering::Relaxed)
    }

    /// Rows retired so far.
    pub fn retired(&self) -> u64 {
        self.worker.counters.retired.load(Ordering::Relaxed)
    }
}

impl Drop for OutboxRelay {
    /// Asks the polling task to stop after its current batch (without waiting).
    fn drop(&mut self) {
        if let Ok(mut r) = self.running.lock()
            && let Some(r) = r.take()
        {
            let _ = r.stop.send(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_backoff_doubles_from_the_poll_interval_up_to_the_cap() {
        let conn = Connection::connect("memory://outbox-relay-backoff")
            .await
            .unwrap();
        #[cfg(feature = "sqlite")]
        {
            let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap();
            let relay = OutboxRelay::new(conn, Outbox::new(pool))
                .poll_interval(Duration::from_millis(100))
                .max_backoff(Duration::from_millis(500));
            let w = &relay.worker;
            assert_eq!(w.backoff(1), Duration::from_millis(100));
            assert_eq!(w.backoff(2), Duration::from_millis(200));
            assert_eq!(w.backoff(3), Duration::from_millis(400));
            assert_eq!(w.backoff(4), Duration::from_millis(500));
            assert_eq!(w.backoff(u32::MAX), Duration::from_millis(500));
        }
        #[cfg(not(feature = "sqlite"))]
        drop(conn);
    }
}
