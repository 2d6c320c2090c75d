//! Proves the benchmark still runs: every scenario with tiny counts, on `memory://` always
//! and against RabbitMQ when `ACEMQ_TEST_AMQP_URL` is set (required when
//! `ACEMQ_TEST_REQUIRE_BROKER=1`).

use acemq_bench::{
    Broker, QueueKind, Scenario, Side, memory_publish_consume, memory_request_reply,
    set_raw_contract, set_raw_envelope_headers, set_raw_two_connections,
};

fn broker_url() -> Option<String> {
    match std::env::var("ACEMQ_TEST_AMQP_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                "ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_AMQP_URL is not set"
            );
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_scenario_runs() {
    let s = memory_publish_consume(500, 256).await.expect("memory run");
    assert_eq!(s.messages, 500);
    assert!(s.rate() > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_scenarios_run_on_both_sides() {
    let Some(url) = broker_url() else {
        eprintln!("ACEMQ_TEST_AMQP_URL not set: broker scenarios skipped");
        return;
    };
    let broker = Broker::connect(&url).await.expect("connect");
    for scenario in Scenario::ALL.into_iter().filter(|s| s.has_raw()) {
        for kind in [QueueKind::Classic, QueueKind::Quorum] {
            for side in [Side::Raw, Side::AceMq] {
                let s = broker
                    .run(scenario, kind, side, 20, 256)
                    .await
                    .unwrap_or_else(|e| panic!("{scenario:?} {kind:?} {side:?}: {e}"));
                assert_eq!(s.messages, 20);
                if scenario.latency_unit().is_some() {
                    assert!(s.p50.is_some() && s.p99 >= s.p50);
                }
            }
        }
    }
    broker.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_lapin_writing_the_contract_runs_every_publishing_scenario() {
    // The `*` rows of the default run: raw lapin matching replies by the
    // `x-acemq-correlation` header, replying to `acemq-reply-to`, on two connections. The
    // flags are process-wide; a broker scenario of another test running meanwhile only
    // writes more headers, which it does not check.
    let Some(url) = broker_url() else {
        eprintln!("ACEMQ_TEST_AMQP_URL not set: the raw contract scenarios skipped");
        return;
    };
    let broker = Broker::connect(&url).await.expect("connect");
    set_raw_contract(true);
    set_raw_two_connections(true);
    let mut results = Vec::new();
    for scenario in Scenario::ALL
        .into_iter()
        .filter(|s| s.has_contract_variant())
    {
        let run = broker
            .run(scenario, QueueKind::Classic, Side::Raw, 20, 256)
            .await;
        results.push((scenario, run.map(|s| s.messages).map_err(|e| e.to_string())));
    }
    set_raw_contract(false);
    set_raw_envelope_headers(false);
    set_raw_two_connections(false);
    broker.close().await.expect("close");
    assert_eq!(results.len(), 3, "scenarios 1, 2 and 7");
    for (scenario, run) in results {
        assert_eq!(run, Ok(20), "{scenario:?} with the contract");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waits_scenario_runs() {
    let Some(url) = broker_url() else {
        eprintln!("ACEMQ_TEST_AMQP_URL not set: the waits scenario skipped");
        return;
    };
    let broker = Broker::connect(&url).await.expect("connect");
    for with_failures in [false, true] {
        let s = broker
            .run_waits(QueueKind::Classic, 20, 256, with_failures)
            .await
            .unwrap_or_else(|e| panic!("waits, failures {with_failures}: {e}"));
        assert_eq!(s.messages, 18, "the others: 20 less every tenth");
        assert!(s.rate() > 0.0);
    }
    broker.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_reply_scenario_runs_on_memory() {
    // On RabbitMQ it runs with the other broker scenarios, on both sides.
    let s = memory_request_reply(50, 256).await.expect("memory run");
    assert_eq!(s.messages, 50);
    assert!(s.rate() > 0.0 && s.p50.is_some() && s.p99 >= s.p50);
}

#[test]
fn percentiles_use_nearest_rank() {
    use std::time::Duration;
    let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
    assert_eq!(
        acemq_bench::percentile(&v, 0.5),
        Some(Duration::from_millis(50))
    );
    assert_eq!(
        acemq_bench::percentile(&v, 0.99),
        Some(Duration::from_millis(99))
    );
    assert_eq!(acemq_bench::percentile(&[], 0.5), None);
    let body = serde_json::to_vec(&acemq_bench::Payload::new(7, 256)).unwrap();
    assert_eq!(body.len(), 256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scale_scenarios_run() {
    let url = broker_url();
    let broker = match &url {
        Some(url) => Some(Broker::connect(url).await.expect("connect")),
        None => None,
    };
    let rows = acemq_bench::scale::run(
        broker.as_ref().map(|b| (&b.acemq, &b.raw)),
        [3, 30],
        [10, 100],
    )
    .await
    .expect("the scale scenarios");
    let expected = if broker.is_some() { 14 } else { 6 };
    assert_eq!(rows.len(), expected, "{rows:?}");
    for row in &rows {
        assert_eq!(row.points.len(), 2, "{row:?}");
        assert!(row.line().contains(&row.what));
    }
    if let Some(b) = broker {
        b.close().await.expect("close");
    }
}
