//! The engine: the state everything a [`Connection`](crate::Connection) hands out shares,
//! and the operations they all build on.
//!
//! One [`Engine`] per connection, held as `Arc<Engine>` by the connection handle, every
//! publisher, consumer (through its settler) and replay. It owns:
//!
//! - the transport and the origin (`{client}@{hostname}`) stamped on what it publishes;
//! - the **confirm window**: a semaphore of publishes awaiting their confirm (default 1000
//!   per connection), so memory stays flat under load;
//! - **`publish_on_behalf`**, the one path every move the engine makes (retry hop, dead
//!   letter, park, replay) goes through: mandatory, confirmed, never refused by a pause,
//!   with a confirm window of its own ([`MOVE_WINDOW`]) so a full application window never
//!   holds a move up;
//! - the copies those moves publish ([`copy_as_delivered`], [`Engine::copy_with`]) and
//!   their sizing against the negotiated `frame_max` ([`Engine::fit`]): the reason is cut
//!   first, and a copy the delivered headers alone make too large is refused before it is
//!   sent (one bad message never closes a connection);
//! - declaring a topology, and a consumer's share of one (one loop for both), and knowing
//!   which source queues carry the contract's dead-letter arguments (`acemq.dlx` →
//!   `{q}.dlq`), so a consumer knows whether a reject without requeue moves a message to
//!   `{q}.dlq`: the queues this engine declared so, and any other queue once the broker
//!   took a declaration of it with exactly those arguments
//!   ([`Engine::dead_letters_natively`]; cached per queue, a refusal rechecked after
//!   [`DEAD_LETTER_RECHECK`]);
//! - the pause flag for publishing, the consumers' [`Lifecycle`], the interceptors and the
//!   health registry, with the connection's health report built from them.
//!
//! Nothing here knows the façade: `connection/` sits on top and delegates down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::envelope::{self, Envelope, origin_for};
use crate::error::Error;
use crate::headers::HeaderValue;
use crate::health::progress::{consumers_report, keyed_by_queue, store_report};
use crate::health::{Health, HealthContributor, HealthRegistry, HealthStatus, connection_report};
use crate::intercept::Interceptors;
use crate::lifecycle::{ABANDON_AFTER, Lifecycle};
use crate::retry::RetryPolicy;
use crate::topology::{
    DEAD_LETTER_EXCHANGE, QueueDecl, Topology, dead_letter_queue, source_dead_letter_arguments,
};
use crate::transport::{
    Confirmation, Delivery, HEADER_MARGIN, Outbound, PendingConfirm, Transport, TransportError,
    header_frame_size,
};
use crate::util::lock;

/// Confirms the engine's own moves (retry hops, dead letters, parks, in-progress copies,
/// replays) may await at once, apart from the application's window: a move never waits
/// behind application publishes.
pub const MOVE_WINDOW: usize = 64;

/// How long a queue found without the contract's dead-letter arguments is believed to be so
/// before the broker is asked again.
pub const DEAD_LETTER_RECHECK: Duration = Duration::from_secs(60);

/// What is known about a source queue's dead-letter arguments.
#[derive(Clone, Debug)]
enum DeadLetterArgs {
    /// It carries the contract's (declared so by this engine, or the broker said so).
    Yes,
    /// The broker refused a declaration with them (`why`), at `checked`.
    No {
        why: String,
        checked: tokio::time::Instant,
    },
}

/// A copy that cannot be sent: its content header would be over the connection's
/// `frame_max` even with the reason cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TooLarge {
    /// The header frame's size with the reason cut away.
    pub(crate) header: usize,
    /// The negotiated `frame_max`.
    pub(crate) frame_max: u32,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its headers need a {}-byte header frame, over the connection's frame_max of {} (less {HEADER_MARGIN} bytes kept free)",
            self.header, self.frame_max
        )
    }
}

/// State shared by everything a connection hands out, and what they all build on.
pub(crate) struct Engine {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) origin: String,
    window: Arc<Semaphore>,
    /// The engine's own confirm window ([`MOVE_WINDOW`]).
    moves: Arc<Semaphore>,
    /// Source queues known to carry the contract's dead-letter arguments, or not.
    dead_letter_args: Mutex<HashMap<String, DeadLetterArgs>>,
    publishing_paused: AtomicBool,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) interceptors: Interceptors,
    health: HealthRegistry,
    /// Held by one replay pass or peek at a time: they share the transport's basic.get
    /// channel, and hand held messages back with one `multiple` nack.
    pub(crate) gets: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("transport", &self.transport.kind())
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine over an open transport, stamping `{client_name}@{hostname}` and allowing
    /// `max_outstanding_confirms` publishes to await their confirm at once.
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        client_name: &str,
        max_outstanding_confirms: usize,
    ) -> Arc<Engine> {
        Arc::new(Engine {
            transport,
            origin: origin_for(client_name),
            window: Arc::new(Semaphore::new(max_outstanding_confirms)),
            moves: Arc::new(Semaphore::new(MOVE_WINDOW)),
            dead_letter_args: Mutex::new(HashMap::new()),
            publishing_paused: AtomicBool::new(false),
            lifecycle: Lifecycle::default(),
            interceptors: Interceptors::default(),
            health: HealthRegistry::new(),
            gets: tokio::sync::Mutex::new(()),
        })
    }

    // --- The confirm window -------------------------------------------------------------

    /// Waits for a slot in the confirm window; [`Error::Closed`] once it is closed.
    pub(crate) async fn acquire(&self) -> Result<OwnedSemaphorePermit, Error> {
        self.window
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::Closed)
    }

    /// A slot in the confirm window if one is free now.
    pub(crate) fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.window.clone().try_acquire_owned().ok()
    }

    /// Whether user publishes are refused ([`Error::PublishingPaused`]).
    pub(crate) fn publishing_paused(&self) -> bool {
        self.publishing_paused.load(Ordering::SeqCst)
    }

    /// Pauses or resumes user publishes (moves made on someone's behalf go on).
    pub(crate) fn set_publishing_paused(&self, paused: bool) {
        self.publishing_paused.store(paused, Ordering::SeqCst);
    }

    // --- Moves made on a caller's behalf ------------------------------------------------

    /// Publishes a message the engine moves on a caller's behalf (retry hop, dead letter,
    /// park, replay): always mandatory and confirmed, never refused by a publishing pause,
    /// in the engine's own confirm window ([`MOVE_WINDOW`]), so application publishes that
    /// fill theirs never hold it up. Returns the broker's confirmation so the caller can ack
    /// the original only when the copy was confirmed *and routed*. The caller sizes the
    /// copy first ([`Engine::fit`]).
    pub(crate) fn publish_on_behalf(
        &self,
        outbound: Outbound,
    ) -> impl Future<Output = Result<Confirmation, TransportError>> + Send + '_ {
        self.publish_move(outbound).map(|(answer, _)| answer)
    }

    /// [`Engine::publish_on_behalf`] for a move whose original is acked only once its copy
    /// landed: besides the answer, for an answer in doubt
    /// ([`TransportError::ConfirmTimeout`]) while the confirm can still arrive, the broker's
    /// own answer to wait for ([`TrackedConfirm::late`](crate::transport::TrackedConfirm)),
    /// holding its slot in the move window until it resolves. Publishing the copy again
    /// instead would make two copies when the first one lands too.
    /// A plain function: its future holds the copy once (as an `async fn`, a reply's
    /// publish was 1,000 bytes instead of 584).
    pub(crate) fn publish_move(
        &self,
        mut outbound: Outbound,
    ) -> impl Future<Output = (Result<Confirmation, TransportError>, Option<PendingConfirm>)> + Send + '_
    {
        outbound.mandatory = true;
        async move {
            let Ok(permit) = self.moves.clone().acquire_owned().await else {
                let closed = TransportError::Closed {
                    detail: "connection closed".into(),
                };
                return (Err(closed), None);
            };
            let tracked = match self.transport.publish_tracked(outbound).await {
                Ok(tracked) => tracked,
                Err(e) => return (Err(e), None),
            };
            let answer = tracked.answer.await;
            let late = match (&answer, tracked.late) {
                (Err(TransportError::ConfirmTimeout { .. }), Some(late)) => {
                    let late: PendingConfirm = Box::pin(async move {
                        let _permit = permit;
                        late.await
                    });
                    Some(late)
                }
                _ => None,
            };
            (answer, late)
        }
    }

    /// A message published on a caller's behalf ([`Engine::publish_move`]: mandatory,
    /// confirmed, not refused by a publishing pause) that must land: `Ok` only when the
    /// broker confirmed it routed. A confirm in doubt is waited for, never answered by
    /// publishing again. What the scheduler's hops and deliveries and a pipeline's hops
    /// use before they ack what they came from.
    pub(crate) async fn publish_landed(&self, mut message: Outbound) -> Result<(), Error> {
        if let Err(e) = self.fit(&mut message) {
            return Err(Error::InvalidArgument(format!(
                "the message's headers ({} bytes) do not fit the connection's frame size ({} bytes): send fewer or smaller headers",
                e.header, e.frame_max
            )));
        }
        let id = message.properties.message_id.clone().unwrap_or_default();
        let (exchange, routing_key) = (message.exchange.clone(), message.routing_key.clone());
        let (answer, late) = self.publish_move(message).await;
        let answer = match (answer, late) {
            (Err(_), Some(late)) => late.await,
            (answer, _) => answer,
        };
        match answer.map_err(Error::Transport)? {
            Confirmation::Routed => Ok(()),
            Confirmation::Unroutable { reply_text, .. } => Err(Error::Unroutable {
                exchange,
                routing_key,
                message_id: id,
                reply_text,
            }),
            _ => Err(Error::Nacked { message_id: id }),
        }
    }

    /// Sizes a copy against the connection's `frame_max` (less [`HEADER_MARGIN`]): when
    /// its content header is too large, the reason (`x-acemq-error`) is cut to fit (with a
    /// marker); when the other headers alone leave no room, [`TooLarge`] (the copy cannot
    /// be sent at all; the reason header is then removed).
    pub(crate) fn fit(&self, copy: &mut Outbound) -> Result<(), TooLarge> {
        fit_to(copy, self.transport.frame_max())
    }

    /// A copy of `d` for `target` through the default exchange: everything as delivered,
    /// then the envelope fields rewritten from `envelope` (this engine's origin stamped
    /// when it has none) and `message_id` set to its id.
    pub(crate) fn copy_with(&self, d: &Delivery, target: &str, envelope: &Envelope) -> Outbound {
        let mut copy = copy_as_delivered(d, target);
        envelope.write(&mut copy.properties.headers, &self.origin);
        copy.properties.message_id = Some(envelope.id().to_owned());
        copy
    }

    // --- Topology -----------------------------------------------------------------------

    /// Declares every exchange, queue and binding of a topology, in that order.
    pub(crate) async fn declare(&self, topology: &Topology) -> Result<(), Error> {
        self.declare_items(topology, |_, e| e.into()).await?;
        let mut known = lock(&self.dead_letter_args);
        for q in topology.queues() {
            let arg = |k: &str| q.arguments.get(k).and_then(HeaderValue::as_str);
            if arg("x-dead-letter-exchange") == Some(DEAD_LETTER_EXCHANGE)
                && arg("x-dead-letter-routing-key") == Some(&dead_letter_queue(&q.name))
            {
                known.insert(q.name.clone(), DeadLetterArgs::Yes);
            }
        }
        Ok(())
    }

    /// Whether `queue` carries the contract's dead-letter arguments (`acemq.dlx`,
    /// `{q}.dlq`), so that a reject without requeue makes the broker move a message to
    /// `{q}.dlq` itself; `Err(why)` when it does not, or that cannot be told now.
    ///
    /// Known at once for a queue this engine declared so. For any other queue (declared by
    /// another service, an operator, another connection) the broker is asked once: the
    /// queue is declared, without being remembered for recovery, with exactly the
    /// arguments [`queue_with_dead_letter`](crate::topology::TopologyBuilder::queue_with_dead_letter)
    /// declares (a quorum queue, `x-dead-letter-exchange`, `x-dead-letter-routing-key`);
    /// taken, they match; refused (406 PRECONDITION_FAILED, which closes only the channel
    /// it was tried on), they do not. Both answers are cached; a refusal is asked again
    /// after [`DEAD_LETTER_RECHECK`]. A queue that is missing, or a broker that cannot be
    /// asked, is not cached.
    pub(crate) async fn dead_letters_natively(&self, queue: &str) -> Result<(), String> {
        match lock(&self.dead_letter_args).get(queue) {
            Some(DeadLetterArgs::Yes) => return Ok(()),
            Some(DeadLetterArgs::No { why, checked })
                if checked.elapsed() < DEAD_LETTER_RECHECK =>
            {
                return Err(why.clone());
            }
            _ => {}
        }
        // Never create it: a declaration of a queue that is gone would.
        if let Err(e) = self.transport.inspect_queue(queue).await {
            return Err(format!("{queue} could not be looked at: {e}"));
        }
        let mut decl = QueueDecl::quorum(queue);
        decl.arguments.extend(source_dead_letter_arguments(queue));
        let known = match self.transport.check_queue(&decl).await {
            Ok(_) => DeadLetterArgs::Yes,
            Err(e @ TransportError::PreconditionFailed { .. }) => DeadLetterArgs::No {
                why: format!(
                    "{queue} does not carry the contract's dead-letter arguments (a quorum queue with x-dead-letter-exchange: {DEAD_LETTER_EXCHANGE}, x-dead-letter-routing-key: {}): {e}",
                    dead_letter_queue(queue)
                ),
                checked: tokio::time::Instant::now(),
            },
            Err(e) => {
                return Err(format!(
                    "whether {queue} carries the dead-letter arguments could not be checked: {e}"
                ));
            }
        };
        let answer = match &known {
            DeadLetterArgs::Yes => Ok(()),
            DeadLetterArgs::No { why, .. } => Err(why.clone()),
        };
        lock(&self.dead_letter_args).insert(queue.to_owned(), known);
        answer
    }

    /// Declares what a consumer of `queue` needs (`acemq.dlx`, `{q}.dlq`, `{q}.parked`, the
    /// rungs of a policy with broker waits; never the source queue); refuses, naming the
    /// item, when it cannot.
    pub(crate) async fn declare_for_consumer(
        &self,
        queue: &str,
        policy: Option<&RetryPolicy>,
    ) -> Result<(), Error> {
        self.declare_consumer_topology(queue, &Topology::for_consumer(queue, policy))
            .await
    }

    /// Declares a consumer's share of the topology (`topology`), refusing, naming the item
    /// and the consumed `queue`, when it cannot.
    pub(crate) async fn declare_consumer_topology(
        &self,
        queue: &str,
        topology: &Topology,
    ) -> Result<(), Error> {
        self.declare_items(topology, |item, source| Error::ConsumerTopology {
            queue: queue.to_owned(),
            item,
            source,
        })
        .await
    }

    /// The one declare loop: exchanges, queues, bindings, in that order; the first failure
    /// becomes `refused(item, error)`.
    async fn declare_items(
        &self,
        topology: &Topology,
        refused: impl Fn(String, TransportError) -> Error,
    ) -> Result<(), Error> {
        let t = &self.transport;
        for e in topology.exchanges() {
            t.declare_exchange(e)
                .await
                .map_err(|s| refused(format!("exchange {}", e.name), s))?;
        }
        for q in topology.queues() {
            t.declare_queue(q)
                .await
                .map_err(|s| refused(format!("queue {}", q.name), s))?;
        }
        for b in topology.bindings() {
            t.bind_queue(b).await.map_err(|s| {
                refused(
                    format!("binding {} <- {} ({})", b.queue, b.exchange, b.routing_key),
                    s,
                )
            })?;
        }
        Ok(())
    }

    // --- Health -------------------------------------------------------------------------

    /// The connection's health from local state only: the transport's status, handler
    /// counts and pauses, the consumers (with their progress), their idempotency stores,
    /// and every registered contributor.
    ///
    /// The `consumers` report is Degraded when a consumer stopped on its own or is
    /// *stalled* (it holds deliveries and settled none for its `stall_after`), with the
    /// reason under `stopped.{queue}` / `stalled.{queue}`; per consumer it also gives
    /// `{queue}.lastDelivery`, `{queue}.lastSettlement` (RFC 3339, UTC), `{queue}.inFlight`
    /// (admitted, not finished), `{queue}.running`, `{queue}.waiting` (admitted, handler not
    /// running: a wait or a move), `{queue}.held` (at the pause gate), `{queue}.movesFailing`
    /// and `{queue}.setAsideFailed`. The `idempotency` report (present when a running
    /// consumer uses a store) is Degraded while a store does not answer. Neither is ever
    /// Down: Down is for a closed connection only.
    pub(crate) fn health(&self) -> Health {
        let lifecycle = &self.lifecycle;
        let mut extra: Vec<(&str, serde_json::Value)> = vec![
            (
                "transport",
                crate::observe::transport_name(self.transport.kind()).into(),
            ),
            ("inFlight", (lifecycle.in_flight() as u64).into()),
            ("held", (lifecycle.held() as u64).into()),
        ];
        if lifecycle.consuming_paused() {
            extra.push(("consuming", "paused".into()));
        }
        if lifecycle.draining() {
            extra.push(("draining", true.into()));
        }
        if self.publishing_paused() {
            extra.push(("publishing", "paused".into()));
        }
        let progress = keyed_by_queue(lifecycle.progress());
        let consumers = consumers_report(
            lifecycle.stopped_consumers(),
            lifecycle.running_consumers(),
            &progress,
        );
        let status = self.transport.status();
        let mut connection = connection_report(&status, &extra);
        if !status.connected && self.transport.recovering() {
            // Lost and being redialled: not Down (`docs/wire.md` §9: Down is reserved for a
            // closed connection, and a restart would fix nothing), but not fine either.
            connection.status = HealthStatus::Degraded;
            connection = connection.with_detail("recovering", true);
        }
        let store = store_report(&progress);
        self.health
            .evaluate_with([connection, consumers].into_iter().chain(store))
    }

    /// Adds a component to the health report.
    pub(crate) fn register_health(&self, contributor: Arc<dyn HealthContributor>) {
        self.health.register(contributor);
    }

    /// Removes the component registered under `name` (an ordered consumer that closed).
    pub(crate) fn unregister_health(&self, name: &str) {
        self.health.unregister(name);
    }

    /// Whether a component is registered under `name`.
    pub(crate) fn has_health(&self, name: &str) -> bool {
        self.health.names().iter().any(|n| n == name)
    }

    // --- Draining and closing -----------------------------------------------------------

    /// Pauses consuming and waits for running handlers; `false` when `timeout` passed first.
    pub(crate) async fn drain_consumers(&self, timeout: Duration) -> bool {
        self.lifecycle.set_paused(true);
        self.lifecycle.set_draining();
        self.lifecycle.wait_idle(timeout).await
    }

    /// Shuts the consumers (up to [`ABANDON_AFTER`] for running handlers), then closes the
    /// transport.
    pub(crate) async fn close_now(&self) -> Result<(), Error> {
        let finished = self.lifecycle.shut_consumers(ABANDON_AFTER).await;
        if !finished {
            tracing::warn!(
                in_flight = self.lifecycle.in_flight(),
                "closing with handlers still running; they are abandoned and their messages will be redelivered"
            );
        }
        // Publishes from here on are answered Error::Closed (kind Closed: closed by its
        // owner), not a transient transport error; permits already held are unaffected.
        self.window.close();
        self.moves.close();
        self.transport.close().await?;
        Ok(())
    }
}

/// A copy of `d` for `target` through the default exchange, exactly as delivered (body,
/// properties and every header), mandatory.
pub(crate) fn copy_as_delivered(d: &Delivery, target: &str) -> Outbound {
    Outbound {
        exchange: String::new(),
        routing_key: target.to_owned(),
        mandatory: true,
        properties: crate::transport::Properties::clone(&d.properties),
        body: d.body.clone(),
    }
}

/// [`Engine::fit`] against a given `frame_max`.
pub(crate) fn fit_to(copy: &mut Outbound, frame_max: u32) -> Result<(), TooLarge> {
    const MARKER: &str = "... [truncated]";
    let limit = (frame_max as usize).saturating_sub(HEADER_MARGIN);
    let size = header_frame_size(&copy.properties);
    if size <= limit {
        return Ok(());
    }
    let headers = &mut copy.properties.headers;
    let reason = match headers.remove(envelope::ERROR) {
        Some(HeaderValue::Str(r)) => r,
        other => {
            // No reason to cut (or not a string): what is left is the headers as delivered.
            if let Some(v) = other {
                headers.insert(envelope::ERROR.into(), v);
            }
            return Err(TooLarge {
                header: size,
                frame_max,
            });
        }
    };
    // Without the reason: the entry (key, type, length) and its text are what can be cut.
    let without = header_frame_size(&copy.properties);
    let entry = 1 + envelope::ERROR.len() + 1 + 4;
    let room = limit.saturating_sub(without + entry);
    if without + entry > limit || room < MARKER.len() + 16 {
        return Err(TooLarge {
            header: without,
            frame_max,
        });
    }
    let mut end = room.min(reason.len()).saturating_sub(MARKER.len());
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let cut = format!("{}{MARKER}", &reason[..end]);
    copy.properties
        .headers
        .insert(envelope::ERROR.into(), HeaderValue::Str(cut));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Properties;

    fn copy_with_headers(filler: usize, reason: &str) -> Outbound {
        let mut p = Properties::default();
        p.headers
            .insert("filler".into(), HeaderValue::Str("f".repeat(filler)));
        p.headers
            .insert(envelope::ERROR.into(), HeaderValue::Str(reason.into()));
        Outbound::new("", "q.dlq", p, "body")
    }

    #[test]
    fn a_copy_that_fits_is_left_alone() {
        let mut c = copy_with_headers(100, "why");
        let before = c.properties.clone();
        assert_eq!(fit_to(&mut c, 131_072), Ok(()));
        assert_eq!(c.properties, before);
    }

    #[test]
    fn the_reason_is_cut_first_to_fit() {
        let mut c = copy_with_headers(130_000, &"r".repeat(4096));
        assert_eq!(fit_to(&mut c, 131_072), Ok(()));
        let size = header_frame_size(&c.properties);
        assert!(size <= 131_072 - HEADER_MARGIN, "{size}");
        let reason = c.properties.headers[envelope::ERROR].as_str().unwrap();
        assert!(
            reason.ends_with("... [truncated]") && reason.starts_with('r'),
            "{reason}"
        );
    }

    #[test]
    fn headers_that_leave_no_room_are_too_large() {
        let mut c = copy_with_headers(131_000, "why");
        let e = fit_to(&mut c, 131_072).unwrap_err();
        assert!(e.header > 131_000 && e.frame_max == 131_072, "{e:?}");
        assert!(e.to_string().contains("frame_max of 131072"), "{e}");
        let mut c = copy_with_headers(200, "why");
        c.properties.headers.remove(envelope::ERROR);
        c.properties
            .headers
            .insert("big".into(), HeaderValue::Bytes(vec![0; 140_000]));
        assert!(fit_to(&mut c, 131_072).is_err());
    }
}
