//! One AMQP connection that can be replaced: dialling (with the startup retry budget and
//! failover across addresses), noticing its loss, and redialling it.
//!
//! Each of the transport's two connections lives in a [`Link`]; everything that needs the
//! connection reads the current one from it (channels are never kept across a recovery).
//! A supervisor task per link drains the connection's event stream (lapin sends events only
//! while a listener exists, and several listeners would split them), keeps the shared
//! status up to date, and on loss redials under the [`RecoveryPolicy`], declares the
//! recorded topology again (consuming side), and only then reports the link ready, so a
//! consumer that re-subscribes finds its queues.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures::StreamExt;
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties, Event};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

use super::errors::from_lapin;
use super::socket::{self, SocketHandle};
use super::tls;
use super::{AmqpOptions, Credentials, Inner, TlsOptions};
use crate::transport::TransportError;
use crate::transport::connect::redact;
use crate::transport::recovery::{RecoveryEvent, RecoveryPolicy, Side};

/// How long one dial (TCP, TLS, the AMQP handshake) may take before it is abandoned and
/// tried again. A local or LAN broker answers in milliseconds; a broker behind a slow TLS
/// link in well under a second.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// How often the connection state is re-read even without an event.
const STATUS_REFRESH: Duration = Duration::from_secs(1);

/// One of the transport's connections, replaced on recovery.
pub(crate) struct Link {
    pub(crate) side: Side,
    conn: RwLock<Arc<Connection>>,
    /// The current connection's socket, ended when the connection is lost, replaced or
    /// closed (see [`super::socket`]).
    socket: std::sync::Mutex<SocketHandle>,
    /// Set from the loss until the replacement is ready (topology declared again).
    recovering: AtomicBool,
    /// Recovery stopped for good.
    gave_up: AtomicBool,
    /// The connection generation: bumped the moment a loss is noticed. Channels,
    /// subscriptions and deliveries remember the generation they were made in; anything
    /// of an older one is dead, whatever lapin still says about it.
    generation: watch::Sender<u64>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("side", &self.side)
            .field("ready", &self.ready())
            .finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(side: Side, (conn, socket): (Connection, SocketHandle)) -> Self {
        Link {
            side,
            conn: RwLock::new(Arc::new(conn)),
            socket: std::sync::Mutex::new(socket),
            recovering: AtomicBool::new(false),
            gave_up: AtomicBool::new(false),
            generation: watch::Sender::new(0),
        }
    }

    /// The current connection generation, to watch for its end.
    pub(crate) fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Ends the current generation (a loss was noticed, or the transport closes).
    pub(crate) fn end_generation(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// The current connection.
    pub(crate) fn current(&self) -> Arc<Connection> {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts the redialled connection in place; the socket of the one it replaces (lost, or
    /// closed after a failed redeclare) is shut.
    fn replace(&self, (conn, socket): (Connection, SocketHandle)) {
        *self.conn.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(conn);
        self.take_socket_for(socket).shut();
    }

    /// Swaps in `next` as the socket handle and returns the one it replaces.
    fn take_socket_for(&self, next: SocketHandle) -> SocketHandle {
        std::mem::replace(
            &mut *self.socket.lock().unwrap_or_else(|e| e.into_inner()),
            next,
        )
    }

    /// Shuts the current connection's socket now (the transport closed).
    pub(crate) fn shut_socket(&self) {
        self.take_socket_for(SocketHandle::default()).shut();
    }

    /// Shuts the lost connection's socket after a grace left to lapin.
    fn retire_socket(&self) {
        self.take_socket_for(SocketHandle::default()).retire();
    }

    /// Connected and not in the middle of a recovery.
    pub(crate) fn ready(&self) -> bool {
        !self.recovering.load(Ordering::Acquire) && self.current().status().connected()
    }

    /// Whether recovery is under way (lost, not yet back, not given up).
    pub(crate) fn recovering(&self) -> bool {
        self.recovering.load(Ordering::Acquire) && !self.gave_up.load(Ordering::Acquire)
    }
}

/// The addresses to dial, in turn, and which one is next.
#[derive(Debug)]
pub(crate) struct Dialer {
    addresses: Vec<String>,
    next: AtomicUsize,
    name: String,
    heartbeat: Option<u16>,
    credentials: Credentials,
    tls: TlsOptions,
    /// Built on the first `amqps://` dial, then shared (rustls can resume sessions).
    connector: std::sync::OnceLock<Result<lapin::tcp::RustlsConnector, TransportError>>,
}

impl Dialer {
    pub(crate) fn new(url: &str, options: &AmqpOptions) -> Self {
        let mut addresses = vec![url.to_owned()];
        addresses.extend(options.addresses.iter().cloned());
        Dialer {
            addresses,
            next: AtomicUsize::new(0),
            name: options.connection_name.clone(),
            heartbeat: options.heartbeat,
            credentials: options.credentials.clone(),
            tls: options.tls.clone(),
            connector: std::sync::OnceLock::new(),
        }
    }

    /// The next address in turn (round robin, so a node that went down is tried last).
    fn next_address(&self) -> String {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.addresses.len().max(1);
        self.addresses.get(i).cloned().unwrap_or_default()
    }

    /// The URI to dial at `address`: its heartbeat and credentials applied.
    fn uri(&self, address: &str) -> Result<AMQPUri, TransportError> {
        let mut uri: AMQPUri = address
            .parse()
            .map_err(|e: String| TransportError::Config {
                detail: format!("invalid broker URL {}: {e}", redact(address)),
            })?;
        if let Some(h) = self.heartbeat
            && uri.query.heartbeat.is_none()
        {
            uri.query.heartbeat = Some(h);
        }
        if let Some((user, password)) = self
            .credentials
            .resolve()
            .map_err(|detail| TransportError::Config { detail })?
        {
            uri.authority.userinfo.username = user;
            uri.authority.userinfo.password = password;
        }
        Ok(uri)
    }

    /// Opens one connection for `side` at the next address.
    pub(crate) async fn dial(
        &self,
        side: Side,
    ) -> (String, Result<(Connection, SocketHandle), TransportError>) {
        let address = self.next_address();
        let name = format!("{} ({})", self.name, side.as_str());
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        let dialled = async {
            match self.uri(&address) {
                Ok(uri) if uri.scheme == AMQPScheme::AMQPS => self.dial_tls(uri, properties).await,
                Ok(uri) => socket::connect(uri, properties, None)
                    .await
                    .map_err(from_lapin),
                Err(e) => Err(e),
            }
        };
        // A handshake the peer stops answering (a socket dropped mid-handshake, seen in
        // the flapping-link drill) would otherwise hold the dial, and the recovery, forever.
        let opened = match tokio::time::timeout(HANDSHAKE_TIMEOUT, dialled).await {
            Ok(opened) => opened,
            Err(_) => Err(TransportError::Closed {
                detail: format!(
                    "no AMQP handshake with {} within {HANDSHAKE_TIMEOUT:?}",
                    redact(&address)
                ),
            }),
        };
        (redact(&address), opened)
    }

    /// Opens an `amqps://` connection through our rustls connector, verifying
    /// [`TlsOptions::server_name`] (or the URL's host); a handshake failure becomes
    /// [`TransportError::Tls`].
    async fn dial_tls(
        &self,
        uri: AMQPUri,
        properties: ConnectionProperties,
    ) -> Result<(Connection, SocketHandle), TransportError> {
        let connector = self
            .connector
            .get_or_init(|| tls::connector(&self.tls))
            .clone()?;
        let host_port = format!("{}:{}", uri.authority.host, uri.authority.port);
        let server_name = self
            .tls
            .server_name
            .clone()
            .unwrap_or_else(|| uri.authority.host.clone());
        socket::connect(uri, properties, Some((connector, server_name)))
            .await
            .map_err(|e| tls::classify(&e, &host_port).unwrap_or_else(|| from_lapin(e)))
    }

    /// Opens a connection for `side`, retrying an unreachable broker for up to `budget`;
    /// refused credentials or vhost fail at once.
    pub(crate) async fn dial_with_budget(
        &self,
        side: Side,
        budget: Duration,
        policy: &RecoveryPolicy,
    ) -> Result<(Connection, SocketHandle), TransportError> {
        let deadline = Instant::now() + budget;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let (address, opened) = self.dial(side).await;
            let error = match opened {
                Ok(c) => return Ok(c),
                Err(e) if permanent(&e) => return Err(e),
                Err(e) => e,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Unreachable {
                    address,
                    waited_ms: budget.as_millis().try_into().unwrap_or(u64::MAX),
                    detail: error.to_string(),
                });
            }
            debug!(%address, attempt, error = %error, "broker unreachable; retrying");
            let delay = policy.delay(attempt).min(Duration::from_secs(5));
            tokio::time::sleep(delay.min(deadline - now)).await;
        }
    }
}

/// Whether a dial error will not pass by retrying: the broker refused the credentials
/// (403) or the vhost (530 NOT_ALLOWED), the TLS handshake failed (a certificate that is
/// not trusted or not for the name, a client certificate refused), or the configuration
/// cannot be used.
pub(crate) fn permanent(e: &TransportError) -> bool {
    matches!(
        e,
        TransportError::AccessRefused { .. }
            | TransportError::Tls { .. }
            | TransportError::Protocol { code: 530, .. }
            | TransportError::Config { .. }
    ) || e.to_string().contains("ACCESS_REFUSED")
}

/// Watches one link for its life: status, blocked state, loss and recovery.
pub(crate) async fn supervise(
    inner: Weak<Inner>,
    side: Side,
    events: impl futures::Stream<Item = Event> + Send + 'static,
) {
    let mut events: futures::stream::BoxStream<'static, Event> = Box::pin(events);
    loop {
        let Some(reason) = watch_live(&inner, side, &mut events).await else {
            return;
        };
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if strong.is_closed() {
            return;
        }
        strong.lost(side, reason.clone());
        let policy = strong.options.recovery.clone();
        drop(strong);
        if !policy.enabled() {
            if let Some(s) = inner.upgrade() {
                s.gave_up(side, format!("recovery is disabled; lost: {reason}"));
            }
            return;
        }
        match redial(&inner, side, &policy).await {
            Some(next) => events = next,
            None => return,
        }
    }
}

/// Follows the live connection's events; returns the reason once it is lost (`None` when
/// the transport is gone or closed).
async fn watch_live(
    inner: &Weak<Inner>,
    side: Side,
    events: &mut futures::stream::BoxStream<'static, Event>,
) -> Option<String> {
    let mut tick = tokio::time::interval(STATUS_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    let mut ended = false;
    loop {
        let event = if ended {
            tick.tick().await;
            None
        } else {
            tokio::select! {
                e = events.next() => match e {
                    Some(e) => Some(e),
                    None => { ended = true; None }
                },
                _ = tick.tick() => None,
            }
        };
        let s = inner.upgrade()?;
        if s.is_closed() {
            return None;
        }
        match event {
            Some(Event::ConnectionBlocked(reason)) if side == Side::Publish => {
                s.set_blocked(Some(reason));
            }
            Some(Event::ConnectionUnblocked) if side == Side::Publish => s.set_blocked(None),
            Some(Event::Error(e)) => {
                debug!(side = side.as_str(), error = %e, "connection event: error");
                last_error = Some(e.to_string());
            }
            Some(other) => debug!(side = side.as_str(), event = ?other, "connection event"),
            None => {}
        }
        let link = s.link(side);
        let status = link.current().status().clone();
        if !status.connected() && !status.connecting() {
            return Some(last_error.unwrap_or_else(|| "the connection closed".to_owned()));
        }
        s.refresh_status();
    }
}

/// Redials `side` under `policy`; returns the new connection's event stream once it is
/// ready, or `None` when recovery stopped (given up, or the transport closed).
async fn redial(
    inner: &Weak<Inner>,
    side: Side,
    policy: &RecoveryPolicy,
) -> Option<futures::stream::BoxStream<'static, Event>> {
    let started = Instant::now();
    let mut last_error = String::new();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        {
            let s = inner.upgrade()?;
            if s.is_closed() {
                return None;
            }
            if policy.exhausted(attempt) {
                s.gave_up(
                    side,
                    format!(
                        "{} redials failed; last error: {last_error}",
                        attempt.saturating_sub(1)
                    ),
                );
                return None;
            }
            let delay = policy.delay(attempt);
            s.events.emit(RecoveryEvent::Retrying {
                side,
                attempt,
                delay,
                last_error: last_error.clone(),
            });
            drop(s);
            tokio::time::sleep(delay).await;
        }
        let s = inner.upgrade()?;
        if s.is_closed() {
            return None;
        }
        let (address, opened) = s.dialer.dial(side).await;
        let dialled = match opened {
            Ok(d) => d,
            // A TLS failure while recovering keeps being retried (and reported in each
            // `Retrying` event): a node that came back with a certificate being rotated
            // or a load balancer mid-change is fixed on the server side, and a service
            // that gave up would need a restart. At startup it fails at once.
            Err(e) if permanent(&e) && !matches!(e, TransportError::Tls { .. }) => {
                s.gave_up(side, format!("the broker refused the connection: {e}"));
                return None;
            }
            Err(e) => {
                last_error = e.to_string();
                continue;
            }
        };
        let events = dialled.0.events_listener();
        let link = s.link(side);
        link.replace(dialled);
        if let Err(e) = s.after_reconnect(side).await {
            last_error = format!("reconnected, but declaring the topology again failed: {e}");
            link.end_generation();
            let _ = link.current().close(200, "OK".into()).await;
            link.shut_socket();
            continue;
        }
        link.recovering.store(false, Ordering::Release);
        s.refresh_status();
        s.events.emit(RecoveryEvent::Recovered {
            side,
            attempts: attempt,
            after: started.elapsed(),
            address,
        });
        return Some(Box::pin(events));
    }
}

impl Inner {
    /// The link of one side.
    pub(crate) fn link(&self, side: Side) -> &Link {
        match side {
            Side::Publish => self.publisher.link(),
            Side::Consume => &self.consume,
        }
    }

    fn lost(&self, side: Side, reason: String) {
        let link = self.link(side);
        link.recovering.store(true, Ordering::Release);
        link.end_generation();
        link.retire_socket();
        if side == Side::Publish {
            // A new connection starts unblocked; a stale reason must not outlive the old one.
            self.status.send_modify(|s| s.blocked = None);
        }
        self.refresh_status();
        self.events.emit(RecoveryEvent::Lost { side, reason });
    }

    fn gave_up(&self, side: Side, reason: String) {
        self.link(side).gave_up.store(true, Ordering::Release);
        self.refresh_status();
        self.events.emit(RecoveryEvent::GaveUp { side, reason });
    }
}
