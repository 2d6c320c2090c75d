//! `cargo run --release -p acemq-bench -- [--url URL] [--messages N] [--size BYTES]`
//!
//! Runs each scenario through raw lapin and through AceMQ in alternating order, `--rounds`
//! times, and prints one table of medians (see `crates/acemq-bench/README.md`).

use std::time::Duration;

use acemq_bench::{
    Broker, QueueKind, Result, Sample, Scenario, Side, memory_publish_consume,
    memory_request_reply, peak_rss_kib,
};
use clap::Parser;

/// Diagnostic (`--features mimalloc`): both sides on mimalloc instead of the system
/// allocator; every table then says so.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator this binary was built with, as the tables name it.
const ALLOCATOR: &str = if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "the system allocator"
};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "AceMQ against raw lapin, and the memory:// transport"
)]
struct Args {
    /// The broker.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    url: String,
    /// Messages per run for every scenario (default: 2,000 confirm-each, 10,000 pipelined
    /// and consume, 300 retry, 200,000 memory://, 600 waits, 5,000 request/reply).
    #[arg(long)]
    messages: Option<u64>,
    /// Body size in bytes (JSON).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Rounds per side; the table shows medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Queue types to run the broker scenarios on (`--queues classic,quorum` adds the
    /// quorum variant; it doubles the run time).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [QueueKind::Classic])]
    queues: Vec<QueueKind>,
    /// Scenarios to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    scenarios: Vec<Scenario>,
    /// A smoke run: tiny counts, one round.
    #[arg(long)]
    quick: bool,
    /// Diagnostic: raw lapin publishes (scenarios 1, 2, 7) also carry AceMQ's envelope headers.
    #[arg(long)]
    raw_envelope_headers: bool,
    /// Diagnostic: raw lapin (scenarios 1, 2, 7) writes everything the wire contract asks of
    /// a publish, like with like: the envelope headers, ids as UUID text, a `traceparent`;
    /// in scenario 7 the correlation and reply address in their headers, the request's
    /// `expiration` and the reply's causation. Implies `--raw-envelope-headers`.
    #[arg(long)]
    raw_contract: bool,
    /// Diagnostic: raw request/reply (scenario 7) publishes on a second connection, as
    /// AceMQ does.
    #[arg(long)]
    raw_two_connections: bool,
    /// Diagnostic: requests in flight in scenario 7, both sides (default 16).
    #[arg(long, default_value_t = acemq_bench::REQUEST_WINDOW)]
    window: usize,
    /// Diagnostic: run only this side of the broker scenarios (`raw` or `acemq`), e.g.
    /// under a profiler; the ratio column is then meaningless. Scenario 7's `memory://` row
    /// is left out, so that a profile holds the broker side alone.
    #[arg(long)]
    only: Option<String>,
    /// Print every run's numbers as it finishes.
    #[arg(long)]
    verbose: bool,
    /// Only the `memory://` rows (scenario 5, and scenario 7's memory row): no broker is
    /// needed. What `scripts/instructions.sh` counts instructions of.
    #[arg(long)]
    memory_only: bool,
    /// Only the codec-wrapper scenarios (encryption, claim check): encode + decode rates,
    /// no broker (`--messages`, default 20,000, and `--size` apply).
    #[arg(long)]
    wrappers: bool,
    /// Run the scale scenarios instead (how cost grows: 100 and 1,000 consumers and
    /// consumer topologies, on memory:// and on the broker when it is reachable; 1,000 and
    /// 10,000 outstanding confirms on the broker, beside raw lapin).
    #[arg(long)]
    scale: bool,
    /// Run the codec scenarios instead (encode + decode per codec, JSON as the baseline,
    /// no broker; `--messages` per codec, default 20,000).
    #[arg(long)]
    codecs: bool,
    /// Run the floor of scenario 5 instead: the wire contract's per-message work written
    /// bare (no AceMQ, no broker), each step alone and all of them in a producer -> consumer
    /// pipe, beside AceMQ's `memory://` scenario 5 in the same run (`--messages`, default
    /// 200,000; `--rounds`).
    #[arg(long)]
    floor: bool,
}

impl Args {
    fn count(&self, s: Scenario) -> u64 {
        if let Some(n) = self.messages {
            return n;
        }
        let full = match s {
            Scenario::ConfirmEach => 2_000,
            Scenario::Pipelined | Scenario::Consume => 10_000,
            Scenario::Retry => 300,
            Scenario::Memory => 200_000,
            Scenario::Waits => 600,
            Scenario::RequestReply => 5_000,
        };
        if self.quick { full / 50 } else { full }
    }
}

struct Row {
    scenario: Scenario,
    /// Against raw lapin writing the wire contract (the default run's second row of 1, 2, 7).
    like: bool,
    queue: &'static str,
    messages: u64,
    raw: Option<Summary>,
    acemq: Summary,
}

struct Summary {
    rate: f64,
    cpu_us: f64,
    p50: Option<Duration>,
    p99: Option<Duration>,
}

fn median_f64(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn median_dur(v: &[Sample], f: impl Fn(&Sample) -> Option<Duration>) -> Option<Duration> {
    let mut d: Vec<Duration> = v.iter().filter_map(f).collect();
    d.sort_unstable();
    d.get(d.len() / 2).copied()
}

fn summarize(samples: &[Sample]) -> Summary {
    if samples.is_empty() {
        return Summary {
            rate: f64::NAN,
            cpu_us: f64::NAN,
            p50: None,
            p99: None,
        };
    }
    Summary {
        rate: median_f64(samples.iter().map(Sample::rate).collect()),
        cpu_us: median_f64(samples.iter().map(Sample::cpu_us_per_message).collect()),
        p50: median_dur(samples, |s| s.p50),
        p99: median_dur(samples, |s| s.p99),
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.2}", d.as_secs_f64() * 1000.0))
        .unwrap_or_else(|| "-".into())
}

fn lat(s: &Summary) -> String {
    if s.p50.is_none() {
        return "-".into();
    }
    format!("{} / {}", ms(s.p50), ms(s.p99))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    // Run like a service does: on a runtime worker, not on the thread that blocks on main.
    tokio::spawn(bench(args)).await?
}

async fn bench(mut args: Args) -> Result<()> {
    if args.quick {
        args.rounds = 1;
    }
    let rounds = args.rounds.max(1);
    if args.wrappers {
        let n = args
            .messages
            .unwrap_or(if args.quick { 100 } else { 20_000 });
        for row in acemq_bench::wrappers::run(n, args.size)? {
            println!("{}", row.line());
        }
        return Ok(());
    }
    if args.scale {
        let broker = if args.memory_only {
            None
        } else {
            match Broker::connect(&args.url).await {
                Ok(b) => Some(b),
                Err(e) => {
                    eprintln!("no broker at the URL ({e}): memory:// only");
                    None
                }
            }
        };
        let (sizes, confirms) = if args.quick {
            ([10, 100], [100, 1_000])
        } else {
            ([100, 1_000], [1_000, 10_000])
        };
        let rows =
            acemq_bench::scale::run(broker.as_ref().map(|b| (&b.acemq, &b.raw)), sizes, confirms)
                .await?;
        println!("| {:<44} | {:<66} | growth |", "measure", "at each size n");
        println!("|{}|{}|--------|", "-".repeat(46), "-".repeat(68));
        for row in &rows {
            println!("{}", row.line());
        }
        return Ok(());
    }
    if args.floor {
        return floor(&args, rounds).await;
    }
    if args.codecs {
        let n = args
            .messages
            .unwrap_or(if args.quick { 400 } else { 20_000 });
        print!(
            "{}",
            acemq_bench::codecs::table(&acemq_bench::codecs::run(n).await?)
        );
        return Ok(());
    }
    acemq_bench::set_raw_envelope_headers(args.raw_envelope_headers);
    acemq_bench::set_raw_contract(args.raw_contract);
    acemq_bench::set_raw_two_connections(args.raw_two_connections);
    acemq_bench::set_request_window(args.window);
    let scenarios: Vec<Scenario> = if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenarios.clone()
    };
    let needs_broker = scenarios
        .iter()
        .any(|s| s.has_raw() || *s == Scenario::Waits)
        && !args.queues.is_empty()
        && !args.memory_only;
    let broker = if needs_broker {
        Some(Broker::connect(&args.url).await?)
    } else {
        None
    };
    let mut rows = Vec::new();
    let mut waits = Vec::new();
    for &scenario in &scenarios {
        let n = args.count(scenario);
        if scenario == Scenario::Waits {
            let Some(broker) = &broker else { continue };
            for &kind in &args.queues {
                waits.push(run_waits(broker, kind, n, &args, rounds).await?);
            }
            continue;
        }
        if !scenario.has_raw() {
            let mut samples = Vec::new();
            for _ in 0..rounds {
                let s = memory_publish_consume(n, args.size).await?;
                if args.verbose {
                    eprintln!(
                        "  {:<26} memory: {:.0} msg/s, {:.1} us CPU/msg",
                        scenario.label(),
                        s.rate(),
                        s.cpu_us_per_message()
                    );
                }
                samples.push(s);
            }
            eprintln!("{:<28} memory   done", scenario.label());
            rows.push(Row {
                scenario,
                like: false,
                queue: "memory",
                messages: n,
                raw: None,
                acemq: summarize(&samples),
            });
            continue;
        }
        if scenario == Scenario::RequestReply && args.only.is_none() {
            // AceMQ alone on memory://; the broker rows follow, against raw lapin.
            rows.push(memory_request_reply_row(n, &args, rounds).await?);
        }
        let Some(broker) = &broker else { continue };
        // Unless the raw side was told what to write, a publishing scenario also runs raw
        // lapin writing the whole contract, for a like-with-like row beside the first.
        let like = scenario.has_contract_variant()
            && !args.raw_envelope_headers
            && !args.raw_contract
            && args.only.as_deref() != Some("acemq");
        for &kind in &args.queues {
            let (mut raw, mut contract, mut ace) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..rounds {
                // raw, acemq, acemq, raw, ...: drift affects both sides alike.
                let order = if round % 2 == 0 {
                    [Run::Raw, Run::Contract, Run::AceMq]
                } else {
                    [Run::AceMq, Run::Contract, Run::Raw]
                };
                for run in order {
                    let side = match run {
                        Run::AceMq => Side::AceMq,
                        Run::Raw | Run::Contract => Side::Raw,
                    };
                    let skip = matches!(
                        (args.only.as_deref(), side),
                        (Some("raw"), Side::AceMq) | (Some("acemq"), Side::Raw)
                    ) || (run == Run::Contract && !like);
                    if skip {
                        continue;
                    }
                    raw_writes_contract(&args, run == Run::Contract);
                    let s = broker.run(scenario, kind, side, n, args.size).await;
                    raw_writes_contract(&args, false);
                    let s = s?;
                    if args.verbose {
                        eprintln!(
                            "  {:<26} {:<7} {run:?}: {:.0} msg/s, {:.1} us CPU/msg",
                            scenario.label(),
                            kind.name(),
                            s.rate(),
                            s.cpu_us_per_message()
                        );
                    }
                    match run {
                        Run::Raw => raw.push(s),
                        Run::Contract => contract.push(s),
                        Run::AceMq => ace.push(s),
                    }
                }
            }
            eprintln!("{:<28} {:<8} done", scenario.label(), kind.name());
            // AceMQ's runs against raw lapin's, and against raw lapin writing the contract.
            let row = |like: bool, raw: &[Sample]| Row {
                scenario,
                like,
                queue: kind.name(),
                messages: n,
                raw: Some(summarize(raw)),
                acemq: summarize(&ace),
            };
            rows.push(row(false, &raw));
            if like {
                rows.push(row(true, &contract));
            }
        }
    }
    if let Some(b) = broker {
        b.close().await?;
    }

    println!();
    println!(
        "{} byte messages, {rounds} round(s), medians; latency p50 / p99 in ms; {ALLOCATOR}",
        args.size
    );
    println!(
        "| {:<27} | {:<7} | {:>7} | {:>10} | {:>11} | {:>9} | {:<15} | {:<15} | {:<16} | {:>15} |",
        "scenario",
        "queue",
        "msgs",
        "raw msg/s",
        "AceMQ msg/s",
        "AceMQ/raw",
        "raw lat",
        "AceMQ lat",
        "latency of",
        "CPU us/msg r/A"
    );
    let widths = [29, 9, 9, 12, 13, 11, 17, 17, 18, 17];
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    println!("|{}|", rule.join("|"));
    for r in &rows {
        let (raw_rate, ratio, raw_lat, raw_cpu) = match &r.raw {
            Some(raw) => (
                format!("{:.0}", raw.rate),
                format!("{:.2}x", r.acemq.rate / raw.rate),
                lat(raw),
                format!("{:.1}", raw.cpu_us),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {:<27} | {:<7} | {:>7} | {:>10} | {:>11.0} | {:>9} | {:<15} | {:<15} | {:<16} | {:>15} |",
            if r.like {
                format!("{} *", r.scenario.label())
            } else {
                r.scenario.label()
            },
            r.queue,
            r.messages,
            raw_rate,
            r.acemq.rate,
            ratio,
            raw_lat,
            lat(&r.acemq),
            r.scenario.latency_unit().unwrap_or("-"),
            format!("{raw_cpu} / {:.1}", r.acemq.cpu_us),
        );
    }
    if rows.iter().any(|r| r.like) {
        println!(
            "\n* like with like: raw lapin writes everything the wire contract asks (--raw-contract: envelope headers, UUID ids, traceparent; for 7 on two connections, with the expiration, reply-to and causation headers); the same AceMQ runs as the row above"
        );
    }
    for w in &waits {
        println!(
            "\n6 waits release the handler slot ({} queue, {} msgs, concurrency 1, 1 in {} fails once and waits {} s in the consumer): the others at {:.0} msg/s against {:.0} msg/s without failures = {:.2} (target >= 0.80)",
            w.queue,
            w.messages,
            acemq_bench::FAIL_EVERY,
            acemq_bench::FAILURE_WAIT.as_secs(),
            w.failing.rate,
            w.baseline.rate,
            w.failing.rate / w.baseline.rate
        );
    }
    match peak_rss_kib() {
        Some(kib) => println!("\npeak RSS (VmHWM): {:.1} MiB", kib as f64 / 1024.0),
        None => println!("\npeak RSS: unavailable (no /proc/self/status)"),
    }
    Ok(())
}

/// One run of a round: AceMQ, raw lapin as told, or raw lapin writing the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Run {
    Raw,
    Contract,
    AceMq,
}

/// Sets what raw lapin writes for the next run: the whole contract on two connections, or
/// what the command line asked for.
fn raw_writes_contract(args: &Args, on: bool) {
    if on {
        acemq_bench::set_raw_contract(true);
        acemq_bench::set_raw_two_connections(true);
    } else {
        acemq_bench::set_raw_contract(args.raw_contract);
        acemq_bench::set_raw_envelope_headers(args.raw_envelope_headers || args.raw_contract);
        acemq_bench::set_raw_two_connections(args.raw_two_connections);
    }
}

/// Scenario 6's medians on one queue type.
struct Waits {
    queue: &'static str,
    messages: u64,
    baseline: Summary,
    failing: Summary,
}

/// Scenario 6: per round, a run without failures and one with them (alternating order).
async fn run_waits(
    broker: &Broker,
    kind: QueueKind,
    n: u64,
    args: &Args,
    rounds: usize,
) -> Result<Waits> {
    let (mut baseline, mut failing) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_failures in order {
            let s = broker.run_waits(kind, n, args.size, with_failures).await?;
            if args.verbose {
                eprintln!(
                    "  {:<26} {:<7} failures {with_failures}: others at {:.0} msg/s",
                    Scenario::Waits.label(),
                    kind.name(),
                    s.rate()
                );
            }
            if with_failures {
                failing.push(s);
            } else {
                baseline.push(s);
            }
        }
    }
    eprintln!("{:<28} {:<8} done", Scenario::Waits.label(), kind.name());
    Ok(Waits {
        queue: kind.name(),
        messages: n,
        baseline: summarize(&baseline),
        failing: summarize(&failing),
    })
}

/// Scenario 7's `memory://` row (AceMQ alone).
async fn memory_request_reply_row(n: u64, args: &Args, rounds: usize) -> Result<Row> {
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let s = memory_request_reply(n, args.size).await?;
        if args.verbose {
            eprintln!(
                "  {:<26} memory: {:.0} round trips/s",
                Scenario::RequestReply.label(),
                s.rate()
            );
        }
        samples.push(s);
    }
    eprintln!("{:<28} memory   done", Scenario::RequestReply.label());
    Ok(Row {
        scenario: Scenario::RequestReply,
        like: false,
        queue: "memory",
        messages: n,
        raw: None,
        acemq: summarize(&samples),
    })
}

/// `--floor`: the floor's steps and pipe, then AceMQ's scenario 5, `rounds` times each
/// (alternating), medians.
async fn floor(args: &Args, rounds: usize) -> Result<()> {
    let n = args.count(Scenario::Memory);
    let (mut floors, mut acemq) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 1 {
            acemq.push(acemq_bench::memory_publish_consume(n, args.size).await?);
        }
        floors.push(acemq_bench::floor::run(n, args.size).await?);
        if round % 2 == 0 {
            acemq.push(acemq_bench::memory_publish_consume(n, args.size).await?);
        }
    }
    let pipes: Vec<Sample> = floors.iter().map(|f| f.pipe.clone()).collect();
    let pipe = summarize(&pipes);
    let batches: Vec<Sample> = floors.iter().map(|f| f.batched.clone()).collect();
    let batched = summarize(&batches);
    let mut median = floors[floors.len() / 2].clone();
    for (i, step) in median.steps.iter_mut().enumerate() {
        step.ns = median_f64(floors.iter().map(|f| f.steps[i].ns).collect());
    }
    let ace = summarize(&acemq);
    println!(
        "floor of scenario 5 ({n} messages of {} bytes, {rounds} round(s), medians; {ALLOCATOR})\n",
        args.size
    );
    print!("{}", median.table());
    println!(
        "\n| run | msg/s | us CPU per message |\n|---|---|---|\n| floor pipe, a hand-over per message (bare: no broker, confirms, window, spans, metrics) | {:.0} | {:.2} |\n| floor pipe, a hand-over per {} | {:.0} | {:.2} |\n| AceMQ memory:// (scenario 5) | {:.0} | {:.2} |",
        pipe.rate,
        pipe.cpu_us,
        acemq_bench::floor::BATCH,
        batched.rate,
        batched.cpu_us,
        ace.rate,
        ace.cpu_us
    );
    Ok(())
}
