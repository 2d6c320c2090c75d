//! One connection to a memory broker ([`MemoryConnection`]): what opening it registers
//! (its status sender and its basic.get channel) and what closing it releases.
//!
//! A [`MemoryTransport`](super::MemoryTransport) holds its current connection and swaps it
//! when it recovers; every subscription keeps the connection it was opened on alive.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;

use super::broker::MemoryBroker;
use super::dispatch::Channel;
use crate::transport::{TransportError, TransportStatus};

/// One connection to a memory broker. Closing it (or dropping it and every subscription
/// opened on it) returns its unsettled deliveries to their queues and deletes its
/// exclusive queues, as a closed AMQP connection does.
#[derive(Debug)]
pub(crate) struct MemoryConnection {
    pub(super) id: u64,
    pub(super) broker: Arc<MemoryBroker>,
    status: Arc<watch::Sender<TransportStatus>>,
    pub(super) closed: AtomicBool,
    /// The channel basic.get deliveries belong to.
    pub(super) get_channel: u64,
}

impl MemoryConnection {
    /// Opens one connection to `broker`, reporting through `status`.
    pub(super) fn open(
        broker: &Arc<MemoryBroker>,
        status: &Arc<watch::Sender<TransportStatus>>,
    ) -> MemoryConnection {
        let mut st = broker.lock();
        let id = st.next_id();
        let get_channel = st.next_id();
        st.channels.insert(get_channel, Channel::new(id, None));
        status.send_modify(|s| {
            s.connected = true;
            s.blocked = st.blocked.clone();
        });
        st.connections.insert(id, status.clone());
        MemoryConnection {
            id,
            broker: broker.clone(),
            status: status.clone(),
            closed: AtomicBool::new(false),
            get_channel,
        }
    }

    /// Closes it once: the broker releases what it held, and its status says disconnected.
    pub(super) fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.broker.lock().close_connection(self.id, Instant::now());
        self.status.send_modify(|s| s.connected = false);
    }

    /// [`TransportError::Closed`] once it was closed.
    pub(super) fn check_open(&self) -> Result<(), TransportError> {
        if self.closed.load(Ordering::Acquire) {
            Err(TransportError::Closed {
                detail: format!("memory://{} connection closed", self.broker.name()),
            })
        } else {
            Ok(())
        }
    }
}

impl Drop for MemoryConnection {
    fn drop(&mut self) {
        self.close();
    }
}
