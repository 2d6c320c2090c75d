//! How a drill opens its AceMQ connection: the only place that knows the connection API, so
//! it can follow the library's options (a connection name, several addresses) in one edit.
//!
//! Shared by `crates/acemq/tests/drills.rs` and `crates/acemq-sql/tests/drills.rs` (the
//! latter includes this file by path).
#![allow(dead_code)]

use std::sync::Arc;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::transport::amqp::{AmqpOptions, AmqpTransport};

/// Connects to `url` with the connection name `name` (RabbitMQ shows `{name} (publish)` and
/// `{name} (consume)`), so the drill can find its own connections and no one else's.
pub async fn connect_named(url: &str, name: &str) -> Result<Connection, acemq::Error> {
    let t = AmqpTransport::connect_with(url, AmqpOptions::default().connection_name(name)).await?;
    Ok(Connection::with_transport(
        Arc::new(t),
        ConnectionOptions::default(),
    ))
}

/// Connects to a cluster given by its nodes' URLs, named `name`.
///
/// For now this connects to the first URL only (failover needs the library's multi-address
/// connection, which replaces this body).
pub async fn connect_cluster(urls: &[String], name: &str) -> Result<Connection, acemq::Error> {
    let first = urls
        .first()
        .ok_or_else(|| acemq::Error::Config("connect_cluster needs at least one URL".into()))?;
    connect_named(first, name).await
}

/// A connection name unique to this drill run: `acemq-drill.{drill}.{pid}.{nanos}`.
pub fn drill_name(drill: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("acemq-drill.{drill}.{}.{nanos}", std::process::id())
}
