//! The idempotency store conformance suite (`acemq::idempotency::conformance`) on the
//! in-memory store, its own single owner. The SQL stores run it in acemq-sql's tests.

use std::sync::Arc;

use acemq::idempotency::conformance::{Owners, one_store_per_timeout, run_all};
use acemq::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_in_memory_store_conforms() {
    let make = one_store_per_timeout(|lease| {
        Arc::new(InMemoryIdempotencyStore::for_one_day().claim_timeout(lease))
            as Arc<dyn IdempotencyStore>
    });
    run_all("memory", make, Owners::One).await;
}
