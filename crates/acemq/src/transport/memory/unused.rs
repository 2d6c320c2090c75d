//! `x-expires`: deleting a queue that has been unused for its expiry time, as RabbitMQ does.
//!
//! This module owns the per-queue task that watches a queue declared with `x-expires`.
//! "Unused" is RabbitMQ's meaning: no consumer attached, no `basic.get`, no redeclaration
//! for the whole period (ready messages do not count as use). The task sleeps on tokio
//! time (so a paused test clock runs ten minutes in microseconds), wakes at the earliest
//! instant the queue could expire, and deletes it only if it is still the same incarnation
//! and still unused; otherwise it sleeps again until the new deadline. Consumers detaching,
//! `basic.get` and redeclaration move `Queue::last_used`.

use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;

use super::broker::{MemoryBroker, State};

/// What the task does next.
enum Step {
    Sleep(Instant),
    Stop,
}

impl State {
    /// Starts the `x-expires` task of queue `name` (incarnation `id`), expiring after `ms`
    /// milliseconds unused. Outside a runtime nothing is started (the queue then never
    /// expires; every test and application runs inside one).
    pub(crate) fn start_unused_expiry(&mut self, name: &str, id: u64, ms: u64) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(watch(
            self.me.clone(),
            name.to_owned(),
            id,
            Duration::from_millis(ms),
        ));
    }

    /// One look at the queue: delete it when it has been unused for `period`, else say
    /// when to look again.
    fn unused_step(&mut self, name: &str, id: u64, period: Duration, now: Instant) -> Step {
        let Some(q) = self.queues.get(name).filter(|q| q.id == id) else {
            return Step::Stop;
        };
        if !q.consumers.is_empty() {
            // In use: it cannot expire before a full period after its last consumer goes.
            return Step::Sleep(now + period);
        }
        let due = q.last_used + period;
        if due > now {
            return Step::Sleep(due);
        }
        tracing::debug!(queue = %name, "memory:// queue unused for its x-expires; deleted");
        self.remove_queue(name);
        Step::Stop
    }
}

async fn watch(broker: Weak<MemoryBroker>, name: String, id: u64, period: Duration) {
    let mut until = Instant::now() + period;
    loop {
        tokio::time::sleep_until(until).await;
        let Some(b) = broker.upgrade() else { return };
        let step = b.lock().unused_step(&name, id, period, Instant::now());
        match step {
            Step::Sleep(at) => until = at,
            Step::Stop => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::headers::HeaderValue;
    use crate::topology::QueueDecl;
    use crate::transport::Transport;
    use crate::transport::memory::{MemoryBroker, MemoryTransport};
    use std::time::Duration;

    fn expiring(name: &str, ms: i64) -> QueueDecl {
        QueueDecl::classic(name).argument("x-expires", HeaderValue::I64(ms))
    }

    #[tokio::test(start_paused = true)]
    async fn an_unused_queue_is_deleted_after_its_expiry_and_a_used_one_is_not() {
        let t = MemoryTransport::connect("unused-expiry");
        let b = MemoryBroker::named("unused-expiry");
        t.declare_queue(&expiring("idle", 1000)).await.unwrap();
        t.declare_queue(&expiring("busy", 1000)).await.unwrap();
        let mut sub = t
            .consume(crate::transport::ConsumeSpec::new("busy", 1))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        // A redeclaration is a use: the period starts again.
        t.declare_queue(&expiring("idle", 1000)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(b.queue_names().contains(&"idle".to_owned()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!b.queue_names().contains(&"idle".to_owned()));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(b.queue_names().contains(&"busy".to_owned()), "consumed");
        sub.close().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(!b.queue_names().contains(&"busy".to_owned()));
    }

    #[tokio::test]
    async fn x_expires_must_be_a_positive_integer() {
        let t = MemoryTransport::connect("unused-args");
        for bad in [expiring("z", 0), expiring("n", -5)] {
            let e = t.declare_queue(&bad).await.unwrap_err();
            assert!(e.is_precondition_failed(), "{e}");
        }
        let s = QueueDecl::classic("s").argument("x-expires", "600000");
        assert!(
            t.declare_queue(&s)
                .await
                .unwrap_err()
                .is_precondition_failed()
        );
        t.declare_queue(&expiring("ok", 600_000)).await.unwrap();
        let other = expiring("ok", 1000);
        assert!(
            t.declare_queue(&other)
                .await
                .unwrap_err()
                .is_precondition_failed()
        );
    }
}
