//! Subscriptions (one channel each, on the consuming connection) and settlement.
//!
//! * `basic_qos(prefetch)` is set before `basic_consume`: lapin buffers deliveries in an
//!   unbounded queue, so the prefetch window is the only backpressure.
//! * A subscription's delivery is settled with its channel's `basic.ack` / `nack` /
//!   `reject`, a `basic.get` delivery with lapin's `Acker`. Either way a settlement that
//!   sent nothing (the delivery was already settled, its channel is closed, the `Acker`
//!   answered `Ok(false)`) is [`TransportError::AckNotSent`], never success; so is an
//!   error from a settlement under way when the channel died. Expect a redelivery.
//! * `requeue` is always passed explicitly (lapin's default is `false`).
//! * A settlement with `multiple = true` settles earlier deliveries on the broker, but their
//!   own ackers do not know it: settling one of them afterwards sends an unknown delivery tag
//!   and the broker closes the channel (406). Settle each delivery once.
//! * lapin ends the consumer stream silently when the broker cancels the consumer (queue
//!   deleted, node down). [`AmqpSubscription`] reports that as the end of the subscription
//!   with [`Subscription::cancelled_by_us`] false, so the engine can re-consume.
//! * Dropping a subscription closes its channel (lapin closes a channel with its last
//!   handle): unsettled deliveries go back to the queue and their settlements fail with
//!   [`TransportError::AckNotSent`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::{DeliveryTag, ShortString};
use lapin::{Channel, Consumer};
use tokio::sync::watch;
use tracing::debug;

use super::convert;
use super::errors::from_lapin;
use crate::transport::{
    AckHandle, Acker, BoxFuture, Delivery, Settlement, Subscription, SubscriptionProbe,
    TransportError,
};

/// How long a settlement may take to be written before it counts as not sent. lapin
/// answers an ack once its frame is written; an ack queued on a connection that is dying
/// was seen never to be answered, which stalled a consumer (and its close) for good.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The connection generation something was made in (see `Link::generation`): it is dead
/// once the generation has moved on, whatever lapin still says about it.
#[derive(Clone, Debug)]
pub(crate) struct Generation {
    rx: watch::Receiver<u64>,
    mine: u64,
}

impl Generation {
    /// The generation current now on `rx`.
    pub(crate) fn now(rx: watch::Receiver<u64>) -> Self {
        let mine = *rx.borrow();
        Generation { rx, mine }
    }

    /// Whether it is still the current one.
    pub(crate) fn is_current(&self) -> bool {
        *self.rx.borrow() == self.mine
    }

    /// Resolves once it is not the current one any more (or the transport is gone).
    pub(crate) async fn ended(&self) {
        let mut rx = self.rx.clone();
        let mine = self.mine;
        let _ = rx.wait_for(|g| *g != mine).await;
    }
}

/// Settles one delivery. The channel's status (`None` for `basic.get` deliveries, whose
/// channel the transport replaces as needed) and the generation tell whether a settlement
/// can still be sent.
struct LapinAcker {
    via: Via,
    status: Option<lapin::ChannelStatus>,
    generation: Generation,
    /// Set by the first settlement sent: a second is not sent (lapin's `Acker` answers it
    /// `Ok(false)`; a second `basic.ack` of one tag would make the broker close the channel).
    used: AtomicBool,
}

/// Where a settlement is sent.
#[derive(Clone)]
enum Via {
    /// A subscription's delivery, settled with its channel's own `basic.ack` / `nack` /
    /// `reject`. lapin's `Acker` would hand each settlement to the connection's internal
    /// task, which spawns a task per settlement to send it; the channel's method queues the
    /// frame at once. The channel is held weakly: once the subscription is dropped (which
    /// closes the channel) a settlement is not sent, as with a poisoned `Acker`.
    Channel(Weak<Channel>, DeliveryTag),
    /// A `basic.get` delivery: lapin's acker.
    Acker(lapin::Acker),
}

impl AckHandle for LapinAcker {
    fn is_live(&self) -> bool {
        self.generation.is_current()
            && self
                .status
                .as_ref()
                .is_none_or(lapin::ChannelStatus::connected)
    }

    fn settle(&self, settlement: Settlement) -> BoxFuture<'static, Result<(), TransportError>> {
        if !self.is_live() || self.used.swap(true, Ordering::AcqRel) {
            return Box::pin(std::future::ready(Err(TransportError::AckNotSent)));
        }
        let via = self.via.clone();
        let generation = self.generation.clone();
        Box::pin(async move {
            let send = async {
                match via {
                    Via::Channel(channel, tag) => match channel.upgrade() {
                        Some(channel) => send_on(&channel, tag, settlement).await.map(|()| true),
                        None => Ok(false),
                    },
                    Via::Acker(acker) => match settlement {
                        Settlement::Ack { multiple } => {
                            acker.ack(BasicAckOptions { multiple }).await
                        }
                        Settlement::Nack { multiple, requeue } => {
                            acker.nack(BasicNackOptions { multiple, requeue }).await
                        }
                        Settlement::Reject { requeue } => {
                            acker.reject(BasicRejectOptions { requeue }).await
                        }
                    },
                }
            };
            let sent = tokio::select! {
                biased;
                sent = send => sent,
                () = generation.ended() => {
                    debug!("settlement not sent: its connection was lost meanwhile");
                    return Err(TransportError::AckNotSent);
                }
                () = tokio::time::sleep(SETTLE_TIMEOUT) => {
                    debug!("settlement not answered within {SETTLE_TIMEOUT:?}; counted as not sent");
                    return Err(TransportError::AckNotSent);
                }
            };
            match sent {
                Ok(true) => Ok(()),
                Ok(false) => Err(TransportError::AckNotSent),
                Err(e) => {
                    debug!(error = %e, "settlement failed: its channel ended");
                    Err(TransportError::AckNotSent)
                }
            }
        })
    }
}

/// A settlement sent with `channel`'s own method (answered once its frame is written).
async fn send_on(channel: &Channel, tag: DeliveryTag, settlement: Settlement) -> lapin::Result<()> {
    match settlement {
        Settlement::Ack { multiple } => channel.basic_ack(tag, BasicAckOptions { multiple }).await,
        Settlement::Nack { multiple, requeue } => {
            channel
                .basic_nack(tag, BasicNackOptions { multiple, requeue })
                .await
        }
        Settlement::Reject { requeue } => {
            channel
                .basic_reject(tag, BasicRejectOptions { requeue })
                .await
        }
    }
}

/// A lapin delivery as a transport [`Delivery`] (the body is moved, not copied).
pub(crate) fn delivery(d: lapin::message::Delivery, generation: Generation) -> Delivery {
    on_channel(d, None, generation)
}

/// A delivery of a subscription's channel: settled on that channel, and its acker knows
/// when the channel is gone.
fn on_channel(
    d: lapin::message::Delivery,
    channel: Option<&Arc<Channel>>,
    generation: Generation,
) -> Delivery {
    let (via, status) = match channel {
        Some(c) => (
            Via::Channel(Arc::downgrade(c), d.delivery_tag),
            Some(c.status().clone()),
        ),
        None => (Via::Acker(d.acker), None),
    };
    Delivery {
        delivery_tag: d.delivery_tag,
        properties: Arc::new(convert::from_basic(&d.properties)),
        exchange: d.exchange.into(),
        routing_key: d.routing_key.into(),
        redelivered: d.redelivered,
        body: Bytes::from(d.data),
        acker: Acker::new(LapinAcker {
            via,
            status,
            generation,
            used: AtomicBool::new(false),
        }),
    }
}

/// How often a subscription waiting for its next delivery checks that its channel and
/// connection are still open (see [`AmqpSubscription`]).
const LIVENESS_CHECK: Duration = Duration::from_millis(500);

/// A consumer on its own channel.
///
/// Its end is normally signalled by lapin's consumer stream ending. A forced close was seen
/// (once in a drill of twenty) to leave the stream open after its connection had been
/// recovered, so the consumer waited on a dead subscription; while waiting for a delivery
/// the subscription also checks every [`LIVENESS_CHECK`] that its channel and connection
/// are open, and ends itself (as the broker ending it) when either is not.
pub(crate) struct AmqpSubscription {
    channel: Arc<Channel>,
    connection: lapin::ConnectionStatus,
    generation: Generation,
    consumer: Consumer,
    tag: ShortString,
    ended: bool,
    by_us: bool,
}

impl std::fmt::Debug for AmqpSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSubscription")
            .field("tag", &self.tag)
            .field("ended", &self.ended)
            .field("cancelled_by_us", &self.by_us)
            .finish_non_exhaustive()
    }
}

impl AmqpSubscription {
    pub(crate) fn new(
        channel: Channel,
        consumer: Consumer,
        connection: lapin::ConnectionStatus,
        generation: Generation,
    ) -> Self {
        let tag = consumer.tag();
        AmqpSubscription {
            channel: Arc::new(channel),
            connection,
            generation,
            consumer,
            tag,
            ended: false,
            by_us: false,
        }
    }
}

impl Subscription for AmqpSubscription {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Delivery, TransportError>>> {
        Box::pin(async move {
            if self.ended {
                return None;
            }
            loop {
                let next = tokio::select! {
                    biased;
                    next = self.consumer.next() => next,
                    () = self.generation.ended() => {
                        debug!(tag = %self.tag, "the subscription's connection was lost");
                        self.ended = true;
                        return None;
                    }
                    () = gone(&self.channel, &self.connection) => {
                        debug!(tag = %self.tag, "the subscription's channel or connection closed without ending its stream");
                        self.ended = true;
                        return None;
                    }
                };
                return match next {
                    // lapin buffers deliveries; once their channel is gone they cannot be settled
                    // and the broker has already put them back: running them would only make a
                    // duplicate. Drop them.
                    Some(Ok(_))
                        if !self.channel.status().connected() || !self.generation.is_current() =>
                    {
                        debug!(tag = %self.tag, "dropping a delivery buffered before its channel closed");
                        continue;
                    }
                    Some(Ok(d)) => Some(Ok(on_channel(
                        d,
                        Some(&self.channel),
                        self.generation.clone(),
                    ))),
                    Some(Err(e)) => {
                        if !self.channel.status().connected() {
                            self.ended = true;
                        }
                        Some(Err(from_lapin(e)))
                    }
                    None => {
                        self.ended = true;
                        if !self.by_us {
                            debug!(tag = %self.tag, "consumer cancelled by the broker");
                        }
                        None
                    }
                };
            }
        })
    }

    fn cancel(&mut self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            self.by_us = true;
            if self.ended || !self.live() {
                return Ok(());
            }
            let cancel = self
                .channel
                .basic_cancel(self.tag.clone(), BasicCancelOptions::default());
            bounded(&self.generation, cancel, "basic.cancel").await
        })
    }

    fn close(&mut self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            self.by_us = true;
            if !self.live() {
                self.ended = true;
                return Ok(());
            }
            let close = self.channel.close(200, "OK".into());
            let closed = bounded(&self.generation, close, "channel.close").await;
            self.ended = true;
            closed
        })
    }

    fn cancelled_by_us(&self) -> bool {
        self.by_us
    }

    fn probe(&self) -> SubscriptionProbe {
        let (channel, connection) = (self.channel.status().clone(), self.connection.clone());
        let generation = self.generation.clone();
        SubscriptionProbe::new(move || {
            generation.is_current() && channel.connected() && connection.connected()
        })
    }
}

impl AmqpSubscription {
    /// Its channel and connection are open and its generation is the current one.
    fn live(&self) -> bool {
        self.generation.is_current()
            && self.channel.status().connected()
            && self.connection.connected()
    }
}

/// How long a channel operation of a subscription (cancel, close) or of subscribing may
/// wait for the broker's answer.
pub(crate) const CHANNEL_OP_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs a lapin channel operation until it answers, its generation ends (a lost
/// connection: [`TransportError::NotConnected`]) or [`CHANNEL_OP_TIMEOUT`] passes
/// ([`TransportError::Closed`]): an operation on a connection that is dying was seen never
/// to be answered.
pub(crate) async fn bounded<T>(
    generation: &Generation,
    op: impl std::future::Future<Output = lapin::Result<T>>,
    what: &str,
) -> Result<T, TransportError> {
    tokio::select! {
        biased;
        r = op => r.map_err(from_lapin),
        () = generation.ended() => Err(TransportError::NotConnected {
            detail: format!("the connection was lost during {what}"),
        }),
        () = tokio::time::sleep(CHANNEL_OP_TIMEOUT) => Err(TransportError::Closed {
            detail: format!("no answer to {what} within {CHANNEL_OP_TIMEOUT:?}"),
        }),
    }
}

/// Resolves once `channel` or `connection` is no longer open, looking every
/// [`LIVENESS_CHECK`] (polled only while no delivery is at hand).
async fn gone(channel: &Channel, connection: &lapin::ConnectionStatus) {
    while channel.status().connected() && connection.connected() {
        tokio::time::sleep(LIVENESS_CHECK).await;
    }
}
