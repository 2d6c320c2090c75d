//! Topology on the consuming connection: declares, binds, deletes and passive checks, one
//! operation per channel from a small pool (a 404 or 406 closes the channel it happens on,
//! so a failed declare closes only its own channel, which is then dropped instead of
//! returned), and declaring the recorded topology again after a recovery.

use lapin::Channel;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use tracing::{debug, warn};

use super::errors::from_lapin;
use super::subscription::CHANNEL_OP_TIMEOUT;
use super::{IDLE_TOPOLOGY_CHANNELS, Inner, convert};
use crate::topology::{BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl};
use crate::transport::recovery::Declared;
use crate::transport::{QueueInfo, TransportError};

impl Inner {
    pub(super) async fn redeclare(&self) -> Result<(), TransportError> {
        let items = self.declared.snapshot();
        let count = items.len();
        for item in items {
            let done = match &item {
                Declared::Exchange(e) => self.declare_exchange_op(e).await,
                Declared::Queue(q) => self.queue_op(&q.name, false, Some(q)).await.map(drop),
                Declared::Binding(b) => self.binding_op(b, true).await,
            };
            match done {
                Ok(()) => {}
                // Someone declared it differently (or removed what it needs) meanwhile: say
                // so and go on; the rest of the topology must still come back.
                Err(
                    e @ (TransportError::PreconditionFailed { .. }
                    | TransportError::NotFound { .. }
                    | TransportError::AccessRefused { .. }
                    | TransportError::ResourceLocked { .. }),
                ) => warn!(error = %e, item = ?item, "could not declare again after recovery"),
                Err(e) => return Err(e),
            }
        }
        debug!(count, "topology declared again after recovery");
        Ok(())
    }

    /// A topology channel for one operation (from the pool, or a new one).
    pub(super) async fn checkout(&self) -> Result<Channel, TransportError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(ch) if ch.status().connected() => Ok(ch),
            _ => timed(self.consume.current().create_channel(), "channel.open").await,
        }
    }

    /// Returns a topology channel to the pool unless the operation closed it.
    pub(super) fn checkin(&self, ch: Channel) {
        if !ch.status().connected() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_TOPOLOGY_CHANNELS {
            idle.push(ch);
        }
    }

    /// queue.bind (`bind`) or queue.unbind on a topology channel.
    pub(super) async fn binding_op(
        &self,
        decl: &BindingDecl,
        bind: bool,
    ) -> Result<(), TransportError> {
        let (queue, exchange) = (convert::name(&decl.queue)?, convert::name(&decl.exchange)?);
        let routing_key = convert::name(&decl.routing_key)?;
        let arguments = convert::to_table(&decl.arguments)?;
        let ch = self.checkout().await?;
        let done = if bind {
            let op = ch.queue_bind(
                queue,
                exchange,
                routing_key,
                QueueBindOptions::default(),
                arguments,
            );
            timed(op, "queue.bind").await
        } else {
            timed(
                ch.queue_unbind(queue, exchange, routing_key, arguments),
                "queue.unbind",
            )
            .await
        };
        self.checkin(ch);
        done
    }

    pub(super) async fn queue_op(
        &self,
        name: &str,
        passive: bool,
        decl: Option<&QueueDecl>,
    ) -> Result<QueueInfo, TransportError> {
        let queue = convert::name(name)?;
        let (options, arguments) = match decl {
            Some(d) => (
                QueueDeclareOptions {
                    passive,
                    durable: d.durable,
                    exclusive: d.exclusive,
                    auto_delete: d.auto_delete,
                    nowait: false,
                },
                convert::to_table(&d.arguments)?,
            ),
            None => (
                QueueDeclareOptions {
                    passive,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        };
        let ch = self.checkout().await?;
        let declared = timed(ch.queue_declare(queue, options, arguments), "queue.declare").await;
        self.checkin(ch);
        let q = declared?;
        Ok(QueueInfo {
            name: q.name().as_str().to_owned(),
            message_count: q.message_count(),
            consumer_count: q.consumer_count(),
        })
    }

    pub(super) async fn declare_exchange_op(
        &self,
        decl: &ExchangeDecl,
    ) -> Result<(), TransportError> {
        let options = ExchangeDeclareOptions {
            passive: false,
            durable: decl.durable,
            auto_delete: decl.auto_delete,
            internal: false,
            nowait: false,
        };
        let arguments = convert::to_table(&decl.arguments)?;
        self.exchange_op(&decl.name, decl.kind, options, arguments)
            .await
    }

    pub(super) async fn exchange_op(
        &self,
        name: &str,
        kind: ExchangeKind,
        options: ExchangeDeclareOptions,
        arguments: FieldTable,
    ) -> Result<(), TransportError> {
        let exchange = convert::name(name)?;
        let kind = match kind {
            ExchangeKind::Direct => lapin::ExchangeKind::Direct,
            ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
            ExchangeKind::Topic => lapin::ExchangeKind::Topic,
            ExchangeKind::Headers => lapin::ExchangeKind::Headers,
        };
        let ch = self.checkout().await?;
        let declared = timed(
            ch.exchange_declare(exchange, kind, options, arguments),
            "exchange.declare",
        )
        .await;
        self.checkin(ch);
        declared
    }
}

/// Runs one topology operation, waiting at most [`CHANNEL_OP_TIMEOUT`] for the broker's
/// answer ([`TransportError::Closed`] then): an operation on a connection that died
/// while it was under way was seen never to be answered, which would hold up a
/// re-declaration after recovery (and the recovery with it) for good.
pub(super) async fn timed<T>(
    op: impl std::future::Future<Output = lapin::Result<T>>,
    what: &str,
) -> Result<T, TransportError> {
    match tokio::time::timeout(CHANNEL_OP_TIMEOUT, op).await {
        Ok(r) => r.map_err(from_lapin),
        Err(_) => Err(TransportError::Closed {
            detail: format!("no answer to {what} within {CHANNEL_OP_TIMEOUT:?}"),
        }),
    }
}
