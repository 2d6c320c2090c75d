//! Publishing with confirms on one confirm-mode channel, and the confirm collector.
//!
//! # Why it is built like this
//!
//! * **One `basic_publish` at a time per channel.** lapin registers the confirm tag and
//!   queues the frames under different locks, so two concurrent `basic_publish` calls on one
//!   channel could pair a `PublisherConfirm` with the other message. Calls are serialized
//!   under an async mutex that is held only until lapin has written the frames; the confirm
//!   is awaited outside it, so publishes pipeline.
//! * **Returns are matched by `message_id`, exchange and routing key.** The engine
//!   republishes a message under its own id (a retry hop, a dead letter), so the id alone
//!   can name two publishes in flight at once; the destination tells them apart. A return
//!   that lapin attached to a publish with the same key is that publish's own. lapin hands
//!   a `basic.return` to whichever pending confirm completes next, and a `multiple=true` ack
//!   completes its tags in `HashMap` order, so a return can ride on another publish's
//!   confirm (or on a dropped one, handed over by `wait_for_confirms`). Every confirm goes,
//!   in publish order, to a collector task (one per publisher channel). When the oldest one
//!   resolves, the collector gathers every later confirm that is already resolved, collects
//!   the returns carried by all of them, and answers each publish by its own id: routed,
//!   unroutable or nacked. Before it gathers, it takes lapin's acknowledgement lock once
//!   (through a single, never-awaited poll of `wait_for_confirms`), so an ack frame that is
//!   being applied is seen whole and a return is never missed because its carrier resolved
//!   a microsecond later; this repeats until a pass finds nothing new. A return waits for
//!   its publish even when the queue is empty (lapin may confirm a publish before it is
//!   handed over); it is dropped once every publish written before it was seen has been
//!   answered (publishes are numbered per channel; `returns` owns that bookkeeping).
//! * **Publishes without a `message_id`** are answered by the return lapin attached to their
//!   own confirm (exact when they are not pipelined with other unroutable publishes; give
//!   every publish an id, as AceMQ does).
//! * **Timeouts.** A confirm that does not arrive within `confirm_timeout` is answered with
//!   [`TransportError::ConfirmTimeout`] (in doubt); the collector keeps waiting for it, so a
//!   late confirm still hands over any return it carries. Deadlines are checked by the
//!   collector (one timer), not by a timer per publish.
//! * **A dead channel heals.** A 404 on publish (missing exchange) makes the broker close the
//!   channel; its pending confirms are rejected with the broker's error. The publish whose
//!   exchange the error names gets [`TransportError::NotFound`]; the others rejected with it
//!   get [`TransportError::Closed`] (they were discarded, not refused). The next publish
//!   sees the channel closed and opens a new one. A written publish whose connection or
//!   channel fails for any other reason before its confirm gets
//!   [`TransportError::ConfirmLost`]: it is in doubt, like a timeout.
//! * **Blocked connection.** A publish checks the blocked state first and is refused with
//!   [`TransportError::Blocked`] while it is set (nothing is sent). RabbitMQ 3.10 sends
//!   `connection.blocked` only when a connection publishes after the alarm went off, so the
//!   first publish after an alarm is always written; the broker then withholds its confirm
//!   until the alarm clears (observed), and the message is routed after the unblock. That
//!   publish, and any other unconfirmed one, is answered in doubt
//!   ([`TransportError::ConfirmTimeout`]) as soon as the block is seen, instead of after
//!   `confirm_timeout`. If the block arrives while a publish's frames are still queued in
//!   lapin, they stay queued and go out after the unblock: that publish is in doubt too.
//! * **The late answer.** A publish made with `publish_tracked` (the engine's moves) keeps
//!   a second reply: when its first answer was in doubt (a timeout or a block) the
//!   collector sends the broker's own answer there once the confirm resolves, so a move
//!   waits for it instead of publishing a second copy that would also be delivered. (A
//!   publish still queued in lapin when the block is seen has no late answer.)

use std::collections::VecDeque;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use futures::FutureExt;
use lapin::Confirmation as LapinConfirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{Channel, ConnectionStatus, PublisherConfirm};
use tokio::sync::{Mutex, mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::convert;
use super::errors::{from_lapin, named_exchange};
use super::link::Link;
use super::returns::{Returned, Returns, Written, horizon, return_key};
use crate::error::ErrorKind;
use crate::transport::{
    Confirmation, Outbound, PendingConfirm, TrackedConfirm, TransportError, TransportStatus,
};

type Reply = oneshot::Sender<Result<Confirmation, TransportError>>;

/// One publish waiting for its confirm, in the collector's FIFO.
struct Pending {
    /// `message_id`, exchange and routing key, to match returns (`None` without an id).
    message_id: Option<String>,
    /// A hash of the exchange, to tell which publish a channel close was about.
    exchange: u64,
    /// The publish's number on its channel ([`Written::begin`]), for matching returns.
    seq: u64,
    /// When the frames were written (the confirm deadline is `confirm_timeout` later).
    published: Instant,
    confirm: PublisherConfirm,
    /// `None` once answered (by a timeout).
    reply: Option<Reply>,
    /// Where the broker's own answer goes when `reply` was answered in doubt first
    /// ([`Publisher::publish_tracked`]).
    late: Option<Reply>,
}

/// The live publisher channel and its collector.
struct Live {
    channel: Channel,
    collector: mpsc::UnboundedSender<Pending>,
    /// Numbers the publishes on this channel; shared with the collector.
    written: Written,
}

struct State {
    live: Option<Live>,
    status: watch::Receiver<TransportStatus>,
    closed: bool,
}

/// The publishing side of the transport: owns the publishing connection's link.
pub(crate) struct Publisher {
    link: Link,
    state: Mutex<State>,
    confirm_timeout: Duration,
    /// How long a publish waits for a recovering connection.
    publish_wait: Duration,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("confirm_timeout", &self.confirm_timeout)
            .finish_non_exhaustive()
    }
}

fn exchange_tag(exchange: &str) -> u64 {
    let mut h = DefaultHasher::new();
    exchange.hash(&mut h);
    h.finish()
}

impl Publisher {
    pub(crate) fn new(
        link: Link,
        status: watch::Receiver<TransportStatus>,
        confirm_timeout: Duration,
        publish_wait: Duration,
    ) -> Self {
        Publisher {
            link,
            state: Mutex::new(State {
                live: None,
                status,
                closed: false,
            }),
            confirm_timeout,
            publish_wait,
        }
    }

    /// The publishing connection's link.
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    /// Forgets the channel of a lost connection (its collector answers what it still holds
    /// once lapin rejects the confirms); the next publish opens one on the new connection.
    pub(crate) async fn reset(&self) {
        self.state.lock().await.live = None;
    }

    /// Waits up to `publish_wait` for the link to be ready; refuses with
    /// [`TransportError::NotConnected`] (nothing sent) otherwise.
    async fn ready(
        &self,
        status: &mut watch::Receiver<TransportStatus>,
    ) -> Result<(), TransportError> {
        if self.link.ready() {
            return Ok(());
        }
        let deadline = Instant::now() + self.publish_wait;
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ =
                tokio::time::timeout(left.min(Duration::from_millis(100)), status.changed()).await;
            if self.link.ready() {
                return Ok(());
            }
        }
        Err(TransportError::NotConnected {
            detail: if self.link.recovering() {
                "the publishing connection is recovering".into()
            } else {
                "the publishing connection is down".into()
            },
        })
    }

    /// `Some(reason)` while the broker blocks the publishing connection. lapin's own flag is
    /// the truth (it is set before the event is sent); the reason comes from the event.
    pub(crate) fn blocked(&self, status: &watch::Receiver<TransportStatus>) -> Option<String> {
        if !self.link.current().status().blocked() {
            return None;
        }
        Some(
            status
                .borrow()
                .blocked
                .clone()
                .unwrap_or_else(|| "blocked by the broker".to_owned()),
        )
    }

    /// Publishes one message; see the module docs.
    pub(crate) async fn publish(&self, m: Outbound) -> Result<PendingConfirm, TransportError> {
        Ok(self.publish_inner(m, false).await?.answer)
    }

    /// [`Publisher::publish`], keeping the broker's own answer for a publish answered in
    /// doubt while its confirm can still arrive (a timeout, or a block seen after it was
    /// written): [`TrackedConfirm::late`].
    pub(crate) async fn publish_tracked(
        &self,
        m: Outbound,
    ) -> Result<TrackedConfirm, TransportError> {
        self.publish_inner(m, true).await
    }

    async fn publish_inner(
        &self,
        m: Outbound,
        track: bool,
    ) -> Result<TrackedConfirm, TransportError> {
        crate::transport::check_short(&m.exchange)?;
        crate::transport::check_short(&m.routing_key)?;
        let exchange_hash = exchange_tag(&m.exchange);
        let message_id = m
            .properties
            .message_id
            .as_deref()
            .map(|id| return_key(id, &m.exchange, &m.routing_key));
        let exchange = convert::short("exchange", m.exchange)?;
        let routing_key = convert::short("routing key", m.routing_key)?;
        let properties = convert::to_basic(m.properties)?;
        let options = BasicPublishOptions {
            mandatory: m.mandatory,
            immediate: false,
        };

        if !self.link.ready() {
            let mut status = {
                let state = self.state.lock().await;
                if state.closed {
                    return Err(TransportError::Closed {
                        detail: "the transport was closed".into(),
                    });
                }
                state.status.clone()
            };
            self.ready(&mut status).await?;
        }
        let mut guard = self.state.lock().await;
        let state = &mut *guard;
        if state.closed {
            return Err(TransportError::Closed {
                detail: "the transport was closed".into(),
            });
        }
        if let Some(reason) = self.blocked(&state.status) {
            return Err(TransportError::Blocked { reason });
        }
        let conn = self.link.current();
        let live = self.live(&mut state.live, &state.status, &conn).await?;
        state.status.mark_unchanged();
        let started = Instant::now();
        // Numbered before lapin gets the frames, and in flight until handed over (see
        // `returns`).
        let in_flight = live.written.begin();
        let written = {
            let publish =
                live.channel
                    .basic_publish(exchange, routing_key, options, &m.body, properties);
            tokio::select! {
                biased;
                written = publish => written,
                () = blocked_change(&mut state.status, &conn) => {
                    warn!("the broker blocked the publishing connection while a publish was queued; it is in doubt");
                    return Err(TransportError::ConfirmTimeout {
                        millis: started.elapsed().as_millis().try_into().unwrap_or(u64::MAX),
                    });
                }
            }
        };
        let confirm = written.map_err(from_lapin)?;
        let (reply, answer) = oneshot::channel();
        let (late, late_answer) = if track {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let pending = Pending {
            message_id,
            exchange: exchange_hash,
            seq: in_flight.seq(),
            published: started,
            confirm,
            reply: Some(reply),
            late,
        };
        if live.collector.send(pending).is_err() {
            return Err(TransportError::Closed {
                detail: "the publisher's confirm collector stopped".into(),
            });
        }
        drop((guard, in_flight));
        Ok(TrackedConfirm {
            answer: awaited(answer),
            late: late_answer.map(awaited),
        })
    }

    /// The live publisher channel, opening a new one (with its collector) when there is none
    /// or the last one was closed.
    async fn live<'a>(
        &self,
        live: &'a mut Option<Live>,
        status: &watch::Receiver<TransportStatus>,
        conn: &lapin::Connection,
    ) -> Result<&'a Live, TransportError> {
        let healthy = live
            .as_ref()
            .is_some_and(|l| l.channel.status().connected());
        if !healthy {
            if live.take().is_some() {
                debug!("the publisher channel was closed; opening a new one");
            }
            let channel = conn
                .create_channel()
                .await
                .map_err(|e| match from_lapin(e) {
                    // The connection died under us: nothing was sent.
                    TransportError::Closed { detail } | TransportError::Io { detail, .. } => {
                        TransportError::NotConnected { detail }
                    }
                    other => other,
                })?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(from_lapin)?;
            let (collector, incoming) = mpsc::unbounded_channel();
            let written = Written::default();
            tokio::spawn(collect(
                Inbox {
                    channel: channel.clone(),
                    incoming,
                    written: written.clone(),
                    received: 0,
                },
                self.confirm_timeout,
                conn.status().clone(),
                status.clone(),
            ));
            *live = Some(Live {
                channel,
                collector,
                written,
            });
        }
        live.as_ref().ok_or_else(|| TransportError::Closed {
            detail: "no publisher channel".into(),
        })
    }

    /// Refuses further publishes. The channel is kept until [`Publisher::release`]: dropping
    /// its last handle sends `channel.close`, which would race with the connection close.
    pub(crate) async fn refuse(&self) {
        self.state.lock().await.closed = true;
    }

    /// Drops the publisher channel; its collector finishes once every confirm is answered
    /// (closing the connection rejects whatever was still unconfirmed).
    pub(crate) async fn release(&self) {
        self.state.lock().await.live = None;
    }
}

/// The confirm future of one reply channel (a collector that stopped is `ConfirmLost`).
fn awaited(answer: oneshot::Receiver<Result<Confirmation, TransportError>>) -> PendingConfirm {
    Box::pin(async move {
        answer.await.unwrap_or_else(|_| {
            Err(TransportError::ConfirmLost {
                detail: "the publisher's confirm collector stopped before answering".into(),
                source: None,
            })
        })
    })
}

/// Resolves once lapin reports the connection blocked (or the status sender is gone).
async fn blocked_change(status: &mut watch::Receiver<TransportStatus>, conn: &lapin::Connection) {
    loop {
        if conn.status().blocked() {
            return;
        }
        if status.changed().await.is_err() {
            return futures::future::pending().await;
        }
    }
}

/// A publish whose confirm has resolved, waiting to be answered with its batch.
struct Done {
    pending: Pending,
    result: lapin::Result<LapinConfirmation>,
    /// The return lapin attached to this publish's confirm when it is this publish's own.
    own_return: Option<Returned>,
}

// A short-lived stack value, once per collector turn: boxing the confirmation would cost an
// allocation per confirm for nothing.
#[allow(clippy::large_enum_variant)]
enum Event {
    Front(lapin::Result<LapinConfirmation>),
    Deadline,
    Status(bool),
}

/// Answers every unanswered publish in `queue` as in doubt, keeping the confirms (a return
/// they carry later still reaches the map).
fn answer_in_doubt(queue: &mut VecDeque<Pending>, now: Instant, only_before: Option<Instant>) {
    for p in queue.iter_mut() {
        if only_before.is_some_and(|limit| p.published > limit) {
            break;
        }
        if let Some(reply) = p.reply.take() {
            let waited = now.saturating_duration_since(p.published).as_millis();
            let millis = waited.try_into().unwrap_or(u64::MAX);
            let _ = reply.send(Err(TransportError::ConfirmTimeout { millis }));
        }
    }
}

/// What the collector receives publishes through, and the channel they were written on.
struct Inbox {
    channel: Channel,
    incoming: mpsc::UnboundedReceiver<Pending>,
    /// The channel's publish counter: the watermark of a return seen now.
    written: Written,
    /// The highest publish number received so far.
    received: u64,
}

impl Inbox {
    /// Moves every publish already handed over into `queue` (after one taken from
    /// `incoming` directly), and notes the highest number received.
    fn pull(&mut self, queue: &mut VecDeque<Pending>) {
        while let Ok(p) = self.incoming.try_recv() {
            queue.push_back(p);
        }
        self.received = queue
            .back()
            .map_or(self.received, |p| p.seq.max(self.received));
    }
}

/// The confirm collector of one publisher channel. Ends when the publisher dropped its
/// sender and every confirm has resolved.
///
/// While the connection is blocked the broker confirms nothing (observed on 3.10: the
/// publish that makes RabbitMQ send `connection.blocked` is written, then its confirm waits
/// for the unblock), so every unanswered publish is answered in doubt as soon as the block is
/// seen, rather than after `confirm_timeout`.
async fn collect(
    mut inbox: Inbox,
    confirm_timeout: Duration,
    connection: ConnectionStatus,
    mut status: watch::Receiver<TransportStatus>,
) {
    let mut watching = true;
    let mut queue: VecDeque<Pending> = VecDeque::new();
    let mut returns = Returns::default();
    let mut batch: Vec<Done> = Vec::new();
    let sleep = tokio::time::sleep(confirm_timeout);
    tokio::pin!(sleep);
    let mut armed: Option<Instant> = None;
    loop {
        // Not a clear when the queue is empty: a return may belong to a publish that lapin
        // has confirmed but that has not been handed over yet (see `returns`).
        returns.expire(horizon(queue.front().map(|p| p.seq), inbox.received));
        if queue.is_empty() {
            match inbox.incoming.recv().await {
                Some(p) => queue.push_back(p),
                None => break,
            }
        }
        inbox.pull(&mut queue);
        if connection.blocked() {
            answer_in_doubt(&mut queue, Instant::now(), None);
        }
        let deadline = queue
            .iter()
            .find(|p| p.reply.is_some())
            .map(|p| p.published + confirm_timeout);
        if let Some(d) = deadline
            && armed.is_none_or(|at| at > d)
        {
            sleep.as_mut().reset(d);
            armed = Some(d);
        }
        let event = {
            let Some(front) = queue.front_mut() else {
                continue;
            };
            // New publishes are not waited for while one is pending: they queue up in
            // `incoming` and are taken in bulk on the next turn (and by `gather`), so a
            // publish does not wake the collector. Only the front confirm, the deadline
            // and the connection state do.
            tokio::select! {
                biased;
                r = &mut front.confirm => Event::Front(r),
                () = &mut sleep, if deadline.is_some() => Event::Deadline,
                changed = status.changed(), if watching => Event::Status(changed.is_ok()),
            }
        };
        match event {
            Event::Deadline => {
                armed = None;
                let now = Instant::now();
                if let Some(limit) = now.checked_sub(confirm_timeout) {
                    answer_in_doubt(&mut queue, now, Some(limit));
                }
            }
            // The loop checks the blocked flag on every turn.
            Event::Status(open) => watching = open,
            Event::Front(result) => {
                if let Some(pending) = queue.pop_front() {
                    batch.push(Done {
                        pending,
                        result,
                        own_return: None,
                    });
                }
                gather(
                    &mut inbox,
                    &mut queue,
                    &mut batch,
                    &mut returns,
                    confirm_timeout,
                )
                .await;
                answer(&mut batch, &mut returns, inbox.written.current());
            }
        }
    }
    debug!("publisher confirm collector finished");
}

/// Moves every already-resolved confirm at the front of `queue` into `batch`, behind a
/// barrier on lapin's acknowledgement lock, until a pass finds nothing new. Each pass first
/// waits (up to `limit`) for the publish being written, if any, to be handed over: lapin may
/// have confirmed it already, with a return of this batch on its confirm.
async fn gather(
    inbox: &mut Inbox,
    queue: &mut VecDeque<Pending>,
    batch: &mut Vec<Done>,
    returns: &mut Returns,
    limit: Duration,
) {
    loop {
        let _ = tokio::time::timeout(limit, inbox.written.settled()).await;
        returns.barrier(&inbox.channel, &inbox.written);
        inbox.pull(queue);
        let before = batch.len();
        while let Some(front) = queue.front_mut() {
            let Some(result) = (&mut front.confirm).now_or_never() else {
                break;
            };
            if let Some(pending) = queue.pop_front() {
                batch.push(Done {
                    pending,
                    result,
                    own_return: None,
                });
            }
        }
        if batch.len() == before {
            return;
        }
    }
}

/// Answers every publish in `batch`, in publish order. `watermark` is the publish counter
/// read after every confirm in the batch resolved.
fn answer(batch: &mut Vec<Done>, returns: &mut Returns, watermark: u64) {
    for done in batch.iter_mut() {
        let own = done.pending.message_id.as_deref();
        done.own_return = returns.carried(&mut done.result, own, watermark);
    }
    for done in batch.drain(..) {
        let Done {
            pending,
            result,
            own_return,
        } = done;
        let outcome = match result {
            Ok(LapinConfirmation::Nack(_)) => Ok(Confirmation::Nacked),
            Ok(_) => Ok(returns.outcome(own_return, pending.message_id.as_deref(), pending.seq)),
            Err(e) => Err(rejected(e, pending.exchange)),
        };
        if let Some(reply) = pending.reply.or(pending.late) {
            let _ = reply.send(outcome);
        }
    }
}

/// The error for a publish whose confirm was rejected. A channel close caused by another
/// publish (its text names a different exchange) is reported as [`TransportError::Closed`]:
/// this message was discarded with the channel, not refused. A rejection that is not the
/// broker refusing (the connection or channel went away under a written publish) is
/// [`TransportError::ConfirmLost`]: the broker may or may not have it.
fn rejected(error: lapin::Error, exchange: u64) -> TransportError {
    let mapped = from_lapin(error);
    let detail = match &mapped {
        TransportError::NotFound { detail }
        | TransportError::PreconditionFailed { detail }
        | TransportError::AccessRefused { detail } => detail,
        _ if mapped.kind() == ErrorKind::Refused => return mapped,
        _ => return lost(mapped),
    };
    match named_exchange(detail) {
        Some(named) if exchange_tag(named) != exchange => TransportError::Closed {
            detail: format!(
                "the publisher channel was closed by the broker because of another publish \
                 ({detail}); this message was not confirmed and may be published again"
            ),
        },
        _ => mapped,
    }
}

/// A written publish whose connection or channel failed before its confirm: in doubt,
/// keeping what failed as the source.
fn lost(cause: TransportError) -> TransportError {
    TransportError::ConfirmLost {
        detail: cause.to_string(),
        source: Some(std::sync::Arc::new(cause)),
    }
}
