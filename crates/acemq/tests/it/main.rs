//! The acemq integration tests, one module per area, in one test binary (one link instead of
//! one per file). A module that needs an optional feature is compiled only with it; the
//! crate's tests always have `testing` (the dev-dependency on itself turns it on).
//!
//! Not here, each a binary of its own because it needs its own process:
//! * `serial/`: tests that change global broker state (a memory alarm), `#[ignore]`d and run
//!   one at a time by `scripts/test.sh`'s serial step;
//! * `drills.rs`: the recovery drills (`#[ignore]`d, run one at a time by `scripts/test.sh`);
//! * `observability.rs`, `observability_contract.rs`, `actuator_prometheus.rs`: each installs
//!   the process-global Prometheus recorder;
//! * `opentelemetry.rs`: installs its own process-global tracing subscriber.
//!
//! A test here that re-runs itself as a child process names itself with
//! [`support::this_test`], the name this binary lists it under.

#[path = "../support/mod.rs"]
mod support;

#[path = "../contract/mod.rs"]
mod contract;

#[cfg(feature = "actuator")]
#[path = "../http_client/mod.rs"]
mod http_client;

mod ack_coalescing;
#[cfg(feature = "actuator")]
mod actuator_router;
#[cfg(feature = "amqp")]
mod amqp_transport;
mod codec_dispatch;
#[cfg(all(feature = "encryption", feature = "claim-check"))]
mod codec_wrappers;
#[cfg(all(
    feature = "yaml",
    feature = "toml",
    feature = "xml",
    feature = "avro",
    feature = "protobuf"
))]
mod codecs;
#[cfg(feature = "console")]
mod console_router;
mod consumer_group;
mod consumer_lifecycle;
mod crash_loop;
mod delivery_core;
#[cfg(feature = "actuator")]
mod health_actuator;
#[cfg(feature = "actuator")]
mod health_consuming;
#[cfg(feature = "testing")]
mod idempotency_conformance;
mod lifecycle;
mod memory_broker;
#[cfg(feature = "testing")]
mod ordered;
mod ordered_kill;
#[cfg(feature = "testing")]
mod ordered_takeover;
mod pipeline;
mod publish_consume;
#[cfg(all(feature = "amqp", feature = "testing"))]
mod recovery;
#[cfg(feature = "testing")]
mod recovery_consumers;
mod recovery_metrics;
mod recovery_model;
mod replay;
mod replay_bounded;
#[cfg(feature = "testing")]
mod request_reply;
mod retry_contract;
mod saga;
mod scheduler;
#[cfg(feature = "schema-registry")]
mod schema_registry;
mod settlement;
mod settlement_faults;
mod settlement_store;
mod settlement_time;
#[cfg(feature = "amqp")]
mod streams;
mod topology_contract;
#[cfg(feature = "testing")]
mod transport_conformance;
#[cfg(feature = "amqp")]
mod wire_contract;
