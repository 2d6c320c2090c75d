//! Connection recovery at the transport seam: a lost connection is redialled, what it
//! declared is declared again, publishing refuses (nothing sent) while it is down and works
//! after, and every step is reported as an event. On `memory://` the fault is injected in
//! virtual time; on RabbitMQ the broker force-closes this test's own connections (found by
//! connection name; no other client's connection is touched).

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use acemq::topology::QueueDecl;
use acemq::transport::amqp::{AmqpOptions, AmqpTransport};
use acemq::transport::memory::MemoryTransport;
use acemq::transport::recovery::{RecoveryEvent, RecoveryPolicy, Side};
use acemq::transport::{
    Confirmation, ConsumeSpec, Outbound, Properties, Transport, TransportError,
};
use tokio::sync::broadcast;

fn outbound(queue: &str) -> Outbound {
    let properties = Properties {
        message_id: Some(support::unique("m")),
        ..Properties::default()
    };
    Outbound::new("", queue, properties, "x")
}

/// Waits for an event matching `pred`, returning every event seen up to it.
async fn until(
    events: &mut broadcast::Receiver<RecoveryEvent>,
    within: Duration,
    mut pred: impl FnMut(&RecoveryEvent) -> bool,
) -> Vec<RecoveryEvent> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(e)) => {
                let done = pred(&e);
                seen.push(e);
                if done {
                    return seen;
                }
            }
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(e)) => panic!("event stream ended: {e}; seen {seen:?}"),
            Err(_) => panic!("no matching event within {within:?}; seen {seen:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn memory_a_dropped_connection_recovers_and_declares_its_topology_again() {
    let name = support::unique("mem-recover");
    let t = MemoryTransport::connect(&name);
    let other = MemoryTransport::connect(&name);
    let mut events = t.recovery_events();
    let q = support::unique("recover.q");
    t.declare_queue(&QueueDecl::classic(&q))
        .await
        .expect("declare");

    t.broker().set_down(true);
    t.drop_connection("drill");
    assert!(!t.status().connected);
    assert!(t.recovering());
    // Down: a publish is refused with nothing sent.
    let refused = t.publish(outbound(&q)).await.map(drop);
    assert!(
        matches!(refused, Err(TransportError::NotConnected { .. })),
        "{refused:?}"
    );
    // Meanwhile an operator deletes the queue.
    other.delete_queue(&q).await.expect("delete");

    // Three redials fail while the broker is down, each after a delay within the
    // default policy's (growing, fully jittered) bound.
    let seen = until(&mut events, Duration::from_secs(60), |e| {
        matches!(e, RecoveryEvent::Retrying { attempt: 4, .. })
    })
    .await;
    assert!(matches!(seen[0], RecoveryEvent::Lost { .. }), "{seen:?}");
    let delays: Vec<Duration> = seen
        .iter()
        .filter_map(|e| match e {
            RecoveryEvent::Retrying { delay, .. } => Some(*delay),
            _ => None,
        })
        .collect();
    assert_eq!(delays.len(), 4, "{seen:?}");
    let policy = acemq::transport::recovery::RecoveryPolicy::default();
    for (n, d) in (1u32..).zip(&delays) {
        assert!(*d <= policy.base_delay(n), "redial {n}: {delays:?}");
    }
    t.broker().set_down(false);
    let seen = until(&mut events, Duration::from_secs(60), |e| {
        matches!(e, RecoveryEvent::Recovered { .. })
    })
    .await;
    let Some(RecoveryEvent::Recovered { attempts, .. }) = seen.last() else {
        unreachable!()
    };
    assert_eq!(*attempts, 4);
    assert!(t.status().connected);
    assert!(!t.recovering());
    // The queue is back and publishing works.
    assert_eq!(other.inspect_queue(&q).await.expect("redeclared").name, q);
    let c = t.publish(outbound(&q)).await.expect("publish").await;
    assert_eq!(c.expect("confirm"), Confirmation::Routed);
    t.close().await.expect("close");
    other.close().await.expect("close");
}

#[tokio::test(start_paused = true)]
async fn memory_unsettled_deliveries_go_back_and_their_acks_report_not_sent() {
    let name = support::unique("mem-recover-ack");
    let t = MemoryTransport::connect(&name);
    let q = support::unique("recover.ack");
    t.declare_queue(&QueueDecl::classic(&q))
        .await
        .expect("declare");
    t.publish(outbound(&q))
        .await
        .expect("publish")
        .await
        .expect("confirm");
    let mut sub = t.consume(ConsumeSpec::new(&q, 1)).await.expect("consume");
    let d = sub.next().await.expect("delivery").expect("ok");
    t.drop_connection("drill");
    assert!(matches!(
        d.acker.ack().await,
        Err(TransportError::AckNotSent)
    ));
    assert!(
        sub.next().await.is_none(),
        "the subscription ends with its connection"
    );
    assert!(!sub.cancelled_by_us());
    let mut events = t.recovery_events();
    until(&mut events, Duration::from_secs(10), |e| {
        matches!(e, RecoveryEvent::Recovered { .. })
    })
    .await;
    let again = t.get(&q).await.expect("get").expect("the message is back");
    assert!(again.redelivered);
    again.acker.ack().await.expect("ack");
    t.close().await.expect("close");
}

#[tokio::test(start_paused = true)]
async fn memory_recovery_can_be_turned_off() {
    let t = MemoryTransport::connect(&support::unique("mem-norecover"))
        .with_recovery(RecoveryPolicy::disabled());
    let mut events = t.recovery_events();
    t.drop_connection("drill");
    let seen = until(&mut events, Duration::from_secs(5), |e| {
        matches!(e, RecoveryEvent::GaveUp { .. })
    })
    .await;
    assert_eq!(seen.len(), 2, "lost then gave up: {seen:?}");
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(!t.status().connected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_force_closed_connection_recovers_with_its_topology() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    let name = support::unique("recover-amqp");
    let t = AmqpTransport::connect_with(
        &url,
        AmqpOptions::default().connection_name(&name).recovery(
            RecoveryPolicy::default().delays(Duration::from_millis(200), Duration::from_secs(2)),
        ),
    )
    .await
    .expect("connect");
    let t = Arc::new(t);
    let mut events = t.recovery_events();
    // An exclusive queue dies with its connection: it comes back only if redeclared.
    let q = support::unique("recover.exclusive");
    t.declare_queue(&QueueDecl {
        exclusive: true,
        durable: false,
        ..QueueDecl::classic(&q)
    })
    .await
    .expect("declare");

    for side in ["publish", "consume"] {
        support::close_rabbit_connection_named(&format!("{name} ({side})"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let mut recovered = std::collections::HashSet::new();
    let seen = until(&mut events, Duration::from_secs(30), |e| {
        if let RecoveryEvent::Recovered { side, .. } = e {
            recovered.insert(*side);
        }
        recovered.len() == 2
    })
    .await;
    assert!(
        seen.iter().any(|e| matches!(
            e,
            RecoveryEvent::Lost {
                side: Side::Publish,
                ..
            }
        )),
        "{seen:?}"
    );
    assert!(t.status().connected, "{seen:?}");
    let info = t
        .inspect_queue(&q)
        .await
        .expect("the exclusive queue is declared again");
    assert_eq!(info.name, q);
    let c = t.publish(outbound(&q)).await.expect("publish").await;
    assert_eq!(c.expect("confirm"), Confirmation::Routed);
    let d = t.get(&q).await.expect("get").expect("the message");
    d.acker.ack().await.expect("ack");
    t.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_an_unreachable_broker_fails_after_the_budget_naming_the_address_without_password() {
    // Nothing listens on port 1.
    let started = std::time::Instant::now();
    let e = AmqpTransport::connect_with(
        "amqp://guest:secret-pw@127.0.0.1:1/%2f",
        AmqpOptions::default().connect_timeout(Duration::from_secs(2)),
    )
    .await
    .map(drop)
    .expect_err("unreachable");
    let text = e.to_string();
    assert!(matches!(e, TransportError::Unreachable { .. }), "{e:?}");
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(!text.contains("secret-pw"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "it retried"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_wrong_credentials_fail_at_once() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    let Some(rest) = url.split("://").nth(1).and_then(|r| r.split('@').nth(1)) else {
        panic!("unexpected test URL shape");
    };
    let started = std::time::Instant::now();
    let e = AmqpTransport::connect_with(
        &format!("amqp://guest:not-the-password@{rest}"),
        AmqpOptions::default().connect_timeout(Duration::from_secs(20)),
    )
    .await
    .map(drop)
    .expect_err("refused");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not retried for the budget: {e:?}"
    );
    assert!(!e.to_string().contains("not-the-password"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn memory_injected_faults_lose_confirms_and_acks_delay_confirms_and_cancel_consumers() {
    let t = MemoryTransport::connect(&support::unique("mem-faults"));
    let broker = t.broker();
    let q = support::unique("faults.q");
    t.declare_queue(&QueueDecl::classic(&q))
        .await
        .expect("declare");

    // A lost confirm: in doubt for the publisher, yet the message is in the queue.
    broker.lose_next_confirms(1);
    let lost = t.publish(outbound(&q)).await.expect("written").await;
    assert!(
        matches!(lost, Err(TransportError::ConfirmLost { .. })),
        "{lost:?}"
    );
    assert_eq!(t.inspect_queue(&q).await.expect("inspect").message_count, 1);
    // The fault counts down: the next confirm arrives.
    let c = t.publish(outbound(&q)).await.expect("written").await;
    assert_eq!(c.expect("confirm"), Confirmation::Routed);

    // A delayed confirm resolves after the delay, in tokio time.
    broker.delay_confirms(Some(Duration::from_secs(3)));
    let started = tokio::time::Instant::now();
    t.publish(outbound(&q))
        .await
        .expect("written")
        .await
        .expect("confirm");
    assert!(started.elapsed() >= Duration::from_secs(3));
    broker.delay_confirms(None);

    // A lost ack: reported sent, the message comes back redelivered.
    let d = t.get(&q).await.expect("get").expect("one");
    let id = d.properties.message_id.clone();
    broker.lose_next_acks(1);
    d.acker.ack().await.expect("reported sent");
    assert_eq!(t.inspect_queue(&q).await.expect("inspect").message_count, 3);
    let again = t.get(&q).await.expect("get").expect("back");
    assert!(again.redelivered);
    assert_eq!(again.properties.message_id, id);
    again.acker.ack().await.expect("ack");

    // A broker-side cancel ends a subscription that we did not cancel.
    let mut sub = t.consume(ConsumeSpec::new(&q, 10)).await.expect("consume");
    assert_eq!(broker.cancel_consumers(&q), 1);
    let mut n = 0;
    while let Some(d) = sub.next().await {
        d.expect("delivery").acker.ack().await.expect("ack");
        n += 1;
    }
    assert!(n <= 2);
    assert!(!sub.cancelled_by_us());
    t.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_credentials_come_from_a_file_or_the_environment_and_are_never_printed() {
    use acemq::transport::amqp::Credentials;
    let Some(url) = support::amqp_url() else {
        return;
    };
    // The URL's own credentials are wrong: the file's must be used.
    let Some(rest) = url.split("://").nth(1).and_then(|r| r.split('@').nth(1)) else {
        panic!("unexpected test URL shape");
    };
    let wrong = format!("amqp://nobody:wrong@{rest}");
    let dir = std::env::temp_dir().join(support::unique("creds"));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("rabbit");
    std::fs::write(&file, "guest:guest\n").expect("write");
    let t = AmqpTransport::connect_with(
        &wrong,
        AmqpOptions::default().credentials(Credentials::file(&file, None)),
    )
    .await
    .expect("the file's credentials are used");
    assert!(t.status().connected);
    t.close().await.expect("close");

    // A variable that is not set fails at once, naming the variable, not a secret.
    let started = std::time::Instant::now();
    let e = AmqpTransport::connect_with(
        &wrong,
        AmqpOptions::default().credentials(Credentials::environment(
            "ACEMQ_TEST_NO_SUCH_USER_VAR",
            "ACEMQ_TEST_NO_SUCH_PASSWORD_VAR",
        )),
    )
    .await
    .map(drop)
    .expect_err("no such variable");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(matches!(e, TransportError::Config { .. }), "{e:?}");
    assert!(e.to_string().contains("ACEMQ_TEST_NO_SUCH_USER_VAR"), "{e}");
    let opts = AmqpOptions::default().credentials(Credentials::user_password("u", "hunter2"));
    assert!(!format!("{opts:?}").contains("hunter2"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `publish_wait`: a publish made while the publishing connection is being redialled waits
/// for the recovery and is confirmed, instead of being refused at once (the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_publish_with_publish_wait_waits_for_the_recovery_and_is_confirmed() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    let name = support::unique("publish-wait");
    let mq = acemq::Connection::connect_with(
        &url,
        acemq::connection::ConnectionOptions::default()
            .name(&name)
            .publish_wait(Duration::from_secs(20)),
    )
    .await
    .unwrap_or_else(|e| panic!("connect: {e}"));
    let q = support::unique("publish-wait.q");
    support::declare_classic(&mq, &q).await;
    let mut events = mq.recovery_events().expect("AMQP reports recovery events");
    support::close_rabbit_connection_named(&format!("{name} (publish)"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Wait until the loss is noticed: from here on a publish finds the link recovering.
    until(&mut events, Duration::from_secs(10), |e| {
        matches!(
            e,
            RecoveryEvent::Lost {
                side: Side::Publish,
                ..
            }
        )
    })
    .await;
    let sent = mq.publisher::<u32>("", &q).send(&7).await;
    assert!(
        sent.is_ok(),
        "waited for the recovery and confirmed: {sent:?}"
    );
    let info = mq.transport().inspect_queue(&q).await.expect("inspect");
    assert_eq!(info.message_count, 1);
    mq.transport().delete_queue(&q).await.ok();
    mq.close().await.ok();
}
