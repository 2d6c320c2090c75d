//! What the benchmark runs: the message [`Payload`], the [`Scenario`]s, [`QueueKind`] and
//! [`Side`], and the [`Broker`] that holds the connections and runs one scenario on a fresh
//! queue through either side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use lapin::ConnectionProperties;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde::{Deserialize, Serialize};

use crate::ace::{acemq_confirm_each, acemq_consume, acemq_pipelined, acemq_retry};
use crate::raw::{fill, raw_confirm_each, raw_consume, raw_pipelined, raw_retry};
use crate::{Result, Sample, acemq_request_reply, raw_request_reply};

/// The message body: JSON of exactly the configured size (when the size allows it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Payload {
    /// Sequence number.
    pub seq: u64,
    /// Padding up to the size.
    pub pad: String,
}

impl Payload {
    /// A payload whose JSON encoding is `size` bytes (or the minimum, when smaller).
    pub fn new(seq: u64, size: usize) -> Payload {
        let empty = serde_json::to_vec(&Payload {
            seq,
            pad: String::new(),
        })
        .map(|v| v.len())
        .unwrap_or(0);
        Payload {
            seq,
            pad: "x".repeat(size.saturating_sub(empty)),
        }
    }
}

/// Durable classic or quorum queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueKind {
    /// A durable classic queue.
    Classic,
    /// A durable quorum queue.
    Quorum,
}

impl QueueKind {
    /// `classic` / `quorum`.
    pub fn name(self) -> &'static str {
        match self {
            QueueKind::Classic => "classic",
            QueueKind::Quorum => "quorum",
        }
    }
}

/// The scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// 1: publish, await each confirm.
    ConfirmEach,
    /// 2: publish with confirms pipelined (batches of 100).
    Pipelined,
    /// 3: consume, one manual ack per message, prefetch 100.
    Consume,
    /// 4: consume where every message fails once and succeeds on the retry.
    Retry,
    /// 5: memory:// publish + consume (AceMQ only).
    Memory,
    /// 6: concurrency 1, 10% fail once with a 2 s consumer wait; the others' rate against
    /// a run without failures (AceMQ only).
    Waits,
    /// 7: request/reply round trips, 16 in flight (and AceMQ alone on memory://).
    RequestReply,
}

impl Scenario {
    /// Every scenario, in table order.
    pub const ALL: [Scenario; 7] = [
        Scenario::ConfirmEach,
        Scenario::Pipelined,
        Scenario::Consume,
        Scenario::Retry,
        Scenario::Memory,
        Scenario::Waits,
        Scenario::RequestReply,
    ];

    /// The table label (request/reply's names its window, `--window`).
    pub fn label(self) -> String {
        let fixed = match self {
            Scenario::ConfirmEach => "1 publish, confirm each",
            Scenario::Pipelined => "2 publish, pipelined x100",
            Scenario::Consume => "3 consume, ack each",
            Scenario::Retry => "4 fail once, retry 1 ms",
            Scenario::Memory => "5 memory:// pub+consume",
            Scenario::Waits => "6 10% wait 2 s, conc. 1",
            Scenario::RequestReply => {
                return format!("7 request/reply x{}", crate::request::request_window());
            }
        };
        fixed.to_owned()
    }

    /// Whether the scenario has a raw lapin counterpart (all but `memory://` and the
    /// waits, which compare AceMQ with itself).
    pub fn has_raw(self) -> bool {
        !matches!(self, Scenario::Memory | Scenario::Waits)
    }

    /// Whether its raw side publishes, so that it can also write the wire contract
    /// (`--raw-contract`): the default run then adds a like-with-like row (1, 2 and 7).
    pub fn has_contract_variant(self) -> bool {
        matches!(
            self,
            Scenario::ConfirmEach | Scenario::Pipelined | Scenario::RequestReply
        )
    }

    /// What the latency columns measure.
    pub fn latency_unit(self) -> Option<&'static str> {
        match self {
            Scenario::ConfirmEach => Some("per publish"),
            Scenario::Pipelined => Some("per batch of 100"),
            Scenario::RequestReply => Some("per round trip"),
            _ => None,
        }
    }
}

/// Which implementation a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Raw lapin.
    Raw,
    /// AceMQ.
    AceMq,
}

/// The connections the AMQP scenarios share.
pub struct Broker {
    /// AceMQ's connection (its own publishing and consuming connections underneath).
    pub acemq: acemq::Connection,
    /// The raw lapin connection.
    pub raw: lapin::Connection,
    /// A second raw connection, on which raw request/reply publishes when asked to
    /// (`--raw-two-connections`).
    pub raw_publishing: lapin::Connection,
    /// A separate raw connection used only to pre-fill queues and for topology.
    pub(crate) admin: lapin::Connection,
    prefix: String,
    counter: AtomicU64,
}

impl Broker {
    /// Connects AceMQ and raw lapin to `url`.
    pub async fn connect(url: &str) -> Result<Broker> {
        let acemq = acemq::Connection::connect(url).await?;
        let raw = lapin::Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name("acemq-bench raw".into()),
        )
        .await?;
        let raw_publishing = lapin::Connection::connect(
            url,
            ConnectionProperties::default()
                .with_connection_name("acemq-bench raw publishing".into()),
        )
        .await?;
        let admin = lapin::Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name("acemq-bench admin".into()),
        )
        .await?;
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Ok(Broker {
            acemq,
            raw,
            raw_publishing,
            admin,
            prefix: format!("acemq-bench.{}.{stamp}", std::process::id()),
            counter: AtomicU64::new(0),
        })
    }

    /// Closes every connection.
    pub async fn close(self) -> Result<()> {
        self.acemq.close().await?;
        self.raw.close(200, "OK".into()).await?;
        self.raw_publishing.close(200, "OK".into()).await?;
        self.admin.close(200, "OK".into()).await?;
        Ok(())
    }

    pub(crate) fn fresh_name(&self, scenario: Scenario, kind: QueueKind, side: Side) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let side = match side {
            Side::Raw => "raw",
            Side::AceMq => "acemq",
        };
        format!("{}.{scenario:?}.{}.{side}.{n}", self.prefix, kind.name())
    }

    pub(crate) async fn declare(&self, name: &str, kind: QueueKind) -> Result<()> {
        let ch = self.admin.create_channel().await?;
        let mut args = FieldTable::default();
        if kind == QueueKind::Quorum {
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString(LongString::from("quorum")),
            );
        }
        ch.queue_declare(
            short(name)?,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await?;
        ch.close(200, "OK".into()).await?;
        Ok(())
    }

    /// Deletes the queue and what an AceMQ consumer declared next to it.
    pub(crate) async fn delete(&self, name: &str) -> Result<()> {
        let ch = self.admin.create_channel().await?;
        for q in [
            name.to_owned(),
            format!("{name}.dlq"),
            format!("{name}.parked"),
        ] {
            ch.queue_delete(short(&q)?, QueueDeleteOptions::default())
                .await?;
        }
        ch.close(200, "OK".into()).await?;
        Ok(())
    }

    /// Runs one scenario once on a fresh queue, then deletes the queue.
    pub async fn run(
        &self,
        scenario: Scenario,
        kind: QueueKind,
        side: Side,
        messages: u64,
        size: usize,
    ) -> Result<Sample> {
        let queue = self.fresh_name(scenario, kind, side);
        self.declare(&queue, kind).await?;
        let result = self.run_on(scenario, side, &queue, messages, size).await;
        let deleted = self.delete(&queue).await;
        let sample = result?;
        deleted?;
        Ok(sample)
    }

    async fn run_on(
        &self,
        scenario: Scenario,
        side: Side,
        queue: &str,
        n: u64,
        size: usize,
    ) -> Result<Sample> {
        match (scenario, side) {
            (Scenario::ConfirmEach, Side::AceMq) => {
                acemq_confirm_each(&self.acemq, queue, n, size).await
            }
            (Scenario::ConfirmEach, Side::Raw) => raw_confirm_each(&self.raw, queue, n, size).await,
            (Scenario::Pipelined, Side::AceMq) => {
                acemq_pipelined(&self.acemq, queue, n, size).await
            }
            (Scenario::Pipelined, Side::Raw) => raw_pipelined(&self.raw, queue, n, size).await,
            (Scenario::Consume, side) => {
                fill(&self.admin, queue, n, size).await?;
                match side {
                    Side::AceMq => acemq_consume(&self.acemq, queue, n).await,
                    Side::Raw => raw_consume(&self.raw, queue, n).await,
                }
            }
            (Scenario::Retry, side) => {
                fill(&self.admin, queue, n, size).await?;
                match side {
                    Side::AceMq => acemq_retry(&self.acemq, queue, n).await,
                    Side::Raw => raw_retry(&self.raw, queue, n).await,
                }
            }
            (Scenario::Memory, _) => {
                Err("memory:// runs without a broker: use memory_publish_consume".into())
            }
            (Scenario::Waits, _) => Err("the waits scenario runs through Broker::run_waits".into()),
            (Scenario::RequestReply, Side::AceMq) => {
                acemq_request_reply(&self.acemq, queue, n, size).await
            }
            (Scenario::RequestReply, Side::Raw) => {
                let publishing = if crate::raw::raw_two_connections() {
                    &self.raw_publishing
                } else {
                    &self.raw
                };
                raw_request_reply(publishing, &self.raw, queue, n, size).await
            }
        }
    }
}

pub(crate) fn short(s: &str) -> Result<ShortString> {
    Ok(ShortString::try_new(s.to_owned())?)
}

pub(crate) fn payloads(n: u64, size: usize) -> Vec<Payload> {
    (0..n).map(|i| Payload::new(i, size)).collect()
}
