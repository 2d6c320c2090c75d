//! The transport conformance kit (feature `testing`): the cases every [`Transport`] must
//! pass, as public async functions, so a third transport (or a fake of your own) runs the
//! very cases `memory://` and RabbitMQ pass in this project's tests.
//!
//! The cases are written for RabbitMQ 3.10's behaviour: routing through every exchange
//! type, mandatory returns, prefetch, requeue, dead-lettering with `x-death`, cancel and
//! close, basic.get, TTLs and head-only expiry, argument equivalence (406), quorum queues,
//! server-named queues, passive inspection (404), `x-death` counting, quorum delivery
//! counts, exclusive queues (405), exclusive consumers (403). Each case uses fresh names and deletes what it declared,
//! so cases can share a broker and run in parallel.
//!
//! A case is handed a [`Target`]: something that opens a fresh [`Transport`] to one broker
//! (some cases open a second connection, or a new one after the broker closed a channel).
//! A case **panics** when its transport does not conform, exactly like a failed assertion
//! in a test; this module is test support, not a runtime API.
//!
//! Three ways to run them:
//! * [`transport_conformance_tests!`](crate::transport_conformance_tests): one `#[test]`
//!   per case in your test file (each case is its own test, so failures are reported by
//!   name);
//! * [`run_all`]: every case in turn, failures collected and reported together;
//! * one case alone: [`Case::run`] from [`CASES`], or the function itself, e.g.
//!   [`routing::default_exchange_routes_by_queue_name`].
//!
//! ```
//! use acemq::transport::conformance::{Target, run_all};
//! use acemq::transport::memory::MemoryTransport;
//! use std::sync::Arc;
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
//! // Your own transport goes here; this one wraps the memory broker.
//! let target = Target::new("mine", || async {
//!     Ok(Arc::new(MemoryTransport::connect("doc-conformance")) as _)
//! });
//! run_all(&target).await;
//! # }
//! ```
//!
//! In a test file (`tests/conformance.rs`), with `acemq = { ..., features = ["testing"] }`
//! among the dev-dependencies:
//!
//! ```
//! mod mine {
//!     // An expression of type `Target` or `Option<Target>` (`None` skips, e.g. when a
//!     // broker is not configured), evaluated once per test.
//!     acemq::transport_conformance_tests!(acemq::transport::conformance::Target::memory());
//! }
//! # fn main() {}
//! ```

pub mod delivery;
pub mod edges;
mod helpers;
pub mod queues;
pub mod routing;

pub use helpers::{eventually, publish_confirmed, unique, wait_for_count};

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use crate::transport::{BoxFuture, Transport, TransportError};
use crate::util::panic_text;

/// How a [`Target`] opens a transport.
type Open =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Transport>, TransportError>> + Send + Sync>;

/// What a case runs against: a name (for reports) and a way to open a fresh transport to
/// one broker.
///
/// ```
/// use acemq::transport::conformance::Target;
/// let t = Target::memory();
/// assert!(t.name().starts_with("memory://"));
/// ```
#[derive(Clone)]
pub struct Target {
    name: String,
    open: Open,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// A target whose transports `open` opens. Every call must reach the same broker.
    pub fn new<F, Fut>(name: impl Into<String>, open: F) -> Target
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn Transport>, TransportError>> + Send + 'static,
    {
        Target {
            name: name.into(),
            open: Arc::new(move || Box::pin(open())),
        }
    }

    /// A fresh `memory://` broker of its own (a unique name).
    pub fn memory() -> Target {
        let url = format!("memory://{}", unique("conformance"));
        Target::url(url)
    }

    /// The broker a URL names, opened with [`crate::transport::connect`]: `amqp://`,
    /// `amqps://` or `memory://name`. The URL's credentials are not shown in reports.
    pub fn url(url: impl Into<String>) -> Target {
        let url: String = url.into();
        let name = crate::transport::connect::redact(&url);
        Target::new(name, move || {
            let url = url.clone();
            async move { crate::transport::connect(&url).await }
        })
    }

    /// The name reports use.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens a fresh transport.
    ///
    /// # Panics
    /// When it cannot be opened (a case cannot run without it).
    pub async fn transport(&self) -> Arc<dyn Transport> {
        match (self.open)().await {
            Ok(t) => t,
            Err(e) => panic!("cannot open a transport to {}: {e}", self.name),
        }
    }
}

/// One conformance case: its name and what it runs.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name: its function's, e.g. `default_exchange_routes_by_queue_name`.
    pub name: &'static str,
    /// The module it is in: `routing`, `delivery`, `queues` or `edges`.
    pub group: &'static str,
    run: fn(Target) -> BoxFuture<'static, ()>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Case({}::{})", self.group, self.name)
    }
}

impl Case {
    /// Runs the case on `target`; panics when the transport does not conform.
    pub async fn run(&self, target: &Target) {
        (self.run)(target.clone()).await
    }
}

/// The list of cases, written once: every case, in a stable order, as `group::function`.
/// It hands the list to `__transport_conformance_expand!`
/// with `cases` (which builds [`CASES`]) or `tests(target)` (which builds one `#[test]` per
/// case, for [`transport_conformance_tests!`](crate::transport_conformance_tests)). A case
/// added here is in both. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __transport_conformance_cases {
    ($($mode:tt)*) => {
        $crate::__transport_conformance_expand! { [$($mode)*]
            routing::default_exchange_routes_by_queue_name,
            routing::the_default_exchange_cannot_be_bound_declared_or_deleted,
            routing::direct_exchange_routes_on_exact_key,
            routing::fanout_exchange_routes_to_every_bound_queue,
            routing::topic_exchange_matches_star_and_hash,
            routing::headers_exchange_matches_all_or_any_header,
            routing::mandatory_unroutable_is_returned_and_non_mandatory_is_acked,
            routing::publishing_to_a_missing_exchange_is_not_found,
            delivery::prefetch_bounds_the_unacked_window,
            delivery::requeue_puts_the_message_back_at_the_head_marked_redelivered,
            delivery::nack_without_requeue_dead_letters_with_x_death,
            delivery::closing_a_subscription_returns_its_unacked_deliveries,
            delivery::dropping_a_subscription_returns_its_unacked_deliveries,
            delivery::cancel_stops_deliveries_but_keeps_unsettled_ones_settleable,
            delivery::deleting_a_queue_cancels_its_consumers,
            delivery::basic_get_takes_the_head_and_settles_it,
            delivery::multiple_ack_settles_every_earlier_delivery,
            delivery::settling_twice_is_ack_not_sent,
            delivery::try_next_takes_what_is_at_hand_without_waiting,
            queues::queue_ttl_dead_letters_into_another_queue,
            queues::per_message_expiration_dead_letters_and_is_removed,
            queues::only_the_head_of_a_queue_expires,
            queues::redeclaring_with_a_different_ttl_is_precondition_failed,
            queues::quorum_and_classic_queues_are_told_apart,
            queues::an_empty_name_gets_a_server_generated_queue,
            queues::passive_inspection_of_missing_things_is_not_found,
            queues::purge_and_delete_report_ready_counts,
            edges::rejecting_into_the_same_queue_counts_up_x_death,
            edges::dead_lettering_to_a_missing_exchange_drops_the_message,
            edges::quorum_queues_count_redeliveries,
            edges::exclusive_queues_belong_to_their_connection,
            edges::an_exclusive_consumer_locks_the_queue_until_its_connection_closes,
        }
    };
}

/// What `__transport_conformance_cases!` expands its
/// list into. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __transport_conformance_expand {
    ([cases] $($group:ident :: $case:ident,)*) => {
        /// Every case, in a stable order.
        pub const CASES: &[Case] = &[
            $(
                Case {
                    name: stringify!($case),
                    group: stringify!($group),
                    run: |t| Box::pin($group::$case(t)),
                },
            )*
        ];
    };
    ([tests($target:expr)] $($group:ident :: $case:ident,)*) => {
        $(
            #[test]
            fn $case() {
                $crate::transport::conformance::run_case(stringify!($case), || $target);
            }
        )*
    };
}

__transport_conformance_cases!(cases);

/// Runs every case on `target` in turn; each starts even when an earlier one failed.
///
/// # Panics
/// After the last case, when any failed, naming each failed case and its message.
pub async fn run_all(target: &Target) {
    let mut failed = Vec::new();
    for case in CASES {
        eprintln!("-- {}::{} on {}", case.group, case.name, target.name());
        if let Err(panic) = AssertUnwindSafe(case.run(target)).catch_unwind().await {
            failed.push(format!("{}: {}", case.name, panic_text(&*panic)));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} conformance cases failed on {}:\n{}",
        failed.len(),
        CASES.len(),
        target.name(),
        failed.join("\n")
    );
}

/// Runs the case called `name` on the target `make` gives, on a fresh multi-threaded tokio
/// runtime (two workers): what each test of
/// [`transport_conformance_tests!`](crate::transport_conformance_tests) calls. `make`
/// returns a [`Target`], or `None` to skip (a note is printed; with
/// `ACEMQ_TEST_REQUIRE_BROKER=1` a missing target fails instead).
///
/// # Panics
/// When the case fails, when no target is given under `ACEMQ_TEST_REQUIRE_BROKER=1`, when
/// there is no case called `name`, or when no runtime can be built.
pub fn run_case<T, F>(name: &str, make: F)
where
    T: Into<Option<Target>>,
    F: FnOnce() -> T,
{
    let Some(case) = CASES.iter().find(|c| c.name == name) else {
        panic!("no conformance case called {name:?}");
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a tokio runtime: {e}"));
    runtime.block_on(async {
        match make().into() {
            Some(target) => {
                eprintln!("-- {}::{} on {}", case.group, case.name, target.name());
                case.run(&target).await;
            }
            None => {
                // CI must not pass a case that never ran.
                assert!(
                    std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
                    "ACEMQ_TEST_REQUIRE_BROKER=1 but no target is configured for {name}"
                );
                eprintln!("note: no target configured; {name} did not run");
            }
        }
    });
}

/// One `#[test]` per conformance case, run on the target an expression gives.
///
/// The expression has type [`Target`](crate::transport::conformance::Target) or
/// `Option<Target>` (`None` skips the case with a note) and is evaluated inside each test's
/// tokio runtime. Put the macro in a module of its own per target: the tests are named
/// after the cases, from the same list as [`CASES`](crate::transport::conformance::CASES).
/// Needs the `testing` feature.
///
/// ```
/// mod memory {
///     acemq::transport_conformance_tests!(acemq::transport::conformance::Target::memory());
/// }
/// mod rabbitmq {
///     acemq::transport_conformance_tests!(
///         std::env::var("AMQP_URL").ok().map(acemq::transport::conformance::Target::url)
///     );
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! transport_conformance_tests {
    ($target:expr) => {
        $crate::__transport_conformance_cases!(tests($target));
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_url_does_not_show_its_password() {
        let t = Target::url("amqp://guest:secret@localhost:5672/%2f");
        assert_eq!(t.name(), "amqp://***@localhost:5672/%2f");
    }
}
