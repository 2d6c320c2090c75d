//! `acemq`: the operator's command line for AceMQ — dead letters and parked messages
//! (list, peek, replay, purge), the topology a service declares (plan, apply, diff), and a
//! service's health. A thin shell over the `acemq` library; `acemq --help` says the rest.

mod broker;
mod cli;
mod console;
mod dlq;
mod fail;
mod health;
mod mgmt;
mod output;
mod topo;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::broker::Broker;
use crate::cli::{Cli, Command};
use crate::fail::{Failure, Outcome};
use crate::mgmt::Management;
use crate::output::Out;

/// What every command gets: the broker, the management API's address, the output mode.
pub struct Context {
    /// The broker (`--url` / `ACEMQ_URL`).
    pub broker: Broker,
    /// `--management-url`, when given.
    pub management_url: Option<String>,
    /// How to write.
    pub out: Out,
}

impl Context {
    /// The management API client (not yet contacted).
    pub fn management(&self) -> Result<Management, Failure> {
        self.broker.management(self.management_url.as_deref())
    }

    /// The management API when it answers; `None` (with a note on stderr when it was asked
    /// for explicitly) otherwise.
    pub fn management_if_reachable(&self) -> Option<Management> {
        let m = self.management().ok()?;
        match m.queues() {
            Ok(_) => Some(m),
            Err(e) => {
                if self.management_url.is_some() {
                    eprintln!("acemq: {e}");
                }
                None
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => fail::OK,
                _ => fail::USAGE,
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail::exit(Err(Failure::error(format!("cannot start: {e}")))),
    };
    let json = cli.json;
    fail::exit_as(runtime.block_on(run(cli)), json)
}

async fn run(cli: Cli) -> Outcome {
    let ctx = Context {
        broker: Broker::new(cli.url),
        management_url: cli.management_url,
        out: Out::new(cli.json),
    };
    match cli.command {
        Command::Dlq(cmd) => dlq::run(cmd, &ctx).await,
        Command::Topology(cmd) => topo::run(cmd, &ctx).await,
        Command::Health(args) => health::run(args, &ctx).await,
        Command::Console(args) => console::run(args, &ctx).await,
    }
}
