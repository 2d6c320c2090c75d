//! Scenario 7: request/reply round trips (a requester and a responder on one queue).
//!
//! One responder (prefetch [`PREFETCH`](crate::PREFETCH), concurrency
//! [`RESPONDER_CONCURRENCY`]) echoes each request; one requester keeps [`REQUEST_WINDOW`]
//! requests in flight (each a confirmed publish, then the wait for the matching reply on its
//! reply queue). The figure is round trips per second, with the p50 / p99 of one round trip
//! (from the call to the decoded reply). On RabbitMQ against raw lapin written the same
//! way (a server-named exclusive reply queue, `correlation_id` matching, confirmed replies
//! acked after their confirm); on `memory://`, AceMQ alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::consume::{ConsumerOptions, Message};
use acemq::topology::QueueDecl;
use futures::StreamExt;
use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use tokio::sync::{Semaphore, oneshot};

use crate::raw::{
    MANDATORY, check_confirm, confirm_channel, header, raw_contract, raw_headers, raw_id,
    raw_properties, raw_properties_with_envelope, text,
};
use crate::scenario::short;
use crate::{BoxError, Clock, PREFETCH, Payload, Result, Sample};

/// Requests in flight from the one requester, unless `--window` says otherwise.
pub const REQUEST_WINDOW: usize = 16;

static WINDOW: AtomicUsize = AtomicUsize::new(REQUEST_WINDOW);

/// Sets the requests in flight of scenario 7 on both sides (a diagnostic: a smaller window
/// runs raw lapin at AceMQ's pace, to see what the pace alone costs the broker).
pub fn set_request_window(n: usize) {
    WINDOW.store(n.max(1), Ordering::Relaxed);
}

/// Requests in flight in scenario 7 (`--window`, default 16).
pub(crate) fn request_window() -> usize {
    WINDOW.load(Ordering::Relaxed)
}

/// Handlers the responder runs at once.
pub const RESPONDER_CONCURRENCY: usize = 8;

/// The timeout of each request (a run that hits it fails).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `n` round trips through `queue` (which must exist) on `mq`: a responder echoing the
/// payload, a requester with [`REQUEST_WINDOW`] requests in flight.
pub async fn acemq_request_reply(
    mq: &acemq::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let responder = mq
        .respond(
            queue,
            ConsumerOptions::default()
                .prefetch(PREFETCH)
                .concurrency(RESPONDER_CONCURRENCY),
            |m: Message<Payload>| async move { Ok(m.into_payload()) },
        )
        .await?;
    let requester = mq.requester().await?;
    let started = Clock::start();
    let latencies: Vec<Result<Duration>> = futures::stream::iter(0..n)
        .map(|seq| {
            let requester = &requester;
            async move {
                let payload = Payload::new(seq, size);
                let t = Instant::now();
                let echo: Payload = requester
                    .request("", queue, &payload, REQUEST_TIMEOUT)
                    .await?;
                if echo.seq != seq {
                    return Err(format!("request {seq} was answered for {}", echo.seq).into());
                }
                Ok(t.elapsed())
            }
        })
        .buffer_unordered(request_window())
        .collect()
        .await;
    let elapsed = started.elapsed();
    requester.close().await;
    responder.close().await;
    let latencies = latencies.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(Sample::new(n, elapsed, latencies))
}

/// Raw lapin, the same exchange written by hand: a responder (prefetch 100, up to 8
/// replies in flight, each published with the request's `correlation_id` to its `reply_to`,
/// confirmed, then the request acked) and a requester with a server-named exclusive reply
/// queue (replies acked), a table of waiters by `correlation_id`, 16 requests in flight,
/// each publish confirmed. Requests and replies are published on `publishing` and consumed
/// on `consuming` (the same connection, written the straightforward way).
pub async fn raw_request_reply(
    publishing: &lapin::Connection,
    consuming: &lapin::Connection,
    queue: &str,
    n: u64,
    size: usize,
) -> Result<Sample> {
    let conn = consuming;
    let serving = conn.create_channel().await?;
    serving
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let replying = confirm_channel(publishing).await?;
    let mut requests = serving
        .basic_consume(
            short(queue)?,
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let responder = tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(RESPONDER_CONCURRENCY));
        while let Some(d) = requests.next().await {
            let d = d?;
            let slot = slots.clone().acquire_owned().await?;
            let ch = replying.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let reply = async {
                    let p: Payload = serde_json::from_slice(&d.data)?;
                    let props = reply_properties(&d.properties, p.seq)?;
                    let to = match header(&d.properties, "acemq-reply-to") {
                        Some(to) => short(to)?,
                        None => d.properties.reply_to().clone().ok_or("no reply_to")?,
                    };
                    let body = serde_json::to_vec(&p)?;
                    let confirm = ch
                        .basic_publish("".into(), to, MANDATORY, &body, props)
                        .await?;
                    check_confirm(confirm.await?)?;
                    d.ack(BasicAckOptions::default()).await?;
                    Ok::<_, BoxError>(())
                };
                if let Err(e) = reply.await {
                    eprintln!("raw responder: {e}");
                }
            });
        }
        Ok::<_, BoxError>(())
    });
    let requesting = confirm_channel(publishing).await?;
    let listening = conn.create_channel().await?;
    listening
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let reply_queue = listening
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?
        .name()
        .clone();
    let mut replies = listening
        .basic_consume(
            reply_queue.clone(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<Vec<u8>>>>>;
    let waiters: Waiters = Arc::default();
    let table = waiters.clone();
    let router = tokio::spawn(async move {
        while let Some(d) = replies.next().await {
            let d = d?;
            let correlation = match d.properties.correlation_id() {
                Some(c) => Some(c.as_str()),
                None => header(&d.properties, "x-acemq-correlation"),
            };
            let waiter =
                correlation.and_then(|c| table.lock().unwrap_or_else(|e| e.into_inner()).remove(c));
            if let Some(w) = waiter {
                let _ = w.send(d.data.clone());
            }
            d.ack(BasicAckOptions::default()).await?;
        }
        Ok::<_, BoxError>(())
    });
    let routing_key = short(queue)?;
    let started = Clock::start();
    let latencies: Vec<Result<Duration>> = futures::stream::iter(0..n)
        .map(|seq| {
            let (waiters, ch) = (waiters.clone(), &requesting);
            let (reply_queue, routing_key) = (reply_queue.clone(), routing_key.clone());
            async move {
                let t = Instant::now();
                let correlation = raw_id(format!("raw-rr-{seq}"));
                let (tx, rx) = oneshot::channel();
                waiters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(correlation.clone(), tx);
                let body = serde_json::to_vec(&Payload::new(seq, size))?;
                let props = request_properties(seq, correlation, reply_queue);
                let confirm = ch
                    .basic_publish("".into(), routing_key, MANDATORY, &body, props)
                    .await?;
                check_confirm(confirm.await?)?;
                let body = tokio::time::timeout(REQUEST_TIMEOUT, rx).await??;
                let echo: Payload = serde_json::from_slice(&body)?;
                if echo.seq != seq {
                    return Err(format!("request {seq} was answered for {}", echo.seq).into());
                }
                Ok(t.elapsed())
            }
        })
        .buffer_unordered(request_window())
        .collect()
        .await;
    let elapsed = started.elapsed();
    for ch in [&requesting, &listening, &serving] {
        ch.close(200, "OK".into()).await?;
    }
    router.abort();
    responder.abort();
    let latencies = latencies.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(Sample::new(n, elapsed, latencies))
}

/// Scenario 7 on a fresh `memory://` broker.
pub async fn memory_request_reply(n: u64, size: usize) -> Result<Sample> {
    let name = format!("memory://acemq-bench-rr-{}", std::process::id());
    let mq = acemq::Connection::connect(&name).await?;
    mq.transport()
        .declare_queue(&QueueDecl::classic("bench.requests"))
        .await?;
    let sample = acemq_request_reply(&mq, "bench.requests", n, size).await;
    mq.transport().delete_queue("bench.requests").await?;
    mq.close().await?;
    sample
}

/// A raw request's properties: its id, correlation and reply address, and what
/// `--raw-envelope-headers` / `--raw-contract` add (the correlation and reply address in
/// headers, the timeout as `expiration`).
fn request_properties(seq: u64, correlation: String, reply_queue: ShortString) -> BasicProperties {
    let id = raw_id(format!("req-{seq}"));
    let mut headers = raw_headers(&id, &correlation, None);
    let props = raw_properties(id).with_reply_to(reply_queue.clone());
    let props = if raw_contract() {
        if let Some(h) = headers.as_mut() {
            h.insert("acemq-reply-to".into(), text(reply_queue.as_str()));
        }
        props.with_expiration(REQUEST_TIMEOUT.as_millis().to_string().into())
    } else {
        props.with_correlation_id(correlation.into())
    };
    match headers {
        Some(h) => props.with_headers(h),
        None => props,
    }
}

/// A raw reply's properties for a request with `request`'s properties: the request's
/// correlation (as the request carried it), and under `--raw-contract` the request's id as
/// causation and its trace continued.
fn reply_properties(request: &BasicProperties, seq: u64) -> Result<BasicProperties> {
    if !raw_contract() {
        let props = raw_properties_with_envelope(format!("reply-{seq}"));
        return Ok(match request.correlation_id() {
            Some(c) => props.with_correlation_id(c.clone()),
            None => props,
        });
    }
    let id = raw_id(format!("reply-{seq}"));
    let correlation = header(request, "x-acemq-correlation").ok_or("no correlation")?;
    let parent = header(request, "traceparent");
    let mut headers = raw_headers(&id, correlation, parent).ok_or("no headers")?;
    if let Some(cause) = header(request, "x-acemq-id") {
        headers.insert("x-acemq-causation".into(), text(cause));
    }
    Ok(raw_properties(id).with_headers(headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The only test that sets the raw side's flags (they are process-wide).
    #[test]
    fn raw_lapin_like_with_like_writes_what_the_contract_asks() {
        crate::raw::set_raw_contract(true);
        let request = request_properties(7, "corr-7".into(), "amq.gen-r".into());
        assert_eq!(
            request.correlation_id(),
            &None,
            "the contract writes no correlation_id"
        );
        assert_eq!(header(&request, "x-acemq-correlation"), Some("corr-7"));
        assert_eq!(header(&request, "acemq-reply-to"), Some("amq.gen-r"));
        assert_eq!(
            request.reply_to().as_ref().map(|r| r.as_str()),
            Some("amq.gen-r")
        );
        let ttl = REQUEST_TIMEOUT.as_millis().to_string();
        assert_eq!(
            request.expiration().as_ref().map(|e| e.as_str()),
            Some(ttl.as_str())
        );
        let id = request.message_id().as_ref().map(|m| m.to_string());
        let id = id.expect("a message id");
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id} is a UUID");
        assert_eq!(header(&request, "x-acemq-id"), Some(id.as_str()));
        let parent = header(&request, "traceparent").expect("a traceparent");
        assert_eq!(parent.len(), 55);

        let reply = reply_properties(&request, 7).expect("reply properties");
        assert_eq!(header(&reply, "x-acemq-correlation"), Some("corr-7"));
        assert_eq!(header(&reply, "x-acemq-causation"), Some(id.as_str()));
        let child = header(&reply, "traceparent").expect("a traceparent");
        assert_eq!(
            child.get(..35),
            parent.get(..35),
            "the request's trace goes on"
        );
        assert_ne!(child, parent, "with a span of its own");
        assert_eq!(reply.expiration(), &None);
    }
}
