//! `acemq console`: the library's operator console ([`acemq::console`]) served on its own,
//! its queue list from the management API. A thin shell: the pages, the passes and the
//! safety rules are the library's.

use acemq::console::{Console, Inventory, QueueStat};
use futures::future::BoxFuture;

use crate::Context;
use crate::cli::ConsoleArgs;
use crate::fail::{Failure, OK, Outcome};
use crate::mgmt::Management;

/// The management API as the console's inventory.
struct ManagementInventory(Management);

impl Inventory for ManagementInventory {
    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueStat>, String>> {
        Box::pin(async move {
            let qs = self.0.live_queues()?;
            Ok(qs
                .into_iter()
                .map(|q| {
                    let rates = q.message_stats.unwrap_or_default();
                    let mut s = QueueStat::new(q.name, q.messages_ready)
                        .unacked(q.messages_unacknowledged)
                        .consumers(q.consumers)
                        .rates(
                            rates.publish_details.unwrap_or_default().rate,
                            rates.deliver_get_details.unwrap_or_default().rate,
                        );
                    if let Some(t) = q.queue_type {
                        s = s.queue_type(t);
                    }
                    s
                })
                .collect())
        })
    }
}

/// Runs `acemq console` until Ctrl-C.
pub async fn run(args: ConsoleArgs, ctx: &Context) -> Outcome {
    let token = match (&args.token_file, &args.token) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::usage(format!("--token-file {}: {e}", path.display())))?;
            let t = text.lines().next().unwrap_or("").trim().to_owned();
            if t.is_empty() {
                return Err(Failure::usage(format!(
                    "--token-file {}: the file is empty; put the token on its first line",
                    path.display()
                )));
            }
            Some(t)
        }
        (None, Some(t)) if !t.trim().is_empty() => Some(t.trim().to_owned()),
        _ => None,
    };
    if !args.listen.ip().is_loopback() && token.is_none() {
        return Err(Failure::usage(format!(
            "refusing to serve the console on {} without a token: give --token-file FILE (or ACEMQ_CONSOLE_TOKEN), or listen on 127.0.0.1",
            args.listen
        )));
    }
    let mgmt = ctx.management()?;
    mgmt.queues().map_err(|e| {
        Failure::error(format!(
            "{e}: the console lists queues through the management API"
        ))
    })?;
    let mq = ctx.broker.connect_lasting().await?;
    let mut b = Console::builder(&mq)
        .inventory(ManagementInventory(mgmt))
        .allow_mutations(args.allow_mutations)
        .peek_limit(args.peek_limit)
        .broker_label(ctx.broker.shown())
        .bind(args.listen);
    if let Some(t) = token {
        b = b.token(t);
    }
    let handle = b.serve().await.map_err(|e| Failure::error(e.to_string()))?;
    eprintln!(
        "acemq console: http://{}/acemq-console/ ({}{}) on {}; Ctrl-C stops it",
        handle.local_addr(),
        if args.allow_mutations {
            "replay and purge allowed"
        } else {
            "read-only"
        },
        if args.token_file.is_some() || args.token.is_some() {
            ", token required"
        } else {
            ""
        },
        ctx.broker.shown()
    );
    let _ = tokio::signal::ctrl_c().await;
    handle.shutdown().await;
    let _ = mq.close().await;
    Ok(OK)
}
