//! How a drill opens its AceMQ connection: the only place that knows the connection API, so
//! it can follow the library's options in one edit.
//!
//! Every drill connection has a unique name (RabbitMQ lists `{name} (publish)` and
//! `{name} (consume)`, so a drill finds its own connections and no one else's), recovers
//! with the library's default policy (what users get: the restart drill asserts its 2 s
//! return), and gives up connecting at startup after [`CONNECT_TIMEOUT`].
//!
//! Shared by `crates/acemq/tests/drills.rs` and `crates/acemq-sql/tests/drills.rs` (the
//! latter includes this file by path).
#![allow(dead_code)]

use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::transport::recovery::RecoveryPolicy;

/// How long connecting at startup retries an unreachable broker.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// The options every drill connection uses: named `name`, recovering with the defaults.
pub fn drill_options(name: &str) -> ConnectionOptions {
    ConnectionOptions::default()
        .name(name)
        .recovery(RecoveryPolicy::default())
        .connect_timeout(CONNECT_TIMEOUT)
}

/// Connects to `url` with the connection name `name` (RabbitMQ shows `{name} (publish)` and
/// `{name} (consume)`), recovering with the default policy.
pub async fn connect_named(url: &str, name: &str) -> Result<Connection, acemq::Error> {
    Connection::connect_with(url, drill_options(name)).await
}

/// [`connect_named`] with a heartbeat of `seconds` (a network cut without a close is
/// noticed only by missed heartbeats, after about two of them).
pub async fn connect_named_with_heartbeat(
    url: &str,
    name: &str,
    seconds: u16,
) -> Result<Connection, acemq::Error> {
    Connection::connect_with(url, drill_options(name).heartbeat(seconds)).await
}

/// [`connect_named`] with recovery turned off: a connection the broker closes stays closed
/// (for tests of the drill tooling itself, which must see the close).
pub async fn connect_named_without_recovery(
    url: &str,
    name: &str,
) -> Result<Connection, acemq::Error> {
    Connection::connect_with(
        url,
        drill_options(name).recovery(RecoveryPolicy::disabled()),
    )
    .await
}

/// Connects to a cluster given by its nodes' URLs, named `name`: the first URL is dialled
/// first, every other is an `.address(..)` the connection fails over to when its node goes.
pub async fn connect_cluster(urls: &[String], name: &str) -> Result<Connection, acemq::Error> {
    let (first, rest) = urls
        .split_first()
        .ok_or_else(|| acemq::Error::Config("connect_cluster needs at least one URL".into()))?;
    let options = rest
        .iter()
        .fold(drill_options(name), |o, url| o.address(url.clone()));
    Connection::connect_with(first, options).await
}

/// A connection name unique to this drill run: `acemq-drill.{drill}.{pid}.{nanos}`.
pub fn drill_name(drill: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("acemq-drill.{drill}.{}.{nanos}", std::process::id())
}
