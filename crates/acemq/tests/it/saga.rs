//! `acemq::saga`: the family's saga tests (Java's `SagaTest`: happy path, reverse
//! compensation, only what completed, steps with no compensation, a failing compensation,
//! the builder's refusals) and what only Rust does: compensations retried, a panic caught,
//! and a dropped future that still compensates. Virtual time wherever anything waits.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::saga::{Saga, SagaError, SagaOptions, StepError, StepFailure};
use tokio::time::{Instant, sleep, timeout};

/// The subject: an order that records what was done to it, in order.
#[derive(Default)]
struct Order {
    journal: Mutex<Vec<String>>,
}

impl Order {
    fn note(&self, what: &str) {
        self.journal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what.to_owned());
    }

    fn journal(&self) -> Vec<String> {
        self.journal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

type StepFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), StepError>> + Send>>;

/// A step that notes `what` and succeeds.
fn does(what: &'static str) -> impl Fn(Arc<Order>) -> StepFuture + Send + Sync + 'static {
    move |o| {
        Box::pin(async move {
            o.note(what);
            Ok(())
        })
    }
}

/// A step that notes `what` and fails.
fn fails(what: &'static str) -> impl Fn(Arc<Order>) -> StepFuture + Send + Sync + 'static {
    move |o| {
        Box::pin(async move {
            o.note(what);
            Err(format!("{what} failed").into())
        })
    }
}

/// Polls `check` every 10 ms (virtual time) until it holds, failing after 10 s.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(10)).await;
    }
}

fn booking(last: impl Fn(Arc<Order>) -> StepFuture + Send + Sync + 'static) -> Saga<Order> {
    Saga::<Order>::named("place-order")
        .step("take-payment", does("charge"))
        .compensate_with(does("refund"))
        .step("reserve-stock", does("reserve"))
        .compensate_with(does("release"))
        .step("book-courier", last)
        .build()
        .expect("a valid saga")
}

#[tokio::test]
async fn happy_path_runs_every_step_in_order_and_compensates_nothing() {
    let order = Arc::new(Order::default());
    let r = booking(does("courier")).run(order.clone()).await;
    assert!(r.is_complete() && !r.compensated() && !r.has_unresolved());
    assert_eq!(r.failed_at(), None);
    assert!(r.failure().is_none());
    assert_eq!(
        r.completed(),
        ["take-payment", "reserve-stock", "book-courier"]
    );
    assert_eq!(order.journal(), ["charge", "reserve", "courier"]);
    assert_eq!(
        r.to_string(),
        "SagaResult{place-order completed: take-payment -> reserve-stock -> book-courier}"
    );
}

#[tokio::test]
async fn a_failure_compensates_the_completed_steps_in_reverse_order() {
    let order = Arc::new(Order::default());
    let r = booking(fails("courier")).run(order.clone()).await;
    assert!(r.compensated() && !r.is_complete() && !r.has_unresolved());
    assert_eq!(r.failed_at(), Some("book-courier"));
    assert_eq!(
        r.failure().map(|f| f.to_string()).as_deref(),
        Some("courier failed")
    );
    assert_eq!(r.completed(), ["take-payment", "reserve-stock"]);
    assert_eq!(
        order.journal(),
        ["charge", "reserve", "courier", "release", "refund"]
    );
}

#[tokio::test]
async fn only_the_steps_that_ran_are_compensated_and_the_failing_one_is_not() {
    let order = Arc::new(Order::default());
    let saga = Saga::<Order>::named("s")
        .step("one", does("one"))
        .compensate_with(does("undo one"))
        .step("two", fails("two"))
        .compensate_with(does("undo two"))
        .step("three", does("three"))
        .compensate_with(does("undo three"))
        .build()
        .unwrap();
    let r = saga.run(order.clone()).await;
    assert_eq!(r.failed_at(), Some("two"));
    assert_eq!(r.completed(), ["one"]);
    assert_eq!(order.journal(), ["one", "two", "undo one"]);
}

#[tokio::test]
async fn a_step_without_a_compensation_is_skipped_not_an_error() {
    let order = Arc::new(Order::default());
    let saga = Saga::<Order>::named("s")
        .step("one", does("one"))
        .compensate_with(does("undo one"))
        .step("lookup", does("lookup"))
        .step("three", does("three"))
        .compensate_with(does("undo three"))
        .step("four", fails("four"))
        .build()
        .unwrap();
    let r = saga.run(order.clone()).await;
    assert!(!r.has_unresolved(), "{r}");
    assert_eq!(r.completed(), ["one", "lookup", "three"]);
    assert_eq!(
        order.journal(),
        ["one", "lookup", "three", "four", "undo three", "undo one"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_compensation_is_unresolved_and_the_rest_still_run() {
    let order = Arc::new(Order::default());
    let saga = Saga::<Order>::named("place-order")
        .step("take-payment", does("charge"))
        .compensate_with(does("refund"))
        .step("reserve-stock", does("reserve"))
        .compensate_with(fails("release"))
        .step("book-courier", fails("courier"))
        .build()
        .unwrap();
    let r = saga.run(order.clone()).await;
    assert_eq!(r.unresolved(), ["reserve-stock"]);
    assert!(r.has_unresolved() && r.compensated());
    assert_eq!(
        r.unresolved_reason("reserve-stock")
            .map(|f| f.to_string())
            .as_deref(),
        Some("release failed")
    );
    // Tried three times (the default), and the refund still ran after it.
    assert_eq!(
        order.journal(),
        [
            "charge", "reserve", "courier", "release", "release", "release", "refund"
        ]
    );
    let text = r.to_string();
    assert!(text.contains("UNRESOLVED [reserve-stock]"), "{text}");
    assert!(text.contains("failed at book-courier"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_compensation_that_fails_twice_then_succeeds_is_not_unresolved() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let order = Arc::new(Order::default());
    let saga = Saga::<Order>::named("s")
        .options(SagaOptions::default().compensation_retry(3, Duration::from_millis(100)))
        .step("reserve-stock", does("reserve"))
        .compensate_with(move |o: Arc<Order>| {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                o.note(&format!("release #{n}"));
                if n < 3 {
                    return Err("inventory unavailable".into());
                }
                Ok(())
            }
        })
        .step("charge", fails("charge"))
        .build()
        .unwrap();
    let started = Instant::now();
    let r = saga.run(order.clone()).await;
    assert!(!r.has_unresolved(), "{r}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        order.journal(),
        [
            "reserve",
            "charge",
            "release #1",
            "release #2",
            "release #3"
        ]
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(300),
        "100 ms, then 200 ms"
    );
}

#[tokio::test]
async fn a_panicking_step_is_a_failure_and_the_earlier_steps_are_compensated() {
    let order = Arc::new(Order::default());
    let r = booking(|_o: Arc<Order>| Box::pin(async { panic!("courier API exploded") }))
        .run(order.clone())
        .await;
    assert_eq!(r.failed_at(), Some("book-courier"));
    assert!(
        matches!(r.failure(), Some(StepFailure::Panicked(m)) if m == "courier API exploded"),
        "{r}"
    );
    assert_eq!(order.journal(), ["charge", "reserve", "release", "refund"]);
}

#[test]
fn the_builder_refuses_what_the_family_refuses_and_empty_names() {
    let e = Saga::<Order>::named("empty").build().unwrap_err();
    assert!(
        matches!(e, SagaError::NoSteps { ref saga } if saga == "empty"),
        "{e}"
    );

    let e = Saga::<Order>::named("dup")
        .step("reserve-stock", does("a"))
        .step("reserve-stock", does("b"))
        .build()
        .unwrap_err();
    assert!(
        matches!(e, SagaError::DuplicateStep { ref step, .. } if step == "reserve-stock"),
        "{e}"
    );
    assert!(e.to_string().contains("give each step its own"), "{e}");

    let e = Saga::<Order>::named("early")
        .compensate_with(does("undo"))
        .build()
        .unwrap_err();
    assert!(matches!(e, SagaError::CompensationBeforeStep { .. }), "{e}");

    let e = Saga::<Order>::named("")
        .step("a", does("a"))
        .build()
        .unwrap_err();
    assert_eq!(e, SagaError::EmptySagaName);
    let e = Saga::<Order>::named("s")
        .step("", does("a"))
        .build()
        .unwrap_err();
    assert!(
        matches!(e, SagaError::EmptyStepName { position: 1, .. }),
        "{e}"
    );
}

/// The drop happens in the middle of step 3, which awaits something that never comes:
/// the caller's `timeout` gives up and drops the saga's future. Steps 2 and 1 must still
/// be compensated, in that order, and step 3 must not be.
#[tokio::test(start_paused = true)]
async fn a_future_dropped_mid_run_still_compensates_the_completed_steps() {
    let order = Arc::new(Order::default());
    let saga = Saga::<Order>::named("dropped")
        .step("one", does("one"))
        .compensate_with(does("undo one"))
        .step("two", does("two"))
        .compensate_with(does("undo two"))
        .step("three", |o: Arc<Order>| async move {
            o.note("three started");
            futures::future::pending::<()>().await;
            o.note("three finished");
            Ok(())
        })
        .compensate_with(does("undo three"))
        .build()
        .unwrap();

    let gave_up = timeout(Duration::from_secs(1), saga.run(order.clone())).await;
    assert!(
        gave_up.is_err(),
        "the caller gave up: the saga's future is dropped"
    );
    // Step 3 was in flight when it was dropped.
    assert_eq!(order.journal(), ["one", "two", "three started"]);

    until("the detached compensations", || order.journal().len() == 5).await;
    assert_eq!(
        order.journal(),
        ["one", "two", "three started", "undo two", "undo one"]
    );
    // Nothing more comes: step 3 was cancelled, not compensated, not finished.
    sleep(Duration::from_secs(60)).await;
    assert_eq!(order.journal().len(), 5);
}

/// Dropped while compensating (the first compensation is slow): the compensations carry
/// on to the end on their own task.
#[tokio::test(start_paused = true)]
async fn a_future_dropped_while_compensating_still_finishes_the_compensations() {
    let order = Arc::new(Order::default());
    let saga = Saga::<Order>::named("slow-undo")
        .step("one", does("one"))
        .compensate_with(does("undo one"))
        .step("two", does("two"))
        .compensate_with(|o: Arc<Order>| async move {
            sleep(Duration::from_secs(2)).await;
            o.note("undo two");
            Ok(())
        })
        .step("three", fails("three"))
        .build()
        .unwrap();
    let gave_up = timeout(Duration::from_millis(500), saga.run(order.clone())).await;
    assert!(gave_up.is_err());
    assert_eq!(order.journal(), ["one", "two", "three"]);
    until("the compensations", || order.journal().len() == 5).await;
    assert_eq!(
        order.journal(),
        ["one", "two", "three", "undo two", "undo one"]
    );
}
