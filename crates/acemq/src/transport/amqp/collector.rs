//! The confirm collector of one confirm-mode channel: it receives every publish lapin has
//! queued, in order ([`Pending`]), waits for any of their confirms to resolve, gathers every
//! other one already resolved, sorts the returns they carry, and answers each publish by its
//! own id (routed, unroutable, nacked, rejected, or in doubt on a timeout or a block) as soon
//! as its own confirm is in: a publish is not kept waiting behind an older one whose confirm
//! is slower (a persistent message the broker confirms only once it is on disk), unless that
//! older one has the same return key (then they are answered in order, so that a return is
//! claimed by the publish it belongs to). Why it works this way is in `publisher`'s module
//! docs; the returns' bookkeeping is in `returns`.

use std::collections::VecDeque;
use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::task::{ArcWake, AtomicWaker};
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

/// A publish in the collector's queue (in publish order), its confirm being awaited in
/// [`Confirms`].
struct Waiting {
    pending: Pending,
    /// Its confirm's result once resolved, with the return lapin attached to it when that
    /// return is this publish's own (returns it carried for others are held already).
    done: Option<(Resolved, Option<Returned>)>,
}

/// Every confirm being awaited, each tagged with its publish's number.
type Confirms = FuturesUnordered<Tagged>;

/// A publish's confirm with its number: the boxed [`Confirming`] polled in place (wrapping it
/// in a second box, as `Box::pin(confirm.map(..))` did, cost an allocation per publish).
struct Tagged {
    seq: u64,
    confirm: Confirming,
}

impl Future for Tagged {
    type Output = (u64, Resolved);

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let seq = self.seq;
        self.confirm.as_mut().poll(cx).map(|r| (seq, r))
    }
}

// A short-lived stack value, once per collector turn (see `Resolved`).
#[allow(clippy::large_enum_variant)]
enum Event {
    Resolved(u64, Resolved),
    /// A publish may have been handed over (taken at the top of the next turn).
    Incoming,
    Deadline,
    Status(bool),
    Stranded,
}

/// Answers every unanswered publish in `queue` as in doubt, keeping the confirms (a return
/// they carry later still reaches the map).
fn answer_in_doubt(queue: &mut VecDeque<Waiting>, now: Instant, only_before: Option<Instant>) {
    for p in queue.iter_mut().map(|w| &mut w.pending) {
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

/// The waker a publisher polls its publish with the first time (under the channel's lock),
/// so that lapin wakes the collector, not the publisher, when the frames are written: a
/// publish handed over while the collector awaits other confirms does not wake it (one
/// task wake-up per publish fewer), it is taken on the collector's next turn, which the
/// publish's own progress causes.
///
/// The one race is a wake that lapin delivers after the first poll but before the publish
/// is in the inbox: the collector may run its turn too early and miss it. So the wakes are
/// counted, and a publisher that sees the count move while it handed over wakes the
/// collector itself ([`Handover::handed`]).
#[derive(Default)]
pub(super) struct Handover {
    collector: AtomicWaker,
    wakes: AtomicU64,
}

impl ArcWake for Handover {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.wakes.fetch_add(1, Ordering::SeqCst);
        arc_self.collector.wake();
    }
}

impl Handover {
    /// The wakes so far: read before the first poll of a publish.
    pub(super) fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::SeqCst)
    }

    /// Called once the publish is in the inbox: wakes the collector when lapin may already
    /// have used this waker (`wakes` moved since `before`) or will not (`settled`: the
    /// first poll finished the publish).
    pub(super) fn handed(self: &Arc<Self>, before: u64, settled: bool) {
        if settled || self.wakes() != before {
            ArcWake::wake_by_ref(self);
        }
    }

    /// Ready once a wake came since the collector last saw one (`seen`), registering the
    /// collector's waker first so that none is lost.
    fn woken(&self, seen: &mut u64) -> impl Future<Output = ()> {
        std::future::poll_fn(move |cx| {
            self.collector.register(cx.waker());
            let now = self.wakes();
            if now == *seen {
                return Poll::Pending;
            }
            *seen = now;
            Poll::Ready(())
        })
    }
}

/// What the collector receives publishes through, and the channel they were written on.
pub(super) struct Inbox {
    pub(super) channel: Channel,
    /// Publishes handed over; it wakes the collector only while it waits with nothing to
    /// collect (otherwise [`Handover`] does).
    pub(super) incoming: mpsc::UnboundedReceiver<Pending>,
    pub(super) handover: Arc<Handover>,
    /// The channel's publish counter: the watermark of a return seen now.
    pub(super) written: Written,
    /// The highest publish number received so far.
    pub(super) received: u64,
}

impl Inbox {
    /// Moves every publish already handed over into `queue` and its confirm into
    /// `confirms`, and notes the highest number received.
    fn pull(&mut self, queue: &mut VecDeque<Waiting>, confirms: &mut Confirms) {
        while let Ok(p) = self.incoming.try_recv() {
            enqueue(p, queue, confirms);
        }
        self.received = queue
            .back()
            .map_or(self.received, |w| w.pending.seq.max(self.received));
    }
}

/// Queues one publish and awaits its confirm (taken out of it) among `confirms`.
fn enqueue(mut p: Pending, queue: &mut VecDeque<Waiting>, confirms: &mut Confirms) {
    let seq = p.seq;
    let confirm = std::mem::replace(
        &mut p.confirm,
        Box::pin(futures::future::pending::<Resolved>()),
    );
    confirms.push(Tagged { seq, confirm });
    queue.push_back(Waiting {
        pending: p,
        done: None,
    });
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
    let mut seen_wakes = inbox.handover.wakes();
    let mut queue: VecDeque<Waiting> = VecDeque::new();
    let mut confirms = Confirms::new();
    let mut returns = Returns::default();
    let sleep = tokio::time::sleep(confirm_timeout);
    tokio::pin!(sleep);
    let mut armed: Option<Instant> = None;
    loop {
        // Not a clear when the queue is empty: a return may belong to a publish that lapin
        // has confirmed but that has not been handed over yet (see `returns`).
        returns.expire(horizon(
            queue.front().map(|w| w.pending.seq),
            inbox.received,
        ));
        if queue.is_empty() {
            match inbox.incoming.recv().await {
                Some(p) => enqueue(p, &mut queue, &mut confirms),
                None => break,
            }
        }
        inbox.pull(&mut queue, &mut confirms);
        if connection.blocked() {
            answer_in_doubt(&mut queue, Instant::now(), None);
        }
        let deadline = queue
            .iter()
            .find(|w| w.pending.reply.is_some())
            .map(|w| w.pending.published + confirm_timeout);
        if let Some(d) = deadline
            && armed.is_none_or(|at| at > d)
        {
            sleep.as_mut().reset(d);
            armed = Some(d);
        }
        // A new publish's progress (lapin, through [`Handover`]) wakes the collector, which
        // then polls it among the others, so that lapin wakes it when that confirm is in: a
        // publish is answered as soon as its own confirm is in, even while an older one's
        // is withheld. Publishes handed over meanwhile are taken in bulk on the next turn
        // (and by `gather`).
        let handover = inbox.handover.clone();
        let event = tokio::select! {
            biased;
            Some((seq, r)) = confirms.next() => Event::Resolved(seq, r),
            () = handover.woken(&mut seen_wakes), if !inbox.incoming.is_closed() => Event::Incoming,
            () = &mut sleep, if deadline.is_some() => Event::Deadline,
            changed = status.changed(), if watching => Event::Status(changed.is_ok()),
            // Every queued publish has its confirm awaited, or an older one with its key
            // has; so this is not reached while the queue holds anything.
            else => Event::Stranded,
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
            // The publisher being gone is seen at the top, once the confirms still awaited
            // are answered and the queue is empty.
            Event::Incoming => {}
            Event::Stranded => {
                debug!("confirm collector: queued publishes without a confirm to await");
                answer_in_doubt(&mut queue, Instant::now(), None);
                queue.retain(|w| w.done.is_some());
                answer(&mut queue, &mut returns);
                queue.clear();
            }
            Event::Resolved(seq, result) => {
                record(&mut queue, &mut returns, &inbox.written, seq, result);
                gather(
                    &mut inbox,
                    &mut queue,
                    &mut confirms,
                    &mut returns,
                    confirm_timeout,
                )
                .await;
                answer(&mut queue, &mut returns);
            }
        }
    }
    debug!("publisher confirm collector finished");
}

/// Notes the result of the publish numbered `seq` and sorts the return its confirm carries
/// (its own is kept with it; another publish's is held for that one).
fn record(
    queue: &mut VecDeque<Waiting>,
    returns: &mut Returns,
    written: &Written,
    seq: u64,
    mut result: Resolved,
) {
    let Ok(at) = queue.binary_search_by_key(&seq, |w| w.pending.seq) else {
        return;
    };
    let waiting = &mut queue[at];
    let own = match &mut result {
        Resolved::Confirmed(confirmation) => returns.carried(
            confirmation,
            waiting.pending.message_id.as_deref(),
            written.current(),
        ),
        Resolved::Unwritten(_) => None,
    };
    waiting.done = Some((result, own));
}

/// Every other confirm already resolved is recorded, behind a barrier on lapin's
/// acknowledgement lock, until a pass finds nothing new. Each pass first waits (up to
/// `limit`) for the publish being written, if any, to be handed over: lapin may have
/// confirmed it already, with the return of a publish about to be answered on its confirm.
async fn gather(
    inbox: &mut Inbox,
    queue: &mut VecDeque<Waiting>,
    confirms: &mut Confirms,
    returns: &mut Returns,
    limit: Duration,
) {
    loop {
        let _ = tokio::time::timeout(limit, inbox.written.settled()).await;
        returns.barrier(&inbox.channel, &inbox.written);
        inbox.pull(queue, confirms);
        let mut found = false;
        while let Some(Some((seq, result))) = confirms.next().now_or_never() {
            record(queue, returns, &inbox.written, seq, result);
            found = true;
        }
        if !found {
            return;
        }
    }
}

/// Answers every resolved publish that no older unanswered one shares a return key with,
/// in publish order, and takes it out of the queue; the others wait for their turn.
fn answer(queue: &mut VecDeque<Waiting>, returns: &mut Returns) {
    let mut at = 0;
    while at < queue.len() {
        let ready = queue[at].done.is_some() && {
            let key = queue[at].pending.message_id.as_deref();
            !queue
                .range(..at)
                .any(|older| older.pending.message_id.as_deref() == key)
        };
        if !ready {
            at += 1;
            continue;
        }
        let Some(Waiting {
            pending,
            done: Some((result, own_return)),
        }) = queue.remove(at)
        else {
            continue;
        };
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Context;

    use futures::task::{ArcWake, waker_ref};

    use super::Handover;

    /// A task's waker that counts its wakes.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl ArcWake for Task {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A collector parked on its hand-over waker (its first turn found nothing to take).
    struct Parked {
        handover: Arc<Handover>,
        task: Arc<Task>,
        seen: u64,
    }

    impl Parked {
        fn new() -> Parked {
            let handover = Arc::new(Handover::default());
            let seen = handover.wakes();
            let mut parked = Parked {
                handover,
                task: Arc::default(),
                seen,
            };
            assert!(!parked.turn(), "nothing to take yet");
            parked
        }

        /// Polls the collector's `woken` once, as its turn would, with the task's waker.
        fn turn(&mut self) -> bool {
            let waker = waker_ref(&self.task);
            let woken = self.handover.woken(&mut self.seen);
            futures::pin_mut!(woken);
            woken.poll(&mut Context::from_waker(&waker)).is_ready()
        }

        /// How often the collector's task was woken.
        fn woken(&self) -> usize {
            self.task.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn lapin_waking_a_handed_over_publish_wakes_the_collector_once() {
        let mut c = Parked::new();
        // A publish polled first with the handover's waker, handed over: no wake by itself.
        let before = c.handover.wakes();
        c.handover.handed(before, false);
        assert_eq!(c.woken(), 0);
        // lapin wrote its frames: the collector is woken and its turn takes it.
        ArcWake::wake_by_ref(&c.handover);
        assert_eq!(c.woken(), 1);
        assert!(c.turn());
        assert!(!c.turn(), "one wake, one turn");
    }

    #[test]
    fn a_wake_before_the_publish_was_in_the_inbox_is_given_again() {
        let mut c = Parked::new();
        let before = c.handover.wakes();
        // lapin wakes between the first poll and the handover; the collector's turn runs
        // then and finds the inbox empty.
        ArcWake::wake_by_ref(&c.handover);
        assert!(c.turn());
        assert!(!c.turn());
        // The publisher sees the count moved: it wakes the collector for another turn.
        c.handover.handed(before, false);
        assert_eq!(c.woken(), 2);
        assert!(c.turn());
    }

    #[test]
    fn a_publish_finished_by_its_first_poll_wakes_the_collector() {
        let mut c = Parked::new();
        c.handover.handed(c.handover.wakes(), true);
        assert_eq!(c.woken(), 1);
        assert!(c.turn());
    }
}
