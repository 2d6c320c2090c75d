//! Lifecycle: pausing, draining and closing (seed 000, "Shutting down").
//!
//! This module owns the connection-wide consumer state: the pause gate (a delivery that
//! arrives while consuming is paused waits there unacked and is counted in `held`), the
//! count of handlers running (`in_flight`), draining (stop handing over, wait for running
//! handlers, answer `false` on timeout), and closing (cancel the consumers first, hand held
//! deliveries back at once, cut retry waits short, wait up to [`ABANDON_AFTER`] for running
//! handlers, then close anyway: an abandoned handler's late ack is dropped, never sent).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::connection::Connection;
use crate::error::Error;

/// How long [`Connection::close`] drains before closing (fits Kubernetes' default 30 s
/// grace period; the family's figure).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// How long closing waits for handlers still running before abandoning them.
pub const ABANDON_AFTER: Duration = Duration::from_secs(5);

/// One consumer as the lifecycle sees it.
#[derive(Debug)]
pub(crate) struct ConsumerControl {
    /// The consumed queue.
    pub(crate) queue: Arc<str>,
    /// Why the consumer stopped when nobody asked it to (health reports it).
    pub(crate) ended: Mutex<Option<String>>,
    /// Stops taking deliveries (the run loop cancels its subscription).
    pub(crate) stop: CancellationToken,
    /// Cuts waits short and cancels handler tokens; held deliveries go back.
    pub(crate) closing: CancellationToken,
    /// Set when the consumer's run loop has finished (its channel closed).
    pub(crate) done: watch::Receiver<bool>,
}

impl ConsumerControl {
    pub(crate) fn ended(&self, reason: Option<String>) {
        *self.ended.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    fn stopped(&self) -> Option<String> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Connection-wide consumer state.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    paused: watch::Sender<bool>,
    in_flight: AtomicUsize,
    held: AtomicUsize,
    idle: Notify,
    closed: AtomicBool,
    consumers: Mutex<Vec<Arc<ConsumerControl>>>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            paused: watch::Sender::new(false),
            in_flight: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            idle: Notify::new(),
            closed: AtomicBool::new(false),
            consumers: Mutex::new(Vec::new()),
        }
    }
}

/// What the pause gate decided for one delivery.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Hand it to the handler.
    Pass,
    /// The consumer is closing: hand it back with requeue.
    Closing,
}

impl Lifecycle {
    pub(crate) fn register(&self, control: Arc<ConsumerControl>) {
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        // Finished consumers are forgotten, unless they stopped on their own: health keeps
        // reporting those until the process deals with them.
        consumers.retain(|c| !*c.done.borrow() || c.stopped().is_some());
        consumers.push(control);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Waits at the pause gate while consuming is paused.
    pub(crate) async fn gate(&self, closing: &CancellationToken) -> Gate {
        if closing.is_cancelled() {
            return Gate::Closing;
        }
        if !*self.paused.borrow() {
            return Gate::Pass;
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        let mut paused = self.paused.subscribe();
        let gate = tokio::select! {
            biased;
            _ = closing.cancelled() => Gate::Closing,
            r = paused.wait_for(|p| !*p) => match r { Ok(_) => Gate::Pass, Err(_) => Gate::Closing },
        };
        self.held.fetch_sub(1, Ordering::SeqCst);
        gate
    }

    pub(crate) fn handler_started(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn handler_finished(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    pub(crate) fn consuming_paused(&self) -> bool {
        *self.paused.borrow()
    }

    fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    /// Waits until no handler runs; `false` when `timeout` passes first.
    async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }

    /// Consumers that stopped without being asked to: `(queue, reason)`.
    pub(crate) fn stopped_consumers(&self) -> Vec<(String, String)> {
        self.controls()
            .iter()
            .filter_map(|c| c.stopped().map(|r| (c.queue.to_string(), r)))
            .collect()
    }

    /// Consumers registered and running.
    pub(crate) fn running_consumers(&self) -> usize {
        self.controls().iter().filter(|c| !*c.done.borrow()).count()
    }

    fn controls(&self) -> Vec<Arc<ConsumerControl>> {
        self.consumers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Cancels every consumer, hands held deliveries back, cuts waits short, and waits up
    /// to `grace` for the consumers to finish. Returns whether they all did.
    async fn shut_consumers(&self, grace: Duration) -> bool {
        self.closed.store(true, Ordering::SeqCst);
        let controls = self.controls();
        for c in &controls {
            c.stop.cancel();
            c.closing.cancel();
        }
        let all_done = async {
            for c in &controls {
                let mut done = c.done.clone();
                let _ = done.wait_for(|d| *d).await;
            }
        };
        tokio::time::timeout(grace, all_done).await.is_ok()
    }
}

impl Connection {
    /// Stops handing deliveries to handlers. Nothing is lost: a delivery that arrives
    /// meanwhile waits at the gate unacked (see [`Connection::held`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-pause").await?;
    /// mq.pause_consuming();
    /// assert!(mq.is_consuming_paused());
    /// mq.resume_consuming();
    /// # Ok(()) }
    /// ```
    pub fn pause_consuming(&self) {
        self.shared.lifecycle.set_paused(true);
    }

    /// Hands deliveries to handlers again (held ones first).
    pub fn resume_consuming(&self) {
        self.shared.lifecycle.set_paused(false);
    }

    /// Whether consuming is paused.
    pub fn is_consuming_paused(&self) -> bool {
        self.shared.lifecycle.consuming_paused()
    }

    /// Handlers running right now, across every consumer of this connection.
    pub fn in_flight(&self) -> usize {
        self.shared.lifecycle.in_flight()
    }

    /// Deliveries fetched and waiting at the pause gate, never handled. They are unacked:
    /// the broker redelivers them if the process goes away.
    pub fn held(&self) -> usize {
        self.shared.lifecycle.held()
    }

    /// Pauses consuming and waits for running handlers. `true` when every handler
    /// finished, `false` when `timeout` passed first (never an error). Consuming stays
    /// paused. A `true` does not mean every delivery was handled: read [`Connection::held`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
    /// let mq = acemq::Connection::connect("memory://doc-drain").await?;
    /// assert!(mq.drain_consumers(std::time::Duration::from_secs(1)).await);
    /// # Ok(()) }
    /// ```
    pub async fn drain_consumers(&self, timeout: Duration) -> bool {
        self.pause_consuming();
        self.shared.lifecycle.wait_idle(timeout).await
    }

    /// Like [`Connection::drain_consumers`], abandoning the wait when `cancel` fires:
    /// that is [`Error::Cancelled`], distinct from the timeout's `Ok(false)`. Handlers are
    /// not interrupted and consuming stays paused.
    pub async fn drain_consumers_until(
        &self,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<bool, Error> {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Error::Cancelled),
            finished = self.drain_consumers(timeout) => Ok(finished),
        }
    }

    /// Drains for up to [`DEFAULT_DRAIN_TIMEOUT`], then closes ([`Connection::close_now`]).
    pub async fn close(&self) -> Result<(), Error> {
        self.drain_consumers(DEFAULT_DRAIN_TIMEOUT).await;
        self.close_now().await
    }

    /// Closes without draining: consumers are cancelled first, held deliveries handed back
    /// at once, handler tokens cancelled (a retry or in-progress wait ends and its message
    /// is requeued, attempt unchanged), running handlers get up to [`ABANDON_AFTER`], then
    /// the connection closes anyway. An abandoned handler's late ack is dropped.
    pub async fn close_now(&self) -> Result<(), Error> {
        let finished = self.shared.lifecycle.shut_consumers(ABANDON_AFTER).await;
        if !finished {
            tracing::warn!(
                in_flight = self.in_flight(),
                "closing with handlers still running; they are abandoned and their messages will be redelivered"
            );
        }
        self.shared.transport.close().await?;
        Ok(())
    }
}
