//! A topology as a plan: one human-readable line per declaration, in declaration order
//! (exchanges, queues, bindings), and the same items as JSON.

use acemq::headers::{HeaderValue, Headers};
use acemq::topology::{BindingDecl, ExchangeDecl, QueueDecl, QueueType, Topology};
use serde_json::{Value, json};

/// One declaration of a topology.
#[derive(Clone, Copy, Debug)]
pub enum Item<'a> {
    /// An exchange.
    Exchange(&'a ExchangeDecl),
    /// A queue.
    Queue(&'a QueueDecl),
    /// A binding.
    Binding(&'a BindingDecl),
}

/// Every declaration, in the order they must be declared.
pub fn items(t: &Topology) -> Vec<Item<'_>> {
    t.exchanges()
        .iter()
        .map(Item::Exchange)
        .chain(t.queues().iter().map(Item::Queue))
        .chain(t.bindings().iter().map(Item::Binding))
        .collect()
}

impl Item<'_> {
    /// `exchange`, `queue` or `binding`.
    pub fn kind(&self) -> &'static str {
        match self {
            Item::Exchange(_) => "exchange",
            Item::Queue(_) => "queue",
            Item::Binding(_) => "binding",
        }
    }

    /// The item's name (`queue <- exchange "key"` for a binding).
    pub fn name(&self) -> String {
        match self {
            Item::Exchange(e) => e.name.clone(),
            Item::Queue(q) => q.name.clone(),
            Item::Binding(b) => format!("{} <- {} on {:?}", b.queue, b.exchange, b.routing_key),
        }
    }

    /// The plan line: `declare queue orders.new (quorum, durable) x-dead-letter-...`.
    pub fn describe(&self) -> String {
        match self {
            Item::Exchange(e) => {
                let mut flags = vec![e.kind.as_str()];
                flags.push(if e.durable { "durable" } else { "transient" });
                if e.auto_delete {
                    flags.push("auto-delete");
                }
                format!(
                    "declare exchange {} ({}){}",
                    e.name,
                    flags.join(", "),
                    args_suffix(&e.arguments)
                )
            }
            Item::Queue(q) => {
                let mut flags = vec![match q.queue_type() {
                    QueueType::Quorum => "quorum",
                    _ => "classic",
                }];
                flags.push(if q.durable { "durable" } else { "transient" });
                if q.exclusive {
                    flags.push("exclusive");
                }
                if q.auto_delete {
                    flags.push("auto-delete");
                }
                let mut args = q.arguments.clone();
                args.remove("x-queue-type");
                format!(
                    "declare queue {} ({}){}",
                    q.name,
                    flags.join(", "),
                    args_suffix(&args)
                )
            }
            Item::Binding(b) => {
                let mut line = format!("bind {} to {}", b.queue, b.exchange);
                if b.arguments.is_empty() || !b.routing_key.is_empty() {
                    line.push_str(&format!(" on {:?}", b.routing_key));
                }
                line + &args_suffix(&b.arguments)
            }
        }
    }

    /// The item as JSON (kind, name, and its declaration).
    pub fn to_json(self) -> Value {
        match self {
            Item::Exchange(e) => json!({
                "kind": "exchange", "name": e.name, "type": e.kind.as_str(),
                "durable": e.durable, "auto_delete": e.auto_delete,
                "arguments": args_json(&e.arguments),
            }),
            Item::Queue(q) => json!({
                "kind": "queue", "name": q.name,
                "type": if q.queue_type() == QueueType::Quorum { "quorum" } else { "classic" },
                "durable": q.durable, "exclusive": q.exclusive, "auto_delete": q.auto_delete,
                "arguments": args_json(&q.arguments),
            }),
            Item::Binding(b) => json!({
                "kind": "binding", "name": self.name(), "queue": b.queue,
                "exchange": b.exchange, "routing_key": b.routing_key,
                "arguments": args_json(&b.arguments),
            }),
        }
    }
}

fn args_suffix(args: &Headers) -> String {
    if args.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = args
        .iter()
        .map(|(k, v)| format!("{k}={}", value_text(v)))
        .collect();
    format!(" {}", parts.join(" "))
}

/// A header value as text (strings bare, numbers as numbers).
pub fn value_text(v: &HeaderValue) -> String {
    match v {
        HeaderValue::Str(s) => s.clone(),
        HeaderValue::Bool(b) => b.to_string(),
        HeaderValue::F32(f) => f.to_string(),
        HeaderValue::F64(f) => f.to_string(),
        HeaderValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        HeaderValue::Void => "null".into(),
        other => match other.as_i64() {
            Some(i) => i.to_string(),
            None => format!("{other:?}"),
        },
    }
}

/// A header value as JSON.
pub fn value_json(v: &HeaderValue) -> Value {
    match v {
        HeaderValue::Str(s) => Value::String(s.clone()),
        HeaderValue::Bool(b) => Value::Bool(*b),
        HeaderValue::F32(f) => json!(f),
        HeaderValue::F64(f) => json!(f),
        HeaderValue::Void => Value::Null,
        HeaderValue::Array(a) => Value::Array(a.iter().map(value_json).collect()),
        HeaderValue::Table(t) => args_json(t),
        other => match other.as_i64() {
            Some(i) => json!(i),
            None => Value::String(value_text(other)),
        },
    }
}

/// Headers as a JSON object.
pub fn args_json(args: &Headers) -> Value {
    Value::Object(
        args.iter()
            .map(|(k, v)| (k.to_string(), value_json(v)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_lines_read_as_the_issue_shows_them() {
        let t = Topology::define()
            .queue_with_dead_letter("orders.new")
            .build()
            .unwrap();
        let lines: Vec<String> = items(&t).iter().map(Item::describe).collect();
        assert!(lines.contains(&"declare exchange acemq.dlx (direct, durable)".to_owned()));
        assert!(lines.contains(&"declare queue orders.new (quorum, durable) x-dead-letter-exchange=acemq.dlx x-dead-letter-routing-key=orders.new.dlq".to_owned()), "{lines:#?}");
        assert!(
            lines.contains(&"bind orders.new.dlq to acemq.dlx on \"orders.new.dlq\"".to_owned())
        );
    }
}
