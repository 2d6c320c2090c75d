//! Expiry: the per-queue tokio task that expires messages at the head of a queue when
//! their TTL runs out.
//!
//! This module owns the timer's life cycle. A queue has a task only while its head has an
//! expiry instant: the task sleeps on `tokio::time::sleep_until` (so a paused test clock
//! auto-advances straight to it: a 6-hour TTL passes in microseconds of wall time), wakes,
//! takes the broker lock briefly to expire and dead-letter the head, and sleeps until the
//! next head's expiry, or ends when there is none. Whenever the head changes to an earlier
//! expiry, the broker pokes the task through a `Notify`. A task whose runtime has shut
//! down is noticed (its handle is finished) and replaced by the next poke.

use std::sync::{Arc, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::broker::{MemoryBroker, State};
use super::dispatch::Work;
use super::queue::Timer;

impl State {
    /// The expiry task's step: expires the head of queue `name` (incarnation `id`) and
    /// returns the instant to sleep until, or `None` to stop (nothing left to expire,
    /// or the queue is gone).
    pub(crate) fn expire_tick(&mut self, name: &str, id: u64, now: Instant) -> Option<Instant> {
        if self.queues.get(name).is_none_or(|q| q.id != id) {
            return None;
        }
        let mut work = Work::new();
        self.dispatch(name, now, &mut work);
        self.run(work, now);
        let q = self.queues.get_mut(name).filter(|q| q.id == id)?;
        match (q.head_expiry(), q.timer.as_mut()) {
            (Some(at), Some(t)) => {
                t.deadline = at;
                Some(at)
            }
            _ => {
                q.timer = None;
                None
            }
        }
    }

    /// Makes sure the expiry task of queue `name` will wake no later than its head's
    /// expiry: starts one if none runs, or wakes it if it sleeps too long.
    pub(crate) fn poke_timer(&mut self, name: &str) {
        let me = self.me.clone();
        let Some(q) = self.queues.get_mut(name) else {
            return;
        };
        let Some(at) = q.head_expiry() else {
            return;
        };
        match &q.timer {
            Some(t) if !t.handle.is_finished() => {
                if at < t.deadline {
                    q.notify.notify_one();
                }
            }
            _ => {
                // Outside a runtime (a drop in plain code) the next poke starts it.
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    q.timer = None;
                    return;
                };
                let handle = rt.spawn(run(me, q.name.to_string(), q.id, q.notify.clone()));
                q.timer = Some(Timer {
                    deadline: at,
                    handle,
                });
            }
        }
    }
}

/// The expiry task of one queue incarnation.
async fn run(broker: Weak<MemoryBroker>, queue: String, id: u64, notify: Arc<Notify>) {
    loop {
        let deadline = {
            let Some(b) = broker.upgrade() else { return };
            let mut st = b.lock();
            match st.expire_tick(&queue, id, Instant::now()) {
                Some(at) => at,
                None => return,
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {}
            () = notify.notified() => {}
        }
    }
}
