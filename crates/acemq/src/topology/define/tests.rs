use std::time::Duration;

use super::*;
use crate::headers::HeaderValue;

#[test]
fn identical_declarations_are_folded() {
    let t = Topology::define()
        .queue_with_dead_letter("a")
        .queue_with_dead_letter("b")
        .queue_with_dead_letter("a")
        .bind("a", "x", "k")
        .bind("a", "x", "k")
        .exchange("x", ExchangeKind::Direct)
        .build()
        .unwrap();
    assert_eq!(t.exchanges().len(), 2); // acemq.dlx once, x
    assert_eq!(t.queues().len(), 6);
    assert_eq!(t.bindings().len(), 5);
}

#[test]
fn conflicting_declarations_name_the_difference() {
    let err = Topology::define()
        .exchange("x", ExchangeKind::Topic)
        .exchange("x", ExchangeKind::Direct)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        TopologyError::ConflictingExchange {
            name: "x".into(),
            difference: "type topic vs direct".into()
        }
    );
    let err = Topology::define()
        .queue("orders.new")
        .queue_with_dead_letter("orders.new")
        .build()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("argument x-dead-letter-exchange absent vs \"acemq.dlx\""),
        "{text}"
    );
    // A user's own dead-letter queue declared as quorum collides with the classic one.
    let err = Topology::define()
        .queue("orders.new.dlq")
        .queue_with_dead_letter("orders.new")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("x-queue-type"), "{err}");
}

#[test]
fn invalid_names_and_combinations_are_errors() {
    let cases: Vec<(TopologyBuilder, &str)> = vec![
        (Topology::define().queue(""), "EmptyName"),
        (
            Topology::define().exchange("", ExchangeKind::Direct),
            "EmptyName",
        ),
        (Topology::define().queue("amq.mine"), "ReservedName"),
        (Topology::define().queue("q".repeat(256)), "NameTooLong"),
        (
            Topology::define().bind("q", "", "q"),
            "DefaultExchangeBinding",
        ),
        (Topology::define().bind("", "x", "q"), "EmptyName"),
        (
            Topology::define()
                .queue_decl(QueueDecl::quorum("q").argument("x", 1i64))
                .queue_decl({
                    let mut d = QueueDecl::quorum("t");
                    d.exclusive = true;
                    d
                }),
            "QuorumNotDurable",
        ),
        (
            Topology::define()
                .exchange("topic", ExchangeKind::Topic)
                .bind_headers("q", "topic", false, Headers::new()),
            "HeadersBindingToNonHeadersExchange",
        ),
        (
            Topology::define().classic_queue(
                "c",
                Headers::from([("x-queue-type".into(), HeaderValue::from("quorum"))]),
            ),
            "QueueTypeArgument",
        ),
        (
            Topology::define().classic_queue_with_dead_letter(
                "c",
                Headers::from([(
                    "x-dead-letter-routing-key".into(),
                    HeaderValue::from("elsewhere"),
                )]),
            ),
            "DeadLetterArgumentAlreadySet",
        ),
    ];
    for (builder, want) in cases {
        let err = builder.build().unwrap_err();
        assert!(
            format!("{err:?}").starts_with(want),
            "{err:?} is not {want}"
        );
    }
}

#[test]
fn server_named_queues_are_not_folded_and_bind_to_headers_exchanges_that_are_not_ours() {
    let t = Topology::define()
        .queue_decl(QueueDecl::server_named())
        .queue_decl(QueueDecl::server_named())
        .bind_headers("q", "amq.headers", true, Headers::new())
        .build()
        .unwrap();
    assert_eq!(t.queues().len(), 2);
    assert_eq!(t.bindings().len(), 1);
}

#[test]
fn classic_queue_with_dead_letter_keeps_its_arguments() {
    let args = Headers::from([("x-max-length".into(), HeaderValue::I64(5))]);
    let t = Topology::define()
        .classic_queue_with_dead_letter("legacy", args)
        .build()
        .unwrap();
    let q = t.queue("legacy").unwrap();
    assert_eq!(q.queue_type(), QueueType::Classic);
    assert!(q.durable);
    assert_eq!(q.arguments.len(), 3);
    assert_eq!(
        q.arguments["x-dead-letter-routing-key"].as_str(),
        Some("legacy.dlq")
    );
    assert!(t.queue("legacy.dlq").is_some());
    assert!(t.exchange(DEAD_LETTER_EXCHANGE).is_some());
}

#[test]
fn for_consumer_without_rungs_declares_no_retry_exchange() {
    let none = RetryPolicy::none();
    let local = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300))
        .unwrap()
        .wait_in_broker_from(Duration::ZERO);
    for policy in [None, Some(&none), Some(&local)] {
        let t = Topology::for_consumer("q", policy);
        assert_eq!(t.exchanges().len(), 1);
        assert_eq!(t.exchanges()[0].name, DEAD_LETTER_EXCHANGE);
        assert_eq!(t.queues().len(), 2);
        assert_eq!(t.bindings().len(), 2);
    }
}

#[test]
fn for_consumer_is_what_the_builder_would_build() {
    let policy =
        RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300)).unwrap();
    let built = Topology::define()
        .queue_with_dead_letter("q")
        .queue_with_retry("q", &policy)
        .build()
        .unwrap();
    let consumer = Topology::for_consumer("q", Some(&policy));
    let rebuilt = Topology::define();
    let rebuilt = consumer
        .exchanges()
        .iter()
        .cloned()
        .fold(rebuilt, TopologyBuilder::exchange_decl);
    let rebuilt = consumer
        .queues()
        .iter()
        .cloned()
        .fold(rebuilt, TopologyBuilder::queue_decl);
    assert_eq!(rebuilt.build().unwrap().queues(), consumer.queues());
    for q in consumer.queues() {
        assert_eq!(built.queue(&q.name), Some(q));
    }
    assert!(consumer.queue("q").is_none());
    assert_eq!(built.queues().len(), consumer.queues().len() + 1);
}
