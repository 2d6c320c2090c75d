//! Unit tests of the replay pass that need the crate's internals (an engine without a
//! connection).

use std::sync::Arc;

use super::Replay;
use crate::engine::Engine;
use crate::error::Error;
use crate::topology::QueueDecl;
use crate::transport::memory::MemoryTransport;
use crate::transport::{Confirmation, Outbound, Properties, Transport};

/// A destination deleted under a running pass: the copy routes nowhere, which is
/// reported as unroutable (not "not found"), and the dead letter stays where it was.
/// (A replay needs only an engine, not a whole connection.)
#[tokio::test]
async fn a_copy_that_routes_nowhere_is_reported_as_unroutable() {
    let t: Arc<dyn Transport> = Arc::new(MemoryTransport::connect("replay-unroutable-unit"));
    let engine = Engine::new(t.clone(), "test", 8);
    t.declare_queue(&QueueDecl::classic("orders"))
        .await
        .unwrap();
    t.declare_queue(&QueueDecl::classic("orders.dlq"))
        .await
        .unwrap();
    let dead = Outbound {
        exchange: String::new(),
        routing_key: "orders.dlq".into(),
        mandatory: true,
        properties: Properties::default(),
        body: bytes::Bytes::from_static(b"lost?"),
    };
    assert_eq!(
        engine.publish_on_behalf(dead).await.unwrap(),
        Confirmation::Routed
    );
    let replay = Replay::new(engine, "orders");
    let deleter = t.clone();
    let err = replay
        .replay_matching(1, move |_| {
            // The destination goes away after the pass checked it.
            futures::executor::block_on(deleter.delete_queue("orders")).unwrap();
            true
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Unroutable { routing_key, .. } if routing_key == "orders"),
        "{err:?}"
    );
    assert_eq!(replay.pending().await.unwrap(), 1, "the dead letter stays");
    t.close().await.unwrap();
}

#[test]
fn a_filter_reads_scalar_headers_as_text() {
    use super::header_text;
    use crate::headers::{HeaderValue, Headers};
    assert_eq!(
        header_text(&HeaderValue::from("acme")).as_deref(),
        Some("acme")
    );
    assert_eq!(header_text(&HeaderValue::I32(42)).as_deref(), Some("42"));
    assert_eq!(header_text(&HeaderValue::U8(7)).as_deref(), Some("7"));
    assert_eq!(
        header_text(&HeaderValue::Bool(true)).as_deref(),
        Some("true")
    );
    assert_eq!(
        header_text(&HeaderValue::Bytes(b"raw".to_vec())).as_deref(),
        Some("raw")
    );
    assert_eq!(header_text(&HeaderValue::Table(Headers::new())), None);
    assert_eq!(header_text(&HeaderValue::Void), None);
}
