//! Faults a test can inject into `memory://` (feature `testing`), and the recovery that
//! follows them.
//!
//! [`MemoryTransport::drop_connection`] loses the connection as a network failure would:
//! unsettled deliveries go back to their queues (marked redelivered), subscriptions end,
//! settlements of what was delivered fail with `AckNotSent`, and the transport reports
//! [`RecoveryEvent::Lost`]. It then redials under its [`RecoveryPolicy`] in `tokio` time
//! (so a paused-clock test runs minutes of outage in milliseconds), declares again what it
//! declared, and reports [`RecoveryEvent::Recovered`]. [`MemoryBroker::set_down`] makes
//! redials fail meanwhile, as a broker that is restarting would.
//!
//! ```
//! # #[cfg(feature = "testing")]
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use acemq::transport::{Transport, memory::MemoryTransport};
//! use acemq::transport::recovery::RecoveryEvent;
//! let t = MemoryTransport::connect("doc-drop");
//! let mut events = t.recovery_events();
//! t.drop_connection("drill");
//! assert!(!t.status().connected);
//! loop {
//!     if let Ok(RecoveryEvent::Recovered { .. }) = events.recv().await { break; }
//! }
//! assert!(t.status().connected);
//! # }
//! ```

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::time::Instant;

use super::Inner;
use super::connection::MemoryConnection;
#[cfg(feature = "testing")]
use super::{MemoryBroker, MemoryTransport};
use crate::transport::recovery::{Declared, RecoveryEvent, Side};

#[cfg(feature = "testing")]
impl MemoryTransport {
    /// Loses the connection (a fault for tests): see the module docs. Recovery starts at
    /// once unless the policy disables it.
    pub fn drop_connection(&self, reason: &str) {
        drop_connection(&self.inner, reason);
    }

    /// Loses the connection `delay` after the next subscription's `consume-ok` (a fault
    /// for tests: the moment a recovered consumer has just subscribed again, before or
    /// during its first deliveries). One shot; `drop_connection` semantics.
    ///
    /// ```
    /// # #[cfg(feature = "testing")]
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use acemq::topology::QueueDecl;
    /// use acemq::transport::{ConsumeSpec, Transport, memory::MemoryTransport};
    /// let t = MemoryTransport::connect("doc-after-consume");
    /// t.declare_queue(&QueueDecl::classic("q")).await.unwrap();
    /// t.lose_connection_after_next_consume(Duration::from_millis(40));
    /// let _sub = t.consume(ConsumeSpec::new("q", 10)).await.unwrap();
    /// assert!(t.status().connected);
    /// tokio::time::sleep(Duration::from_millis(41)).await;
    /// assert!(!t.status().connected);
    /// # }
    /// ```
    pub fn lose_connection_after_next_consume(&self, delay: std::time::Duration) {
        *self
            .inner
            .after_consume
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(delay);
    }
}

/// Arms the one-shot fault of [`MemoryTransport::lose_connection_after_next_consume`], if
/// set: called after each successful `consume`.
pub(super) fn after_consume(inner: &Arc<Inner>) {
    let delay = inner
        .after_consume
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(delay) = delay {
        let weak = Arc::downgrade(inner);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(inner) = weak.upgrade() {
                drop_connection(&inner, "injected: lost after a consume-ok");
            }
        });
    }
}

/// See [`MemoryTransport::drop_connection`].
fn drop_connection(inner: &Arc<Inner>, reason: &str) {
    {
        if inner.closed.load(Ordering::Acquire) || inner.recovering.swap(true, Ordering::AcqRel) {
            return;
        }
        inner.conn().close();
        inner.events.emit(RecoveryEvent::Lost {
            side: Side::Consume,
            reason: reason.to_owned(),
        });
        let policy = inner
            .policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if !policy.enabled() {
            inner.recovering.store(false, Ordering::Release);
            inner.events.emit(RecoveryEvent::GaveUp {
                side: Side::Consume,
                reason: "recovery is disabled".into(),
            });
            return;
        }
        tokio::spawn(recover(Arc::downgrade(inner)));
    }
}

#[cfg(feature = "testing")]
impl MemoryBroker {
    /// While `down`, connections to this broker cannot be (re)opened: a recovering
    /// transport keeps retrying. Existing connections are not touched (drop them with
    /// [`MemoryTransport::drop_connection`]).
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// let b = MemoryBroker::named("doc-down");
    /// b.set_down(true);
    /// assert!(b.is_down());
    /// b.set_down(false);
    /// ```
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Whether [`MemoryBroker::set_down`] is in force.
    pub fn is_down(&self) -> bool {
        self.lock().down
    }

    /// Cancels every consumer of `queue` from the broker's side (as RabbitMQ does when a
    /// queue's node goes down): their subscriptions end with `cancelled_by_us()` false.
    /// Returns how many were cancelled.
    ///
    /// ```
    /// use acemq::transport::memory::MemoryBroker;
    /// assert_eq!(MemoryBroker::named("doc-cancel").cancel_consumers("nothing"), 0);
    /// ```
    pub fn cancel_consumers(&self, queue: &str) -> usize {
        let mut st = self.lock();
        let channels: Vec<u64> = st
            .channels
            .iter()
            .filter(|(_, c)| c.consumer.as_ref().is_some_and(|c| &*c.queue == queue))
            .map(|(id, _)| *id)
            .collect();
        for id in &channels {
            st.cancel_consumer(*id);
        }
        channels.len()
    }

    /// Detaches every consumer of `queue` **without telling it** (its subscription stays
    /// open and silent), as RabbitMQ 3.10 was seen to do when a quorum queue is deleted
    /// while it is being published to. Returns how many were detached.
    pub fn forget_consumers(&self, queue: &str) -> usize {
        let mut st = self.lock();
        match st.queues.get_mut(queue) {
            Some(q) => {
                let n = q.consumers.len();
                for c in std::mem::take(&mut q.consumers) {
                    q.remove_consumer(c);
                }
                n
            }
            None => 0,
        }
    }

    /// The next `n` acks are answered as sent but never arrive: each message comes back,
    /// redelivered (a duplicate delivery, as after a connection lost right after an ack).
    pub fn lose_next_acks(&self, n: u32) {
        self.lock().faults.lose_acks = n;
    }

    /// The next `n` publishes are routed, but their confirm is lost: the publisher is
    /// answered [`TransportError::ConfirmLost`](crate::transport::TransportError) (in
    /// doubt) although the message is in its queue.
    pub fn lose_next_confirms(&self, n: u32) {
        self.lock().faults.lose_confirms = n;
    }

    /// Confirms arrive `delay` after the publish (`None`: at once); the message is in its
    /// queue at once. A confirm still outstanding when the broker [blocks](MemoryBroker::block)
    /// is answered in doubt (`ConfirmTimeout`) at once, as the AMQP transport answers
    /// RabbitMQ's withheld confirms; its real answer still comes after `delay`, through
    /// [`TrackedConfirm::late`](crate::transport::TrackedConfirm).
    pub fn delay_confirms(&self, delay: Option<std::time::Duration>) {
        self.lock().faults.confirm_delay = delay;
    }
}

/// Redials until the broker takes the connection (or the policy gives up, or the transport
/// is closed or dropped).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
async fn recover(inner: Weak<Inner>) {
    let started = Instant::now();
    let mut attempt = 0u32;
    let mut last_error = String::new();
    loop {
        attempt += 1;
        let Some(s) = inner.upgrade() else { return };
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        let policy = s.policy.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if policy.exhausted(attempt) {
            s.recovering.store(false, Ordering::Release);
            s.events.emit(RecoveryEvent::GaveUp {
                side: Side::Consume,
                reason: format!("{} redials failed: {last_error}", attempt - 1),
            });
            return;
        }
        let delay = policy.delay(attempt);
        s.events.emit(RecoveryEvent::Retrying {
            side: Side::Consume,
            attempt,
            delay,
            last_error: last_error.clone(),
        });
        drop(s);
        tokio::time::sleep(delay).await;
        let Some(s) = inner.upgrade() else { return };
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        if s.broker.lock().down {
            last_error = format!("memory://{} is down", s.broker.name());
            continue;
        }
        let conn = Arc::new(MemoryConnection::open(&s.broker, &s.status));
        for item in s.declared.snapshot() {
            let mut st = conn.broker.lock();
            let done = match &item {
                Declared::Exchange(e) => st.declare_exchange(e),
                Declared::Queue(q) => st.declare_queue(conn.id, q).map(drop),
                Declared::Binding(b) => st.bind(conn.id, b),
            };
            if let Err(e) = done {
                tracing::warn!(error = %e, item = ?item, "could not declare again after recovery");
            }
        }
        *s.conn.write().unwrap_or_else(|e| e.into_inner()) = conn;
        s.recovering.store(false, Ordering::Release);
        s.events.emit(RecoveryEvent::Recovered {
            side: Side::Consume,
            attempts: attempt,
            after: started.elapsed(),
            address: format!("memory://{}", s.broker.name()),
        });
        return;
    }
}
