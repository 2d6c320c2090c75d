//! Subscriptions (one channel each, on the consuming connection) and settlement.
//!
//! * `basic_qos(prefetch)` is set before `basic_consume`: lapin buffers deliveries in an
//!   unbounded queue, so the prefetch window is the only backpressure.
//! * lapin's `Acker` answers `Ok(false)` when nothing was sent (the delivery was already
//!   settled, or its channel was closed, which poisons every acker on it). That is
//!   [`TransportError::AckNotSent`], never success; so is an error from an ack under way
//!   when the channel died. Expect a redelivery.
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

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::ShortString;
use lapin::{Channel, Consumer};
use tracing::debug;

use super::convert;
use super::errors::from_lapin;
use crate::transport::{
    AckHandle, Acker, BoxFuture, Delivery, Settlement, Subscription, TransportError,
};

/// Settles one delivery through lapin's acker (bound to the channel it arrived on).
/// The channel's status tells whether a settlement can still be sent (`None` for
/// `basic.get` deliveries, whose channel the transport replaces as needed).
struct LapinAcker(lapin::Acker, Option<lapin::ChannelStatus>);

impl AckHandle for LapinAcker {
    fn is_live(&self) -> bool {
        self.1.as_ref().is_none_or(lapin::ChannelStatus::connected)
    }

    fn settle(&self, settlement: Settlement) -> BoxFuture<'static, Result<(), TransportError>> {
        let acker = self.0.clone();
        Box::pin(async move {
            let sent = match settlement {
                Settlement::Ack { multiple } => acker.ack(BasicAckOptions { multiple }).await,
                Settlement::Nack { multiple, requeue } => {
                    acker.nack(BasicNackOptions { multiple, requeue }).await
                }
                Settlement::Reject { requeue } => {
                    acker.reject(BasicRejectOptions { requeue }).await
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

/// A lapin delivery as a transport [`Delivery`] (the body is moved, not copied).
pub(crate) fn delivery(d: lapin::message::Delivery) -> Delivery {
    on_channel(d, None)
}

/// A delivery of a subscription's channel: its acker knows when that channel is gone.
fn on_channel(d: lapin::message::Delivery, channel: Option<lapin::ChannelStatus>) -> Delivery {
    Delivery {
        delivery_tag: d.delivery_tag,
        properties: convert::from_basic(&d.properties),
        exchange: d.exchange.into(),
        routing_key: d.routing_key.into(),
        redelivered: d.redelivered,
        body: Bytes::from(d.data),
        acker: Acker::new(LapinAcker(d.acker, channel)),
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
    channel: Channel,
    connection: lapin::ConnectionStatus,
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
    ) -> Self {
        let tag = consumer.tag();
        AmqpSubscription {
            channel,
            connection,
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
                    Some(Ok(_)) if !self.channel.status().connected() => {
                        debug!(tag = %self.tag, "dropping a delivery buffered before its channel closed");
                        continue;
                    }
                    Some(Ok(d)) => Some(Ok(on_channel(d, Some(self.channel.status().clone())))),
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
            if self.ended || !self.channel.status().connected() {
                return Ok(());
            }
            self.channel
                .basic_cancel(self.tag.clone(), BasicCancelOptions::default())
                .await
                .map_err(from_lapin)
        })
    }

    fn close(&mut self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            self.by_us = true;
            if !self.channel.status().connected() {
                self.ended = true;
                return Ok(());
            }
            let closed = self
                .channel
                .close(200, "OK".into())
                .await
                .map_err(from_lapin);
            self.ended = true;
            closed
        })
    }

    fn cancelled_by_us(&self) -> bool {
        self.by_us
    }
}

/// Resolves once `channel` or `connection` is no longer open, looking every
/// [`LIVENESS_CHECK`] (polled only while no delivery is at hand).
async fn gone(channel: &Channel, connection: &lapin::ConnectionStatus) {
    while channel.status().connected() && connection.connected() {
        tokio::time::sleep(LIVENESS_CHECK).await;
    }
}
