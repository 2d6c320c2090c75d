//! Drift: each declaration of a topology probed against the broker on its own, so one
//! failure never stops the others.
//!
//! A queue or exchange is first inspected passively (missing when that says 404), then
//! declared with the expected arguments: a 406 PRECONDITION_FAILED is drift, with the
//! broker's text naming the argument. The 406 closes only the channel it happened on, and
//! the transport never reuses a closed channel, so the next item probes on a fresh one.
//! With the management API the queue's arguments are compared one by one too (RabbitMQ
//! ignores some arguments when it checks equivalence), and bindings are looked up; without
//! it, bindings are "not checked".

use acemq::Connection;
use acemq::topology::Topology;
use acemq::transport::TransportError;
use serde_json::{Map, Value, json};

use crate::mgmt::Management;
use crate::topo::plan::{Item, args_json, items};

/// What the probe found for one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Exists as declared.
    Same,
    /// Does not exist.
    Missing,
    /// Exists, differently.
    Drift,
    /// Could not be checked (bindings without the management API).
    NotChecked,
    /// The probe itself failed.
    Error,
}

impl State {
    /// The word shown and written to JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Same => "ok",
            State::Missing => "missing",
            State::Drift => "drift",
            State::NotChecked => "not checked",
            State::Error => "error",
        }
    }
}

/// One item's finding.
#[derive(Clone, Debug)]
pub struct Finding {
    /// `exchange`, `queue`, `binding`.
    pub kind: &'static str,
    /// The item's name.
    pub name: String,
    /// What was found.
    pub state: State,
    /// Why, when not the same.
    pub detail: String,
}

impl Finding {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({"kind": self.kind, "name": self.name, "state": self.state.as_str(), "detail": self.detail})
    }
}

/// Probes every item of `t`.
pub async fn diff(t: &Topology, mq: &Connection, mgmt: Option<&Management>) -> Vec<Finding> {
    let mut out = Vec::new();
    for item in items(t) {
        let (state, detail) = probe(item, mq, mgmt).await;
        out.push(Finding {
            kind: item.kind(),
            name: item.name(),
            state,
            detail,
        });
    }
    out
}

async fn probe(item: Item<'_>, mq: &Connection, mgmt: Option<&Management>) -> (State, String) {
    let transport = mq.transport();
    match item {
        Item::Exchange(e) => {
            if let Err(err) = transport.inspect_exchange(&e.name).await {
                return classify_missing(err);
            }
            match transport.declare_exchange(e).await {
                Ok(()) => (State::Same, String::new()),
                Err(err) => classify_declare(err),
            }
        }
        Item::Queue(q) => {
            if let Err(err) = transport.inspect_queue(&q.name).await {
                return classify_missing(err);
            }
            if let Err(err) = transport.declare_queue(q).await {
                return classify_declare(err);
            }
            let Some(m) = mgmt else {
                return (State::Same, String::new());
            };
            match m.queue(&q.name) {
                Ok(Some(stat)) => compare_arguments(&args_json(&q.arguments), &stat.arguments),
                Ok(None) => (State::Missing, "gone between the probes".into()),
                Err(e) => (State::Same, format!("arguments not compared: {e}")),
            }
        }
        Item::Binding(b) => {
            let Some(m) = mgmt else {
                return (
                    State::NotChecked,
                    "bindings need the management API (--management-url)".into(),
                );
            };
            match m.bindings(&b.exchange, &b.queue) {
                Ok(found) => {
                    let want = args_json(&b.arguments);
                    let hit = found.iter().any(|f| {
                        f.routing_key == b.routing_key
                            && (b.arguments.is_empty()
                                || Value::Object(f.arguments.clone()) == want)
                    });
                    if hit {
                        (State::Same, String::new())
                    } else if found.is_empty() {
                        (State::Missing, "no binding".into())
                    } else {
                        let keys: Vec<String> = found
                            .iter()
                            .map(|f| format!("{:?}", f.routing_key))
                            .collect();
                        (State::Missing, format!("bound only on {}", keys.join(", ")))
                    }
                }
                Err(e) => (State::Error, e),
            }
        }
    }
}

fn classify_missing(err: TransportError) -> (State, String) {
    if err.is_not_found() {
        (State::Missing, "does not exist".into())
    } else {
        (State::Error, err.to_string())
    }
}

fn classify_declare(err: TransportError) -> (State, String) {
    match err {
        TransportError::PreconditionFailed { detail } => (State::Drift, detail),
        other => (State::Error, other.to_string()),
    }
}

/// Argument by argument: what differs, what is missing, what the broker has extra.
fn compare_arguments(want: &Value, have: &Map<String, Value>) -> (State, String) {
    let empty = Map::new();
    let want = want.as_object().unwrap_or(&empty);
    let mut diffs = Vec::new();
    for (k, v) in want {
        match have.get(k) {
            Some(h) if h == v => {}
            Some(h) => diffs.push(format!("{k}: broker has {h}, file says {v}")),
            None => diffs.push(format!("{k}: missing on the broker (file says {v})")),
        }
    }
    for (k, h) in have {
        if !want.contains_key(k) {
            diffs.push(format!("{k}: broker has {h}, file has none"));
        }
    }
    if diffs.is_empty() {
        (State::Same, String::new())
    } else {
        (State::Drift, diffs.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_compared_both_ways() {
        let want = json!({"x-queue-type": "quorum", "x-max-length": 10});
        let mut have = Map::new();
        have.insert("x-queue-type".into(), json!("quorum"));
        have.insert("x-message-ttl".into(), json!(5));
        let (state, detail) = compare_arguments(&want, &have);
        assert_eq!(state, State::Drift);
        assert!(detail.contains("x-max-length: missing"), "{detail}");
        assert!(detail.contains("x-message-ttl: broker has 5"), "{detail}");
        have.remove("x-message-ttl");
        have.insert("x-max-length".into(), json!(10));
        assert_eq!(compare_arguments(&want, &have).0, State::Same);
    }
}
