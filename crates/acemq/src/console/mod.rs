//! The operator console (feature `console`): dead letters grouped by reason and type,
//! parked messages, stuck queues, and filtered replay and purge, as server-rendered HTML.
//!
//! This module owns the console's configuration ([`Console`], [`ConsoleBuilder`]), the
//! queue inventory it shows ([`Inventory`], [`QueueStat`]), and its safety rules. Pages are
//! in `pages.rs`, replay and purge (dry run, confirmation, progress, summary) in
//! `actions.rs`, the token and CSRF checks in `auth.rs`, the message filters in
//! `filter.rs`; the hand-written script and style sheet are `assets/`.
//!
//! Every look and every move goes through [`crate::replay::Replay`]: a page peeks through
//! a held, bounded window ([`crate::replay::Replay::peek`]), a dry run, replay or purge is
//! one bounded pass (`dry_run_matching`, `replay_matching`, `purge_matching`).
//!
//! **Safe by default.** [`ConsoleBuilder::serve`] binds `127.0.0.1` unless told otherwise
//! and refuses a non-loopback address without a token; a console is read-only unless
//! [`ConsoleBuilder::allow_mutations`] was called; every mutation is a POST carrying the
//! console's CSRF token and a confirmation naming the count a dry run found; everything
//! taken from a message is HTML-escaped (maud escapes every interpolation).
//!
//! Two ways to run it, one code: `acemq console --listen 127.0.0.1:9465 --url amqp://…`
//! (the command line, any broker), or [`ConsoleBuilder::router`] merged into a service's
//! axum app beside its actuator:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mq = acemq::Connection::connect("amqp://127.0.0.1").await?;
//! // With feature `actuator` too: `acemq::actuator::router(&mq).merge(...)`.
//! let app = axum::Router::new().merge(
//!     acemq::console::Console::builder(&mq)
//!         .queues(["orders.new", "orders.paid"])
//!         .router(),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

mod actions;
mod auth;
mod filter;
mod pages;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};
use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Connection;

pub use filter::Filter;

/// Where the console's pages live (so it merges beside `/acemq-health`).
pub const BASE_PATH: &str = "/acemq-console";
/// The default address of `acemq console`.
pub const DEFAULT_BIND: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), DEFAULT_PORT);
/// The default port of `acemq console`.
pub const DEFAULT_PORT: u16 = 9465;
/// How many messages a page looks at unless told otherwise (held unacked while it looks).
pub const DEFAULT_PEEK_LIMIT: usize = 100;

/// One queue as the console lists it.
///
/// ```
/// let q = acemq::console::QueueStat::new("orders.new", 3);
/// assert_eq!((q.name.as_str(), q.ready, q.consumers), ("orders.new", 3, None));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct QueueStat {
    /// The queue's name.
    pub name: String,
    /// Ready messages.
    pub ready: u64,
    /// Delivered and not yet acked (when known: the management API counts them).
    pub unacked: Option<u64>,
    /// Consumers attached (when known).
    pub consumers: Option<u64>,
    /// `classic`, `quorum` or `stream` (when known).
    pub queue_type: Option<String>,
    /// Messages published per second (when known).
    pub publish_rate: Option<f64>,
    /// Messages delivered (and fetched) per second (when known).
    pub deliver_rate: Option<f64>,
}

impl QueueStat {
    /// A queue with `ready` messages and nothing else known.
    pub fn new(name: impl Into<String>, ready: u64) -> QueueStat {
        QueueStat {
            name: name.into(),
            ready,
            ..QueueStat::default()
        }
    }

    /// Sets the unacked count.
    pub fn unacked(mut self, n: u64) -> Self {
        self.unacked = Some(n);
        self
    }

    /// Sets the consumer count.
    pub fn consumers(mut self, n: u64) -> Self {
        self.consumers = Some(n);
        self
    }

    /// Sets the queue type (`classic`, `quorum`, `stream`).
    pub fn queue_type(mut self, t: impl Into<String>) -> Self {
        self.queue_type = Some(t.into());
        self
    }

    /// Sets the publish and deliver rates (messages per second).
    pub fn rates(mut self, publish: f64, deliver: f64) -> Self {
        self.publish_rate = Some(publish);
        self.deliver_rate = Some(deliver);
        self
    }
}

/// Where the console learns which queues exist: the management API in `acemq console`, a
/// fixed list of names ([`ConsoleBuilder::queues`]) in a service.
///
/// ```
/// use acemq::console::{Inventory, QueueStat};
/// use futures::future::BoxFuture;
/// struct Fixed;
/// impl Inventory for Fixed {
///     fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueStat>, String>> {
///         Box::pin(async { Ok(vec![QueueStat::new("orders.new", 0).consumers(1)]) })
///     }
/// }
/// ```
pub trait Inventory: Send + Sync + 'static {
    /// Every queue to show, with what is known of it; an error says what to do.
    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueStat>, String>>;
}

/// The queues named to [`ConsoleBuilder::queues`], their `.dlq` and `.parked`, counted over
/// AMQP (ready and consumers; no unacked counts, no rates).
struct NamedQueues {
    mq: Connection,
    names: Vec<String>,
}

impl Inventory for NamedQueues {
    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueStat>, String>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for name in &self.names {
                for q in [
                    name.clone(),
                    crate::topology::dead_letter_queue(name),
                    crate::topology::parked_queue(name),
                ] {
                    match self.mq.transport().inspect_queue(&q).await {
                        Ok(info) => out.push(
                            QueueStat::new(q, u64::from(info.message_count))
                                .consumers(u64::from(info.consumer_count)),
                        ),
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(format!("cannot inspect {q}: {e}")),
                    }
                }
            }
            Ok(out)
        })
    }
}

/// Why the console did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
    /// A non-loopback address without a token: anyone on the network could read messages.
    #[error(
        "refusing to serve the console on {addr} without a token: give a token (acemq console --token-file FILE or ACEMQ_CONSOLE_TOKEN) or bind 127.0.0.1"
    )]
    TokenRequired {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The address could not be bound (in use, not permitted).
    #[error("cannot bind the console to {addr}: {source}: choose another --listen address")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The operator console; [`Console::builder`] configures one.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// let mq = acemq::Connection::connect("memory://doc-console").await?;
/// let app: axum::Router = acemq::console::Console::builder(&mq)
///     .queues(["orders.new"])
///     .token("s3cret")
///     .router();
/// # let _ = app;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Console;

impl Console {
    /// A console over `connection`'s broker: read-only, no token, queues unknown until
    /// [`ConsoleBuilder::queues`] or [`ConsoleBuilder::inventory`] says.
    pub fn builder(connection: &Connection) -> ConsoleBuilder {
        ConsoleBuilder {
            mq: connection.clone(),
            inventory: None,
            token: None,
            allow_mutations: false,
            peek_limit: DEFAULT_PEEK_LIMIT,
            broker_label: String::new(),
            bind: DEFAULT_BIND,
        }
    }
}

/// How a console is set up; [`ConsoleBuilder::router`] or [`ConsoleBuilder::serve`]
/// finishes it.
pub struct ConsoleBuilder {
    mq: Connection,
    inventory: Option<Arc<dyn Inventory>>,
    token: Option<String>,
    allow_mutations: bool,
    peek_limit: usize,
    broker_label: String,
    bind: SocketAddr,
}

impl std::fmt::Debug for ConsoleBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleBuilder")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("allow_mutations", &self.allow_mutations)
            .field("peek_limit", &self.peek_limit)
            .field("bind", &self.bind)
            .finish_non_exhaustive()
    }
}

impl ConsoleBuilder {
    /// Shows these source queues (and their `.dlq` and `.parked`), counted over AMQP.
    pub fn queues<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.inventory = Some(Arc::new(NamedQueues {
            mq: self.mq.clone(),
            names: names.into_iter().map(Into::into).collect(),
        }));
        self
    }

    /// Takes the queue list from `inventory` (e.g. the management API).
    pub fn inventory(mut self, inventory: impl Inventory) -> Self {
        self.inventory = Some(Arc::new(inventory));
        self
    }

    /// Requires this token on every request: `Authorization: Bearer …`, or `?token=…` once
    /// (which sets a same-site, HTTP-only cookie).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        self.token = (!token.is_empty()).then_some(token);
        self
    }

    /// Allows replay and purge (each still a POST with the CSRF token and a confirmation).
    /// Without it the console is read-only and refuses every POST.
    pub fn allow_mutations(mut self, allow: bool) -> Self {
        self.allow_mutations = allow;
        self
    }

    /// Looks at most `n` (at least 1) messages per page (held unacked while it looks).
    pub fn peek_limit(mut self, n: usize) -> Self {
        self.peek_limit = n.max(1);
        self
    }

    /// What the header says the console is connected to (give it without a password).
    pub fn broker_label(mut self, label: impl Into<String>) -> Self {
        self.broker_label = label.into();
        self
    }

    /// The address [`ConsoleBuilder::serve`] binds (default `127.0.0.1:9465`).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// The console's pages under [`BASE_PATH`], to merge into an application's axum app.
    /// The caller chooses the address: give it a [`ConsoleBuilder::token`] when that is
    /// not loopback.
    pub fn router(self) -> Router {
        let state = Arc::new(State {
            mq: self.mq,
            inventory: self.inventory,
            token: self.token,
            csrf: uuid::Uuid::new_v4().simple().to_string(),
            allow_mutations: self.allow_mutations,
            peek_limit: self.peek_limit,
            broker_label: self.broker_label,
            jobs: Mutex::new(HashMap::new()),
        });
        let p = |s: &str| format!("{BASE_PATH}{s}");
        Router::new()
            .route(&p("/"), get(pages::queues))
            .route(&p("/stuck"), get(pages::stuck))
            .route(&p("/events"), get(actions::queue_events))
            .route(&p("/q/{queue}"), get(pages::dead_letters))
            .route(&p("/q/{queue}/m/{id}"), get(pages::message))
            .route(&p("/q/{queue}/dry-run"), post(actions::dry_run))
            .route(&p("/q/{queue}/run"), post(actions::run))
            .route(&p("/jobs/{id}"), get(actions::job_page))
            .route(&p("/jobs/{id}/events"), get(actions::job_events))
            .route(&p("/assets/console.js"), get(pages::script))
            .route(&p("/assets/console.css"), get(pages::style))
            .route(BASE_PATH, get(pages::to_index))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                auth::guard,
            ))
            .with_state(state)
    }

    /// Serves the console on its own (at [`ConsoleBuilder::bind`]; `/` leads to the
    /// pages) until [`ConsoleHandle::shutdown`]. Refuses a non-loopback address without a
    /// token.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let mq = acemq::Connection::connect("amqp://127.0.0.1").await?;
    /// let console = acemq::console::Console::builder(&mq)
    ///     .queues(["orders.new"])
    ///     .serve()
    ///     .await?;
    /// println!("http://{}/acemq-console/", console.local_addr());
    /// console.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn serve(self) -> Result<ConsoleHandle, ConsoleError> {
        let addr = self.bind;
        if !addr.ip().is_loopback() && self.token.is_none() {
            return Err(ConsoleError::TokenRequired { addr });
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ConsoleError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| ConsoleError::Bind { addr, source })?;
        let app = self.router().route(
            "/",
            get(|| async { axum::response::Redirect::to(&format!("{BASE_PATH}/")) }),
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::warn!("the console stopped: {e}");
            }
        });
        Ok(ConsoleHandle {
            addr: local,
            stop: Some(stop),
            task,
        })
    }
}

/// A running console ([`ConsoleBuilder::serve`]).
#[derive(Debug)]
pub struct ConsoleHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ConsoleHandle {
    /// The address it listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets open requests finish (live-update streams are cut after 5 s).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }

    /// Waits until the server stops (it only stops on [`ConsoleHandle::shutdown`] or an
    /// I/O failure).
    pub async fn wait(self) {
        let ConsoleHandle { stop, task, .. } = self;
        let _ = task.await;
        drop(stop);
    }
}

/// What every handler shares.
pub(crate) struct State {
    mq: Connection,
    inventory: Option<Arc<dyn Inventory>>,
    token: Option<String>,
    csrf: String,
    allow_mutations: bool,
    peek_limit: usize,
    broker_label: String,
    jobs: Mutex<HashMap<String, Arc<Mutex<actions::Job>>>>,
}

impl State {
    /// The inventory's queues, or what to tell the operator.
    async fn queues(&self) -> Result<Vec<QueueStat>, String> {
        match &self.inventory {
            Some(i) => i.queues().await,
            None => Err("no queues configured: name them with Console::builder(..).queues([..]) or give an inventory".into()),
        }
    }

    /// The replay of `queue`'s `.dlq`, or its `.parked` when `parked`.
    fn replay(&self, queue: &str, parked: bool) -> crate::replay::Replay {
        let r = self.mq.replay(queue);
        if parked { r.parked() } else { r }
    }
}
