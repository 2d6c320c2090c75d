//! Replay and purge from the console: a dry run that counts, a confirmation naming that
//! count, the pass itself as a background job with progress over server-sent events, and
//! its summary (scanned, replayed or purged, declined, failed). And the live queue counts
//! the queues page listens to.
//!
//! Every pass is the library's own bounded one ([`crate::replay::Replay::dry_run_matching`],
//! `replay_matching`, `purge_matching`). A confirmed pass takes only the messages its dry
//! run listed (by id, up to [`MAX_LISTED_IDS`]) and never more than the confirmed count.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Form;
use axum::extract::{Path, State as AxState};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use futures::Stream;
use maud::html;
use serde_json::json;

use super::pages::{Selection, enc, hidden_filter, layout};
use super::{BASE_PATH, State, auth};
use crate::replay::{ReplayProgress, ReplayReport};

/// A dry run's ids are carried into the confirmation up to this many; beyond, the
/// confirmed pass goes by the filter and the count alone.
pub const MAX_LISTED_IDS: usize = 1_000;

/// How many jobs' pages the console remembers (finished ones are forgotten first).
const MAX_JOBS_KEPT: usize = 100;

/// What a pass does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Replay,
    Purge,
}

impl Action {
    fn parse(s: Option<&String>) -> Option<Action> {
        match s.map(String::as_str) {
            Some("replay") => Some(Action::Replay),
            Some("purge") => Some(Action::Purge),
            _ => None,
        }
    }
    fn word(self) -> &'static str {
        match self {
            Action::Replay => "replay",
            Action::Purge => "purge",
        }
    }
}

/// One confirmed pass, as its page shows it.
#[derive(Debug)]
pub(crate) struct Job {
    action: Action,
    from: String,
    to: String,
    confirmed: usize,
    progress: ReplayProgress,
    outcome: Option<Result<ReplayReport, String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn form_map(pairs: Vec<(String, String)>) -> HashMap<String, String> {
    pairs.into_iter().collect()
}

fn csrf_ok(state: &State, form: &HashMap<String, String>) -> bool {
    form.get("csrf").is_some_and(|c| auth::same(c, &state.csrf))
}

fn refuse(state: &State, status: StatusCode, why: &str) -> Response {
    let body = html! { p.refused { (why) } };
    (status, layout(state, "Refused", body)).into_response()
}

/// `POST /q/{queue}/dry-run`: counts what a replay or purge would take.
pub(crate) async fn dry_run(
    AxState(state): AxState<Arc<State>>,
    Path(queue): Path<String>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let form = form_map(pairs);
    if !csrf_ok(&state, &form) {
        return refuse(
            &state,
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or stale: reload the page and try again",
        );
    }
    let Some(action) = Action::parse(form.get("action")) else {
        return refuse(
            &state,
            StatusCode::BAD_REQUEST,
            "say what to do: action=replay or action=purge",
        );
    };
    let sel = Selection::from_pairs(&form);
    if let Err(e) = sel.filter.older_than() {
        return refuse(&state, StatusCode::BAD_REQUEST, &e);
    }
    let max = form
        .get("max")
        .and_then(|m| m.trim().parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    let replay = state.replay(&queue, sel.parked);
    let filter = sel.filter.clone();
    let report = match replay
        .dry_run_matching(max, |d| filter.accepts_dead_letter(d))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return refuse(
                &state,
                StatusCode::BAD_GATEWAY,
                &format!("the dry run failed: {e}"),
            );
        }
    };
    let count = report.matched_ids.len();
    let from = replay.from_queue().to_owned();
    let base = format!("{BASE_PATH}/q/{}", enc(&queue));
    let verb = match action {
        Action::Replay => format!("Replay {count} messages from {from} to {queue}"),
        Action::Purge => format!("Purge {count} messages from {from}"),
    };
    let ids = (count <= MAX_LISTED_IDS).then(|| report.matched_ids.join("\n"));
    let body = html! {
        p.summary #dry-run {
            "Dry run: " strong #dry-count { (count) } " of " span #dry-scanned { (report.scanned) }
            " scanned match. Nothing moved."
        }
        @if count == 0 {
            p { "Nothing to " (action.word()) ". " a href={ (base) "?from=" (sel.companion()) } { "Back" } }
        } @else {
            form.confirm #confirm method="post" action={ (base) "/run" } {
                input type="hidden" name="csrf" value=(state.csrf);
                input type="hidden" name="action" value=(action.word());
                input type="hidden" name="confirm" value=(count);
                @if let Some(ids) = &ids { input type="hidden" name="ids" value=(ids); }
                (hidden_filter(&sel))
                p.warn { (verb) "? " @if action == Action::Purge { "Purged messages are gone for good." } }
                button.danger type="submit" #confirm-button { (verb) }
                " " a href={ (base) "?from=" (sel.companion()) } { "Cancel" }
            }
        }
    };
    layout(&state, &format!("Confirm: {}", action.word()), body).into_response()
}

/// `POST /q/{queue}/run`: the confirmed pass, started in the background.
pub(crate) async fn run(
    AxState(state): AxState<Arc<State>>,
    Path(queue): Path<String>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let form = form_map(pairs);
    if !csrf_ok(&state, &form) {
        return refuse(
            &state,
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or stale: reload the page and try again",
        );
    }
    let Some(action) = Action::parse(form.get("action")) else {
        return refuse(
            &state,
            StatusCode::BAD_REQUEST,
            "say what to do: action=replay or action=purge",
        );
    };
    let Some(confirmed) = form
        .get("confirm")
        .and_then(|c| c.trim().parse::<usize>().ok())
    else {
        return refuse(
            &state,
            StatusCode::BAD_REQUEST,
            "a pass needs the confirmation its dry run asks for: run the dry run first",
        );
    };
    let sel = Selection::from_pairs(&form);
    let ids: Option<HashSet<String>> = form.get("ids").map(|s| {
        s.lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect()
    });
    let job_id = uuid::Uuid::new_v4().simple().to_string();
    let replay = state.replay(&queue, sel.parked);
    let job = Arc::new(Mutex::new(Job {
        action,
        from: replay.from_queue().to_owned(),
        to: queue.clone(),
        confirmed,
        progress: ReplayProgress::default(),
        outcome: None,
    }));
    {
        let mut jobs = lock(&state.jobs);
        // Keep the page of every running job and of the latest finished ones.
        if jobs.len() >= MAX_JOBS_KEPT {
            let finished: Vec<String> = jobs
                .iter()
                .filter(|(_, j)| lock(j).outcome.is_some())
                .map(|(id, _)| id.clone())
                .collect();
            for id in finished.iter().take(jobs.len() + 1 - MAX_JOBS_KEPT) {
                jobs.remove(id);
            }
        }
        jobs.insert(job_id.clone(), job.clone());
    }
    let seen = job.clone();
    let replay = replay.on_progress(move |p| lock(&seen).progress = *p);
    let filter = sel.filter.clone();
    tokio::spawn(async move {
        let mut taken = 0usize;
        let accept = |d: &crate::replay::DeadLetter<'_>| {
            let ok = taken < confirmed
                && ids.as_ref().is_none_or(|ids| ids.contains(d.envelope.id()))
                && filter.accepts_dead_letter(d);
            if ok {
                taken += 1;
            }
            ok
        };
        let outcome = match action {
            Action::Replay => replay.replay_matching(confirmed, accept).await,
            Action::Purge => replay.purge_matching(accept).await,
        };
        if let Err(e) = &outcome {
            tracing::warn!(from = %replay.from_queue(), "console {} stopped: {e}", action.word());
        }
        lock(&job).outcome = Some(outcome.map_err(|e| e.to_string()));
    });
    Redirect::to(&format!("{BASE_PATH}/jobs/{job_id}")).into_response()
}

fn job_json(j: &Job) -> serde_json::Value {
    let (moved, declined, failed, scanned, error) = match &j.outcome {
        Some(Ok(r)) => (r.replayed + r.purged, r.declined, r.failed, r.scanned, None),
        Some(Err(e)) => (
            j.progress.replayed,
            j.progress.declined,
            j.progress.failed,
            j.progress.scanned,
            Some(e.clone()),
        ),
        None => (
            j.progress.replayed,
            j.progress.declined,
            j.progress.failed,
            j.progress.scanned,
            None,
        ),
    };
    json!({
        "status": match &j.outcome { None => "running", Some(Ok(_)) => "done", Some(Err(_)) => "failed" },
        "scanned": scanned,
        "moved": moved,
        "declined": declined,
        "failed": failed,
        "total": j.progress.total_hint,
        "error": error,
    })
}

/// `/jobs/{id}`: a pass's progress and, once it ends, its summary.
pub(crate) async fn job_page(
    AxState(state): AxState<Arc<State>>,
    Path(id): Path<String>,
) -> Response {
    let Some(job) = lock(&state.jobs).get(&id).cloned() else {
        return refuse(
            &state,
            StatusCode::NOT_FOUND,
            "no such job (jobs are forgotten when the console restarts)",
        );
    };
    let (j, title) = {
        let g = lock(&job);
        let title = match g.action {
            Action::Replay => format!("Replay {} → {}", g.from, g.to),
            Action::Purge => format!("Purge {}", g.from),
        };
        (job_json(&g), title)
    };
    let moved_label = match lock(&job).action {
        Action::Replay => "replayed",
        Action::Purge => "purged",
    };
    let (confirmed, from, to) = {
        let g = lock(&job);
        (g.confirmed, g.from.clone(), g.to.clone())
    };
    let n = |k: &str| j[k].as_u64().unwrap_or(0);
    let body = html! {
        div #job data-events={ (BASE_PATH) "/jobs/" (id) "/events" } {
            p { "Status: " strong #status { (j["status"].as_str().unwrap_or("")) } " · confirmed " (confirmed) }
            @let max = j["total"].as_u64().unwrap_or(confirmed as u64).max(1);
            progress #bar max=(max) value=(if j["status"] == "running" { n("scanned") } else { max }) {}
            table.fields #summary {
                tr { th { "scanned" } td #scanned { (n("scanned")) } }
                tr { th { (moved_label) } td #moved { (n("moved")) } }
                tr { th { "declined" } td #declined { (n("declined")) } }
                tr { th { "failed" } td #failed { (n("failed")) } }
            }
            p.error #job-error { (j["error"].as_str().unwrap_or("")) }
            p { a href={ (BASE_PATH) "/q/" (enc(&to)) "?from=" (if from.ends_with(".parked") { "parked" } else { "dlq" }) } { "← " (from) } }
        }
    };
    layout(&state, &title, body).into_response()
}

/// `/jobs/{id}/events`: the job's counts every 250 ms until it ends.
pub(crate) async fn job_events(
    AxState(state): AxState<Arc<State>>,
    Path(id): Path<String>,
) -> Response {
    let Some(job) = lock(&state.jobs).get(&id).cloned() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let stream = futures::stream::unfold((job, false), |(job, ended)| async move {
        if ended {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (data, done) = {
            let g = lock(&job);
            (job_json(&g), g.outcome.is_some())
        };
        let ev = Event::default().event("job").data(data.to_string());
        Some((Ok::<_, Infallible>(ev), (job, done)))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `/events`: every queue's counts and rates every 2 s.
pub(crate) async fn queue_events(
    AxState(state): AxState<Arc<State>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures::stream::unfold((state, true), |(state, first)| async move {
        if !first {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let data = match state.queues().await {
            Ok(qs) => json!(
                qs.iter()
                    .map(|q| json!({
                        "name": q.name,
                        "ready": q.ready,
                        "unacked": q.unacked,
                        "consumers": q.consumers,
                        "publish_rate": q.publish_rate,
                        "deliver_rate": q.deliver_rate,
                    }))
                    .collect::<Vec<_>>()
            ),
            Err(e) => json!({ "error": e }),
        };
        let ev = Event::default().event("queues").data(data.to_string());
        Some((Ok(ev), (state, false)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
