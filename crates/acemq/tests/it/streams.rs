//! Streams: `memory://` refuses them clearly; on RabbitMQ a declared stream has
//! exactly the family's arguments, and each start (`first`, an offset, a timestamp, the
//! last 10 minutes, `last`, `next`) begins where it should; a failing handler stops the
//! reader, `skip_failures` counts and goes on. The reconnect drill is in `tests/drills.rs`
//! (`drill_stream_resumes_after_a_close`).

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use acemq::Connection;
use acemq::consume::HandlerError;
use acemq::consume::Message;
use acemq::stream::{StreamConsumer, StreamRetention};
use support::{amqp_url, eventually, unique};

type Seen = Arc<Mutex<Vec<(u64, i64)>>>;

async fn reader(
    r: acemq::stream::StreamReader<i64, acemq::codec::Json>,
    fail_on: Option<i64>,
) -> (StreamConsumer, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let consumer = r
        .consume(move |e: Message<i64>| {
            let s = s.clone();
            async move {
                if Some(*e.payload()) == fail_on {
                    return Err(HandlerError::retry(format!("no {}", e.payload())));
                }
                s.lock()
                    .unwrap()
                    .push((e.stream_offset().unwrap(), *e.payload()));
                Ok(())
            }
        })
        .await
        .expect("the reader starts");
    (consumer, seen)
}

async fn wait_for(seen: &Seen, n: usize, what: &str) -> Vec<(u64, i64)> {
    eventually(Duration::from_secs(15), what, || async {
        let s = seen.lock().unwrap().clone();
        (s.len() >= n).then_some(s)
    })
    .await
}

async fn publish(mq: &Connection, stream: &str, values: std::ops::Range<i64>) {
    let p = mq.publisher::<i64>("", stream);
    for v in values {
        p.send(&v).await.expect("confirmed");
    }
}

#[tokio::test]
async fn memory_refuses_streams_naming_the_limitation() {
    let mq = Connection::connect(&format!("memory://{}", unique("streams")))
        .await
        .unwrap();
    let e = mq
        .declare_stream("s", StreamRetention::new().max_age(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no stream"), "{e}");
    support::declare_classic(&mq, "q").await;
    let e = mq
        .stream::<i64>("q")
        .from_first()
        .consume(|_| async { Ok(()) })
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("memory:// broker has no streams") && text.contains("RabbitMQ"),
        "{text}"
    );
    mq.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_stream_has_the_family_arguments() {
    let Some(url) = amqp_url() else { return };
    let mq = Connection::connect(&url).await.unwrap();
    let s = unique("stream.args");
    mq.declare_stream(
        &s,
        StreamRetention::new()
            .max_age(Duration::from_secs(7 * 86_400))
            .max_length_bytes(1 << 30)
            .segment_bytes(1 << 20),
    )
    .await
    .unwrap();
    support::assert_rabbit_queue_arguments(
        &s,
        &[
            ("x-queue-type", "longstr", "stream"),
            ("x-max-age", "longstr", "7D"),
            ("x-max-length-bytes", "long", "1073741824"),
            ("x-stream-max-segment-size-bytes", "long", "1048576"),
        ],
    );
    let bare = unique("stream.bare");
    mq.declare_stream(
        &bare,
        StreamRetention::new().max_age(Duration::from_secs(90 * 60)),
    )
    .await
    .unwrap();
    support::assert_rabbit_queue_arguments(
        &bare,
        &[
            ("x-queue-type", "longstr", "stream"),
            ("x-max-age", "longstr", "90m"),
        ],
    );
    for q in [&s, &bare] {
        mq.transport().delete_queue(q).await.unwrap();
    }
    mq.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_start_begins_where_it_should() {
    let Some(url) = amqp_url() else { return };
    let mq = Connection::connect(&url).await.unwrap();
    let s = unique("stream.offsets");
    mq.declare_stream(
        &s,
        StreamRetention::new().max_age(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    publish(&mq, &s, 0..5).await;
    // A timestamp start is chunk-granular in whole seconds: put a second boundary between
    // the two batches (a wall-clock condition, so a wait rather than a poll).
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    let boundary = Duration::from_secs(now.as_secs() + 1);
    tokio::time::sleep(boundary - now + Duration::from_millis(50)).await;
    let between = SystemTime::UNIX_EPOCH + boundary;
    publish(&mq, &s, 5..10).await;

    let (first, seen) = reader(mq.stream::<i64>(&s).from_first(), None).await;
    let got = wait_for(&seen, 10, "from first: all ten").await;
    assert_eq!(
        got.iter().map(|e| e.1).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    assert_eq!(got[0].0, 0, "a new stream starts at offset 0");
    eventually(Duration::from_secs(5), "last handled offset", || async {
        (first.last_handled_offset() == Some(got[9].0)).then_some(())
    })
    .await;
    first.close().await;
    let offset_of_7 = got[7].0;

    let (r, seen) = reader(mq.stream::<i64>(&s).from_offset(offset_of_7), None).await;
    let got = wait_for(&seen, 3, "from offset").await;
    assert_eq!(got[0], (offset_of_7, 7), "from_offset starts at that entry");
    r.close().await;

    let (r, seen) = reader(mq.stream::<i64>(&s).from_timestamp(between), None).await;
    let got = wait_for(&seen, 5, "from timestamp").await;
    assert_eq!(got[0].1, 5, "the first entry written after the timestamp");
    r.close().await;

    let (r, seen) = reader(
        mq.stream::<i64>(&s)
            .from_last_duration(Duration::from_secs(600)),
        None,
    )
    .await;
    let got = wait_for(&seen, 10, "the last 10 minutes").await;
    assert_eq!(got[0].1, 0, "everything was written in the last 10 minutes");
    r.close().await;

    let (last, seen_last) = reader(mq.stream::<i64>(&s).from_last(), None).await;
    let (next, seen_next) = reader(mq.stream::<i64>(&s).from_next(), None).await;
    let got = wait_for(&seen_last, 1, "from last").await;
    assert!(
        got[0].1 >= 5,
        "from_last starts in the last chunk, not at {}",
        got[0].1
    );
    // `next` is only what is written after it subscribed.
    publish(&mq, &s, 10..11).await;
    let got = wait_for(&seen_next, 1, "from next").await;
    assert_eq!(got, [(offset_of_7 + 3, 10)]);
    wait_for(&seen_last, 1, "last sees 10 too").await;
    last.close().await;
    next.close().await;
    mq.transport().delete_queue(&s).await.unwrap();
    mq.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_stops_the_reader_unless_it_skips_failures() {
    let Some(url) = amqp_url() else { return };
    let mq = Connection::connect(&url).await.unwrap();
    let s = unique("stream.failing");
    mq.declare_stream(&s, StreamRetention::new().max_length_bytes(1 << 20))
        .await
        .unwrap();
    publish(&mq, &s, 0..6).await;

    let (stops, seen) = reader(mq.stream::<i64>(&s).from_first(), Some(3)).await;
    stops.stopped().await;
    assert!(!stops.is_active());
    assert_eq!(
        seen.lock().unwrap().iter().map(|e| e.1).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(stops.last_handled_offset(), Some(2));
    let failure = stops.failure().expect("why it stopped");
    assert!(
        failure.contains("stopped at offset 3") && failure.contains("no 3"),
        "{failure}"
    );

    let (skips, seen) = reader(mq.stream::<i64>(&s).from_first().skip_failures(), Some(3)).await;
    let got = wait_for(&seen, 5, "every entry but the failing one").await;
    assert_eq!(got.iter().map(|e| e.1).collect::<Vec<_>>(), [0, 1, 2, 4, 5]);
    assert_eq!(skips.skipped(), 1);
    // Six entries in all: the failed one was not republished into the stream by the first
    // reader (it would be a seventh).
    assert_eq!(got.last().map(|e| e.0), Some(5));
    assert!(skips.is_active());
    skips.close().await;
    mq.transport().delete_queue(&s).await.unwrap();
    mq.close().await.unwrap();
}
