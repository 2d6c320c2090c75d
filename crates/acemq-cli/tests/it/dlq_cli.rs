//! `acemq dlq list|peek|replay|purge` end to end against RabbitMQ: the built binary, unique
//! queues, counts checked from a second connection.

use crate::support;

use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, HandlerError, Message};
use acemq::topology::{dead_letter_queue, parked_queue};
use acemq::transport::{Outbound, Properties};
use support::{
    Seed, TempFile, amqp_url, cleanup, declare_dead_lettered, eventually, json, ready, run,
    run_watching, seed, stdout,
};

const REASON: &str = "an order of zero cents cannot be charged";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_shows_the_reason_and_leaves_the_count_unchanged() {
    let Some(url) = amqp_url() else { return };
    let mq = Connection::connect(&url).await.unwrap();
    let q = support::unique("peek");
    let _guard = support::Cleanup::new(&url, &q);
    declare_dead_lettered(&mq, &q).await;

    // Dead letters made the way a service makes them: a handler that fails fatally.
    let orders = mq.publisher::<serde_json::Value>("", &q);
    for i in 0..3 {
        orders
            .send(&serde_json::json!({"order": format!("o-{i}"), "amount_cents": 0}))
            .await
            .unwrap();
    }
    // And a body that does not decode: parked without running the handler.
    let props = Properties {
        content_type: Some("application/json".into()),
        ..Properties::default()
    };
    let out = Outbound::new("", q.as_str(), props, b"not json".to_vec());
    mq.transport().publish(out).await.unwrap().await.unwrap();
    let consumer = mq
        .consume(
            &q,
            ConsumerOptions::default(),
            |_m: Message<serde_json::Value>| async { Err::<(), _>(HandlerError::fatal(REASON)) },
        )
        .await
        .unwrap();
    let dlq = dead_letter_queue(&q);
    let t = mq.transport().clone();
    let parked = parked_queue(&q);
    eventually(Duration::from_secs(20), "3 dead letters, 1 parked", || {
        let (t, dlq, parked) = (t.clone(), dlq.clone(), parked.clone());
        async move { ready(&t, &dlq).await == 3 && ready(&t, &parked).await == 1 }
    })
    .await;
    consumer.close().await;

    let o = run(Some(&url), &["dlq", "peek", &q, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let j = json(&o);
    assert_eq!(j["waiting"], 3);
    let msgs = j["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    assert!(
        msgs.iter()
            .all(|m| m["error"].as_str().unwrap_or("").contains(REASON)),
        "{j}"
    );
    assert_eq!(
        msgs[0]["body"]["amount_cents"], 0,
        "a JSON body is JSON: {j}"
    );
    assert_eq!(ready(&t, &dlq).await, 3, "peek moved nothing");

    let text = stdout(&run(Some(&url), &["dlq", "peek", &q, "-n", "2"]));
    assert!(
        text.contains("REASON") && text.contains("an order of zero cents"),
        "{text}"
    );
    assert!(text.contains("2 of 3 waiting"), "{text}");

    let j = json(&run(Some(&url), &["dlq", "peek", &q, "--parked", "--json"]));
    assert_eq!(j["queue"], parked.as_str());
    assert_eq!(j["messages"][0]["body"], "not json", "{j}");
    assert_eq!(j["messages"][0]["body_encoding"], "text", "{j}");
    assert_eq!(ready(&t, &parked).await, 1);

    let id = msgs[1]["id"].as_str().unwrap();
    let full = stdout(&run(Some(&url), &["dlq", "peek", &q, "--id", id]));
    assert!(full.contains(REASON), "{full}");
    assert!(
        full.contains("\"amount_cents\": 0"),
        "pretty JSON body: {full}"
    );
    let cut = stdout(&run(
        Some(&url),
        &["dlq", "peek", &q, "--id", id, "--max-body", "5"],
    ));
    assert!(cut.contains("truncated"), "{cut}");
    assert_eq!(ready(&t, &dlq).await, 3, "peek --id moved nothing");

    // list finds it through the management API, with its counts and oldest age.
    let j = json(&run(Some(&url), &["dlq", "list", "--json"]));
    assert_eq!(j["discovery"], "management", "{j}");
    let row = j["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["queue"] == q.as_str())
        .unwrap_or_else(|| panic!("{q} not listed: {j}"))
        .clone();
    assert_eq!(row["dlq"]["ready"], 3, "{row}");
    assert_eq!(row["dlq"]["unacked"], 0, "{row}");
    assert_eq!(row["parked"]["ready"], 1, "{row}");
    assert!(row["oldest_age_seconds"].is_u64(), "{row}");
    // Without the management API: the queue named on the command line, counted over AMQP.
    let o = run(
        Some(&url),
        &[
            "dlq",
            "list",
            &q,
            "--management-url",
            "http://127.0.0.1:1",
            "--json",
        ],
    );
    let j = json(&o);
    assert_eq!(j["discovery"], "named", "{j}");
    assert_eq!(j["queues"][0]["dlq"]["ready"], 3, "{j}");
    assert_eq!(
        j["queues"][0]["dlq"]["unacked"],
        serde_json::Value::Null,
        "{j}"
    );
    // ... or the queues of a topology file that have a .dlq.
    let file = TempFile::toml(&format!("[[queue]]\nname = \"{q}\"\ndead_letter = true\n"));
    let o = run(
        Some(&url),
        &[
            "dlq",
            "list",
            "-f",
            file.arg(),
            "--management-url",
            "http://127.0.0.1:1",
            "--json",
        ],
    );
    let j = json(&o);
    assert_eq!(j["queues"][0]["queue"], q.as_str(), "{j}");
    assert_eq!(j["queues"][0]["parked"]["ready"], 1, "{j}");

    cleanup(&mq, &q).await;
    mq.close().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_replay_moves_exactly_the_matching_ones_and_a_dry_run_moves_nothing() {
    let Some(url) = amqp_url() else { return };
    let mq = Connection::connect(&url).await.unwrap();
    let q = support::unique("replay");
    let _guard = support::Cleanup::new(&url, &q);
    declare_dead_lettered(&mq, &q).await;
    let (t, dlq) = (mq.transport().clone(), dead_letter_queue(&q));
    let bank = Seed {
        message_type: "order.placed",
        error: "timeout talking to the bank",
        headers: &[("tenant", "eu")],
    };
    let wanted = seed(&t, &dlq, 2, &bank).await;
    seed(
        &t,
        &dlq,
        2,
        &Seed {
            headers: &[("tenant", "us")],
            ..bank
        },
    )
    .await;
    seed(
        &t,
        &dlq,
        3,
        &Seed {
            message_type: "order.cancelled",
            error: "schema",
            headers: &[],
        },
    )
    .await;
    let filter = [
        "--type",
        "order.placed",
        "--error-contains",
        "bank",
        "--header",
        "tenant=eu",
    ];

    let mut args = vec!["dlq", "replay", q.as_str(), "--dry-run", "--json"];
    args.extend(filter);
    let o = run(Some(&url), &args);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let j = json(&o);
    let ids: Vec<&str> = j["matched_ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        ids,
        wanted.iter().map(String::as_str).collect::<Vec<_>>(),
        "{j}"
    );
    assert_eq!(j["replayed"], 0);
    assert_eq!(ready(&t, &dlq).await, 7, "a dry run moves nothing");
    assert_eq!(ready(&t, &q).await, 0);

    let mut args = vec!["dlq", "replay", q.as_str()];
    args.extend(filter);
    let o = run(Some(&url), &args);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let text = stdout(&o);
    assert!(text.contains("replayed 2 from"), "{text}");
    assert!(text.contains("scanned 7, declined 5, failed 0"), "{text}");
    assert_eq!(ready(&t, &dlq).await, 5);
    for _ in 0..2 {
        let d = t.get(&q).await.unwrap().expect("a replayed message");
        let h = &d.properties.headers;
        let id = h["x-acemq-id"].as_str().unwrap().to_owned();
        assert!(wanted.contains(&id), "{id} was not asked for");
        assert_eq!(
            h["acemq-replayed-from"].as_str(),
            Some(dlq.as_str()),
            "provenance"
        );
        assert_eq!(h["acemq-replay-count"].as_i64(), Some(1));
        assert_eq!(h["x-acemq-attempt"].as_i64(), Some(1), "attempts reset");
        d.acker.ack().await.unwrap();
    }
    assert!(
        t.get(&q).await.unwrap().is_none(),
        "exactly the matching ones moved"
    );

    // Purge: refused without --yes off a terminal; with --yes only the old ones go.
    let o = run(Some(&url), &["dlq", "purge", &q]);
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    assert_eq!(ready(&t, &dlq).await, 5);
    let o = run(
        Some(&url),
        &["dlq", "purge", &q, "--older-than", "2h", "--yes", "--json"],
    );
    assert_eq!(json(&o)["purged"], 0, "seeded 1h ago: none older than 2h");
    let o = run(
        Some(&url),
        &["dlq", "purge", &q, "--older-than", "30m", "--yes", "--json"],
    );
    assert_eq!(json(&o)["purged"], 5);
    assert_eq!(ready(&t, &dlq).await, 0);

    cleanup(&mq, &q).await;
    mq.close().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_dead_letters_are_peeked_and_filtered_with_a_bounded_hold() {
    let Some(url) = amqp_url() else { return };
    let mq = Connection::connect(&url).await.unwrap();
    let q = support::unique("bulk");
    let _guard = support::Cleanup::new(&url, &q);
    declare_dead_lettered(&mq, &q).await;
    let (t, dlq) = (mq.transport().clone(), dead_letter_queue(&q));
    let other = Seed {
        message_type: "order.placed",
        error: "timeout",
        headers: &[],
    };
    seed(&t, &dlq, 5_000, &other).await;
    let wanted = seed(
        &t,
        &dlq,
        10,
        &Seed {
            error: "poison",
            ..other
        },
    )
    .await;
    seed(&t, &dlq, 4_990, &other).await;
    assert_eq!(ready(&t, &dlq).await, 10_000);

    // Peek 5: never more than 5 out of the queue at any moment, seen from a second
    // connection sampling the ready count the whole time.
    let (o, lowest) = run_watching(&url, &["dlq", "peek", &q, "-n", "5", "--json"], &dlq).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        lowest >= 9_995,
        "peek -n 5 held {} at once",
        10_000 - lowest
    );
    assert_eq!(json(&o)["shown"], 5);
    assert_eq!(ready(&t, &dlq).await, 10_000);

    // Replay the 10 among 10,000: the hold stays bounded (hold limit 100 + the one in hand
    // + the 10 that left for good).
    let args = [
        "dlq",
        "replay",
        q.as_str(),
        "--error-contains",
        "poison",
        "--json",
    ];
    let (o, lowest) = run_watching(&url, &args, &dlq).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let j = json(&o);
    assert_eq!(j["replayed"], 10, "{j}");
    assert_eq!(j["scanned"], 10_000, "{j}");
    assert!(
        lowest >= 10_000 - 10 - 101,
        "the pass held {} at once",
        10_000 - lowest
    );
    assert_eq!(ready(&t, &q).await, 10);
    assert_eq!(ready(&t, &dlq).await, 9_990);
    let mut moved = Vec::new();
    while let Some(d) = t.get(&q).await.unwrap() {
        moved.push(
            d.properties.headers["x-acemq-id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        d.acker.ack().await.unwrap();
    }
    moved.sort();
    let mut wanted = wanted;
    wanted.sort();
    assert_eq!(moved, wanted);

    cleanup(&mq, &q).await;
    mq.close().await.ok();
}
