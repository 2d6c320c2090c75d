//! A drill in motion: one AceMQ connection publishing a known sequence of ids to a queue and
//! consuming them, all booked in a [`Ledger`], while the drill injects faults.
//!
//! * The **publisher loop** takes ids 0, 1, 2, … at a steady pace and sends each through
//!   `Connection::publisher` (mandatory, confirmed). A send that errors (or takes longer
//!   than [`ATTEMPT_TIMEOUT`]) is retried with the same id and message id until it is
//!   confirmed; every attempt counts as sent. A failed attempt may still have reached the
//!   queue, so each retry may add one duplicate.
//! * The **consumer** (prefetch [`PREFETCH`], concurrency [`CONCURRENCY`]) books every
//!   handler run and acks.
//! * [`Drill::await_recovery`] asserts that, after the fault ends at `t0`, an id confirmed
//!   after `t0` is handled after `t0` within [`RECOVERY_BOUND`], by the same connection and
//!   consumer the drill started with (nothing in the process is restarted).
//! * [`Drill::finish`] stops publishing, waits until every confirmed id is handled and the
//!   queue is empty, prints the accounting line and asserts: lost = 0, no phantom ids, the
//!   queue left empty, and duplicates within the window
//!   `PREFETCH × faults + (sent − confirmed)`: each fault may redeliver up to a prefetch
//!   window of unacked deliveries, and each failed publish attempt may have been stored.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::consume::{Consumer, ConsumerOptions, Message};
use acemq::publish::SendOptions;
use acemq::topology::{QueueDecl, Topology};
use acemq::transport::Transport;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::broker::delete_queue_cli;
use super::ledger::{Counts, Ledger};

/// How long after the fault ends recovery may take.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(30);
/// The consumer's prefetch: the duplicate window per fault.
pub const PREFETCH: u16 = 20;
/// Handlers at once.
pub const CONCURRENCY: usize = 4;
/// The pace of new ids (about 200 a second).
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(5);
/// The pause before a failed publish is retried.
pub const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// A publish attempt that has not answered by then counts as failed (in doubt).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(45);
/// How long `Connection::close` may take at the end of a drill: its own budget (the 20 s
/// drain, then up to 5 s for running handlers) and a margin for closing the sockets.
pub const CLOSE_BOUND: Duration = Duration::from_secs(30);
/// How long the end of a drill may take (last confirm, draining the queue).
pub const FINISH_BOUND: Duration = Duration::from_secs(60);

/// The payload: the id the ledger books.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Item {
    pub id: u64,
}

/// The queues a drill's consumer leaves behind, deleted through `rabbitmqctl` when the drill
/// panics (the normal path deletes them through the broker connection).
struct Cleanup {
    node: Option<String>,
    queues: Vec<String>,
    armed: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.armed && std::thread::panicking() {
            for q in &self.queues {
                delete_queue_cli(self.node.as_deref(), q);
            }
        }
    }
}

/// A running drill; see the module docs.
pub struct Drill {
    /// The drill's name in the accounting line.
    pub label: String,
    /// The connection under test.
    pub mq: Connection,
    /// The consumed queue.
    pub queue: String,
    /// The books.
    pub ledger: Arc<Ledger>,
    consumer: Consumer,
    publisher: Option<JoinHandle<()>>,
    stop: CancellationToken,
    abandon: CancellationToken,
    paused: watch::Sender<bool>,
    /// Set by the publisher loop while it waits, paused, with no publish in hand.
    parked: watch::Receiver<bool>,
    faults: u64,
    /// The consumer's prefetch: the duplicate window per fault.
    prefetch: u16,
    slowest: Option<Duration>,
    cleanup: Cleanup,
}

impl Drill {
    /// Declares `decl` through `mq` (so it is this connection's topology), starts the
    /// consumer and the publisher loop. `node` is where `rabbitmqctl` cleans up after a
    /// failed drill.
    pub async fn start(
        label: &str,
        mq: Connection,
        decl: QueueDecl,
        node: Option<String>,
    ) -> Drill {
        Self::start_with(label, mq, decl, node, PREFETCH, CONCURRENCY).await
    }

    /// [`Drill::start`] with the consumer's prefetch and concurrency of its own.
    pub async fn start_with(
        label: &str,
        mq: Connection,
        decl: QueueDecl,
        node: Option<String>,
        prefetch: u16,
        concurrency: usize,
    ) -> Drill {
        let queue = decl.name.clone();
        let cleanup = Cleanup {
            node,
            queues: ["", ".dlq", ".parked"]
                .iter()
                .map(|s| format!("{queue}{s}"))
                .collect(),
            armed: true,
        };
        let topology = Topology::define()
            .queue_decl(decl)
            .build()
            .expect("the drill's topology");
        mq.declare(&topology)
            .await
            .expect("declare the drill's queue");
        // Every recovery event, timed from the start, in the drill's output.
        if let Some(mut events) = mq.recovery_events() {
            let (label, t0) = (label.to_owned(), Instant::now());
            tokio::spawn(async move {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    match events.recv().await {
                        Ok(e) => eprintln!(
                            "drill {label}: +{}ms recovery event {e:?}",
                            t0.elapsed().as_millis()
                        ),
                        Err(RecvError::Lagged(n)) => {
                            eprintln!("drill {label}: {n} recovery events not shown");
                        }
                        Err(RecvError::Closed) => return,
                    }
                }
            });
        }
        let ledger = Arc::new(Ledger::default());
        let books = ledger.clone();
        let consumer = mq
            .consume(
                &queue,
                ConsumerOptions::default()
                    .prefetch(prefetch)
                    .concurrency(concurrency),
                move |m: Message<Item>| {
                    books.handled(m.payload().id);
                    async { Ok::<(), acemq::consume::HandlerError>(()) }
                },
            )
            .await
            .expect("start the drill's consumer");
        let stop = CancellationToken::new();
        let abandon = CancellationToken::new();
        // Every change of the consumers' health (Degraded with the reason while one is not
        // subscribed), timed from the start.
        {
            let (mq, label, t0, stop) =
                (mq.clone(), label.to_owned(), Instant::now(), stop.clone());
            tokio::spawn(async move {
                let mut last = String::new();
                while !stop.is_cancelled() {
                    let consumers = mq.health().to_json()["components"]["consumers"].clone();
                    // The status and the reasons, not the progress timestamps and counts
                    // that change with every message.
                    let mut now = consumers["status"].to_string();
                    if let Some(details) = consumers["details"].as_object() {
                        for (k, v) in details {
                            if k.contains(".stopped")
                                || k.starts_with("stopped.")
                                || k.contains("stalled")
                            {
                                now.push_str(&format!(" {k}={v}"));
                            }
                        }
                    }
                    if now != last {
                        eprintln!(
                            "drill {label}: +{}ms consumers {now}",
                            t0.elapsed().as_millis()
                        );
                        last = now;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }
        let (paused, paused_rx) = watch::channel(false);
        let (parked_tx, parked) = watch::channel(false);
        let publisher = tokio::spawn(publish_loop(
            mq.clone(),
            queue.clone(),
            label.to_owned(),
            ledger.clone(),
            Pause {
                paused: paused_rx,
                parked: parked_tx,
            },
            stop.clone(),
            abandon.clone(),
        ));
        Drill {
            label: label.to_owned(),
            mq,
            queue,
            ledger,
            consumer,
            publisher: Some(publisher),
            stop,
            abandon,
            paused,
            parked,
            faults: 0,
            prefetch,
            slowest: None,
            cleanup,
        }
    }

    /// Waits (up to [`RECOVERY_BOUND`]) until `n` more ids are confirmed and `n` more
    /// handler runs happened: traffic flows both ways.
    pub async fn wait_flowing(&self, n: u64) {
        let (c0, r0) = (self.ledger.confirmed_count(), self.ledger.total_runs());
        let end = Instant::now() + RECOVERY_BOUND;
        while self.ledger.confirmed_count() < c0 + n || self.ledger.total_runs() < r0 + n {
            assert!(
                Instant::now() < end,
                "drill {}: traffic did not flow ({n} confirms and runs) within {RECOVERY_BOUND:?}: {}",
                self.label,
                self.line()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops taking new ids, and waits (up to [`FINISH_BOUND`]) until the one in hand is
    /// confirmed: once this returns, nothing of the drill's is on its way to the broker.
    pub async fn pause_publishing(&self) {
        self.paused.send_replace(true);
        let mut parked = self.parked.clone();
        let waited = tokio::time::timeout(FINISH_BOUND, parked.wait_for(|p| *p)).await;
        assert!(
            matches!(waited, Ok(Ok(_))),
            "drill {}: the publish in hand was not confirmed within {FINISH_BOUND:?}: {}",
            self.label,
            self.line()
        );
    }

    /// Takes new ids again.
    pub fn resume_publishing(&self) {
        self.paused.send_replace(false);
    }

    /// Waits until every confirmed id is handled, the queue holds nothing ready, and no
    /// handler runs, checked through `raw` (a connection of its own).
    pub async fn wait_drained(&self, raw: &dyn Transport, within: Duration) {
        let end = Instant::now() + within;
        loop {
            let ready = match raw.inspect_queue(&self.queue).await {
                Ok(i) => Some(i.message_count),
                Err(_) => None,
            };
            if ready == Some(0)
                && self.ledger.unhandled_confirmed().is_empty()
                && self.consumer.in_flight() == 0
            {
                return;
            }
            assert!(
                Instant::now() < end,
                "drill {}: not drained within {within:?} (ready on the queue: {ready:?}, \
                 confirmed but unhandled: {:?}…): {}",
                self.label,
                self.ledger
                    .unhandled_confirmed()
                    .iter()
                    .take(10)
                    .collect::<Vec<_>>(),
                self.line()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Books one fault (it widens the duplicate window by a prefetch).
    pub fn fault(&mut self) {
        self.faults += 1;
    }

    /// Asserts that publishing and consuming both work again within [`RECOVERY_BOUND`] after
    /// `t0` (the moment the fault ended, `what`); returns how long it took.
    pub async fn await_recovery(&mut self, t0: Instant, what: &str) -> Duration {
        let end = t0 + RECOVERY_BOUND;
        loop {
            if let Some(d) = self.ledger.recovered_since(t0) {
                self.slowest = Some(self.slowest.map_or(d, |s| s.max(d)));
                eprintln!(
                    "drill {}: fault {} ({what}): recovered in {}ms",
                    self.label,
                    self.faults,
                    d.as_millis()
                );
                return d;
            }
            assert!(
                Instant::now() < end,
                "drill {}: fault {} ({what}): no recovery within {RECOVERY_BOUND:?} \
                 (no id both confirmed and handled since; connection status {:?}; health {}): {}",
                self.label,
                self.faults,
                self.mq.status(),
                self.mq.health().to_json(),
                self.line()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The accounting line so far.
    pub fn line(&self) -> String {
        self.ledger.counts().line(&self.label, self.slowest)
    }

    /// The consumer under test.
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    /// Ends the drill: stops publishing, drains, closes the consumer, prints the accounting
    /// line, asserts the books (see the module docs), deletes the queues through `raw` and
    /// closes the connection. Returns the final counts.
    pub async fn finish(mut self, raw: &dyn Transport) -> Counts {
        self.stop.cancel();
        self.resume_publishing();
        if let Some(mut p) = self.publisher.take()
            && tokio::time::timeout(FINISH_BOUND, &mut p).await.is_err()
        {
            self.abandon.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut p).await;
            p.abort();
            panic!(
                "drill {}: the last publish was not confirmed within {FINISH_BOUND:?}: {}",
                self.label,
                self.line()
            );
        }
        self.wait_drained(raw, FINISH_BOUND).await;
        tokio::time::timeout(Duration::from_secs(30), self.consumer.close())
            .await
            .unwrap_or_else(|_| panic!("drill {}: the consumer did not close", self.label));
        let left = raw
            .inspect_queue(&self.queue)
            .await
            .map(|i| i.message_count)
            .unwrap_or_else(|e| panic!("drill {}: inspect {}: {e}", self.label, self.queue));
        let c = self.ledger.counts();
        println!("{}", c.line(&self.label, self.slowest));
        assert_eq!(
            c.lost,
            0,
            "drill {}: confirmed ids never handled: {:?}…",
            self.label,
            self.ledger
                .unhandled_confirmed()
                .iter()
                .take(10)
                .collect::<Vec<_>>()
        );
        assert_eq!(c.phantom, 0, "drill {}: handled ids never sent", self.label);
        assert_eq!(left, 0, "drill {}: messages left on the queue", self.label);
        let window = u64::from(self.prefetch) * self.faults + c.sent.saturating_sub(c.confirmed);
        assert!(
            c.duplicates <= window,
            "drill {}: {} duplicates, above the window of {window} (prefetch {} × {} \
             faults + {} failed publish attempts)",
            self.label,
            c.duplicates,
            self.prefetch,
            self.faults,
            c.sent.saturating_sub(c.confirmed)
        );
        for q in &self.cleanup.queues {
            let _ = raw.delete_queue(q).await;
        }
        self.cleanup.armed = false;
        let closing = Instant::now();
        let closed = tokio::time::timeout(CLOSE_BOUND, self.mq.close()).await;
        let took = closing.elapsed();
        eprintln!("drill {}: close() took {}ms", self.label, took.as_millis());
        assert!(
            closed.is_ok(),
            "drill {}: close() had not returned after {CLOSE_BOUND:?} (its budget: the drain, \
             then {:?} for running handlers)",
            self.label,
            acemq::lifecycle::ABANDON_AFTER
        );
        c
    }
}

/// The publisher loop's side of [`Drill::pause_publishing`].
struct Pause {
    /// Whether to stop taking new ids.
    paused: watch::Receiver<bool>,
    /// Set while waiting, paused, with no publish in hand.
    parked: watch::Sender<bool>,
}

async fn publish_loop(
    mq: Connection,
    queue: String,
    label: String,
    ledger: Arc<Ledger>,
    pause: Pause,
    stop: CancellationToken,
    abandon: CancellationToken,
) {
    let Pause { mut paused, parked } = pause;
    let p = mq.publisher::<Item>("", &queue);
    let mut tick = tokio::time::interval(PUBLISH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for id in 0u64.. {
        // Nothing in hand here: while paused, say so (a pause waits for it), then wait.
        while *paused.borrow_and_update() {
            parked.send_replace(true);
            tokio::select! {
                r = paused.changed() => if r.is_err() { return },
                _ = stop.cancelled() => return,
            }
        }
        parked.send_replace(false);
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let message_id = format!("{label}-{id}");
        let mut failures = 0u32;
        loop {
            ledger.attempt(id);
            let sent = tokio::time::timeout(
                ATTEMPT_TIMEOUT,
                p.send_with(&Item { id }, SendOptions::new().message_id(&message_id)),
            )
            .await;
            match sent {
                Ok(Ok(_)) => {
                    ledger.confirmed(id);
                    if failures > 0 {
                        eprintln!(
                            "drill {label}: id {id} confirmed after {failures} failed attempts"
                        );
                    }
                    break;
                }
                Ok(Err(e)) => {
                    ledger.publish_failed();
                    if failures == 0 {
                        eprintln!("drill {label}: publish of id {id} failed: {e}; retrying");
                    }
                }
                Err(_) => {
                    ledger.publish_failed();
                    eprintln!(
                        "drill {label}: publish of id {id} unanswered after {ATTEMPT_TIMEOUT:?}; retrying"
                    );
                }
            }
            failures += 1;
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PAUSE) => {}
                _ = abandon.cancelled() => return,
            }
        }
    }
}
