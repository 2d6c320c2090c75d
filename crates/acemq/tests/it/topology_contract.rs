//! The topology names, rung arguments, declarations and queue types against the family's
//! `contract-fixtures.json` (`docs/wire.md` §4). See `contract/mod.rs` for where the
//! fixtures come from. Last, the README tour's `Connection::declare(&Topology)` on
//! `memory://` and RabbitMQ.

use crate::contract;
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use acemq::headers::{HeaderValue, Headers};
use acemq::retry::{DEFAULT_BROKER_WAIT_THRESHOLD, RetryPolicy};
use acemq::topology::{
    DEAD_LETTER_EXCHANGE, ExchangeKind, QueueDecl, QueueType, RETRY_EXCHANGE, Topology,
    dead_letter_queue, dead_letter_queue_decl, parked_queue, parked_queue_decl, render_delay,
    retry_queue, rung_arguments, rung_decl,
};
use serde_json::{Map, Value};

use contract::*;

/// How long a broker case waits for a message to arrive.
const WAIT: Duration = Duration::from_secs(15);

// naming
// ---------------------------------------------------------------------------------------

/// A second, independent rendering of a rung delay (`docs/wire.md` §4): largest unit that
/// divides the delay exactly, in whole milliseconds.
fn independent_render(millis: u128) -> String {
    for (unit, suffix) in [(3_600_000u128, "h"), (60_000, "m"), (1_000, "s")] {
        if millis > 0 && millis.is_multiple_of(unit) {
            return format!("{}{suffix}", millis / unit);
        }
    }
    format!("{millis}ms")
}

#[test]
fn naming() {
    let Some(doc) = fixtures() else { return };
    let s = section(&doc, "naming");
    let queue = str_of(s, "queue");
    assert_eq!(dead_letter_queue(queue), str_of(s, "deadLetterQueue"));
    assert_eq!(parked_queue(queue), str_of(s, "parkedQueue"));
    let retry_queues = array_of(s, "retryQueues");
    assert!(!retry_queues.is_empty());
    for case in retry_queues {
        let delay = ms(u64_of(case, "delayMillis"));
        assert_eq!(
            retry_queue(queue, delay),
            str_of(case, "queue"),
            "{delay:?}"
        );
        assert_eq!(
            render_delay(delay),
            independent_render(delay.as_millis()),
            "{delay:?}"
        );
    }
    // The recorded disagreement: we follow Java (`500ms`), not Go/Python/Ruby (`0s`).
    assert!(str_of(s, "subSecondDisagreement").contains(".retry.500ms"));
    assert_eq!(retry_queue(queue, ms(500)), format!("{queue}.retry.500ms"));
    // The two renderings agree everywhere else too.
    for millis in (0..10_000_000u128).step_by(7_919).chain([
        1, 999, 1_000, 60_000, 90_000, 3_600_000, 5_400_000, 7_200_000,
    ]) {
        assert_eq!(
            render_delay(ms(millis as u64)),
            independent_render(millis),
            "{millis} ms"
        );
    }
}

// ---------------------------------------------------------------------------------------
// rungArguments
// ---------------------------------------------------------------------------------------

/// Compares an argument table with a fixture's JSON object exactly: the same names,
/// integers as AMQP integers with the same value, strings as strings.
fn assert_arguments_eq(actual: &Headers, expected: &Map<String, Value>, ctx: &str) {
    let actual_keys: BTreeSet<&str> = actual.keys().map(|k| k.as_str()).collect();
    let expected_keys: BTreeSet<&str> = expected.keys().map(String::as_str).collect();
    assert_eq!(actual_keys, expected_keys, "{ctx}: argument names");
    for (key, want) in expected {
        let got = &actual[key.as_str()];
        match want {
            Value::String(s) => assert_eq!(got, &HeaderValue::Str(s.clone()), "{ctx}: {key}"),
            Value::Number(n) => {
                let n = n
                    .as_i64()
                    .unwrap_or_else(|| panic!("{ctx}: {key} is not an integer in the fixture"));
                assert!(
                    matches!(
                        got,
                        HeaderValue::I8(_)
                            | HeaderValue::U8(_)
                            | HeaderValue::I16(_)
                            | HeaderValue::U16(_)
                            | HeaderValue::I32(_)
                            | HeaderValue::U32(_)
                            | HeaderValue::I64(_)
                    ),
                    "{ctx}: {key} must be an AMQP integer, got {got:?}"
                );
                assert_eq!(got.as_i64(), Some(n), "{ctx}: {key}");
            }
            other => panic!("{ctx}: unexpected fixture value {other} for {key}"),
        }
    }
}

#[test]
fn rung_arguments_match_exactly() {
    let Some(doc) = fixtures() else { return };
    let rungs = doc
        .get("rungArguments")
        .and_then(Value::as_array)
        .expect("rungArguments");
    assert!(!rungs.is_empty());
    for case in rungs {
        let delay = ms(u64_of(case, "delayMillis"));
        let expected = case
            .get("arguments")
            .and_then(Value::as_object)
            .expect("arguments");
        let source = expected
            .get("x-dead-letter-routing-key")
            .and_then(Value::as_str)
            .expect("x-dead-letter-routing-key");
        let ctx = str_of(case, "queue");
        assert_eq!(retry_queue(source, delay), ctx);
        assert_arguments_eq(&rung_arguments(source, delay), expected, ctx);
        let decl = rung_decl(source, delay);
        assert_eq!(decl.name, ctx);
        assert_eq!(decl.queue_type(), QueueType::Classic);
        assert!(decl.durable && !decl.exclusive && !decl.auto_delete);
        assert_arguments_eq(&decl.arguments, expected, ctx);
    }
}

// ---------------------------------------------------------------------------------------
// topology
// ---------------------------------------------------------------------------------------

fn declared_by(item: &Value, who: &[&str]) -> bool {
    who.contains(&str_of(item, "declaredBy"))
}

/// Checks `topology` holds exactly the fixture's items accepted by `who`.
fn assert_topology_matches(topology: &Topology, fixture: &Value, who: &[&str], ctx: &str) {
    // Exchanges.
    let expected: Vec<&Value> = array_of(fixture, "exchanges")
        .iter()
        .filter(|e| declared_by(e, who))
        .collect();
    let expected_names: BTreeSet<&str> = expected.iter().map(|e| str_of(e, "name")).collect();
    let actual_names: BTreeSet<&str> = topology
        .exchanges()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(actual_names, expected_names, "{ctx}: exchanges");
    assert_eq!(
        topology.exchanges().len(),
        expected.len(),
        "{ctx}: exchanges"
    );
    for want in expected {
        let name = str_of(want, "name");
        let got = topology.exchange(name).expect("exchange");
        assert_eq!(
            Some(got.kind),
            ExchangeKind::parse(str_of(want, "type")),
            "{ctx}: {name}"
        );
        assert_eq!(got.durable, bool_of(want, "durable"), "{ctx}: {name}");
        assert!(!got.auto_delete, "{ctx}: {name}");
        assert!(got.arguments.is_empty(), "{ctx}: {name}");
    }

    // Queues.
    let expected: Vec<&Value> = array_of(fixture, "queues")
        .iter()
        .filter(|q| declared_by(q, who))
        .collect();
    let expected_names: BTreeSet<&str> = expected.iter().map(|q| str_of(q, "name")).collect();
    let actual_names: BTreeSet<&str> = topology.queues().iter().map(|q| q.name.as_str()).collect();
    assert_eq!(actual_names, expected_names, "{ctx}: queues");
    assert_eq!(topology.queues().len(), expected.len(), "{ctx}: queues");
    for want in expected {
        let name = str_of(want, "name");
        let got = topology.queue(name).expect("queue");
        let qctx = format!("{ctx}: {name}");
        // The type is the presence of x-queue-type; the other arguments are exact.
        let mut arguments = got.arguments.clone();
        let queue_type = match arguments.remove("x-queue-type") {
            None => "classic",
            Some(HeaderValue::Str(t)) if t == "quorum" => "quorum",
            Some(other) => panic!("{qctx}: x-queue-type {other:?}"),
        };
        assert_eq!(queue_type, str_of(want, "type"), "{qctx}");
        assert_eq!(got.durable, bool_of(want, "durable"), "{qctx}");
        assert!(!got.exclusive && !got.auto_delete, "{qctx}");
        let expected_args = want
            .get("arguments")
            .and_then(Value::as_object)
            .expect("arguments");
        assert_arguments_eq(&arguments, expected_args, &qctx);
    }

    // Bindings.
    let expected: BTreeSet<(&str, &str, &str)> = array_of(fixture, "bindings")
        .iter()
        .filter(|b| declared_by(b, who))
        .map(|b| {
            (
                str_of(b, "queue"),
                str_of(b, "exchange"),
                str_of(b, "routingKey"),
            )
        })
        .collect();
    let actual: BTreeSet<(&str, &str, &str)> = topology
        .bindings()
        .iter()
        .map(|b| {
            (
                b.queue.as_str(),
                b.exchange.as_str(),
                b.routing_key.as_str(),
            )
        })
        .collect();
    assert_eq!(actual, expected, "{ctx}: bindings");
    assert_eq!(topology.bindings().len(), expected.len(), "{ctx}: bindings");
    assert!(
        topology.bindings().iter().all(|b| b.arguments.is_empty()),
        "{ctx}: binding arguments"
    );
}

#[test]
fn topology() {
    let Some(doc) = fixtures() else { return };
    let fixture = section(&doc, "topology");
    assert_eq!(str_of(&doc, "deadLetterExchange"), DEAD_LETTER_EXCHANGE);
    assert_eq!(str_of(&doc, "retryExchange"), RETRY_EXCHANGE);

    let source = str_of(fixture, "sourceQueue");
    let how = str_of(fixture, "policy");
    let how = how.split(" at ").next().unwrap_or(how);
    let policy = parse_policy(how);
    assert_eq!(
        policy,
        RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300)).unwrap()
    );
    assert_eq!(
        policy.broker_wait_threshold(),
        DEFAULT_BROKER_WAIT_THRESHOLD
    );
    assert_eq!(
        as_millis(&policy.schedule()),
        millis_list(fixture, "policyScheduleMillis")
    );
    assert_eq!(
        as_millis(&policy.broker_rungs()),
        millis_list(fixture, "policyRungDelaysMillis")
    );

    let built = Topology::define()
        .exchange("orders", ExchangeKind::Topic)
        .queue_with_dead_letter(source)
        .queue_with_retry(source, &policy)
        .bind(source, "orders", "order.*")
        .build()
        .expect("the fixture topology builds");
    assert_topology_matches(
        &built,
        fixture,
        &["topology", "consumer", "both"],
        "builder",
    );

    let consumer = Topology::for_consumer(source, Some(&policy));
    assert_topology_matches(&consumer, fixture, &["consumer", "both"], "for_consumer");
    assert!(
        consumer.queue(source).is_none(),
        "a consumer never declares its source queue"
    );
    // What the consumer declares is declared identically by the builder: no second
    // declarer can fail with PRECONDITION_FAILED.
    for q in consumer.queues() {
        assert_eq!(built.queue(&q.name), Some(q));
    }
    for e in consumer.exchanges() {
        assert_eq!(built.exchange(&e.name), Some(e));
    }
    for b in consumer.bindings() {
        assert!(built.bindings().contains(b), "{b:?}");
    }

    // Without a policy (or with one that never waits in the broker) the consumer still
    // declares the dead-letter half, and nothing of the retry half.
    let dead_letter_only = |item: &Value| {
        declared_by(item, &["consumer", "both"])
            && !str_of(item, "name").starts_with(&format!("{source}.retry."))
            && str_of(item, "name") != RETRY_EXCHANGE
    };
    for policy in [None, Some(&RetryPolicy::none())] {
        let t = Topology::for_consumer(source, policy);
        let expected_queues: BTreeSet<&str> = array_of(fixture, "queues")
            .iter()
            .filter(|q| dead_letter_only(q))
            .map(|q| str_of(q, "name"))
            .collect();
        let queues: BTreeSet<&str> = t.queues().iter().map(|q| q.name.as_str()).collect();
        assert_eq!(queues, expected_queues);
        let expected_exchanges: BTreeSet<&str> = array_of(fixture, "exchanges")
            .iter()
            .filter(|e| dead_letter_only(e))
            .map(|e| str_of(e, "name"))
            .collect();
        let exchanges: BTreeSet<&str> = t.exchanges().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(exchanges, expected_exchanges);
        assert!(
            t.bindings()
                .iter()
                .all(|b| b.exchange == DEAD_LETTER_EXCHANGE)
        );
        assert_eq!(t.bindings().len(), 2);
    }
}

// ---------------------------------------------------------------------------------------
// queueTypeDefaults
// ---------------------------------------------------------------------------------------

fn type_name(q: &QueueDecl) -> &'static str {
    match q.queue_type() {
        QueueType::Quorum => "quorum",
        QueueType::Classic => "classic",
        _ => "other",
    }
}

#[test]
fn queue_type_defaults() {
    let Some(doc) = fixtures() else { return };
    let s = section(&doc, "queueTypeDefaults");
    let first_queue =
        |t: Topology, name: &str| -> QueueDecl { t.queue(name).cloned().expect("declared queue") };
    let decls: Vec<(&str, QueueDecl)> = vec![
        (
            "sourceQueue",
            first_queue(Topology::define().queue("src").build().unwrap(), "src"),
        ),
        (
            "sourceQueueWithDeadLetter",
            first_queue(
                Topology::define()
                    .queue_with_dead_letter("src")
                    .build()
                    .unwrap(),
                "src",
            ),
        ),
        (
            "explicitClassicQueue",
            first_queue(
                Topology::define()
                    .classic_queue("src", Headers::new())
                    .build()
                    .unwrap(),
                "src",
            ),
        ),
        (
            "explicitClassicQueueWithDeadLetter",
            first_queue(
                Topology::define()
                    .classic_queue_with_dead_letter("src", Headers::new())
                    .build()
                    .unwrap(),
                "src",
            ),
        ),
        ("deadLetterQueue", dead_letter_queue_decl("src")),
        ("parkedQueue", parked_queue_decl("src")),
        ("retryRung", rung_decl("src", Duration::from_secs(30))),
    ];
    for (key, decl) in &decls {
        assert_eq!(type_name(decl), str_of(s, key), "{key}");
    }

    let durability = section(s, "durability");
    if bool_of(durability, "everyDeclaredQueueIsDurable") {
        for (key, decl) in &decls {
            assert!(decl.durable, "{key} must be durable");
        }
        let policy =
            RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300)).unwrap();
        for q in Topology::for_consumer("src", Some(&policy)).queues() {
            assert!(q.durable, "{} must be durable", q.name);
        }
    }
    // Java cannot be asked; the Rust API can, and keeps such queues classic.
    for decl in [
        QueueDecl::quorum("x").exclusive(),
        QueueDecl::quorum("x").auto_delete(),
        QueueDecl::quorum("x").transient(),
        QueueDecl::server_named(),
    ] {
        assert_eq!(decl.queue_type(), QueueType::Classic, "{decl:?}");
        let t = Topology::define().queue_decl(decl).build().unwrap();
        assert_eq!(t.queues()[0].queue_type(), QueueType::Classic);
    }
}

// the README tour's declaration, on a broker
// ---------------------------------------------------------------------------------------

/// `Connection::declare(&Topology)` exactly as the README tour uses it (with unique
/// names): everything it promises exists and routes, on `memory://` and RabbitMQ, a second
/// declare is harmless, and a consumer with the same policy starts on it and consumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_topology_declares_and_routes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use acemq::Connection;
    use acemq::consume::{ConsumerOptions, Message};
    use support::{Broker, eventually, on_each_target, unique, wait_for_count};

    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let orders = unique("tour.orders");
        let queue = unique("tour.orders.new");
        let policy =
            RetryPolicy::exponential(5, Duration::from_secs(10), Duration::from_secs(300)).unwrap();
        let topology = Topology::define()
            .exchange(&orders, ExchangeKind::Topic)
            .queue_with_dead_letter(&queue) // quorum queue + .dlq + .parked
            .queue_with_retry(&queue, &policy) // acemq.retry + the rungs
            .bind(&queue, &orders, "order.*")
            .build()
            .unwrap();
        mq.declare(&topology).await.unwrap();
        mq.declare(&topology)
            .await
            .expect("declaring the same topology again is harmless");
        assert_eq!(
            topology.queue(&queue).unwrap().queue_type(),
            QueueType::Quorum,
            "the source queue is a quorum queue"
        );

        let t = mq.transport();
        let rungs = policy.broker_rungs();
        assert_eq!(
            rungs,
            vec![Duration::from_secs(40), Duration::from_secs(80)],
            "five attempts are four waits (10s, 20s, 40s, 80s): 40s and 80s wait on rungs \
             (the README tour's comment also names a 160s rung, which five attempts never use)"
        );
        let mut queues = vec![
            queue.clone(),
            dead_letter_queue(&queue),
            parked_queue(&queue),
        ];
        queues.extend(rungs.iter().map(|d| retry_queue(&queue, *d)));
        for name in &queues {
            t.inspect_queue(name)
                .await
                .unwrap_or_else(|e| panic!("{name} was declared: {e}"));
        }
        for exchange in [orders.as_str(), RETRY_EXCHANGE, DEAD_LETTER_EXCHANGE] {
            t.inspect_exchange(exchange)
                .await
                .unwrap_or_else(|e| panic!("{exchange} was declared: {e}"));
        }

        // The bindings route: the topic binding, the retry loop back into the queue, the
        // dead-letter route into `.dlq` (every publish is mandatory: unroutable would fail).
        mq.publisher::<u32>(&orders, "order.placed")
            .send(&1)
            .await
            .expect("order.placed routes to the queue");
        mq.publisher::<u32>(RETRY_EXCHANGE, &queue)
            .send(&2)
            .await
            .expect("acemq.retry routes back to the queue");
        mq.publisher::<u32>(DEAD_LETTER_EXCHANGE, dead_letter_queue(&queue))
            .send(&3)
            .await
            .expect("acemq.dlx routes to .dlq");
        let err = mq
            .publisher::<u32>(&orders, "invoice.placed")
            .send(&4)
            .await
            .expect_err("nothing is bound for invoice.*");
        assert!(err.is_unroutable(), "{err}");
        assert_eq!(wait_for_count(&**t, &queue, 2, WAIT).await, 2);
        assert_eq!(
            wait_for_count(&**t, &dead_letter_queue(&queue), 1, WAIT).await,
            1
        );

        // A consumer with the same policy agrees with what was declared, and consumes.
        let handled = Arc::new(AtomicUsize::new(0));
        let h = handled.clone();
        let consumer = mq
            .consume(
                &queue,
                ConsumerOptions::default().retry(policy.clone()),
                move |_m: Message<u32>| {
                    let h = h.clone();
                    async move {
                        h.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                },
            )
            .await
            .expect("the consumer starts on the declared topology");
        eventually(WAIT, "both messages acked", || async {
            (consumer.stats().acked == 2).then_some(())
        })
        .await;
        assert_eq!(handled.load(Ordering::SeqCst), 2);
        consumer.close().await;

        for name in &queues {
            t.delete_queue(name).await.ok();
        }
        t.delete_exchange(&orders).await.ok();
        mq.close().await.ok();
    })
    .await;
}
