//! Tests that change global broker state (`rabbitmqctl set_vm_memory_high_watermark 0`
//! blocks every publisher on the broker), in a binary of their own. Each is
//! `#[ignore = "serial: changes global broker state"]`: a plain `cargo test` leaves them out,
//! and `scripts/test.sh`'s serial step runs them with `--ignored --test-threads=1`, after the
//! parallel tests and never beside them. By hand: `flock /tmp/acemq-broker.lock cargo test
//! -p acemq --all-features --test serial -- --ignored --test-threads=1`. Each restores the
//! watermark with a drop guard, also when it fails.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "actuator")]
#[path = "../http_client/mod.rs"]
mod http_client;

#[cfg(feature = "amqp")]
mod amqp_blocked;
#[cfg(feature = "amqp")]
mod amqp_blocked_moves;
#[cfg(all(feature = "amqp", feature = "actuator"))]
mod blocked_health;
