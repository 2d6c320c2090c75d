//! The AceMQ side: scenarios 1 to 4 through AceMQ on the broker, and scenario 5 on
//! `memory://`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::retry::RetryPolicy;
use acemq::topology::QueueDecl;
use tokio::sync::Notify;

use crate::scenario::payloads;
use crate::{BATCH, Clock, MEMORY_BACKLOG, PREFETCH, Payload, RETRY_WAIT, Result, Sample};

// ---------------------------------------------------------------------------------------
// 1: publish, confirm each.

/// AceMQ: `Publisher::send`, one at a time.
pub async fn acemq_confirm_each(
    mq: &acemq::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let items = payloads(n, size);
    let publisher = mq.publisher::<Payload>("", queue);
    let mut latencies = Vec::with_capacity(items.len());
    let started = Clock::start();
    for p in &items {
        let t = Instant::now();
        publisher.send(p).await?;
        latencies.push(t.elapsed());
    }
    Ok(Sample::new(n, started.elapsed(), latencies))
}

// ---------------------------------------------------------------------------------------
// 2: publish, confirms pipelined.

/// AceMQ: `Publisher::send_all` over batches of [`BATCH`].
pub async fn acemq_pipelined(
    mq: &acemq::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let items = payloads(n, size);
    let publisher = mq.publisher::<Payload>("", queue);
    let mut latencies = Vec::with_capacity(items.len() / BATCH + 1);
    let started = Clock::start();
    for chunk in items.chunks(BATCH) {
        let t = Instant::now();
        publisher.send_all(chunk).await?;
        latencies.push(t.elapsed());
    }
    Ok(Sample::new(n, started.elapsed(), latencies))
}

// ---------------------------------------------------------------------------------------
// 3: consume, ack each.

/// Counts handled messages and wakes the waiter at the target.
struct Counter {
    count: AtomicU64,
    target: u64,
    done: Notify,
    /// Woken every 1,000 messages.
    progress: Notify,
}

impl Counter {
    fn new(target: u64) -> Arc<Counter> {
        Arc::new(Counter {
            count: AtomicU64::new(0),
            target,
            done: Notify::new(),
            progress: Notify::new(),
        })
    }

    fn bump(&self) {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.target {
            self.done.notify_one();
        }
        if n.is_multiple_of(1000) {
            self.progress.notify_waiters();
        }
    }

    async fn wait(&self) {
        if self.target > 0 {
            self.done.notified().await;
        }
    }
}

/// AceMQ: typed JSON consumer, prefetch [`PREFETCH`], the handler returns `Ok` (acked).
pub async fn acemq_consume(mq: &acemq::Connection, queue: &str, n: u64) -> Result<Sample> {
    let counter = Counter::new(n);
    let c = counter.clone();
    let started = Clock::start();
    let consumer = mq
        .consume(
            queue,
            ConsumerOptions::default().prefetch(PREFETCH),
            move |m: Message<Payload>| {
                let c = c.clone();
                async move {
                    std::hint::black_box(m.payload().seq);
                    c.bump();
                    Ok(())
                }
            },
        )
        .await?;
    counter.wait().await;
    consumer.close().await;
    let elapsed = started.elapsed();
    let acked = consumer.stats().acked;
    if acked != n {
        return Err(format!("acemq consumer acked {acked} of {n}").into());
    }
    Ok(Sample::new(n, elapsed, Vec::new()))
}

// ---------------------------------------------------------------------------------------
// 4: every message fails once, succeeds on the retry after a 1 ms in-consumer wait.

/// AceMQ: the handler fails attempt 1; the policy waits 1 ms in the consumer, republishes
/// with the attempt advanced (confirmed and routed), then acks the original.
pub async fn acemq_retry(mq: &acemq::Connection, queue: &str, n: u64) -> Result<Sample> {
    let counter = Counter::new(n);
    let c = counter.clone();
    let policy = RetryPolicy::fixed(2, RETRY_WAIT)?;
    let started = Clock::start();
    let consumer = mq
        .consume(
            queue,
            ConsumerOptions::default().prefetch(PREFETCH).retry(policy),
            move |m: Message<Payload>| {
                let c = c.clone();
                async move {
                    if m.attempt() < 2 {
                        return Err(HandlerError::retry("fails once"));
                    }
                    c.bump();
                    Ok(())
                }
            },
        )
        .await?;
    counter.wait().await;
    consumer.close().await;
    let elapsed = started.elapsed();
    let s = consumer.stats();
    if s.acked != n || s.retried != n {
        return Err(format!(
            "acemq retry: acked {} retried {} of {n}",
            s.acked, s.retried
        )
        .into());
    }
    Ok(Sample::new(n, elapsed, Vec::new()))
}

// ---------------------------------------------------------------------------------------
// 5: memory:// publish + consume.

/// AceMQ on `memory://`: a typed consumer (prefetch [`PREFETCH`]) runs while `send_all`
/// publishes every message in batches of 1,000, at most [`MEMORY_BACKLOG`] ahead of the
/// consumer; timed until the last one is handled.
pub async fn memory_publish_consume(n: u64, size: usize) -> Result<Sample> {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "memory://acemq-bench-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    );
    let mq = acemq::Connection::connect(&name).await?;
    mq.transport()
        .declare_queue(&QueueDecl::classic("bench"))
        .await?;
    let items = payloads(n, size);
    let counter = Counter::new(n);
    let c = counter.clone();
    let started = Clock::start();
    let consumer = mq
        .consume(
            "bench",
            ConsumerOptions::default().prefetch(PREFETCH),
            move |m: Message<Payload>| {
                let c = c.clone();
                async move {
                    std::hint::black_box(m.payload().seq);
                    c.bump();
                    Ok(())
                }
            },
        )
        .await?;
    let publisher = mq.publisher::<Payload>("", "bench");
    let mut published = 0u64;
    for chunk in items.chunks(1000) {
        // Stay at most MEMORY_BACKLOG ahead of the consumer: the figure is the steady-state
        // rate, not the cost of growing the heap for a queue of every message.
        while published.saturating_sub(counter.count.load(Ordering::SeqCst)) > MEMORY_BACKLOG {
            let progress = counter.progress.notified();
            if published.saturating_sub(counter.count.load(Ordering::SeqCst)) <= MEMORY_BACKLOG {
                break;
            }
            progress.await;
        }
        publisher.send_all(chunk).await?;
        published += chunk.len() as u64;
    }
    counter.wait().await;
    let elapsed = started.elapsed();
    consumer.close().await;
    mq.close().await?;
    Ok(Sample::new(n, elapsed, Vec::new()))
}
