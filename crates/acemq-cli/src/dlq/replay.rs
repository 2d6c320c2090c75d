//! `acemq dlq replay` and `acemq dlq purge`: bounded passes of the library's
//! [`acemq::replay::Replay`] with a progress bar and a summary.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;

use acemq::replay::ReplayReport;
use serde_json::json;

use crate::Context;
use crate::cli::{FilterArgs, PurgeArgs, ReplayArgs};
use crate::dlq::{existing_replay, matches, progress};
use crate::fail::{Failure, OK, Outcome, PARTIAL};
use crate::output::age;

/// How many matching ids a dry run lists in text (all of them in JSON).
const SHOWN_IDS: usize = 20;

/// Runs `acemq dlq replay`.
pub async fn replay(args: ReplayArgs, ctx: &Context) -> Outcome {
    let mq = ctx.broker.connect().await?;
    let mut r = existing_replay(&mq, &args.queue, args.parked).await?;
    if args.keep_attempts {
        r = r.keeping_attempts();
    }
    if let Some(n) = args.scan_limit {
        r = r.scan_limit(n);
    }
    if let Some(n) = args.hold_limit {
        r = r.hold_limit(n);
    }
    let (from, to) = (r.from_queue().to_owned(), r.to_queue().to_owned());
    let waiting = u64::from(r.pending().await?);
    let total = args.scan_limit.map_or(waiting, |s| waiting.min(s as u64));
    let bar = progress(total, ctx.out.json);
    let shown = bar.clone();
    let r = r.on_progress(move |p| {
        shown.set_position(p.scanned as u64);
        shown.set_message(format!(
            "scanned, {} replayed, {} declined",
            p.replayed, p.declined
        ));
    });
    let limit = args.limit.unwrap_or(waiting as usize);
    let filter = args.filter.clone();
    let started = Instant::now();
    let result = if args.dry_run {
        r.dry_run_matching(limit, move |d| matches(&filter, d))
            .await
    } else {
        r.replay_matching(limit, move |d| matches(&filter, d)).await
    };
    bar.finish_and_clear();
    let _ = mq.close().await;
    let report = result?;
    let took = started.elapsed();

    if ctx.out.json {
        ctx.out.print_json(&json!({
            "from": from, "to": to, "dry_run": args.dry_run,
            "scanned": report.scanned, "replayed": report.replayed,
            "declined": report.declined, "failed": report.failed,
            "matched_ids": report.matched_ids,
            "seconds": took.as_secs_f64(),
        }));
    } else if args.dry_run {
        println!(
            "{} {} of {} scanned in {from} (dry run: nothing moved)",
            ctx.out.status("would replay"),
            report.matched_ids.len(),
            report.scanned
        );
        for id in report.matched_ids.iter().take(SHOWN_IDS) {
            println!("  {id}");
        }
        if report.matched_ids.len() > SHOWN_IDS {
            println!(
                "  … and {} more (--json lists all)",
                report.matched_ids.len() - SHOWN_IDS
            );
        }
    } else {
        print_summary(ctx, &report, &from, &to, took.as_secs_f64());
    }
    Ok(if report.failed > 0 { PARTIAL } else { OK })
}

fn print_summary(ctx: &Context, report: &ReplayReport, from: &str, to: &str, secs: f64) {
    println!(
        "{} {} from {from} to {to}: scanned {}, declined {}, failed {} ({secs:.1}s)",
        ctx.out.status("replayed"),
        report.replayed,
        report.scanned,
        report.declined,
        report.failed,
    );
}

/// Runs `acemq dlq purge`.
pub async fn purge(args: PurgeArgs, ctx: &Context) -> Outcome {
    let mq = ctx.broker.connect().await?;
    let r = existing_replay(&mq, &args.queue, args.parked).await?;
    let from = r.from_queue().to_owned();
    let waiting = r.pending().await?;
    let what = match args.older_than {
        Some(d) => format!("the messages first seen more than {} ago", age(d)),
        None => format!("all {waiting} messages"),
    };
    if waiting == 0 {
        let _ = mq.close().await;
        report_purged(ctx, &from, 0, 0);
        return Ok(OK);
    }
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            let _ = mq.close().await;
            return Err(Failure::usage(format!(
                "refusing to purge {what} of {from} without --yes (stdin is not a terminal)"
            )));
        }
        eprint!("Purge {what} of {from} ({waiting} waiting)? This cannot be undone. [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            let _ = mq.close().await;
            eprintln!("nothing purged");
            return Ok(PARTIAL);
        }
    }
    let (purged, scanned) = match args.older_than {
        None => {
            let n = mq.transport().purge_queue(&from).await;
            let _ = mq.close().await;
            let n = n.map_err(|e| Failure::error(e.to_string()))?;
            (n as usize, n as usize)
        }
        Some(_) => {
            let bar = progress(u64::from(waiting), ctx.out.json);
            let shown = bar.clone();
            let r = r.on_progress(move |p| {
                shown.set_position(p.scanned as u64);
                shown.set_message("scanned");
            });
            let filter = FilterArgs {
                older_than: args.older_than,
                ..FilterArgs::default()
            };
            let result = r.purge_matching(move |d| matches(&filter, d)).await;
            bar.finish_and_clear();
            let _ = mq.close().await;
            let report = result?;
            (report.purged, report.scanned)
        }
    };
    report_purged(ctx, &from, purged, scanned);
    Ok(OK)
}

fn report_purged(ctx: &Context, from: &str, purged: usize, scanned: usize) {
    if ctx.out.json {
        ctx.out
            .print_json(&json!({"from": from, "purged": purged, "scanned": scanned}));
    } else {
        println!("{} {purged} from {from}", ctx.out.status("purged"));
    }
}
