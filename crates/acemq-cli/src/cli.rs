//! The command line: every subcommand, flag and its help text (clap derive).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The broker when neither `--url` nor `ACEMQ_URL` names one.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A service's actuator when `acemq health` is given no address.
pub const DEFAULT_SERVICE_URL: &str = "http://127.0.0.1:9464";

const EXIT_CODES: &str = "\
Exit codes (for scripts):
  0   ok: done; health UP; no drift
  1   partial: health DEGRADED; topology drift or missing items; some messages failed to move
  2   error: health DOWN or unreachable; broker or management API unreachable; a command failed
  64  usage: bad arguments, or a purge refused without --yes on a non-terminal

Environment:
  ACEMQ_URL   the broker, as --url (the password is never printed)
  NO_COLOR    set to anything to turn colour off (colour is only used on a terminal)";

/// acemq: the operator's tool for AceMQ services on RabbitMQ.
///
/// Looks at and moves dead letters ({q}.dlq) and parked messages ({q}.parked) without a
/// management UI or hand-written scripts, plans/applies/diffs the topology a service
/// declares, and reads a service's health endpoint. Every listing takes --json.
#[derive(Debug, Parser)]
#[command(name = "acemq", version, after_help = EXIT_CODES, propagate_version = true)]
pub struct Cli {
    /// The broker (AMQP URL). Default: amqp://guest:***@127.0.0.1:5672/%2f
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "ACEMQ_URL",
        hide_env_values = true,
        value_name = "AMQP_URL"
    )]
    pub url: Option<String>,

    /// RabbitMQ's management HTTP API. Default: http://BROKER-HOST:15672, with the AMQP
    /// URL's credentials and vhost.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "HTTP_URL"
    )]
    pub management_url: Option<String>,

    /// Machine-readable output: one JSON document on stdout.
    #[arg(long, global = true, help_heading = "Global options")]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Dead letters and parked messages: list, peek, replay, purge.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// The topology a service declares, from a TOML file: plan, apply, diff.
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// A service's /acemq-health as a readable summary (exit 0 UP, 1 DEGRADED, 2 DOWN).
    Health(HealthArgs),
    /// The operator web console: queues, dead letters grouped by reason, parked messages,
    /// stuck queues; filtered replay and purge (with --allow-mutations).
    ///
    /// Binds 127.0.0.1:9465 unless told otherwise; any other address needs a token
    /// (--token-file or ACEMQ_CONSOLE_TOKEN). Read-only unless --allow-mutations.
    Console(ConsoleArgs),
}

/// `acemq dlq ...`
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Every queue with a .dlq or .parked companion: counts and the oldest dead letter's age.
    ///
    /// Queues are discovered through the management API when it answers; otherwise name
    /// them (QUEUE...) or give a topology file (-f). OLDEST is the age of the message at the
    /// head of the .dlq (else .parked), counted from its x-acemq-first-seen: how long ago
    /// AceMQ first saw it. It is read with a one-message peek, which moves nothing.
    List(ListArgs),
    /// Look at dead letters without moving them (never more than -n held at once).
    Peek(PeekArgs),
    /// Move dead letters back to their queue, optionally filtered, with provenance headers.
    Replay(ReplayArgs),
    /// Drop dead letters (all, or those older than a duration). Asks first unless --yes.
    Purge(PurgeArgs),
}

/// `acemq dlq list`
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Source queues to look at when the management API is not reachable.
    #[arg(value_name = "QUEUE")]
    pub queues: Vec<String>,
    /// Take the source queues from a topology file instead.
    #[arg(short = 'f', long = "file", value_name = "TOPOLOGY_TOML")]
    pub file: Option<PathBuf>,
    /// Also show discovered queues whose .dlq and .parked are empty (hidden by default;
    /// queues named on the command line or in a file are always shown).
    #[arg(long)]
    pub all: bool,
}

/// `acemq dlq peek`
#[derive(Debug, Args)]
pub struct PeekArgs {
    /// The source queue (its .dlq is read; .parked with --parked).
    pub queue: String,
    /// How many messages to look at, from the head of the queue.
    #[arg(short = 'n', long = "count", value_name = "N")]
    pub count: Option<usize>,
    /// Read {QUEUE}.parked instead of {QUEUE}.dlq.
    #[arg(long)]
    pub parked: bool,
    /// Show one message in full (headers, reason, body) by its x-acemq-id; looks among the
    /// first -n messages (default 100 with --id).
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// With --id: show at most this many bytes of the body.
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    pub max_body: usize,
}

/// The filters `replay` and `purge` share.
#[derive(Debug, Args, Default, Clone)]
pub struct FilterArgs {
    /// Only messages of this x-acemq-type.
    #[arg(long = "type", value_name = "TYPE")]
    pub message_type: Option<String>,
    /// Only messages whose reason (x-acemq-error) contains this text.
    #[arg(long, value_name = "TEXT")]
    pub error_contains: Option<String>,
    /// Only messages first seen longer ago than this (10m, 2h, 1d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<Duration>,
    /// Only messages with this application header value (repeatable; all must match).
    #[arg(long = "header", value_name = "KEY=VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
}

/// `acemq dlq replay`
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The source queue: messages move from {QUEUE}.dlq (or .parked) back into QUEUE.
    pub queue: String,
    /// Move at most this many (default: what is waiting now).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Keep each message's attempt count instead of resetting it to 1.
    #[arg(long)]
    pub keep_attempts: bool,
    /// Replay {QUEUE}.parked instead of {QUEUE}.dlq.
    #[arg(long)]
    pub parked: bool,
    /// Show what would move, and move nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Stop after examining this many messages.
    #[arg(long, value_name = "N")]
    pub scan_limit: Option<usize>,
    /// Hold at most this many passed-over messages unacked at once (the library's default
    /// is 100); beyond that they go to the tail of the queue.
    #[arg(long, value_name = "N")]
    pub hold_limit: Option<usize>,
}

/// `acemq dlq purge`
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// The source queue: messages are dropped from {QUEUE}.dlq (or .parked).
    pub queue: String,
    /// Only messages first seen longer ago than this (10m, 2h, 1d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<Duration>,
    /// Purge {QUEUE}.parked instead of {QUEUE}.dlq.
    #[arg(long)]
    pub parked: bool,
    /// Do not ask. Required when stdin is not a terminal.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// `acemq topology ...`
#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// Print what the file declares, one line per exchange, queue and binding.
    Plan(TopologyArgs),
    /// Declare everything in the file on the broker (idempotent).
    Apply(TopologyArgs),
    /// Compare the file with the broker, item by item (exit 1 on drift or missing items).
    Diff(TopologyArgs),
}

/// The topology file argument.
#[derive(Debug, Args)]
pub struct TopologyArgs {
    /// The topology file (TOML; see crates/acemq-cli/examples/topology.toml).
    #[arg(short = 'f', long = "file", value_name = "TOPOLOGY_TOML")]
    pub file: PathBuf,
}

/// `acemq console`
#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// The address to serve on (loopback unless a token is given).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9465")]
    pub listen: std::net::SocketAddr,
    /// A file holding the token every request must carry (its first line).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The token every request must carry (prefer --token-file: the environment of a
    /// process can be read by its user's other processes).
    #[arg(
        long = "token-env",
        env = "ACEMQ_CONSOLE_TOKEN",
        hide_env_values = true,
        hide = true
    )]
    pub token: Option<String>,
    /// Allow replay and purge (each a POST with a CSRF token, a dry run and a confirmation).
    #[arg(long)]
    pub allow_mutations: bool,
    /// Look at most this many messages per page (held unacked while looking).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub peek_limit: usize,
}

/// `acemq health`
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The service's actuator; /acemq-health is added when the URL has no path.
    #[arg(value_name = "SERVICE_URL", default_value = DEFAULT_SERVICE_URL)]
    pub service_url: String,
    /// Give up after this long (5s, 500ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s")]
    pub timeout: Duration,
}

/// `10m`, `2h`, `1d`, `90s`, `1h 30m` (humantime).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}: write a duration like 90s, 10m, 2h or 1d"))
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err("write a header filter as KEY=VALUE".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_read_as_operators_write_them() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_header("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_header("=x").is_err());
    }
}
