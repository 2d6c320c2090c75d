//! Transport conformance: every case of [`acemq::transport::conformance`] runs on
//! `memory://` and, when `ACEMQ_TEST_AMQP_URL` is set, on RabbitMQ, and must pass on both.
//! The cases are written for RabbitMQ 3.10's behaviour; where the memory broker differs, it
//! is wrong.
//!
//! Each case uses fresh names and deletes what it declared. The cases: routing through the
//! default, direct, fanout, topic and headers exchanges, mandatory returns, missing
//! exchanges (`routing`); subscriptions and settlement: prefetch, requeue, nack to a
//! dead-letter exchange, close, cancel, basic.get, multiple acks, `try_next` (`delivery`); queue
//! declarations and time-to-live: TTL and per-message expiration dead-lettering, head-only
//! expiry, PRECONDITION_FAILED, queue types, server-named queues (`queues`).

/// On a fresh `memory://` broker per case.
mod memory {
    acemq::transport_conformance_tests!(acemq::transport::conformance::Target::memory());
}

/// On RabbitMQ at `ACEMQ_TEST_AMQP_URL`; skipped with a note when it is unset, and failing
/// when `ACEMQ_TEST_REQUIRE_BROKER=1` (CI) and it is unset. Not in a build without the
/// `amqp` feature: that build has no RabbitMQ transport.
#[cfg(feature = "amqp")]
mod rabbitmq {
    acemq::transport_conformance_tests!(
        crate::support::amqp_url().map(acemq::transport::conformance::Target::url)
    );
}
