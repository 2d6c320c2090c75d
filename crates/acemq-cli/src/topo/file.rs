//! The topology file: TOML mapped onto acemq's [`Topology`] builder, so the CLI declares
//! exactly what a service declaring the same topology in code would.
//!
//! ```toml
//! [[exchange]]
//! name = "orders"
//! type = "topic"                 # direct | fanout | topic | headers
//!
//! [[queue]]
//! name = "orders.new"            # quorum by default; type = "classic" for a classic one
//! dead_letter = true             # + orders.new.dlq, orders.new.parked, acemq.dlx, bindings
//! retry = { attempts = 5, initial = "10s", max = "5m" }   # + acemq.retry and the rungs
//!
//! [[binding]]
//! queue = "orders.new"
//! exchange = "orders"
//! routing_key = "order.*"
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use acemq::headers::{HeaderValue, Headers};
use acemq::retry::RetryPolicy;
use acemq::topology::{ExchangeDecl, ExchangeKind, QueueDecl, Topology};
use serde::Deserialize;

use crate::cli::parse_duration;
use crate::fail::Failure;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    #[serde(default)]
    exchange: Vec<ExchangeSpec>,
    #[serde(default)]
    queue: Vec<QueueSpec>,
    #[serde(default)]
    binding: Vec<BindingSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExchangeSpec {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    auto_delete: bool,
    #[serde(default)]
    arguments: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueSpec {
    name: String,
    #[serde(rename = "type", default)]
    queue_type: Option<String>,
    #[serde(default)]
    dead_letter: bool,
    #[serde(default)]
    arguments: BTreeMap<String, toml::Value>,
    retry: Option<RetrySpec>,
}

/// `exponential` (attempts, initial, max[, multiplier]) or `fixed` (attempts, delay).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetrySpec {
    attempts: u32,
    initial: Option<String>,
    max: Option<String>,
    multiplier: Option<f64>,
    delay: Option<String>,
    /// Waits at least this long are spent on broker rungs (the library's default: 30s).
    broker_from: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingSpec {
    queue: String,
    exchange: String,
    #[serde(default)]
    routing_key: String,
    /// For a headers exchange: the values to match, and `match = "all" | "any"`.
    #[serde(default)]
    headers: BTreeMap<String, toml::Value>,
    #[serde(rename = "match", default)]
    match_mode: Option<String>,
}

/// Reads and builds the topology a file describes.
pub fn load(path: &Path) -> Result<Topology, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
    parse(&text).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))
}

/// Builds the topology a TOML text describes.
pub fn parse(text: &str) -> Result<Topology, String> {
    let file: TopologyFile = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut b = Topology::define();
    for e in file.exchange {
        let kind = ExchangeKind::parse(&e.kind).ok_or_else(|| {
            format!(
                "exchange {}: type {:?}: use direct, fanout, topic or headers",
                e.name, e.kind
            )
        })?;
        let mut decl = ExchangeDecl::durable(e.name, kind);
        decl.auto_delete = e.auto_delete;
        decl.arguments = headers(&e.arguments)?;
        b = b.exchange_decl(decl);
    }
    for q in file.queue {
        let args = headers(&q.arguments)?;
        let classic = match q.queue_type.as_deref() {
            None | Some("quorum") => false,
            Some("classic") => true,
            Some(other) => {
                return Err(format!(
                    "queue {}: type {other:?}: use quorum or classic",
                    q.name
                ));
            }
        };
        b = match (classic, q.dead_letter) {
            (true, true) => b.classic_queue_with_dead_letter(q.name.as_str(), args),
            (true, false) => b.classic_queue(q.name.as_str(), args),
            (false, true) if args.is_empty() => b.queue_with_dead_letter(q.name.as_str()),
            (false, dead_letter) => {
                let mut decl = QueueDecl::quorum(q.name.as_str());
                decl.arguments.extend(args);
                if dead_letter {
                    // A quorum source queue with arguments of its own: its dead-letter
                    // arguments, and the targets a consumer of it declares.
                    decl.arguments
                        .extend(acemq::topology::source_dead_letter_arguments(&q.name));
                }
                let mut b = b.queue_decl(decl);
                if dead_letter {
                    b = merge(b, &Topology::for_consumer(&q.name, None));
                }
                b
            }
        };
        if let Some(r) = &q.retry {
            b = b.queue_with_retry(q.name.as_str(), &policy(&q.name, r)?);
        }
    }
    for bnd in file.binding {
        b = if bnd.headers.is_empty() && bnd.match_mode.is_none() {
            b.bind(bnd.queue, bnd.exchange, bnd.routing_key)
        } else {
            let all = match bnd.match_mode.as_deref() {
                None | Some("all") => true,
                Some("any") => false,
                Some(other) => return Err(format!("binding match {other:?}: use all or any")),
            };
            b.bind_headers(bnd.queue, bnd.exchange, all, headers(&bnd.headers)?)
        };
    }
    b.build().map_err(|e| e.to_string())
}

fn merge(
    mut b: acemq::topology::TopologyBuilder,
    t: &Topology,
) -> acemq::topology::TopologyBuilder {
    for e in t.exchanges() {
        b = b.exchange_decl(e.clone());
    }
    for q in t.queues() {
        b = b.queue_decl(q.clone());
    }
    for x in t.bindings() {
        b = if x.arguments.is_empty() {
            b.bind(
                x.queue.as_str(),
                x.exchange.as_str(),
                x.routing_key.as_str(),
            )
        } else {
            b.bind_headers(
                x.queue.as_str(),
                x.exchange.as_str(),
                true,
                x.arguments.clone(),
            )
        };
    }
    b
}

fn policy(queue: &str, r: &RetrySpec) -> Result<RetryPolicy, String> {
    let dur = |what: &str, v: &Option<String>| -> Result<Duration, String> {
        let v = v
            .as_deref()
            .ok_or_else(|| format!("queue {queue}: retry needs {what}"))?;
        parse_duration(v).map_err(|e| format!("queue {queue}: retry {what}: {e}"))
    };
    let p = if r.delay.is_some() {
        RetryPolicy::fixed(r.attempts, dur("delay", &r.delay)?)
    } else {
        let (initial, max) = (dur("initial", &r.initial)?, dur("max", &r.max)?);
        match r.multiplier {
            Some(m) => RetryPolicy::exponential_with_multiplier(r.attempts, initial, m, max),
            None => RetryPolicy::exponential(r.attempts, initial, max),
        }
    }
    .map_err(|e| format!("queue {queue}: retry: {e}"))?;
    Ok(match &r.broker_from {
        Some(_) => p.wait_in_broker_from(dur("broker_from", &r.broker_from)?),
        None => p,
    })
}

fn headers(values: &BTreeMap<String, toml::Value>) -> Result<Headers, String> {
    values
        .iter()
        .map(|(k, v)| Ok((k.into(), header(k, v)?)))
        .collect()
}

fn header(key: &str, v: &toml::Value) -> Result<HeaderValue, String> {
    Ok(match v {
        toml::Value::String(s) => HeaderValue::from(s.as_str()),
        toml::Value::Integer(i) => HeaderValue::I64(*i),
        toml::Value::Float(f) => HeaderValue::F64(*f),
        toml::Value::Boolean(b) => HeaderValue::Bool(*b),
        other => {
            return Err(format!(
                "argument {key}: {} values are not supported (use a string, number or boolean)",
                other.type_str()
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_file_builds_what_the_builder_builds() {
        let t = parse(include_str!("../../examples/topology.toml")).unwrap();
        assert!(t.exchange("acemq.dlx").is_some());
        assert!(t.queue("orders.new.dlq").is_some());
        assert!(t.queue("orders.new.retry.40s").is_some());
        assert_eq!(
            t.queue("orders.new").unwrap().arguments["x-dead-letter-routing-key"].as_str(),
            Some("orders.new.dlq")
        );
    }

    #[test]
    fn mistakes_say_what_to_write() {
        let e = parse("[[exchange]]\nname = \"x\"\ntype = \"fan\"\n").unwrap_err();
        assert!(e.contains("direct, fanout, topic or headers"), "{e}");
        let e = parse("[[queue]]\nname = \"q\"\ntype = \"stream\"\n").unwrap_err();
        assert!(e.contains("quorum or classic"), "{e}");
        assert!(parse("[[queue]]\nnam = \"q\"\n").is_err());
    }
}
