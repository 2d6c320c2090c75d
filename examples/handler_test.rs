//! Testing your own handler on `memory://`, in virtual time: a policy of five attempts with
//! waits of minutes runs in milliseconds of real time, and the test asserts what a user
//! cares about — how many times the handler ran, what was acked, what reached `{q}.dlq`.
//!
//! ```text
//! cargo test -p acemq-examples --example handler_test
//! ```
//!
//! The handler is an ordinary function of your service; the test wires it to a consumer on
//! an in-process broker (one per test, by name) with the clock paused
//! (`#[tokio::test(start_paused = true)]`): tokio jumps the clock forward whenever every
//! task is waiting, so retry waits and TTL rungs pass at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use acemq::consume::{HandlerError, Message};
use serde::{Deserialize, Serialize};

/// A payment in the service under test.
#[derive(Debug, Serialize, Deserialize)]
pub struct Payment {
    pub id: String,
    pub amount_cents: u64,
}

/// The handler under test: the gateway fails the first `flaky` calls; a zero amount is
/// never valid.
pub async fn charge(
    m: Message<Payment>,
    gateway_calls: Arc<AtomicU32>,
    flaky: u32,
) -> Result<(), HandlerError> {
    if m.payload().amount_cents == 0 {
        return Err(HandlerError::fatal("a zero amount is not a payment"));
    }
    if gateway_calls.fetch_add(1, Ordering::SeqCst) < flaky {
        return Err(HandlerError::retry("payment gateway timed out"));
    }
    Ok(())
}

fn main() {
    println!("run it as a test: cargo test -p acemq-examples --example handler_test");
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use acemq::Connection;
    use acemq::consume::{Consumer, ConsumerOptions};
    use acemq::retry::RetryPolicy;
    use acemq::topology::{Topology, dead_letter_queue};

    use super::*;

    /// Five attempts: 1 min, 2 min, 4 min, 8 min between them (the longer ones on broker
    /// rungs, whose TTLs expire on the virtual clock too).
    fn policy() -> RetryPolicy {
        RetryPolicy::exponential(5, Duration::from_secs(60), Duration::from_secs(600))
            .expect("a valid policy")
    }

    async fn start(name: &str, flaky: u32) -> (Connection, Consumer, Arc<AtomicU32>) {
        let mq = Connection::connect(&format!("memory://{name}"))
            .await
            .expect("memory:// always connects");
        mq.declare(
            &Topology::define()
                .queue_with_dead_letter("payments")
                .queue_with_retry("payments", &policy())
                .build()
                .expect("a valid topology"),
        )
        .await
        .expect("declare");
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let consumer = mq
            .consume(
                "payments",
                ConsumerOptions::default().retry(policy()),
                move |m: Message<Payment>| charge(m, c.clone(), flaky),
            )
            .await
            .expect("consume");
        (mq, consumer, calls)
    }

    async fn pay(mq: &Connection, amount_cents: u64) {
        mq.publisher::<Payment>("", "payments")
            .send(&Payment {
                id: "p-1".into(),
                amount_cents,
            })
            .await
            .expect("confirmed");
    }

    /// Waits (in virtual time) until `done` holds, for at most a virtual hour.
    async fn until(mut done: impl FnMut() -> bool) {
        for _ in 0..3600 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        panic!("not done after a virtual hour");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flaky_gateway_is_retried_until_it_answers() {
        let (mq, consumer, calls) = start("handler-test-flaky", 3).await;
        let started = tokio::time::Instant::now();
        pay(&mq, 1250).await;
        until(|| consumer.stats().acked == 1).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "three failures, then success"
        );
        assert_eq!(consumer.stats().retried, 3);
        // 1 + 2 + 4 minutes of waits, passed on the paused clock.
        assert!(started.elapsed() >= Duration::from_secs(7 * 60));
        mq.close().await.expect("close");
    }

    #[tokio::test(start_paused = true)]
    async fn a_gateway_that_never_answers_ends_in_the_dead_letter_queue() {
        let (mq, consumer, calls) = start("handler-test-down", u32::MAX).await;
        pay(&mq, 990).await;
        until(|| consumer.stats().dead_lettered == 1).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            5,
            "every attempt of the policy"
        );
        let dlq = mq
            .transport()
            .inspect_queue(&dead_letter_queue("payments"))
            .await
            .expect("inspect");
        assert_eq!(dlq.message_count, 1);
        mq.close().await.expect("close");
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_amount_is_dead_lettered_without_retrying() {
        let (mq, consumer, calls) = start("handler-test-zero", 0).await;
        pay(&mq, 0).await;
        until(|| consumer.stats().rejected == 1).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "the gateway was never called"
        );
        assert_eq!(consumer.stats().retried, 0);
        mq.close().await.expect("close");
    }
}
