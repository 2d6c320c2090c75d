//! Measuring a run: wall and process CPU time ([`Clock`], [`Span`]), latency percentiles and
//! the [`Sample`] a run yields, and the process's peak memory.

use std::time::{Duration, Instant};

/// One timed run.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Messages in the run.
    pub messages: u64,
    /// Wall time of the timed part.
    pub elapsed: Duration,
    /// CPU time (user + system, every thread of this process) spent in the timed part.
    pub cpu: Duration,
    /// Median latency, where it applies.
    pub p50: Option<Duration>,
    /// 99th percentile latency, where it applies.
    pub p99: Option<Duration>,
}

impl Sample {
    pub(crate) fn new(messages: u64, span: Span, mut latencies: Vec<Duration>) -> Sample {
        latencies.sort_unstable();
        Sample {
            messages,
            elapsed: span.wall,
            cpu: span.cpu,
            p50: percentile(&latencies, 0.50),
            p99: percentile(&latencies, 0.99),
        }
    }

    /// Messages per second.
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Client CPU microseconds per message (10 ms clock-tick resolution over the run).
    pub fn cpu_us_per_message(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / (self.messages.max(1) as f64)
    }
}

/// Wall and CPU time of a timed part.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// Wall time.
    pub wall: Duration,
    /// Process CPU time.
    pub cpu: Duration,
}

/// Starts timing wall and process CPU time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall: Instant,
    cpu: Duration,
}

impl Clock {
    /// Now.
    pub fn start() -> Clock {
        Clock {
            wall: Instant::now(),
            cpu: process_cpu(),
        }
    }

    /// Since [`Clock::start`].
    pub fn elapsed(&self) -> Span {
        Span {
            wall: self.wall.elapsed(),
            cpu: process_cpu().saturating_sub(self.cpu),
        }
    }
}

/// User + system CPU time of this process (all threads) from `/proc/self/stat`; zero where
/// unavailable. Clock ticks are taken as 100 Hz (Linux's USER_HZ).
pub fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may contain spaces) start at field 3.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime is field 14 and stime field 15 (1-based), i.e. 11 and 12 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The `q` quantile of sorted values (nearest rank); `None` when empty.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The process's peak resident set size in KiB (`VmHWM` from `/proc/self/status`).
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
