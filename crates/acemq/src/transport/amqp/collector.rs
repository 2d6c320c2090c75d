//! The confirm collector of one confirm-mode channel: it receives every publish lapin has
//! queued, in order ([`Pending`]), waits for the front one to be written and confirmed,
//! gathers every later one already
//! resolved, and answers each publish by its own id (routed, unroutable, nacked, rejected,
//! or in doubt on a timeout or a block). Why it works this way is in `publisher`'s module
//! docs; the returns' bookkeeping is in `returns`.

use std::collections::VecDeque;
use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::time::Duration;

use futures::FutureExt;
use lapin::Confirmation as LapinConfirmation;
use lapin::{Channel, ConnectionStatus};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::debug;

use super::errors::{from_lapin, named_exchange};
use super::returns::{Returned, Returns, Written, horizon};
use crate::transport::{Confirmation, ErrorKind, TransportError, TransportStatus};

pub(super) type Reply = oneshot::Sender<Result<Confirmation, TransportError>>;

/// One publish after lapin queued its frames: the rest of `basic_publish` (the frames being
/// written) and then the `PublisherConfirm` it returned, as one future the collector polls.
pub(super) type Confirming = Pin<Box<dyn Future<Output = Resolved> + Send>>;

/// How a [`Confirming`] publish ended.
// A short-lived value, once per publish: boxing the confirmation would cost an allocation
// per confirm for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Resolved {
    /// lapin could not write the frames (the channel or connection failed first).
    Unwritten(lapin::Error),
    /// The frames were written; the broker's answer.
    Confirmed(lapin::Result<LapinConfirmation>),
}

/// One publish waiting for its confirm, in the collector's FIFO.
pub(super) struct Pending {
    /// `message_id`, exchange and routing key, to match returns (`None` without an id).
    pub(super) message_id: Option<String>,
    /// A hash of the exchange, to tell which publish a channel close was about.
    pub(super) exchange: u64,
    /// The publish's number on its channel ([`Written::begin`]), for matching returns.
    pub(super) seq: u64,
    /// When the frames were queued (the confirm deadline is `confirm_timeout` later).
    pub(super) published: Instant,
    pub(super) confirm: Confirming,
    /// `None` once answered (by a timeout).
    pub(super) reply: Option<Reply>,
    /// Where the broker's own answer goes when `reply` was answered in doubt first
    /// ([`ConfirmChannel::publish_tracked`]).
    pub(super) late: Option<Reply>,
}

/// A hash of an exchange name, to tell which publish a channel close was about.
pub(super) fn exchange_tag(exchange: &str) -> u64 {
    let mut h = DefaultHasher::new();
    exchange.hash(&mut h);
    h.finish()
}

/// A publish whose confirm has resolved, waiting to be answered with its batch.
struct Done {
    pending: Pending,
    result: Resolved,
    /// The return lapin attached to this publish's confirm when it is this publish's own.
    own_return: Option<Returned>,
}

// A short-lived stack value, once per collector turn (see `Resolved`).
#[allow(clippy::large_enum_variant)]
enum Event {
    Front(Resolved),
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
pub(super) struct Inbox {
    pub(super) channel: Channel,
    pub(super) incoming: mpsc::UnboundedReceiver<Pending>,
    /// The channel's publish counter: the watermark of a return seen now.
    pub(super) written: Written,
    /// The highest publish number received so far.
    pub(super) received: u64,
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
pub(super) async fn collect(
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
        if let Resolved::Confirmed(result) = &mut done.result {
            done.own_return = returns.carried(result, own, watermark);
        }
    }
    for done in batch.drain(..) {
        let Done {
            pending,
            result,
            own_return,
        } = done;
        let outcome = match result {
            Resolved::Unwritten(e) => Err(from_lapin(e)),
            Resolved::Confirmed(Ok(LapinConfirmation::Nack(_))) => Ok(Confirmation::Nacked),
            Resolved::Confirmed(Ok(_)) => {
                Ok(returns.outcome(own_return, pending.message_id.as_deref(), pending.seq))
            }
            Resolved::Confirmed(Err(e)) => Err(rejected(e, pending.exchange)),
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
