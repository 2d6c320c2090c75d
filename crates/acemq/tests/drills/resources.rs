//! What a recovery could leak, measured in this process and on the broker: live heap bytes
//! (counted by [`CountingAlloc`], the drills binary's global allocator), open file
//! descriptors (`/proc/self/fd`), live tokio tasks, and the broker's channels on this
//! drill's connections. Resident memory (`VmRSS` of `/proc/self/status`) is printed too,
//! but not bounded: after 240 reconnections the allocator keeps freed buffers of earlier
//! connections mapped (fragmented arenas), and RSS was seen 36 MiB up in a CI run whose live
//! heap came back; what is still allocated is what a leak shows in.
//!
//! The bounds [`Resources::assert_flat`] applies after 20 recoveries, each far below what
//! one leaked item per recovery would add:
//! * channels: at most [`CHANNEL_SLACK`] more (a leak of one per recovery adds 20);
//! * file descriptors: at most [`FD_SLACK`] more (each connection is one socket);
//! * tokio tasks: at most [`TASK_SLACK`] more (a leaked watcher per recovery adds 20+);
//! * live heap: at most [`HEAP_SLACK_KIB`] KiB more (the ledger itself grows with the ids
//!   booked; a leaked connection with its buffers per recovery would exceed it).
//!
//! A connection that was closed leaves one task behind for a while: lapin's heartbeat task
//! notices the close only at its next tick, up to half the heartbeat later (30 s with
//! RabbitMQ's default of 60 s; observed on 3.10 with lapin 4: +1 task per closed connection,
//! all gone after that time). That is not a leak, so [`Resources::assert_settles`] measures
//! again until the counts are back within the slack, for up to [`SETTLE_BOUND`]; a real
//! leak never comes back.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::broker::our_channels;

/// The system allocator, counting the bytes it has handed out and not had back. The
/// drills binary installs it as its `#[global_allocator]`.
pub struct CountingAlloc;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; the counter is only arithmetic.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

fn heap_kib() -> u64 {
    (LIVE_BYTES.load(Ordering::Relaxed) / 1024) as u64
}

/// Extra broker channels allowed after the drill.
pub const CHANNEL_SLACK: usize = 2;
/// Extra file descriptors allowed.
pub const FD_SLACK: usize = 4;
/// Extra live tokio tasks allowed.
pub const TASK_SLACK: usize = 8;
/// Extra live heap allowed, in KiB (24 MiB).
pub const HEAP_SLACK_KIB: u64 = 24 * 1024;
/// How long closed connections' lingering tasks may take to end (half the default
/// heartbeat, and some).
pub const SETTLE_BOUND: Duration = Duration::from_secs(40);

/// One measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    pub heap_kib: u64,
    pub rss_kib: u64,
    pub fds: usize,
    pub tasks: usize,
    pub channels: usize,
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

impl Resources {
    /// Measures now; channels are those on connections named `prefix…` (through `node`).
    pub async fn measure(node: Option<String>, prefix: String) -> Resources {
        let channels = tokio::task::spawn_blocking(move || our_channels(node.as_deref(), &prefix))
            .await
            .expect("rabbitmqctl task")
            .expect("rabbitmqctl list_channels");
        Resources {
            heap_kib: heap_kib(),
            rss_kib: rss_kib(),
            fds: fds(),
            tasks: tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks(),
            channels,
        }
    }

    /// Whether `after` is within the slack of `self`.
    pub fn is_flat(&self, after: &Resources) -> bool {
        after.channels <= self.channels + CHANNEL_SLACK
            && after.fds <= self.fds + FD_SLACK
            && after.tasks <= self.tasks + TASK_SLACK
            && after.heap_kib <= self.heap_kib + HEAP_SLACK_KIB
    }

    /// Measures (channels through `node`, on connections named `prefix…`) until the counts
    /// are within the slack of `self`, for up to [`SETTLE_BOUND`], then asserts they are
    /// (see the module docs); returns the last measurement.
    pub async fn assert_settles(
        &self,
        node: Option<String>,
        prefix: String,
        drill: &str,
    ) -> Resources {
        let start = Instant::now();
        let first = Resources::measure(node.clone(), prefix.clone()).await;
        let mut after = first;
        while !self.is_flat(&after) && start.elapsed() < SETTLE_BOUND {
            tokio::time::sleep(Duration::from_millis(500)).await;
            after = Resources::measure(node.clone(), prefix.clone()).await;
        }
        eprintln!(
            "drill {drill}: resources right after the last recovery {first:?}; settled after {}ms",
            start.elapsed().as_millis()
        );
        self.assert_flat(&after, drill);
        after
    }

    /// Asserts `after` stays within the slack of `self` (see the module docs).
    pub fn assert_flat(&self, after: &Resources, drill: &str) {
        eprintln!("drill {drill}: resources before {self:?}, after {after:?}");
        assert!(
            after.channels <= self.channels + CHANNEL_SLACK,
            "drill {drill}: channels grew from {} to {} (a channel leaked per recovery?)",
            self.channels,
            after.channels
        );
        assert!(
            after.fds <= self.fds + FD_SLACK,
            "drill {drill}: open file descriptors grew from {} to {}",
            self.fds,
            after.fds
        );
        assert!(
            after.tasks <= self.tasks + TASK_SLACK,
            "drill {drill}: live tokio tasks grew from {} to {}",
            self.tasks,
            after.tasks
        );
        assert!(
            after.heap_kib <= self.heap_kib + HEAP_SLACK_KIB,
            "drill {drill}: live heap grew from {} KiB to {} KiB",
            self.heap_kib,
            after.heap_kib
        );
    }
}
