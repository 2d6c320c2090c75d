//! Ordered standby takeover when the holder's **process dies** (SIGKILL, no close), on
//! RabbitMQ: a child process (this test binary, running this test with the child's environment) holds every
//! partition and handles steps, writing each to a log file as it finishes it; this process
//! waits on standby. The child is killed in the middle of the stream: the broker notices the
//! dead socket, the standby takes every partition over, and between the child's log and
//! this process's handler every step is handled, per key in order (a step the child ran but
//! had not acked runs again here, never out of order).

use crate::support;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::Connection;
use acemq::consume::Message;
use acemq::ordered::{OnFailure, OrderedQueue, PartitionRole};
use support::{eventually, unique};

const KEYS: usize = 20;
const SEQS: u32 = 30;
const PARTITIONS: u32 = 4;
const WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Step {
    key: String,
    seq: u32,
}

fn ordered(mq: &Connection, name: &str) -> OrderedQueue<Step> {
    mq.ordered::<Step>(name)
        .partitions(PARTITIONS)
        .keyed_by(|s: &Step| s.key.clone())
        .on_failure(OnFailure::Stop)
}

/// The child's side: holds the partitions of `name`, appending `key seq` to `log` for
/// each step it finished, until it is killed. The child is this test binary running
/// [`the_standby_takes_over_when_the_holder_process_is_killed`] with `ACEMQ_KILL_HOLDER`
/// and `ACEMQ_KILL_LOG` set.
async fn hold(name: String, log: String, url: String) {
    let mq = Connection::connect(&url).await.expect("connect");
    let q = ordered(&mq, &name);
    q.declare().await.expect("declare");
    let file = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("the log file"),
    ));
    let _consumer = q
        .consume(move |m: Message<Step>| {
            let file = file.clone();
            async move {
                // Slow enough that some steps are in hand when the kill comes.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let p = m.payload();
                let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
                writeln!(f, "{} {}", p.key, p.seq).expect("log a step");
                f.flush().expect("flush the log");
                Ok(())
            }
        })
        .await
        .expect("consume");
    println!("holding");
    std::future::pending::<()>().await;
}

type Seen = Arc<Mutex<HashMap<String, Vec<u32>>>>;

fn child_log(path: &std::path::Path) -> HashMap<String, Vec<u32>> {
    let mut out: HashMap<String, Vec<u32>> = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        if let Some((k, s)) = line.split_once(' ')
            && let Ok(s) = s.parse()
        {
            out.entry(k.to_owned()).or_default().push(s);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_when_the_holder_process_is_killed() {
    let Some(url) = support::amqp_url() else {
        return;
    };
    if let (Ok(name), Ok(log)) = (
        std::env::var("ACEMQ_KILL_HOLDER"),
        std::env::var("ACEMQ_KILL_LOG"),
    ) {
        // This process is the child: hold until killed.
        hold(name, log, url).await;
        return;
    }
    let name = unique("ordered-kill");
    let log = std::env::temp_dir().join(format!("{name}.log"));
    let mut child = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args([
            "--exact",
            &support::this_test(
                module_path!(),
                "the_standby_takes_over_when_the_holder_process_is_killed",
            ),
            "--nocapture",
        ])
        .env("ACEMQ_KILL_HOLDER", &name)
        .env("ACEMQ_KILL_LOG", &log)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the holder process");
    let mq = Connection::connect(&url).await.expect("connect");
    let q = ordered(&mq, &name);
    q.declare().await.expect("declare");
    // The child holds every partition (each queue has its exclusive consumer).
    let t = mq.transport().clone();
    let queues = q.queues();
    eventually(WAIT, "the child to hold every partition", || {
        let (t, queues) = (t.clone(), queues.clone());
        async move {
            for name in &queues {
                if t.inspect_queue(name).await.ok()?.consumer_count != 1 {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;
    let seen: Seen = Arc::default();
    let books = seen.clone();
    let standby = q
        .consume(move |m: Message<Step>| {
            let books = books.clone();
            async move {
                let p = m.payload();
                books
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(p.key.clone())
                    .or_default()
                    .push(p.seq);
                Ok(())
            }
        })
        .await
        .expect("the standby consumes");
    eventually(
        WAIT,
        "the standby on standby for every partition",
        || async {
            standby
                .roles()
                .iter()
                .all(|r| *r == PartitionRole::Standby)
                .then_some(())
        },
    )
    .await;
    for seq in 0..SEQS {
        for k in 0..KEYS {
            q.send(&Step {
                key: format!("key-{k}"),
                seq,
            })
            .await
            .expect("send");
        }
    }
    let total = KEYS * SEQS as usize;
    eventually(WAIT, "the child to handle a third", || {
        let n: usize = child_log(&log).values().map(Vec::len).sum();
        async move { (n >= total / 3).then_some(()) }
    })
    .await;
    child.kill().expect("SIGKILL the holder");
    let killed = Instant::now();
    let _ = child.wait();
    eventually(WAIT, "the standby to hold every partition", || async {
        (standby.active_partitions().len() == PARTITIONS as usize).then_some(())
    })
    .await;
    let took = killed.elapsed();
    eprintln!("ordered takeover after SIGKILL took {took:?}");
    let by_child = child_log(&log);
    eventually(
        WAIT,
        "every step handled by one process or the other",
        || {
            let here = seen.lock().unwrap_or_else(|e| e.into_inner());
            let missing = (0..KEYS)
                .flat_map(|k| (0..SEQS).map(move |seq| (format!("key-{k}"), seq)))
                .filter(|(k, seq)| !has(&by_child, k, *seq) && !has(&here, k, *seq))
                .count();
            async move { (missing == 0).then_some(()) }
        },
    )
    .await;
    let here = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut repeated = 0;
    for k in 0..KEYS {
        let key = format!("key-{k}");
        let child_steps = by_child.get(&key).cloned().unwrap_or_default();
        let here_steps = here.get(&key).cloned().unwrap_or_default();
        // Each process ran its part in order, the child from 0, this one from where the
        // child's unacked part began: together 0..SEQS with repeats only at the seam.
        assert_eq!(
            child_steps,
            (0..child_steps.len() as u32).collect::<Vec<_>>(),
            "{key}: the child's steps in order"
        );
        let start = here_steps.first().copied().unwrap_or(SEQS);
        assert!(
            start <= child_steps.len() as u32,
            "{key}: a gap between the child's last step and the standby's first: {child_steps:?} / {here_steps:?}"
        );
        assert_eq!(
            here_steps,
            (start..SEQS).collect::<Vec<_>>(),
            "{key}: the standby's steps in order, to the end"
        );
        repeated += child_steps.len() as u32 - start;
    }
    eprintln!(
        "ordered kill: {} steps by the child, {} by the standby, {repeated} run twice (in hand at the kill)",
        by_child.values().map(Vec::len).sum::<usize>(),
        here.values().map(Vec::len).sum::<usize>()
    );
    standby.close().await;
    for name in q.queues() {
        for suffix in ["", ".dlq", ".parked"] {
            let _ = t.delete_queue(&format!("{name}{suffix}")).await;
        }
    }
    let _ = t.delete_exchange(q.name()).await;
    let _ = std::fs::remove_file(&log);
    mq.close().await.ok();
}

fn has(steps: &HashMap<String, Vec<u32>>, key: &str, seq: u32) -> bool {
    steps.get(key).is_some_and(|v| v.contains(&seq))
}
