use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::with_local_recorder;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use super::*;

type Log = Arc<Mutex<Vec<String>>>;

fn ok_step(
    log: &Log,
    what: &'static str,
) -> impl Fn(Arc<()>) -> BoxFuture<'static, Result<(), StepError>> + Send + Sync + 'static {
    let log = log.clone();
    move |_| {
        let log = log.clone();
        async move {
            crate::util::lock(&log).push(what.to_owned());
            Ok(())
        }
        .boxed()
    }
}

fn entries(log: &Log) -> Vec<String> {
    crate::util::lock(log).clone()
}

#[test]
fn the_builder_refuses_with_a_message_that_says_what_to_do() {
    let noop = |_: Arc<()>| async { Ok(()) };
    let e = Saga::<()>::named("s").build().unwrap_err();
    assert_eq!(e, SagaError::NoSteps { saga: "s".into() });
    assert!(e.to_string().contains(".step(name, action)"), "{e}");

    let e = Saga::<()>::named("").step("a", noop).build().unwrap_err();
    assert_eq!(e, SagaError::EmptySagaName);

    let e = Saga::<()>::named("s")
        .step("a", noop)
        .step("", noop)
        .build()
        .unwrap_err();
    assert_eq!(
        e,
        SagaError::EmptyStepName {
            saga: "s".into(),
            position: 2
        }
    );

    let e = Saga::<()>::named("s")
        .compensate_with(noop)
        .step("a", noop)
        .build()
        .unwrap_err();
    assert_eq!(e, SagaError::CompensationBeforeStep { saga: "s".into() });
    assert!(
        e.to_string().contains("call .step(name, action) first"),
        "{e}"
    );

    let e = Saga::<()>::named("s")
        .step("a", noop)
        .compensate_with(noop)
        .compensate_with(noop)
        .build()
        .unwrap_err();
    assert_eq!(
        e,
        SagaError::DuplicateCompensation {
            saga: "s".into(),
            step: "a".into()
        }
    );

    // The first refusal wins, even when a later one follows.
    let e = Saga::<()>::named("s")
        .step("a", noop)
        .step("a", noop)
        .step("", noop)
        .build()
        .unwrap_err();
    assert_eq!(
        e,
        SagaError::DuplicateStep {
            saga: "s".into(),
            step: "a".into()
        }
    );
}

#[test]
fn backoff_doubles_from_the_first_wait_and_is_capped() {
    let o = SagaOptions::default().compensation_retry(20, Duration::from_millis(100));
    assert_eq!(o.backoff_after(1), Duration::from_millis(100));
    assert_eq!(o.backoff_after(2), Duration::from_millis(200));
    assert_eq!(o.backoff_after(3), Duration::from_millis(400));
    assert_eq!(o.backoff_after(19), MAX_COMPENSATION_BACKOFF);
    assert_eq!(o.backoff_after(u32::MAX), MAX_COMPENSATION_BACKOFF);
}

#[tokio::test(start_paused = true)]
async fn a_failing_compensation_is_retried_on_the_backoff_then_unresolved() {
    let tries: Arc<Mutex<Vec<tokio::time::Instant>>> = Arc::default();
    let t = tries.clone();
    let saga = Saga::<()>::named("s")
        .options(SagaOptions::default().compensation_retry(3, Duration::from_millis(100)))
        .step("a", |_: Arc<()>| async { Ok(()) })
        .compensate_with(move |_: Arc<()>| {
            crate::util::lock(&t).push(tokio::time::Instant::now());
            async { Err("down".into()) }
        })
        .step("b", |_: Arc<()>| async { Err("no".into()) })
        .build()
        .unwrap();
    let r = saga.run(()).await;
    assert_eq!(r.unresolved(), ["a"]);
    assert_eq!(
        r.unresolved_reason("a").map(|f| f.to_string()).as_deref(),
        Some("down")
    );
    let tries = crate::util::lock(&tries).clone();
    assert_eq!(tries.len(), 3, "three attempts");
    assert_eq!(tries[1] - tries[0], Duration::from_millis(100));
    assert_eq!(tries[2] - tries[1], Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_whole_compensation_phase() {
    let log: Log = Arc::default();
    let saga = Saga::<()>::named("s")
        .options(
            SagaOptions::default()
                .compensation_retry(100, Duration::from_secs(1))
                .compensation_deadline(Duration::from_secs(5)),
        )
        .step("first", ok_step(&log, "first"))
        .compensate_with(ok_step(&log, "undo first"))
        .step("hangs", |_: Arc<()>| async { Ok(()) })
        .compensate_with(|_: Arc<()>| async {
            futures::future::pending::<()>().await;
            Ok(())
        })
        .step("fails", |_: Arc<()>| async { Err("no".into()) })
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let r = saga.run(()).await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(5),
        "stopped at the deadline"
    );
    // The hanging one timed out; the one after it had no time left: both unresolved.
    assert_eq!(r.unresolved(), ["hangs", "first"]);
    assert_eq!(
        entries(&log),
        ["first"],
        "never attempted past the deadline"
    );
    assert!(r.to_string().contains("UNRESOLVED [hangs, first]"), "{r}");
    assert!(matches!(
        r.unresolved_reason("hangs"),
        Some(StepFailure::DeadlinePassed)
    ));
    assert!(matches!(
        r.unresolved_reason("first"),
        Some(StepFailure::DeadlinePassed)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_compensation_is_a_failed_attempt_not_a_crash() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let saga = Saga::<()>::named("s")
        .step("a", |_: Arc<()>| async { Ok(()) })
        .compensate_with(move |_: Arc<()>| {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    panic!("first try explodes");
                }
                Ok(())
            }
        })
        .step("b", |_: Arc<()>| async { Err("no".into()) })
        .build()
        .unwrap();
    let r = saga.run(()).await;
    assert!(!r.has_unresolved(), "{r}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_step_that_panics_while_making_its_future_is_a_failure() {
    let saga = Saga::<()>::named("s")
        .step(
            "a",
            |_: Arc<()>| -> BoxFuture<'static, Result<(), StepError>> {
                panic!("before the future")
            },
        )
        .build()
        .unwrap();
    let r = saga.run(()).await;
    assert!(
        matches!(r.failure(), Some(StepFailure::Panicked(m)) if m == "before the future"),
        "{r}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_detached_hook_gets_the_result_of_an_abandoned_saga() {
    let (tx, rx) = tokio::sync::oneshot::channel::<String>();
    let tx = Mutex::new(Some(tx));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = Mutex::new(Some(started_tx));
    let saga = Saga::<()>::named("s")
        .options(SagaOptions::default().on_detached(move |r| {
            if let Some(tx) = crate::util::lock(&tx).take() {
                let _ = tx.send(r.to_string());
            }
        }))
        .step("a", |_: Arc<()>| async { Ok(()) })
        .compensate_with(|_: Arc<()>| async { Ok(()) })
        .step("waits", move |_: Arc<()>| {
            if let Some(tx) = crate::util::lock(&started_tx).take() {
                let _ = tx.send(());
            }
            futures::future::pending::<Result<(), StepError>>()
        })
        .build()
        .unwrap();
    let run = tokio::spawn(saga.run(()));
    started_rx.await.unwrap();
    run.abort();
    let text = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .expect("the hook is called")
        .unwrap();
    assert!(text.contains("failed at waits (abandoned"), "{text}");
    assert!(
        text.contains("compensated [a]") && !text.contains("UNRESOLVED"),
        "{text}"
    );
}

fn counter(
    snapshot: &[(metrics_util::CompositeKey, DebugValue)],
    name: &str,
    labels: &[(&str, &str)],
) -> u64 {
    snapshot
        .iter()
        .filter(|(k, _)| k.key().name() == name)
        .filter(|(k, _)| {
            let mut have: Vec<(&str, &str)> =
                k.key().labels().map(|l| (l.key(), l.value())).collect();
            have.sort();
            let mut want = labels.to_vec();
            want.sort();
            have == want
        })
        .map(|(_, v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

#[test]
fn outcomes_are_counted_by_saga_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let ok = Saga::<()>::named("m")
                .step("a", |_: Arc<()>| async { Ok(()) })
                .build()
                .unwrap();
            ok.run(()).await;
            ok.run(()).await;
            let undone = Saga::<()>::named("m")
                .step("a", |_: Arc<()>| async { Ok(()) })
                .compensate_with(|_: Arc<()>| async { Ok(()) })
                .step("b", |_: Arc<()>| async { Err("no".into()) })
                .build()
                .unwrap();
            undone.run(()).await;
            let stuck = Saga::<()>::named("m")
                .step("a", |_: Arc<()>| async { Ok(()) })
                .compensate_with(|_: Arc<()>| async { Err("no".into()) })
                .step("b", |_: Arc<()>| async { Ok(()) })
                .compensate_with(|_: Arc<()>| async { Err("no".into()) })
                .step("c", |_: Arc<()>| async { Err("no".into()) })
                .build()
                .unwrap();
            stuck.run(()).await;
        });
    });
    let snap: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();
    let total = |outcome| {
        counter(
            &snap,
            SAGA_TOTAL_NAME,
            &[("saga", "m"), ("outcome", outcome)],
        )
    };
    assert_eq!(total("completed"), 2);
    assert_eq!(total("compensated"), 1);
    assert_eq!(total("unresolved"), 1);
    assert_eq!(
        counter(&snap, "acemq.saga.compensating.total", &[("saga", "m")]),
        2
    );
    assert_eq!(
        counter(&snap, "acemq.saga.unresolved.total", &[("saga", "m")]),
        2,
        "one per step"
    );
}

const SAGA_TOTAL_NAME: &str = crate::observe::metrics::SAGA_TOTAL;

#[test]
fn the_saga_metrics_are_described_as_rust_only() {
    use crate::observe::metrics::{RUST_ONLY_METRICS, spec_of};
    for name in [
        "acemq.saga.total",
        "acemq.saga.compensating.total",
        "acemq.saga.unresolved.total",
    ] {
        assert!(RUST_ONLY_METRICS.iter().any(|m| m.name == name), "{name}");
        assert!(
            spec_of(name).is_some_and(|m| m.labels.contains(&"saga")),
            "{name}"
        );
    }
}
