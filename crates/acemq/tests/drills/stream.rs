//! The stream resume drill: a reader's consuming connection is closed by the
//! broker 650 entries into 1,000; the reader subscribes again from its position (just after
//! the newest settled entry, or at the oldest delivered-but-unsettled one) and the books
//! must show no entry lost and at most the entry in the handler at the close repeated
//! (offset tracking skips what was handled; not a prefetch window of repeats).

use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::consume::Message;
use acemq::stream::StreamRetention;
use tokio::sync::Notify;

use super::broker::close_our_connections_async;
use super::ledger::Ledger;

/// Entries written before the reader starts.
pub const ENTRIES: u64 = 1_000;
/// The entry whose handler is running when the connection is closed.
pub const CLOSE_AT: u64 = 650;
/// The reader's prefetch: the most entries that can be delivered and not settled.
pub const PREFETCH: u16 = 100;

/// Runs the drill on `mq` (named `name`, so `{name} (consume)` is the reader's connection);
/// returns the accounting line after asserting it.
pub async fn run(mq: &Connection, name: &str, node: Option<String>) -> String {
    let s = crate::support::unique("drill.stream");
    mq.declare_stream(
        &s,
        StreamRetention::new().max_age(Duration::from_secs(3600)),
    )
    .await
    .expect("declare the stream");
    let ledger = Arc::new(Ledger::default());
    let publisher = mq.publisher::<u64>("", &s);
    for id in 0..ENTRIES {
        ledger.attempt(id);
        publisher.send(&id).await.expect("confirmed");
        ledger.confirmed(id);
    }
    let closed = Arc::new(Notify::new());
    let (books, gate) = (ledger.clone(), closed.clone());
    let t0 = Instant::now();
    let reader = mq
        .stream::<u64>(&s)
        .from_first()
        .prefetch(PREFETCH)
        .consume(move |e: Message<u64>| {
            let (books, gate) = (books.clone(), gate.clone());
            async move {
                if *e.payload() == CLOSE_AT && books.total_runs() == CLOSE_AT {
                    // Hold this entry (delivered, not settled) until the close is done.
                    gate.notified().await;
                }
                books.handled(*e.payload());
                Ok(())
            }
        })
        .await
        .expect("the reader starts");
    crate::support::eventually(Duration::from_secs(60), "650 entries handled", || async {
        (ledger.total_runs() >= CLOSE_AT).then_some(())
    })
    .await;
    let fault = Instant::now();
    let n = close_our_connections_async(node, format!("{name} (consume)"), "acemq stream drill")
        .await
        .expect("rabbitmqctl close_connection");
    assert_eq!(n, 1, "exactly the reader's connection is closed");
    closed.notify_one();
    crate::support::eventually(
        Duration::from_secs(60),
        "entries after the close",
        || async { (ledger.counts().handled_distinct >= CLOSE_AT + 2).then_some(()) },
    )
    .await;
    let recovered_in = fault.elapsed();
    crate::support::eventually(Duration::from_secs(60), "every entry handled", || async {
        (ledger.counts().handled_distinct >= ENTRIES).then_some(())
    })
    .await;
    // Let anything repeated arrive before counting (the reader is idle at the end).
    crate::support::eventually(Duration::from_secs(10), "the reader idle", || async {
        (reader.last_handled_offset() == Some(ENTRIES - 1)).then_some(())
    })
    .await;
    let counts = ledger.counts();
    let line = format!(
        "{} resubscriptions={} elapsed={}ms",
        counts.line("stream-resume", Some(recovered_in)),
        reader.resubscriptions(),
        t0.elapsed().as_millis()
    );
    println!("{line}");
    reader.close().await;
    mq.transport()
        .delete_queue(&s)
        .await
        .expect("delete the stream");
    assert_eq!(counts.lost, 0, "{line}");
    assert_eq!(counts.phantom, 0, "{line}");
    // What offset tracking guarantees: entries run one at a time, the reader resumes from
    // its position and skips what it handled (the floor), so only the entry whose handler
    // was running at the close could run twice — and not even that one, as its handler
    // finishes before the new subscription delivers it. Not a prefetch window.
    assert!(counts.duplicates <= 1, "{line}");
    assert!(
        reader.resubscriptions() >= 1,
        "the close was not noticed: {line}"
    );
    line
}
