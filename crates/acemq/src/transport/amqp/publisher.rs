//! Publishing with confirms on one confirm-mode channel ([`ConfirmChannel`]); the confirm
//! collector that answers each publish is in `collector`.
//!
//! # Why it is built like this
//!
//! * **One `basic_publish` at a time per channel.** lapin registers the confirm tag and
//!   queues the frames under different locks, so two concurrent `basic_publish` calls on one
//!   channel could pair a `PublisherConfirm` with the other message. Calls are serialized
//!   under an async mutex that is held for one poll of `basic_publish`: lapin registers the
//!   confirm and queues the frames before its first await (lapin 4.12, `channel.rs`). The
//!   rest (the frames being written, then the confirm) is awaited by the collector, so
//!   publishes made while lapin writes go out together in one socket write, as they do
//!   when raw lapin callers publish concurrently. (Holding the lock until the frames were
//!   written made every publish its own write and its own wake-up of lapin's I/O thread:
//!   1.0 `sendto` per publish against raw lapin's 0.66 in the request/reply bench.) That
//!   first poll is made with the collector's waker (`collector::Handover`), so lapin wakes
//!   the collector when the frames are written, and handing the publish over does not wake
//!   it a second time.
//! * **Returns are matched by `message_id`, exchange and routing key.** The engine
//!   republishes a message under its own id (a retry hop, a dead letter), so the id alone
//!   can name two publishes in flight at once; the destination tells them apart. A return
//!   that lapin attached to a publish with the same key is that publish's own. lapin hands
//!   a `basic.return` to whichever pending confirm completes next, and a `multiple=true` ack
//!   completes its tags in `HashMap` order, so a return can ride on another publish's
//!   confirm (or on a dropped one, handed over by `wait_for_confirms`). Every confirm goes,
//!   in publish order, to a collector task (one per publisher channel). When any one
//!   resolves, the collector gathers every other confirm that is already resolved, collects
//!   the returns carried by all of them, and answers each publish by its own id: routed,
//!   unroutable or nacked. A publish is not held back by an older one whose confirm is
//!   slower (a persistent message is confirmed once on disk, a transient reply at once),
//!   unless the older one has the same return key: those are answered in publish order. Before it gathers, it takes lapin's acknowledgement lock once
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
//!   lapin, they stay queued and go out after the unblock: that publish is in doubt too, and
//!   its late answer (below) is the broker's answer once they went out.
//! * **The late answer.** A publish made with `publish_tracked` (the engine's moves) keeps
//!   a second reply: when its first answer was in doubt (a timeout or a block) the
//!   collector sends the broker's own answer there once the confirm resolves, so a move
//!   waits for it instead of publishing a second copy that would also be delivered.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel};
use tokio::sync::{Mutex, mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::debug;

use super::collector::{Confirming, Handover, Inbox, Pending, Resolved, collect, exchange_tag};
use super::convert;
use super::errors::from_lapin;
use super::link::{HANDSHAKE_TIMEOUT, Link};
use super::returns::{Written, return_key};
use crate::transport::{
    BoxFuture, Confirmation, Outbound, PendingConfirm, TrackedConfirm, TransportError,
    TransportStatus,
};

/// The live publisher channel and its collector.
struct Live {
    /// Shared: each publish takes a handle for its frames, one count (cloning lapin's
    /// `Channel` counts each of its shared parts, a dozen atomic updates and as many on drop).
    channel: Arc<Channel>,
    collector: mpsc::UnboundedSender<Pending>,
    /// The waker each publish is first polled with (it wakes the collector).
    handover: Arc<Handover>,
    /// Numbers the publishes on this channel; shared with the collector.
    written: Written,
}

struct State {
    live: Option<Live>,
    status: watch::Receiver<TransportStatus>,
    closed: bool,
}

/// The publishing side of the transport: the publishing connection's link and its one
/// confirm-mode channel (opened again after it closes), with that channel's collector.
pub(crate) struct ConfirmChannel {
    link: Link,
    state: Mutex<State>,
    confirm_timeout: Duration,
    /// How long a publish waits for a recovering connection.
    publish_wait: Duration,
}

impl std::fmt::Debug for ConfirmChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfirmChannel")
            .field("confirm_timeout", &self.confirm_timeout)
            .finish_non_exhaustive()
    }
}

impl ConfirmChannel {
    pub(crate) fn new(
        link: Link,
        status: watch::Receiver<TransportStatus>,
        confirm_timeout: Duration,
        publish_wait: Duration,
    ) -> Self {
        ConfirmChannel {
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
    /// [`TransportError::NotConnected`] (nothing sent) otherwise. Boxed: a rare wait, kept
    /// out of every publish's future.
    fn ready<'a>(
        &'a self,
        status: &'a mut watch::Receiver<TransportStatus>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if self.link.ready() {
                return Ok(());
            }
            let deadline = Instant::now() + self.publish_wait;
            while Instant::now() < deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                let _ =
                    tokio::time::timeout(left.min(Duration::from_millis(100)), status.changed())
                        .await;
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
    pub(crate) fn publish(
        &self,
        m: Outbound,
    ) -> BoxFuture<'_, Result<PendingConfirm, TransportError>> {
        match Prepared::of(m) {
            Ok(p) => Box::pin(self.publish_inner(p, false).map(|r| r.map(|t| t.answer))),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// [`ConfirmChannel::publish`], keeping the broker's own answer for a publish answered
    /// in doubt while its confirm can still arrive (a timeout, or a block seen after it was
    /// written): [`TrackedConfirm::late`].
    pub(crate) fn publish_tracked(
        &self,
        m: Outbound,
    ) -> BoxFuture<'_, Result<TrackedConfirm, TransportError>> {
        match Prepared::of(m) {
            Ok(p) => Box::pin(self.publish_inner(p, true)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// `p` goes in whole and its fields are used in place: the future keeps one copy of the
    /// message (an `async fn` keeps its arguments, and a value moved out of one still holds
    /// its place), so it stays small enough for glibc's per-thread cache.
    async fn publish_inner(
        &self,
        p: Prepared,
        track: bool,
    ) -> Result<TrackedConfirm, TransportError> {
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
        let healthy = state
            .live
            .as_ref()
            .is_some_and(|l| l.channel.status().connected());
        if !healthy {
            if state.live.take().is_some() {
                debug!("the publisher channel was closed; opening a new one");
            }
            state.live = Some(self.open(&state.status, &conn).await?);
        }
        let Some(live) = state.live.as_ref() else {
            return Err(TransportError::Closed {
                detail: "no publisher channel".into(),
            });
        };
        state.status.mark_unchanged();
        let started = Instant::now();
        // Numbered before lapin gets the frames, and in flight until handed over (see
        // `returns`).
        let in_flight = live.written.begin();
        let channel = live.channel.clone();
        let Prepared {
            exchange,
            routing_key,
            properties,
            body,
            options,
            message_id,
            exchange_hash,
        } = p;
        let mut confirm: Confirming = Box::pin(async move {
            match channel
                .basic_publish(exchange, routing_key, options, &body, properties)
                .await
            {
                Ok(confirm) => Resolved::Confirmed(confirm.await),
                Err(e) => Resolved::Unwritten(e),
            }
        });
        // The first poll registers the confirm and queues the frames (lapin does both before
        // its first await), under the lock: what the one-at-a-time rule needs. Waiting for the
        // frames to be written is the collector's part, so publishes queued meanwhile go out
        // in one write; lapin wakes the collector for it ([`Handover`]).
        let wakes = live.handover.wakes();
        let waker = futures::task::waker_ref(&live.handover);
        let settled = match confirm.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Pending => false,
            Poll::Ready(Resolved::Unwritten(e)) => return Err(from_lapin(e)),
            Poll::Ready(confirmed) => {
                confirm = Box::pin(futures::future::ready(confirmed));
                true
            }
        };
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
        live.handover.handed(wakes, settled);
        drop((guard, in_flight));
        Ok(TrackedConfirm {
            answer: awaited(answer),
            late: late_answer.map(awaited),
        })
    }

    /// Opens a publisher channel in confirm mode, with its collector. Boxed and made by a
    /// plain function: opening is rare, and lapin's channel handshake would otherwise be part
    /// of every publish's future (too large for glibc's per-thread cache to serve).
    fn open<'a>(
        &'a self,
        status: &'a watch::Receiver<TransportStatus>,
        conn: &'a lapin::Connection,
    ) -> BoxFuture<'a, Result<Live, TransportError>> {
        Box::pin(async move {
            // Bounded: on a connection cut just after its handshake, lapin may never answer
            // `channel.open`, and this publish holds the state lock the redial's reset
            // waits for (seen in the flapping-link drill: the publish side never recovered).
            let opening = async {
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
                Ok::<_, TransportError>(channel)
            };
            let channel = tokio::time::timeout(HANDSHAKE_TIMEOUT, opening)
                .await
                .map_err(|_| TransportError::NotConnected {
                    detail: format!(
                        "the broker did not open a publisher channel within {HANDSHAKE_TIMEOUT:?} (the connection is going away)"
                    ),
                })??;
            let (collector, incoming) = mpsc::unbounded_channel();
            let handover = Arc::new(Handover::default());
            let written = Written::default();
            tokio::spawn(collect(
                Inbox {
                    channel: channel.clone(),
                    incoming,
                    handover: handover.clone(),
                    written: written.clone(),
                    received: 0,
                },
                self.confirm_timeout,
                conn.status().clone(),
                status.clone(),
            ));
            Ok(Live {
                channel: Arc::new(channel),
                collector,
                handover,
                written,
            })
        })
    }

    /// Refuses further publishes. The channel is kept until [`ConfirmChannel::release`]:
    /// dropping its last handle sends `channel.close`, which would race with the connection
    /// close.
    pub(crate) async fn refuse(&self) {
        self.state.lock().await.closed = true;
    }

    /// Drops the publisher channel; its collector finishes once every confirm is answered
    /// (closing the connection rejects whatever was still unconfirmed).
    pub(crate) async fn release(&self) {
        self.state.lock().await.live = None;
    }
}

/// One publish as lapin takes it, converted before its future starts (so the future holds
/// this, not the [`Outbound`] too).
struct Prepared {
    exchange: ShortString,
    routing_key: ShortString,
    properties: BasicProperties,
    body: Bytes,
    options: BasicPublishOptions,
    /// The return key ([`return_key`]), when the message has an id.
    message_id: Option<String>,
    /// [`exchange_tag`] of the exchange.
    exchange_hash: u64,
}

impl Prepared {
    fn of(m: Outbound) -> Result<Prepared, TransportError> {
        let Outbound {
            exchange,
            routing_key,
            mandatory,
            properties,
            body,
        } = m;
        crate::topology::check_short(&exchange)?;
        crate::topology::check_short(&routing_key)?;
        let message_id = properties
            .message_id
            .as_deref()
            .map(|id| return_key(id, &exchange, &routing_key));
        Ok(Prepared {
            exchange_hash: exchange_tag(&exchange),
            message_id,
            exchange: convert::short("exchange", exchange)?,
            routing_key: convert::short("routing key", routing_key)?,
            properties: convert::to_basic(properties)?,
            body,
            options: BasicPublishOptions {
                mandatory,
                immediate: false,
            },
        })
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
