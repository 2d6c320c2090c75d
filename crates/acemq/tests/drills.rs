//! Recovery drills: real faults on RabbitMQ while one AceMQ connection publishes a
//! known sequence of ids and consumes them, with the accounting of `drills/ledger.rs` and the
//! assertions of `drills/run.rs` (lost = 0, duplicates within prefetch × faults plus failed
//! publish attempts, recovery within 30 s of the fault's end with nothing restarted).
//!
//! The drills disturb the broker (forced closes, `stop_app`, queue deletion, a cluster node
//! going down), so they are `#[ignore]`d and run one at a time by `scripts/test.sh`'s drill
//! step: `cargo test -p acemq --all-features --test drills -- --ignored --test-threads=1`.
//! Each restores what it changed even when it fails (drop guards). They reach the broker of
//! `ACEMQ_DRILL_AMQP_URL` (else `ACEMQ_TEST_AMQP_URL`), whose node `rabbitmqctl` addresses
//! with `-n $ACEMQ_DRILL_NODE` when set (e.g. `r1@localhost` of `scripts/cluster.sh`, to
//! drill away from a shared broker). The failover drill uses `scripts/cluster.sh`, the TLS
//! drill the node of `scripts/tls-node.sh`.
//!
//! Not ignored (they disturb nothing but their own connections): the proxy's own test, the
//! ledger's, a no-fault run of the harness on `memory://` and RabbitMQ, and closing this
//! process's connections by name.

mod support;

mod drills {
    pub mod broker;
    pub mod connect;
    pub mod flapping;
    pub mod ledger;
    pub mod proxy;
    pub mod resources;
    pub mod run;
    pub mod schedule;
    pub mod stream;
    pub mod tls;
}

/// Counts live heap bytes, so a drill's leak check measures what is still allocated
/// rather than what the allocator keeps mapped.
#[global_allocator]
static ALLOC: drills::resources::CountingAlloc = drills::resources::CountingAlloc;

use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::headers::HeaderValue;
use acemq::topology::QueueDecl;
use acemq::transport::Transport;
use acemq::transport::amqp::{AmqpOptions, AmqpTransport};
use acemq::transport::memory::MemoryTransport;
use drills::broker::{
    AppStopped, Cluster, DrillTarget, close_our_connections_async, our_connections, queue_members,
};
use drills::connect::{
    connect_cluster, connect_named, connect_named_with_heartbeat, connect_named_without_recovery,
    drill_name,
};
use drills::proxy::Proxy;
use drills::resources::Resources;
use drills::run::Drill;

/// How soon after `start_app` returns the restart drill must be publishing and consuming.
const RESTART_BOUND: Duration = Duration::from_secs(2);

/// How long a broker-side outage lasts in the drills that stop something.
const OUTAGE: Duration = Duration::from_secs(5);

/// A raw transport of its own (the drill's "operator" connection), named after the drill.
async fn raw(url: &str, name: &str) -> AmqpTransport {
    AmqpTransport::connect_with(
        url,
        AmqpOptions::default().connection_name(format!("{name}-operator")),
    )
    .await
    .unwrap_or_else(|e| panic!("cannot connect to RabbitMQ at {url}: {e}"))
}

/// `(scheme://userinfo@, host:port, /path?query)` of an AMQP URL.
fn split_url(url: &str) -> (String, String, String) {
    let (scheme, rest) = url.split_once("://").unwrap_or(("amqp", url));
    let (user, rest) = match rest.find('@') {
        Some(at) if rest[..at].find('/').is_none() => (&rest[..=at], &rest[at + 1..]),
        _ => ("", rest),
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let mut host = rest[..end].to_owned();
    if !host.contains(':') {
        host.push_str(":5672");
    }
    (format!("{scheme}://{user}"), host, rest[end..].to_owned())
}

/// A drill proxy in front of `target`'s broker.
async fn proxy_to(target: &DrillTarget) -> Proxy {
    let (_, hostport, _) = split_url(&target.url);
    let upstream = tokio::net::lookup_host(&hostport)
        .await
        .expect("the broker's address resolves")
        .next()
        .expect("the broker's address");
    Proxy::start(upstream)
        .await
        .expect("the drill proxy starts")
}

/// `url` through `127.0.0.1:port`, with `query` (e.g. `heartbeat=2`) added unless empty.
fn via(url: &str, port: u16, query: &str) -> String {
    let (head, _, tail) = split_url(url);
    let tail = if tail.is_empty() {
        "/".to_owned()
    } else {
        tail
    };
    if query.is_empty() {
        return format!("{head}127.0.0.1:{port}{tail}");
    }
    let sep = if tail.contains('?') { '&' } else { '?' };
    format!("{head}127.0.0.1:{port}{tail}{sep}{query}")
}

#[test]
fn urls_are_rewritten_through_the_proxy() {
    assert_eq!(
        split_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
        (
            "amqp://guest:guest@".to_owned(),
            "127.0.0.1:5672".to_owned(),
            "/%2f".to_owned()
        )
    );
    assert_eq!(
        via("amqp://guest:guest@127.0.0.1:5672/%2f", 4000, "heartbeat=2"),
        "amqp://guest:guest@127.0.0.1:4000/%2f?heartbeat=2"
    );
    assert_eq!(
        via("amqp://localhost?frame_max=8192", 1, "heartbeat=2"),
        "amqp://127.0.0.1:1?frame_max=8192&heartbeat=2"
    );
    assert_eq!(split_url("amqp://localhost").1, "localhost:5672");
    assert_eq!(
        via("amqp://guest:guest@127.0.0.1:5672/%2f", 4000, ""),
        "amqp://guest:guest@127.0.0.1:4000/%2f"
    );
}

/// The harness itself, with no fault: everything confirmed is handled, nothing lost, no
/// recovery measured. On `memory://` and on RabbitMQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_without_faults_books_everything_and_loses_nothing() {
    let name = drill_name("baseline");
    let q = support::unique("drill.baseline");
    // memory://
    let broker = support::unique("drill-mem");
    let mq = Connection::connect(&format!("memory://{broker}"))
        .await
        .unwrap();
    let d = Drill::start("baseline-memory", mq, QueueDecl::quorum(&q), None).await;
    d.wait_flowing(300).await;
    let c = d.finish(&MemoryTransport::connect(&broker)).await;
    assert!(
        c.confirmed >= 300 && c.lost == 0 && c.duplicates == 0,
        "{c:?}"
    );
    assert_eq!(c.sent, c.confirmed, "no fault, no failed attempt");
    // RabbitMQ
    let Some(url) = support::amqp_url() else {
        return;
    };
    let mq = connect_named(&url, &name).await.unwrap();
    let d = Drill::start("baseline-amqp", mq, QueueDecl::quorum(&q), None).await;
    d.wait_flowing(300).await;
    assert_eq!(
        our_connections(None, &name).expect("rabbitmqctl").len(),
        2,
        "the named publish and consume connections are listed"
    );
    let r = Resources::measure(None, name.clone()).await;
    assert!(
        r.channels >= 2 && r.fds > 2 && r.tasks > 2 && r.rss_kib > 0 && r.heap_kib > 0,
        "the probe sees our channels and this process: {r:?}"
    );
    let c = d.finish(&raw(&url, &name).await).await;
    assert!(c.confirmed >= 300 && c.lost == 0, "{c:?}");
    assert_eq!(c.duplicates, 0, "no fault, no duplicate: {c:?}");
    assert_eq!(c.sent, c.confirmed, "no fault, no failed attempt");
}

/// The harness through a fault the library already survives: publishing paused (each
/// publish refused, nothing sent) for a while, then resumed. The loop retries the refused id
/// until it is confirmed, counts every attempt as sent, and recovery is measured from the
/// resume. On `memory://` and RabbitMQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_publish_is_retried_until_confirmed_and_recovery_is_measured() {
    let broker = support::unique("drill-mem");
    let mq = Connection::connect(&format!("memory://{broker}"))
        .await
        .unwrap();
    let q = support::unique("drill.paused");
    paused_publishing(mq, &q, &MemoryTransport::connect(&broker)).await;
    let Some(url) = support::amqp_url() else {
        return;
    };
    let name = drill_name("paused");
    let mq = connect_named(&url, &name).await.unwrap();
    paused_publishing(mq, &q, &raw(&url, &name).await).await;
}

async fn paused_publishing(mq: Connection, q: &str, raw: &dyn Transport) {
    let label = format!("paused-{}", mq.transport_kind());
    let mut d = Drill::start(&label, mq, QueueDecl::quorum(q), None).await;
    d.wait_flowing(100).await;
    d.mq.pause_publishing();
    d.fault();
    let before = d.ledger.counts();
    support::eventually(Duration::from_secs(5), "refused attempts", || {
        let failed = d.ledger.counts().publish_errors > before.publish_errors + 2;
        async move { failed.then_some(()) }
    })
    .await;
    d.mq.resume_publishing();
    let took = d.await_recovery(Instant::now(), "publishing resumed").await;
    assert!(took < Duration::from_secs(2), "{took:?}");
    d.wait_flowing(100).await;
    let c = d.finish(raw).await;
    assert!(
        c.sent >= c.confirmed + 3,
        "the refused attempts count as sent: {c:?}"
    );
    assert_eq!(c.lost, 0);
    assert_eq!(c.duplicates, 0, "a refused publish is not sent: {c:?}");
}

/// Closing "this process's connections" closes exactly those named with the drill's prefix.
/// The closed connection does not recover (recovery off), so its close stays visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_own_connections_by_name_leaves_others_alone() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    let mine = drill_name("close-mine");
    let other = drill_name("close-other");
    let a = connect_named_without_recovery(&url, &mine).await.unwrap();
    let b = connect_named(&url, &other).await.unwrap();
    assert_eq!(our_connections(None, &mine).unwrap().len(), 2);
    let closed = close_our_connections_async(None, mine.clone(), "drill")
        .await
        .unwrap();
    assert_eq!(closed, 2);
    support::eventually(Duration::from_secs(10), "our connections gone", || {
        let gone = our_connections(None, &mine).unwrap().is_empty();
        async move { gone.then_some(()) }
    })
    .await;
    support::eventually(Duration::from_secs(10), "ours reported lost", || {
        let lost = !a.status().connected;
        async move { lost.then_some(()) }
    })
    .await;
    assert_eq!(
        our_connections(None, &other).unwrap().len(),
        2,
        "others untouched"
    );
    assert!(b.status().connected);
    b.close().await.unwrap();
    let _ = a.close().await;
}

/// (a) The broker force-closes this process's connections mid-stream, 20 times in a row;
/// each time both directions recover within the bound, and RSS, file descriptors, tokio
/// tasks and broker channels stay flat (bounds in `drills/resources.rs`; a closed
/// connection's heartbeat task may linger up to half a heartbeat, so the counts are given
/// that long to settle).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_forced_close_20_times() {
    let Some(target) = DrillTarget::from_env() else {
        return;
    };
    let name = drill_name("forced-close");
    let mq = connect_named(&target.url, &name).await.unwrap();
    let q = support::unique("drill.forced-close");
    let mut d = Drill::start(
        "forced-close",
        mq,
        QueueDecl::quorum(&q),
        target.node.clone(),
    )
    .await;
    d.wait_flowing(400).await;
    let before = Resources::measure(target.node.clone(), name.clone()).await;
    for round in 1..=20 {
        let closed = close_our_connections_async(target.node.clone(), name.clone(), "drill")
            .await
            .expect("rabbitmqctl close_connection");
        // Both were serving (the last round's recovery was awaited), so both are closed:
        // a round that closed one of them would drill half the fault.
        assert_eq!(
            closed, 2,
            "round {round}: closed {closed} of our two connections (publish and consume)"
        );
        d.fault();
        d.await_recovery(Instant::now(), &format!("forced close {round}"))
            .await;
        d.wait_flowing(50).await;
    }
    d.wait_flowing(200).await;
    before
        .assert_settles(target.node.clone(), name.clone(), "forced-close")
        .await;
    d.finish(&raw(&target.url, &name).await).await;
    let left = our_connections(target.node.as_deref(), &name).expect("rabbitmqctl");
    assert!(left.is_empty(), "connections left after close(): {left:?}");
}

/// (b) `rabbitmqctl stop_app` / `start_app` mid-stream, publishing and consuming going on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_broker_restart() {
    let Some(target) = DrillTarget::from_env() else {
        return;
    };
    let name = drill_name("restart");
    let mq = connect_named(&target.url, &name).await.unwrap();
    let q = support::unique("drill.restart");
    let mut d = Drill::start("restart", mq, QueueDecl::quorum(&q), target.node.clone()).await;
    d.wait_flowing(400).await;
    let node = target.node.clone();
    let stopped = tokio::task::spawn_blocking(move || AppStopped::stop(node.as_deref()))
        .await
        .unwrap()
        .expect("rabbitmqctl stop_app");
    d.fault();
    tokio::time::sleep(OUTAGE).await; // the outage itself: publishing goes on, and fails
    let took = stopped.start_async().await.expect("rabbitmqctl start_app");
    eprintln!("drill restart: start_app took {took:?}");
    // Serving again within 2 s of the broker taking connections: a publish
    // confirmed and a delivery handled, both after start_app returned.
    let back = d.await_recovery(Instant::now(), "stop_app/start_app").await;
    assert!(
        back <= RESTART_BOUND,
        "drill restart: first confirmed publish and handled delivery {back:?} after \
         start_app returned, above {RESTART_BOUND:?}"
    );
    d.wait_flowing(200).await;
    d.finish(&raw(&target.url, &name).await).await;
}

/// (c) A network cut without a close (the proxy stops forwarding, sockets stay open), so
/// only heartbeats (2 s, from `ConnectionOptions::heartbeat`) can notice; then the network
/// comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_network_cut() {
    let Some(target) = DrillTarget::from_env() else {
        return;
    };
    let proxy = proxy_to(&target).await;
    let name = drill_name("network-cut");
    let mq = connect_named_with_heartbeat(&via(&target.url, proxy.port(), ""), &name, 2)
        .await
        .unwrap();
    let q = support::unique("drill.network-cut");
    let mut d = Drill::start(
        "network-cut",
        mq,
        QueueDecl::quorum(&q),
        target.node.clone(),
    )
    .await;
    d.wait_flowing(400).await;
    proxy.cut();
    d.fault();
    let cut_at = Instant::now();
    support::eventually(
        Duration::from_secs(20),
        "the heartbeat to notice the cut",
        || {
            let lost = !d.mq.status().connected;
            async move { lost.then_some(()) }
        },
    )
    .await;
    eprintln!(
        "drill network-cut: loss noticed {}ms after the cut",
        cut_at.elapsed().as_millis()
    );
    tokio::time::sleep(Duration::from_secs(2)).await; // stays cut a little longer
    proxy.restore();
    d.await_recovery(Instant::now(), "network restored").await;
    d.wait_flowing(200).await;
    d.finish(&raw(&target.url, &name).await).await;
}

/// A flapping link: the proxy drops every socket at once, at least 240 times at
/// random moments (some within 100 ms of a recovery), publishing and consuming all along;
/// see `drills/flapping.rs` for what is asserted after each burst and at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_flapping_link() {
    let Some(target) = DrillTarget::from_env() else {
        return;
    };
    let proxy = proxy_to(&target).await;
    let name = drill_name("flapping");
    let mq = connect_named(&via(&target.url, proxy.port(), ""), &name)
        .await
        .unwrap();
    let q = support::unique("drill.flapping");
    // What the user who found it ran: prefetch 50, one handler at a time, a quorum queue.
    let mut d = Drill::start_with(
        "flapping",
        mq,
        QueueDecl::quorum(&q),
        target.node.clone(),
        50,
        1,
    )
    .await;
    d.wait_flowing(400).await;
    let operator = raw(&target.url, &name).await;
    drills::flapping::run(&mut d, &proxy, &operator, target.node.clone(), &name).await;
    d.wait_flowing(200).await;
    d.finish(&operator).await;
    operator.close().await.ok();
}

/// (d) The consumed queue is deleted and declared again by an operator (another
/// connection); publishes meanwhile are unroutable and retried; the consumer resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_queue_deleted_and_declared_again() {
    let Some(target) = DrillTarget::from_env() else {
        return;
    };
    let name = drill_name("queue-deleted");
    let mq = connect_named(&target.url, &name).await.unwrap();
    let q = support::unique("drill.queue-deleted");
    let decl = QueueDecl::quorum(&q);
    let mut d = Drill::start("queue-deleted", mq, decl.clone(), target.node.clone()).await;
    let operator = raw(&target.url, &name).await;
    d.wait_flowing(400).await;
    // Deleting a queue drops what it holds: drain it first, so what is lost is not ours.
    d.pause_publishing().await;
    d.wait_drained(&operator, Duration::from_secs(30)).await;
    operator.delete_queue(&q).await.expect("delete the queue");
    d.fault();
    d.resume_publishing();
    tokio::time::sleep(OUTAGE).await; // publishes are unroutable meanwhile, and retried
    operator
        .declare_queue(&decl)
        .await
        .expect("declare the queue again");
    d.await_recovery(Instant::now(), "queue declared again")
        .await;
    d.wait_flowing(200).await;
    d.finish(&operator).await;
    operator.close().await.ok();
}

/// (f) A 3-node cluster (`scripts/cluster.sh`), a quorum queue with 3 replicas; the node the
/// client's publishing connection is on is stopped mid-stream, then (once it is back) the
/// node its consuming connection is on: the library dials its two connections round robin
/// across the addresses, so they may live on different nodes, and each direction must fail
/// over at least once. Each time the client fails over to the remaining majority, publishing
/// goes on, and nothing confirmed is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_cluster_failover() {
    if DrillTarget::from_env().is_none() {
        return;
    }
    let cluster = Cluster::ensure().expect("scripts/cluster.sh start");
    let name = drill_name("failover");
    let mq = connect_cluster(&cluster.urls, &name).await.unwrap();
    let q = support::unique("drill.failover");
    let decl = QueueDecl::quorum(&q).argument("x-quorum-initial-group-size", HeaderValue::I64(3));
    let mut d = Drill::start("failover", mq, decl, Some(cluster.nodes[0].clone())).await;
    let members = queue_members(Some(&cluster.nodes[0]), &q).expect("rabbitmqctl list_queues");
    assert_eq!(members.len(), 3, "a replica on every node: {members:?}");
    d.wait_flowing(400).await;
    let mut operator_url = cluster.urls[0].clone();
    for side in ["publish", "consume"] {
        let ours = our_connections(Some(&cluster.nodes[0]), &name).expect("rabbitmqctl");
        let node = ours
            .iter()
            .find(|c| c.name.ends_with(&format!("({side})")))
            .map(|c| c.node().to_owned())
            .unwrap_or_else(|| panic!("our {side} connection on the cluster: {ours:?}"));
        assert!(
            cluster.owns(&node),
            "refusing to stop {node}: not a node of scripts/cluster.sh"
        );
        let on_node: Vec<&str> = ours
            .iter()
            .filter(|c| c.node() == node)
            .map(|c| c.name.as_str())
            .collect();
        eprintln!("drill failover: stopping {node}, which holds {on_node:?}");
        let n = node.clone();
        let stopped = tokio::task::spawn_blocking(move || AppStopped::stop(Some(&n)))
            .await
            .unwrap()
            .expect("rabbitmqctl stop_app");
        d.fault();
        // The majority is up at once: recovery is measured from the stop.
        d.await_recovery(Instant::now(), &format!("{node} stopped ({side} side)"))
            .await;
        d.wait_flowing(400).await;
        let survivor = cluster.node_besides(&node).to_owned();
        let moved = our_connections(Some(&survivor), &name).expect("rabbitmqctl");
        assert_eq!(
            moved.len(),
            2,
            "both connections are open again, on the remaining nodes: {moved:?}"
        );
        assert!(
            moved.iter().all(|c| c.node() != node),
            "no connection of ours left on the stopped {node}: {moved:?}"
        );
        operator_url = cluster.url_besides(&node).to_owned();
        let took = stopped.start_async().await.expect("start_app");
        eprintln!("drill failover: {node} back after {took:?}");
        d.wait_flowing(200).await;
    }
    let operator = raw(&operator_url, &name).await;
    let c = d.finish(&operator).await;
    assert!(c.confirmed > 800, "publishing went on: {c:?}");
    operator.close().await.ok();
    drop(cluster);
}

/// (h) Scheduled messages on the scheduler's rungs across `stop_app` / `start_app`: all
/// delivered after the restart, none before its due time. Prints
/// `drill schedule-restart: scheduled=.. delivered=.. lost=0 ..`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_scheduled_messages_survive_a_broker_restart() {
    let Some(target) = DrillTarget::from_env() else {
        return;
    };
    let name = drill_name("schedule-restart");
    let mq = connect_named(&target.url, &name).await.unwrap();
    drills::schedule::run(&mq, target.node.clone()).await;
    mq.close().await.unwrap();
}

// --- streams helper ----------------------------------------------------------------------

/// A stream reader's consuming connection is closed (by name, ours only) 650
/// entries into 1,000: it resumes from its position, nothing is lost and nothing repeats
/// beyond the unsettled window. Prints `drill stream-resume: sent=.. lost=.. duplicates=..`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: disturbs the shared broker; run one at a time by scripts/test.sh's drill step"]
async fn drill_stream_resumes_after_a_close() {
    let Some(target) = DrillTarget::from_env() else {
        return;
    };
    let name = drill_name("stream-resume");
    let mq = connect_named(&target.url, &name).await.unwrap();
    drills::stream::run(&mq, &name, target.node.clone()).await;
    mq.close().await.unwrap();
}

/// (g) TLS as users deploy it, on RabbitMQ's own TLS listener (`scripts/tls-node.sh`:
/// `verify_peer`, `fail_if_no_peer_cert`): a private CA and mutual TLS, connecting by IP with
/// the server name given apart; publishing and consuming; this process's connections
/// force-closed by name (3 times) and recovered over TLS (confirmed publishes and handled
/// deliveries again). Then the refusals users meet, each failing at once (under 2 s, not
/// after the 20 s connect timeout) with a [`TransportError::Tls`] naming its cause: a CA
/// that is not trusted, a name not on the certificate, a client certificate of another CA,
/// no client certificate (all on the node), and an X.509 v1 server certificate (on the
/// script's `openssl s_server`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drill: needs scripts/tls-node.sh's node; run one at a time by scripts/test.sh's drill step"]
async fn drill_tls_mutual_forced_close_and_refusals() {
    use acemq::connection::ConnectionOptions;
    use acemq::transport::{TlsFailure, TransportError};
    use drills::connect::drill_options;
    use drills::tls::{AMQP_URL, AMQPS_URL, NODE, SERVER_NAME, TlsNode, V1_URL};

    let Some(node) = TlsNode::from_env() else {
        return;
    };
    let name = drill_name("tls");
    let options = drill_options(&name).tls(node.mutual().server_name(SERVER_NAME));
    let mq = Connection::connect_with(AMQPS_URL, options)
        .await
        .unwrap_or_else(|e| panic!("mutual TLS to {AMQPS_URL} (server name {SERVER_NAME}): {e}"));
    let q = support::unique("drill.tls");
    let mut d = Drill::start("tls", mq, QueueDecl::quorum(&q), Some(NODE.to_owned())).await;
    d.wait_flowing(200).await;
    for round in 1..=3 {
        let closed = close_our_connections_async(Some(NODE.to_owned()), name.clone(), "drill")
            .await
            .expect("rabbitmqctl close_connection");
        assert!(
            closed >= 1,
            "round {round}: none of our TLS connections was found to close"
        );
        d.fault();
        d.await_recovery(Instant::now(), &format!("forced close {round} over TLS"))
            .await;
        d.wait_flowing(50).await;
    }
    // A force-closed connection does not linger: lapin can leave the socket of a
    // connection the broker closed open (its close-ok unwritten, seen over TLS about one
    // run in five), and the broker then lists it for 30 s; the transport shuts it.
    support::eventually(Duration::from_secs(5), "only the live two listed", || {
        let listed = our_connections(Some(NODE), &name).expect("rabbitmqctl list_connections");
        async move { (listed.len() == 2).then_some(()) }
    })
    .await;
    d.finish(&raw(AMQP_URL, &name).await).await;

    let refusals: [(&str, &str, ConnectionOptions, TlsFailure, &str); 5] = [
        (
            "CA not trusted",
            AMQPS_URL,
            drill_options(&name).tls(node.without_ca()),
            TlsFailure::UnknownCa,
            "not signed by a trusted CA",
        ),
        (
            "name not on the certificate",
            AMQPS_URL,
            drill_options(&name).tls(node.mutual().server_name("other.acemq.test")),
            TlsFailure::NameMismatch,
            "not valid for name \"other.acemq.test\"",
        ),
        (
            "X.509 v1 server certificate",
            V1_URL,
            drill_options(&name).tls(node.mutual()),
            TlsFailure::UnsupportedCertificate,
            "X.509 v1",
        ),
        (
            "client certificate of another CA",
            AMQPS_URL,
            drill_options(&name).tls(node.rogue_client()),
            TlsFailure::ClientCertificateRefused,
            "refused the client certificate",
        ),
        (
            "no client certificate",
            AMQPS_URL,
            drill_options(&name).tls(node.no_client_certificate()),
            TlsFailure::ClientCertificateRefused,
            "refused the client certificate",
        ),
    ];
    for (case, url, options, expected, phrase) in refusals {
        let t0 = Instant::now();
        let result = Connection::connect_with(url, options).await;
        let took = t0.elapsed();
        let e = match result {
            Ok(_) => panic!("TLS refusal {case:?}: connected"),
            Err(e) => e,
        };
        let text = e.to_string();
        eprintln!(
            "drill tls: refusal {case:?} failed in {}ms: {text}",
            took.as_millis()
        );
        assert!(
            matches!(&e, acemq::Error::Transport(TransportError::Tls { failure, .. }) if *failure == expected),
            "TLS refusal {case:?}: expected {expected:?}, got {e:?}"
        );
        assert!(text.contains(phrase), "TLS refusal {case:?}: {text}");
        let (_, host_port, _) = split_url(url);
        assert!(text.contains(&host_port), "TLS refusal {case:?}: {text}");
        assert!(
            took < Duration::from_secs(2),
            "TLS refusal {case:?} took {took:?}: {text}"
        );
    }
    // Nothing of ours is left on the node.
    let left = our_connections(Some(NODE), &name).expect("rabbitmqctl list_connections");
    assert!(left.is_empty(), "connections left on {NODE}: {left:?}");
}
