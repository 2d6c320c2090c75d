//! `acemq dlq list`: every queue with a `.dlq` or `.parked` companion, its counts and the
//! age of its oldest dead letter.
//!
//! Discovery: the management API (every queue of the vhost whose name ends in `.dlq` or
//! `.parked`); without it, the queues named on the command line or in a topology file.
//! Ready counts are always read over AMQP (exact at that moment); unacked counts come from
//! the management API (AMQP cannot count them), "?" without it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use acemq::Connection;
use acemq::topology::{dead_letter_queue, parked_queue};
use serde_json::{Value, json};

use crate::Context;
use crate::cli::ListArgs;
use crate::dlq::replay_of;
use crate::fail::{Failure, OK, Outcome, PARTIAL};
use crate::output::{age, print_table, table};
use crate::topo::file;

/// Counts of one companion queue.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    ready: u64,
    unacked: Option<u64>,
}

/// Runs `acemq dlq list`.
pub async fn run(args: ListArgs, ctx: &Context) -> Outcome {
    let mgmt = ctx.management_if_reachable();
    let asked_for_some = !args.queues.is_empty() || args.file.is_some();
    let mut named: BTreeSet<String> = args.queues.iter().cloned().collect();
    if let Some(path) = &args.file {
        let t = file::load(path)?;
        for q in t.queues() {
            if t.queue(&dead_letter_queue(&q.name)).is_some() {
                named.insert(q.name.clone());
            }
        }
    }
    // name -> counts, from the management API when it answers.
    let mut stats: BTreeMap<String, Counts> = BTreeMap::new();
    let sources: BTreeSet<String> = match &mgmt {
        Some(m) => {
            let queues = m.queues().map_err(Failure::error)?;
            let mut found = BTreeSet::new();
            for q in queues {
                let source = q
                    .name
                    .strip_suffix(".dlq")
                    .or_else(|| q.name.strip_suffix(".parked"))
                    .map(str::to_owned);
                stats.insert(
                    q.name.clone(),
                    Counts {
                        ready: q.messages_ready,
                        unacked: Some(q.messages_unacknowledged),
                    },
                );
                if let Some(s) = source
                    && (named.is_empty() || named.contains(&s))
                {
                    found.insert(s);
                }
            }
            found
        }
        None if named.is_empty() => {
            let m = ctx.management()?;
            return Err(Failure::error(format!(
                "the management API at {} does not answer: name the queues (acemq dlq list orders.new ...) or give -f topology.toml",
                m.base()
            )));
        }
        None => named,
    };

    let mq = ctx.broker.connect().await?;
    let mut rows = Vec::new();
    let mut partial = false;
    for source in &sources {
        let dlq = counts(&mq, &stats, &dead_letter_queue(source)).await;
        let parked = counts(&mq, &stats, &parked_queue(source)).await;
        let mut oldest: Option<Duration> = None;
        let mut note = String::new();
        for (is_parked, c) in [(false, &dlq), (true, &parked)] {
            if let Ok(Some(c)) = c
                && c.ready > 0
            {
                match replay_of(&mq, source, is_parked).peek(1).await {
                    Ok(m) => {
                        if let Some(a) = m.first().and_then(|m| m.age) {
                            oldest = Some(oldest.map_or(a, |o| o.max(a)));
                        }
                    }
                    Err(e) => {
                        partial = true;
                        note = e.to_string();
                    }
                }
            }
        }
        for c in [&dlq, &parked] {
            if let Err(e) = c {
                partial = true;
                note = e.clone();
            }
        }
        rows.push((source.clone(), dlq, parked, oldest, note));
    }
    let _ = mq.close().await;

    // On a shared broker most companions are empty: discovered ones are hidden unless
    // --all (named ones are what the operator asked about).
    let empty = |c: &Result<Option<Counts>, String>| match c {
        Ok(Some(c)) => c.ready == 0 && c.unacked.unwrap_or(0) == 0,
        Ok(None) => true,
        Err(_) => false,
    };
    let before = rows.len();
    if mgmt.is_some() && !asked_for_some && !args.all {
        rows.retain(|(_, d, p, _, _)| !(empty(d) && empty(p)));
    }
    let hidden = before - rows.len();

    if ctx.out.json {
        let c = |c: &Result<Option<Counts>, String>| match c {
            Ok(Some(c)) => json!({"ready": c.ready, "unacked": c.unacked}),
            Ok(None) => Value::Null,
            Err(e) => json!({"error": e}),
        };
        let list: Vec<Value> = rows
            .iter()
            .map(|(s, d, p, o, note)| {
                json!({
                    "queue": s,
                    "dlq": c(d),
                    "parked": c(p),
                    "oldest_age_seconds": o.map(|o| o.as_secs()),
                    "error": if note.is_empty() { Value::Null } else { json!(note) },
                })
            })
            .collect();
        ctx.out.print_json(&json!({
            "discovery": if mgmt.is_some() { "management" } else { "named" },
            "queues": list,
            "hidden_empty": hidden,
        }));
    } else if rows.is_empty() {
        if hidden > 0 {
            println!(
                "no dead letters or parked messages ({hidden} empty queues hidden; --all shows them)"
            );
        } else {
            println!("no dead-letter or parked queues found");
        }
    } else {
        let mut t = table(&[
            "QUEUE",
            "DLQ READY",
            "DLQ UNACKED",
            "PARKED READY",
            "PARKED UNACKED",
            "OLDEST",
        ]);
        let cell = |c: &Result<Option<Counts>, String>, ready: bool| match c {
            Ok(Some(c)) if ready => c.ready.to_string(),
            Ok(Some(c)) => c.unacked.map_or_else(|| "?".into(), |u| u.to_string()),
            Ok(None) => "-".into(),
            Err(_) => "error".into(),
        };
        for (s, d, p, o, _) in &rows {
            t.add_row(vec![
                s.clone(),
                cell(d, true),
                cell(d, false),
                cell(p, true),
                cell(p, false),
                o.map_or_else(|| "-".into(), age),
            ]);
        }
        print_table(&t);
        if hidden > 0 {
            println!(
                "\n{}",
                ctx.out.dim(&format!(
                    "{hidden} queues with empty .dlq and .parked hidden (--all shows them)"
                ))
            );
        }
        if mgmt.is_none() {
            println!(
                "\n{}",
                ctx.out
                    .dim("management API not reachable: unacked counts unknown (?)")
            );
        }
        for (s, _, _, _, note) in &rows {
            if !note.is_empty() {
                eprintln!("acemq: {s}: {note}");
            }
        }
    }
    Ok(if partial { PARTIAL } else { OK })
}

/// A companion queue's counts: ready from a passive declare (exact, now), unacked from the
/// management API's list when there is one (its figures are up to a few seconds old);
/// `None` when the queue does not exist.
async fn counts(
    mq: &Connection,
    stats: &BTreeMap<String, Counts>,
    name: &str,
) -> Result<Option<Counts>, String> {
    match mq.transport().inspect_queue(name).await {
        Ok(info) => Ok(Some(Counts {
            ready: u64::from(info.message_count),
            unacked: stats.get(name).and_then(|c| c.unacked),
        })),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}
