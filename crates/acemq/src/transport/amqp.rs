//! RabbitMQ transport. Stub to be replaced.
use super::*;
use crate::topology::*;
/// Stub.
#[derive(Debug)]
pub struct AmqpTransport;
impl AmqpTransport {
    /// Connects to RabbitMQ (`amqp://` or `amqps://`).
    pub async fn connect(_url: &str) -> Result<AmqpTransport, TransportError> {
        Ok(AmqpTransport)
    }
}
impl Transport for AmqpTransport {
    fn kind(&self) -> &'static str {
        "amqp"
    }
    fn publish(&self, _m: Outbound) -> BoxFuture<'_, Result<PendingConfirm, TransportError>> {
        todo!()
    }
    fn consume(
        &self,
        _s: ConsumeSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Subscription>, TransportError>> {
        todo!()
    }
    fn get(&self, _q: &str) -> BoxFuture<'_, Result<Option<Delivery>, TransportError>> {
        todo!()
    }
    fn declare_exchange(&self, _d: &ExchangeDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        todo!()
    }
    fn declare_queue(&self, _d: &QueueDecl) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        todo!()
    }
    fn bind_queue(&self, _d: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        todo!()
    }
    fn unbind_queue(&self, _d: &BindingDecl) -> BoxFuture<'_, Result<(), TransportError>> {
        todo!()
    }
    fn inspect_queue(&self, _n: &str) -> BoxFuture<'_, Result<QueueInfo, TransportError>> {
        todo!()
    }
    fn inspect_exchange(&self, _n: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        todo!()
    }
    fn delete_queue(&self, _n: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        todo!()
    }
    fn delete_exchange(&self, _n: &str) -> BoxFuture<'_, Result<(), TransportError>> {
        todo!()
    }
    fn purge_queue(&self, _n: &str) -> BoxFuture<'_, Result<u32, TransportError>> {
        todo!()
    }
    fn status(&self) -> TransportStatus {
        TransportStatus::default()
    }
    fn watch_status(&self) -> watch::Receiver<TransportStatus> {
        todo!()
    }
    fn close(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }
}
