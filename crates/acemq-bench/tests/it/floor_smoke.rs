//! The floor of scenario 5 (`--floor`) runs and measures every step.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_runs_every_step_and_both_pipes() {
    let floor = acemq_bench::floor::run(2_500, 256)
        .await
        .expect("floor run");
    let steps: Vec<&str> = floor.steps.iter().map(|s| s.what).collect();
    assert_eq!(
        steps,
        [
            "encode the JSON body",
            "decode the JSON body",
            "the id: a UUID v4, as text",
            "traceparent written and parsed",
            "the seven envelope headers written, then found and read",
        ]
    );
    assert!(floor.steps.iter().all(|s| s.ns > 0.0), "{floor:?}");
    assert_eq!(floor.pipe.messages, 2_500);
    assert_eq!(floor.batched.messages, 2_500);
    let table = floor.table();
    assert!(
        table.contains("| sum: the contract's work on one core |"),
        "{table}"
    );
}
