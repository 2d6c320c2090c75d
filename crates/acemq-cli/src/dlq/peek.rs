//! `acemq dlq peek QUEUE`: look without moving (the library's `Replay::peek`, which never
//! holds more than `n` messages and returns them to the queue in their order).

use serde_json::{Value, json};

use crate::Context;
use crate::cli::PeekArgs;
use crate::dlq::existing_replay;
use crate::dlq::message::{self, HEADER};
use crate::fail::{ERROR, OK, Outcome};
use crate::output::{print_table, table};

/// Runs `acemq dlq peek`.
pub async fn run(args: PeekArgs, ctx: &Context) -> Outcome {
    let mq = ctx.broker.connect().await?;
    let replay = existing_replay(&mq, &args.queue, args.parked).await?;
    let from = replay.from_queue().to_owned();
    let n = args
        .count
        .unwrap_or(if args.id.is_some() { 100 } else { 10 });
    let waiting = replay.pending().await;
    let peeked = replay.peek(n).await;
    let _ = mq.close().await;
    let waiting = waiting?;
    let peeked = peeked?;

    if let Some(id) = &args.id {
        let Some(m) = peeked.iter().find(|m| m.id.as_deref() == Some(id.as_str())) else {
            eprintln!(
                "acemq: no message with id {id} among the first {} of {from} ({waiting} waiting); raise -n to look further",
                peeked.len()
            );
            return Ok(ERROR);
        };
        if ctx.out.json {
            let mut v = message::to_json(m, true);
            v["queue"] = json!(from);
            ctx.out.print_json(&v);
        } else {
            message::print_full(&ctx.out, &from, m, args.max_body);
        }
        return Ok(OK);
    }

    if ctx.out.json {
        let list: Vec<Value> = peeked.iter().map(|m| message::to_json(m, true)).collect();
        ctx.out.print_json(&json!({
            "queue": from,
            "waiting": waiting,
            "shown": list.len(),
            "messages": list,
        }));
        return Ok(OK);
    }
    if peeked.is_empty() {
        println!("{from}: empty");
        return Ok(OK);
    }
    let mut t = table(&HEADER);
    for (i, m) in peeked.iter().enumerate() {
        t.add_row(message::row(i, m));
    }
    print_table(&t);
    println!(
        "\n{}",
        ctx.out.dim(&format!(
            "{} of {waiting} waiting in {from} (nothing moved; --id ID shows one in full)",
            peeked.len()
        ))
    );
    Ok(OK)
}
