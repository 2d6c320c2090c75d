//! `acemq topology plan|apply|diff -f topology.toml`: the file format ([`mod@file`]), the plan
//! lines ([`plan`]) and the drift probe ([`diff`]).

pub mod diff;
pub mod file;
pub mod plan;

use serde_json::{Value, json};

use crate::Context;
use crate::cli::TopologyCommand;
use crate::fail::{ERROR, OK, Outcome, PARTIAL};
use crate::output::{print_table, table};
use diff::State;
use plan::{Item, items};

/// Runs a topology subcommand.
pub async fn run(cmd: TopologyCommand, ctx: &Context) -> Outcome {
    match cmd {
        TopologyCommand::Plan(a) => {
            let t = file::load(&a.file)?;
            // With the broker: what apply would change. Without it: the declarations.
            let findings = match ctx.broker.connect().await {
                Ok(mq) => {
                    let mgmt = ctx.management_if_reachable();
                    let f = diff::diff(&t, &mq, mgmt.as_ref()).await;
                    let _ = mq.close().await;
                    Some(f)
                }
                Err(e) => {
                    eprintln!(
                        "acemq: {}; listing the declarations, not the changes",
                        e.message
                    );
                    None
                }
            };
            let all = items(&t);
            let change = |i: usize| {
                findings.as_ref().map(|f| match f[i].state {
                    State::Missing => ("create", "+", String::new()),
                    State::Same => ("unchanged", "=", String::new()),
                    State::Drift => (
                        "conflict",
                        "!",
                        format!(
                            " — exists differently ({}); apply fails on it: delete and redeclare",
                            f[i].detail
                        ),
                    ),
                    State::NotChecked => (
                        "declare",
                        "?",
                        " — cannot compare without the management API".to_owned(),
                    ),
                    State::Error => ("unknown", "?", format!(" — {}", f[i].detail)),
                })
            };
            if ctx.out.json {
                let list: Vec<Value> = all
                    .iter()
                    .enumerate()
                    .map(|(n, i)| {
                        let mut v = i.to_json();
                        if let Some((word, _, _)) = change(n) {
                            v["change"] = json!(word);
                        }
                        v
                    })
                    .collect();
                ctx.out
                    .print_json(&json!({ "items": list, "compared": findings.is_some() }));
            } else {
                let mut counts = std::collections::BTreeMap::<&str, usize>::new();
                for (n, item) in all.iter().enumerate() {
                    match change(n) {
                        Some((word, mark, note)) => {
                            *counts.entry(word).or_default() += 1;
                            println!("{mark} {}{note}", item.describe());
                        }
                        None => println!("{}", item.describe()),
                    }
                }
                if findings.is_some() {
                    let summary: Vec<String> =
                        counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
                    println!("\n{} (on {})", summary.join(", "), ctx.broker.shown());
                }
            }
            Ok(OK)
        }
        TopologyCommand::Apply(a) => {
            let t = file::load(&a.file)?;
            let mq = ctx.broker.connect().await?;
            let transport = mq.transport().clone();
            let mut results = Vec::new();
            for item in items(&t) {
                let r = match item {
                    Item::Exchange(e) => transport.declare_exchange(e).await,
                    Item::Queue(q) => transport.declare_queue(q).await.map(|_| ()),
                    Item::Binding(b) => transport.bind_queue(b).await,
                };
                if !ctx.out.json {
                    match &r {
                        Ok(()) => println!("{} {}", ctx.out.status("ok"), item.describe()),
                        Err(e) => println!("{} {}: {e}", ctx.out.status("failed"), item.describe()),
                    }
                }
                results.push((item, r));
            }
            let _ = mq.close().await;
            let failed = results.iter().filter(|(_, r)| r.is_err()).count();
            if ctx.out.json {
                let list: Vec<Value> = results
                    .iter()
                    .map(|(i, r)| {
                        let mut v = i.to_json();
                        v["result"] = json!(if r.is_ok() { "ok" } else { "failed" });
                        if let Err(e) = r {
                            v["error"] = json!(e.to_string());
                        }
                        v
                    })
                    .collect();
                ctx.out
                    .print_json(&json!({ "items": list, "failed": failed }));
            } else {
                println!(
                    "applied {} of {} on {}",
                    results.len() - failed,
                    results.len(),
                    ctx.broker.shown()
                );
            }
            Ok(if failed == 0 { OK } else { ERROR })
        }
        TopologyCommand::Diff(a) => {
            let t = file::load(&a.file)?;
            let mq = ctx.broker.connect().await?;
            let mgmt = ctx.management_if_reachable();
            let findings = diff::diff(&t, &mq, mgmt.as_ref()).await;
            let _ = mq.close().await;
            let count = |s: State| findings.iter().filter(|f| f.state == s).count();
            let (drift, missing, errors) = (
                count(State::Drift),
                count(State::Missing),
                count(State::Error),
            );
            if ctx.out.json {
                let list: Vec<Value> = findings.iter().map(diff::Finding::to_json).collect();
                ctx.out.print_json(&json!({
                    "items": list,
                    "management": mgmt.is_some(),
                    "summary": {"ok": count(State::Same), "drift": drift, "missing": missing,
                                "not_checked": count(State::NotChecked), "error": errors},
                }));
            } else {
                let mut tbl = table(&["STATE", "KIND", "NAME", "DETAIL"]);
                for f in &findings {
                    tbl.add_row(vec![
                        f.state.as_str().to_owned(),
                        f.kind.to_owned(),
                        f.name.clone(),
                        f.detail.clone(),
                    ]);
                }
                print_table(&tbl);
                println!(
                    "\n{} ok, {} drift, {} missing, {} not checked, {} error{}",
                    count(State::Same),
                    ctx.out.status(&drift.to_string()),
                    missing,
                    count(State::NotChecked),
                    errors,
                    if mgmt.is_none() {
                        ctx.out.dim(
                            " (management API not reachable: arguments and bindings not compared)",
                        )
                    } else {
                        String::new()
                    }
                );
            }
            Ok(if errors > 0 {
                ERROR
            } else if drift + missing > 0 {
                PARTIAL
            } else {
                OK
            })
        }
    }
}
