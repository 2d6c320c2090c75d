//! On RabbitMQ: while a memory alarm blocks publishing, a retry hop whose
//! publish was written (the one that makes RabbitMQ send `connection.blocked`) is answered
//! in doubt, and the broker routes it once the alarm clears. It must not be published a
//! second time meanwhile: each message's handler runs once per attempt (an earlier build
//! ran 5 messages under `fixed(3, 100 ms)` 21 times instead of 15).
//!
//! No duplicated hop is tolerated. A hop whose frames were still queued in lapin when the
//! block arrived was once answered in doubt with no later answer, so its move published
//! again and both copies arrived after the alarm cleared (about half of the runs: 17 runs
//! instead of 15). Such a publish now stays with the confirm collector through the block,
//! and its move waits for the broker's answer once the frames went out.
//!
//! This test changes global broker state (`rabbitmqctl set_vm_memory_high_watermark 0`), so
//! it is a serial test (see `main.rs`); the watermark is restored by a drop guard even when
//! the test fails.

use crate::support;

use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::retry::RetryPolicy;
use acemq::topology::QueueDecl;
use support::settle::{assert_runs_equal_attempts, consume_always_failing, send_json};
use support::{MemoryAlarm, eventually, unique};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "serial: changes global broker state"]
async fn in_doubt_retry_hops_under_a_memory_alarm_run_no_extra_handler() {
    let Some(url) = support::amqp_url() else {
        eprintln!("note: ACEMQ_TEST_AMQP_URL unset; RabbitMQ test skipped");
        return;
    };
    let mq = Connection::connect_with(
        &url,
        ConnectionOptions::default().name(unique("blocked-moves")),
    )
    .await
    .expect("connect");
    let t = mq.transport().clone();
    let q = unique("blocked-moves");
    t.declare_queue(&QueueDecl::classic(&q))
        .await
        .expect("declare");
    let ids: Vec<String> = (1..=5).map(|i| format!("m-{i}")).collect();
    for id in &ids {
        send_json(&mq, &q, id).await;
    }
    let alarm = MemoryAlarm::raise();
    let policy = RetryPolicy::fixed(3, Duration::from_millis(100)).expect("policy");
    let (consumer, seen) = consume_always_failing(&mq, &q, policy).await;
    eventually(WAIT, "five first runs", || async {
        (seen.total() >= 5).then_some(())
    })
    .await;
    eventually(WAIT, "publishing blocked, moves failing", || async {
        (mq.status().blocked.is_some() && consumer.moves().moves_failing == 5).then_some(())
    })
    .await;
    eprintln!(
        "observed: {} runs while blocked; moves {:?}",
        seen.total(),
        consumer.moves()
    );
    assert_eq!(seen.total(), 5, "no run while publishing is blocked");
    drop(alarm);
    assert_runs_equal_attempts(
        &*t,
        &consumer,
        &seen,
        &q,
        &ids,
        support::settle::Expected {
            attempts: 3,
            duplicated_hops: 0,
        },
        WAIT,
    )
    .await;
    consumer.close().await;
    support::delete_queues(&mq, &q, &[]).await;
    mq.close().await.ok();
}
