//! `rabbitmqctl` for the drills: this process's connections and channels found by connection
//! name, closing only those, a stopped-app guard that always restarts the app, and the local
//! cluster from `scripts/cluster.sh`.
//!
//! Every call names its node (`-n`) when the drill targets one other than the default; the
//! default is the node `rabbitmqctl` reaches without `-n` (the system node). Nothing here
//! closes a connection it cannot attribute to the drill's own unique connection name.
//!
//! Shared by `crates/acemq/tests/drills.rs` and `crates/acemq-sql/tests/drills.rs` (the
//! latter includes this file by path), so it depends on nothing but std and tokio.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Where a drill runs: an AMQP URL and the node `rabbitmqctl` must address for it.
#[derive(Clone, Debug)]
pub struct DrillTarget {
    /// The URL AceMQ connects to.
    pub url: String,
    /// `rabbitmqctl -n` node; `None` is rabbitmqctl's default (the system node).
    pub node: Option<String>,
}

impl DrillTarget {
    /// `ACEMQ_DRILL_AMQP_URL` (else `ACEMQ_TEST_AMQP_URL`) and `ACEMQ_DRILL_NODE` (else the
    /// default node). `None` when no URL is set, unless `ACEMQ_TEST_REQUIRE_BROKER=1`, which
    /// panics: drills must run in CI.
    pub fn from_env() -> Option<DrillTarget> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let url = var("ACEMQ_DRILL_AMQP_URL").or_else(|| var("ACEMQ_TEST_AMQP_URL"));
        match url {
            Some(url) => Some(DrillTarget {
                url,
                node: var("ACEMQ_DRILL_NODE"),
            }),
            None => {
                assert!(
                    std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                    "ACEMQ_TEST_REQUIRE_BROKER=1 but ACEMQ_TEST_AMQP_URL is not set: drills must run"
                );
                eprintln!("note: ACEMQ_TEST_AMQP_URL unset; drill skipped");
                None
            }
        }
    }

    /// The node as `rabbitmqctl` arguments.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }
}

/// Runs `rabbitmqctl -q [-n node] args`; the standard output, or what went wrong.
pub fn ctl(node: Option<&str>, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("rabbitmqctl");
    cmd.arg("-q");
    if let Some(n) = node {
        cmd.args(["-n", n]);
    }
    cmd.args(args);
    let out = cmd
        .output()
        .map_err(|e| format!("rabbitmqctl {args:?}: {e} (is RabbitMQ installed?)"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "rabbitmqctl {}{args:?} failed: {}{}",
            node.map(|n| format!("-n {n} ")).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

/// [`ctl`] off the async worker threads.
pub async fn ctl_async(node: Option<String>, args: Vec<String>) -> Result<String, String> {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ctl(node.as_deref(), &args)
    })
    .await
    .map_err(|e| format!("rabbitmqctl task: {e}"))?
}

/// One broker connection of this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OurConnection {
    /// The connection's Erlang pid, e.g. `<rabbit@localhost.1764.123.0>`.
    pub pid: String,
    /// Its `connection_name` client property.
    pub name: String,
}

impl OurConnection {
    /// The node the connection lives on (from its pid).
    pub fn node(&self) -> &str {
        let p = self.pid.trim_start_matches('<');
        p.split('.').next().unwrap_or(p)
    }
}

/// The `connection_name` inside a `client_properties` value as `rabbitmqctl` prints it:
/// `[…,{"connection_name","NAME"},…]` (3.10), or with the type, `{"connection_name",longstr,"NAME"}`.
fn connection_name(props: &str) -> Option<&str> {
    let at = props.find("\"connection_name\"")? + "\"connection_name\"".len();
    let rest = &props[at..];
    let rest = &rest[rest.find('"')? + 1..];
    Some(&rest[..rest.find('"')?])
}

/// The connections whose `connection_name` starts with `prefix` (a drill's unique name).
///
/// The plain (tab-separated) listing is read, not `--formatter json`: only it prints pids
/// as `close_connection` takes them (`<node.N.N.N>`, not `#PID<N.N.N>`).
pub fn our_connections(node: Option<&str>, prefix: &str) -> Result<Vec<OurConnection>, String> {
    let out = ctl(
        node,
        &[
            "list_connections",
            "--no-table-headers",
            "pid",
            "client_properties",
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|line| {
            let (pid, props) = line.trim().split_once(char::is_whitespace)?;
            let name = connection_name(props)?;
            name.starts_with(prefix).then(|| OurConnection {
                pid: pid.to_owned(),
                name: name.to_owned(),
            })
        })
        .collect())
}

/// Closes (broker side, `close_connection … reason`) every connection whose name starts with
/// `prefix`, and only those; returns how many were closed.
pub fn close_our_connections(
    node: Option<&str>,
    prefix: &str,
    reason: &str,
) -> Result<usize, String> {
    let ours = our_connections(node, prefix)?;
    let mut closed = 0;
    for c in &ours {
        assert!(
            c.name.starts_with(prefix),
            "refusing to close {c:?}: not ours"
        );
        match ctl(node, &["close_connection", &c.pid, reason]) {
            Ok(_) => closed += 1,
            // Gone already (closed by the broker meanwhile): not an error for a drill.
            Err(e) if e.contains("not_found") || e.contains("no_such") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(closed)
}

/// [`close_our_connections`] off the async worker threads.
pub async fn close_our_connections_async(
    node: Option<String>,
    prefix: String,
    reason: &'static str,
) -> Result<usize, String> {
    tokio::task::spawn_blocking(move || close_our_connections(node.as_deref(), &prefix, reason))
        .await
        .map_err(|e| format!("rabbitmqctl task: {e}"))?
}

/// How many channels the broker holds open on connections whose name starts with `prefix`.
pub fn our_channels(node: Option<&str>, prefix: &str) -> Result<usize, String> {
    let ours: std::collections::HashSet<String> = our_connections(node, prefix)?
        .into_iter()
        .map(|c| c.pid)
        .collect();
    let out = ctl(node, &["list_channels", "--no-table-headers", "connection"])?;
    Ok(out.lines().filter(|l| ours.contains(l.trim())).count())
}

/// The members (nodes holding a replica) of a quorum queue.
pub fn queue_members(node: Option<&str>, queue: &str) -> Result<Vec<String>, String> {
    let out = ctl(
        node,
        &["list_queues", "--no-table-headers", "name", "members"],
    )?;
    let line = out
        .lines()
        .find(|l| l.split('\t').next() == Some(queue))
        .ok_or_else(|| format!("queue {queue} is not listed"))?;
    let members = line.split_once('\t').map_or("", |(_, m)| m);
    Ok(members
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect())
}

/// Deletes a queue through `rabbitmqctl` (for cleanup after a failed drill); errors ignored.
pub fn delete_queue_cli(node: Option<&str>, queue: &str) {
    let _ = ctl(node, &["delete_queue", queue]);
}

/// The RabbitMQ application of a node, stopped for the life of the guard: `start` (or drop,
/// also on a panic) runs `start_app` again.
#[derive(Debug)]
pub struct AppStopped {
    node: Option<String>,
    started: bool,
}

impl AppStopped {
    /// `rabbitmqctl [-n node] stop_app`.
    pub fn stop(node: Option<&str>) -> Result<AppStopped, String> {
        let guard = AppStopped {
            node: node.map(str::to_owned),
            started: false,
        };
        ctl(node, &["stop_app"])?;
        Ok(guard)
    }

    /// `start_app`, then waits (bounded) until the node answers `await_startup`; the time
    /// `start_app` took is returned.
    pub fn start(&mut self) -> Result<Duration, String> {
        let t = Instant::now();
        let r = ctl(self.node.as_deref(), &["start_app"]);
        self.started = r.is_ok();
        r?;
        ctl(self.node.as_deref(), &["await_startup", "--timeout", "60"])?;
        Ok(t.elapsed())
    }

    /// [`AppStopped::start`] off the async worker threads.
    pub async fn start_async(mut self) -> Result<Duration, String> {
        tokio::task::spawn_blocking(move || self.start())
            .await
            .map_err(|e| format!("start_app task: {e}"))?
    }
}

impl Drop for AppStopped {
    fn drop(&mut self) {
        if !self.started
            && let Err(e) = ctl(self.node.as_deref(), &["start_app"])
        {
            eprintln!("drill guard: start_app failed: {e}; run `rabbitmqctl start_app`");
        }
    }
}

/// The local 3-node cluster of `scripts/cluster.sh`.
pub struct Cluster {
    /// `amqp://guest:guest@127.0.0.1:568N/%2f` for r1, r2, r3.
    pub urls: Vec<String>,
    /// `r1@localhost`, `r2@localhost`, `r3@localhost`.
    pub nodes: Vec<String>,
    started_here: bool,
}

fn cluster_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster.sh")
}

fn cluster_sh(arg: &str) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(cluster_script())
        .arg(arg)
        .output()
        .map_err(|e| format!("scripts/cluster.sh {arg}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("scripts/cluster.sh {arg} failed: {text}"))
    }
}

impl Cluster {
    /// The cluster, started with `scripts/cluster.sh start` unless it already runs (then it
    /// is left running afterwards; one started here is stopped when the value drops).
    pub fn ensure() -> Result<Cluster, String> {
        let running = cluster_sh("status").is_ok();
        if !running {
            let t = Instant::now();
            let out = cluster_sh("start")?;
            eprintln!("{}cluster started in {:?}", out, t.elapsed());
        }
        Ok(Cluster {
            urls: (1..=3)
                .map(|i| format!("amqp://guest:guest@127.0.0.1:568{i}/%2f"))
                .collect(),
            nodes: (1..=3).map(|i| format!("r{i}@localhost")).collect(),
            started_here: !running,
        })
    }

    /// Whether `node` is one of this cluster's (never the system node).
    pub fn owns(&self, node: &str) -> bool {
        self.nodes.iter().any(|n| n == node)
    }

    /// A node other than `node` (where `rabbitmqctl` still answers while `node` is down).
    pub fn node_besides(&self, node: &str) -> &str {
        self.nodes
            .iter()
            .find(|n| *n != node)
            .map(String::as_str)
            .unwrap_or(&self.nodes[0])
    }

    /// The URL of a node other than `node`.
    pub fn url_besides(&self, node: &str) -> &str {
        self.nodes
            .iter()
            .zip(&self.urls)
            .find(|(n, _)| *n != node)
            .map(|(_, u)| u.as_str())
            .unwrap_or(&self.urls[0])
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.started_here
            && let Err(e) = cluster_sh("stop")
        {
            eprintln!("drill guard: {e}; run scripts/cluster.sh stop");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_connection_name_and_node() {
        let props = r#"[{"capabilities",table,[{"publisher_confirms",bool,true}]},{"connection_name",longstr,"acemq-drill.x.1.2 (publish)"},{"product",longstr,"lapin"}]"#;
        assert_eq!(connection_name(props), Some("acemq-drill.x.1.2 (publish)"));
        assert_eq!(connection_name("[]"), None);
        let plain = r#"[{"capabilities",[{"basic.nack",true}]},{"connection_name","acemq-drill.y (consume)"},{"platform","rust"}]"#;
        assert_eq!(connection_name(plain), Some("acemq-drill.y (consume)"));
        let c = OurConnection {
            pid: "<r1@localhost.1764516000.3308.0>".into(),
            name: String::new(),
        };
        assert_eq!(c.node(), "r1@localhost");
    }
}
