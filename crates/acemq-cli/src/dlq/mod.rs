//! `acemq dlq list|peek|replay|purge`: dead letters (`{q}.dlq`) and parked messages
//! (`{q}.parked`), through the library's [`acemq::replay::Replay`], which never holds more
//! than a bounded number of messages unacked.

mod list;
mod message;
mod peek;
mod replay;

use std::io::IsTerminal;

use acemq::replay::{DeadLetter, Replay};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

use crate::Context;
use crate::cli::{DlqCommand, FilterArgs};
use crate::fail::Outcome;

/// Runs a `dlq` subcommand.
pub async fn run(cmd: DlqCommand, ctx: &Context) -> Outcome {
    match cmd {
        DlqCommand::List(a) => list::run(a, ctx).await,
        DlqCommand::Peek(a) => peek::run(a, ctx).await,
        DlqCommand::Replay(a) => replay::replay(a, ctx).await,
        DlqCommand::Purge(a) => replay::purge(a, ctx).await,
    }
}

/// The replay of `queue`'s `.dlq`, or `.parked` when asked.
fn replay_of(mq: &acemq::Connection, queue: &str, parked: bool) -> Replay {
    let r = mq.replay(queue);
    if parked { r.parked() } else { r }
}

/// The replay of `queue`, once its `.dlq` (or `.parked`) is known to exist.
async fn existing_replay(
    mq: &acemq::Connection,
    queue: &str,
    parked: bool,
) -> Result<Replay, crate::fail::Failure> {
    let r = replay_of(mq, queue, parked);
    match mq.transport().inspect_queue(r.from_queue()).await {
        Ok(_) => Ok(r),
        Err(e) if e.is_not_found() => Err(crate::fail::Failure::error(format!(
            "{} does not exist: give the source queue's name (acemq dlq list shows the queues that have one)",
            r.from_queue()
        ))),
        Err(e) => Err(crate::fail::Failure::error(e.to_string())),
    }
}

/// Whether a dead letter passes every filter given. A message whose age is unknown is
/// never "older than" anything.
fn matches(f: &FilterArgs, d: &DeadLetter<'_>) -> bool {
    if let Some(t) = &f.message_type
        && d.message_type() != t.as_str()
    {
        return false;
    }
    if let Some(s) = &f.error_contains
        && !d.error().is_some_and(|e| e.contains(s.as_str()))
    {
        return false;
    }
    if let Some(min) = f.older_than
        && d.age().is_none_or(|a| a < min)
    {
        return false;
    }
    f.headers
        .iter()
        .all(|(k, v)| d.header(k).as_deref() == Some(v.as_str()))
}

/// A progress bar on stderr with rate and ETA; hidden when stderr is not a terminal or
/// the output is JSON.
fn progress(total: u64, json: bool) -> ProgressBar {
    let target = if json || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:24.cyan/blue} {pos}/{len} {msg} {rate} ETA {eta}")
    {
        let style = style.progress_chars("=> ").with_key(
            "rate",
            |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0}/s", s.per_sec());
            },
        );
        bar.set_style(style);
    }
    bar
}
