//! The console's read-only pages: queues with their companions, stuck queues, a queue's
//! dead letters grouped by reason and type, one message in full; the layout they share,
//! and the script and style sheet (hand-written, `include_str!`, no build step).
//!
//! Everything interpolated into a page goes through maud's escaping; nothing from a
//! message is ever written with `PreEscaped`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State as AxState};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, html};

use super::filter::{Filter, age};
use super::{BASE_PATH, QueueStat, State};
use crate::headers::HeaderValue;
use crate::replay::PeekedMessage;

const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// `/acemq-console` → `/acemq-console/`.
pub(crate) async fn to_index() -> Redirect {
    Redirect::to(&format!("{BASE_PATH}/"))
}

pub(crate) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

pub(crate) async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// The page frame: navigation, what it is connected to, whether it is read-only.
pub(crate) fn layout(state: &State, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · AceMQ console" }
                link rel="stylesheet" href={ (BASE_PATH) "/assets/console.css" };
                script src={ (BASE_PATH) "/assets/console.js" } defer {}
            }
            body data-base=(BASE_PATH) {
                header {
                    a.brand href={ (BASE_PATH) "/" } { "AceMQ console" }
                    nav {
                        a href={ (BASE_PATH) "/" } { "Queues" }
                        a href={ (BASE_PATH) "/stuck" } { "Stuck" }
                    }
                    span.broker { (state.broker_label) }
                    @if state.allow_mutations {
                        span.badge.write { "replay & purge allowed" }
                    } @else {
                        span.badge.ro { "read-only" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// A bare page for a refusal (no navigation: the caller may not be allowed to see any).
pub(crate) fn error_page(status: StatusCode, why: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { (status.as_u16()) " · AceMQ console" } }
            body { h1 { (status) } p.refused { (why) } }
        }
    }
}

/// What a queue name is to its source queue.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Source,
    Dlq,
    Parked,
    Rung,
}

fn role(name: &str) -> (String, Role) {
    if let Some(s) = name.strip_suffix(".dlq") {
        (s.to_owned(), Role::Dlq)
    } else if let Some(s) = name.strip_suffix(".parked") {
        (s.to_owned(), Role::Parked)
    } else if let Some((s, _)) = name.rsplit_once(".retry.") {
        (s.to_owned(), Role::Rung)
    } else {
        (name.to_owned(), Role::Source)
    }
}

/// One source queue and its companions.
#[derive(Default)]
struct Family {
    source: Option<QueueStat>,
    dlq: Option<QueueStat>,
    parked: Option<QueueStat>,
    rungs: Vec<QueueStat>,
}

fn families(queues: Vec<QueueStat>) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for q in queues {
        let (source, r) = role(&q.name);
        let f = out.entry(source).or_default();
        match r {
            Role::Source => f.source = Some(q),
            Role::Dlq => f.dlq = Some(q),
            Role::Parked => f.parked = Some(q),
            Role::Rung => f.rungs.push(q),
        }
    }
    out
}

fn opt(n: Option<u64>) -> String {
    n.map_or_else(|| "–".into(), |n| n.to_string())
}

fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.1}/s"))
}

fn live(q: &QueueStat, field: &str, text: String) -> Markup {
    html! { span data-q=(q.name) data-f=(field) { (text) } }
}

/// `/`: every source queue with its `.dlq`, `.parked` and rungs.
pub(crate) async fn queues(AxState(state): AxState<Arc<State>>) -> Markup {
    let body = match state.queues().await {
        Err(e) => html! { p.error { (e) } },
        Ok(qs) => {
            let fams = families(qs);
            html! {
                p.hint { "Counts update live. Click a column to sort. A dead-letter count links to its messages." }
                table.sortable #queues {
                    thead { tr {
                        th { "Queue" } th { "Type" } th.num { "Ready" } th.num { "Unacked" }
                        th.num { "Consumers" } th.num { "In" } th.num { "Out" } th { "Rate" }
                        th.num { "Dead letters" } th.num { "Parked" } th { "Retry rungs" }
                    } }
                    tbody {
                        @for (name, f) in &fams {
                            tr {
                                td.name { (name) }
                                @if let Some(q) = &f.source {
                                    td { (q.queue_type.clone().unwrap_or_default()) }
                                    td.num { (live(q, "ready", q.ready.to_string())) }
                                    td.num { (live(q, "unacked", opt(q.unacked))) }
                                    td.num { (live(q, "consumers", opt(q.consumers))) }
                                    td.num { (live(q, "publish_rate", rate(q.publish_rate))) }
                                    td.num { (live(q, "deliver_rate", rate(q.deliver_rate))) }
                                    td { span.spark data-q=(q.name) {} }
                                } @else {
                                    td colspan="7" { span.dim { "source queue not found" } }
                                }
                                td.num {
                                    @if let Some(d) = &f.dlq {
                                        a href={ (BASE_PATH) "/q/" (enc(name)) } { (live(d, "ready", d.ready.to_string())) }
                                    } @else { span.dim { "–" } }
                                }
                                td.num {
                                    @if let Some(p) = &f.parked {
                                        a href={ (BASE_PATH) "/q/" (enc(name)) "?from=parked" } { (live(p, "ready", p.ready.to_string())) }
                                    } @else { span.dim { "–" } }
                                }
                                td {
                                    @for r in &f.rungs {
                                        span.rung title=(r.name) { (r.name.rsplit('.').next().unwrap_or("")) ": " (live(r, "ready", r.ready.to_string())) }
                                        " "
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout(&state, "Queues", body)
}

/// `/stuck`: what waits and nothing takes.
pub(crate) async fn stuck(AxState(state): AxState<Arc<State>>) -> Markup {
    let body = match state.queues().await {
        Err(e) => html! { p.error { (e) } },
        Ok(qs) => {
            let mut rows: Vec<(String, String, String)> = Vec::new();
            for q in &qs {
                let (source, r) = role(&q.name);
                match r {
                    Role::Source if q.ready > 0 && q.consumers == Some(0) => {
                        let what = if q.name == "acemq.schedule.due" {
                            "scheduler backlog: due messages and no scheduler consuming"
                        } else {
                            "ready messages and no consumer"
                        };
                        rows.push((q.name.clone(), what.into(), format!("{} ready", q.ready)));
                    }
                    Role::Dlq if q.ready > 0 => rows.push((
                        q.name.clone(),
                        format!("dead letters of {source} wait for a decision"),
                        format!("{} dead letters", q.ready),
                    )),
                    Role::Parked if q.ready > 0 => rows.push((
                        q.name.clone(),
                        format!("parked messages of {source}: unreadable, waiting for a fix"),
                        format!("{} parked", q.ready),
                    )),
                    // Rungs hold messages with no consumer by design: they wait out a TTL.
                    _ => {}
                }
            }
            html! {
                @if rows.is_empty() {
                    p.ok { "Nothing is stuck: every queue with ready messages has a consumer, and no dead letters or parked messages wait." }
                } @else {
                    table.sortable #stuck {
                        thead { tr { th { "Queue" } th { "Why" } th.num { "How much" } } }
                        tbody { @for (q, why, n) in &rows { tr { td.name { (q) } td { (why) } td.num { (n) } } } }
                    }
                }
                p.hint { "Halted ordered partitions and outbox lag are reported by a service's own /acemq-health, not by the broker." }
            }
        }
    };
    layout(&state, "Stuck", body)
}

/// A page's query string: which companion, how many to look at, and the filter.
pub(crate) struct Selection {
    pub(crate) parked: bool,
    pub(crate) limit: Option<usize>,
    pub(crate) filter: Filter,
}

impl Selection {
    pub(crate) fn from_pairs(pairs: &HashMap<String, String>) -> Selection {
        let get = |k: &str| pairs.get(k).filter(|v| !v.trim().is_empty()).cloned();
        Selection {
            parked: pairs.get("from").is_some_and(|f| f == "parked"),
            limit: get("limit").and_then(|l| l.trim().parse().ok()),
            filter: Filter {
                id: get("id"),
                message_type: get("type"),
                reason: get("reason"),
                header: get("header"),
                older: get("older"),
                body: get("body"),
            },
        }
    }

    pub(crate) fn companion(&self) -> &'static str {
        if self.parked { "parked" } else { "dlq" }
    }
}

/// The percent-encoding of a path segment or query value.
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query string for a companion and a filter.
pub(crate) fn query(parked: bool, f: &Filter) -> String {
    let mut q = vec![format!("from={}", if parked { "parked" } else { "dlq" })];
    q.extend(
        f.pairs()
            .into_iter()
            .map(|(k, v)| format!("{k}={}", enc(&v))),
    );
    q.join("&")
}

/// The hidden inputs that carry a filter into a form.
pub(crate) fn hidden_filter(sel: &Selection) -> Markup {
    html! {
        input type="hidden" name="from" value=(sel.companion());
        @for (k, v) in sel.filter.pairs() { input type="hidden" name=(k) value=(v); }
    }
}

/// A warning when the companion is a quorum queue or a stream (a peek costs a delivery).
pub(crate) async fn queue_warning(state: &State, name: &str) -> Option<String> {
    let qs = state.queues().await.ok()?;
    let t = qs.into_iter().find(|q| q.name == name)?.queue_type?;
    match t.as_str() {
        "quorum" => Some(format!(
            "{name} is a quorum queue: every look requeues, which counts a delivery toward its delivery limit and can reorder it."
        )),
        "stream" => Some(format!(
            "{name} is a stream: this console cannot peek it without a stream reader."
        )),
        _ => None,
    }
}

/// `/q/{queue}`: a queue's dead letters (or parked messages), grouped by reason and type.
pub(crate) async fn dead_letters(
    AxState(state): AxState<Arc<State>>,
    Path(queue): Path<String>,
    Query(pairs): Query<HashMap<String, String>>,
) -> Response {
    let sel = Selection::from_pairs(&pairs);
    let replay = state.replay(&queue, sel.parked);
    let from = replay.from_queue().to_owned();
    let title = from.clone();
    let limit = sel
        .limit
        .unwrap_or(state.peek_limit)
        .clamp(1, state.peek_limit);
    let pending = match state.mq.transport().inspect_queue(&from).await {
        Ok(i) => i.message_count,
        Err(e) if e.is_not_found() => {
            let body = html! { p.error { (from) " does not exist." } };
            return (StatusCode::NOT_FOUND, layout(&state, &title, body)).into_response();
        }
        Err(e) => {
            let body = html! { p.error { "cannot inspect " (from) ": " (e.to_string()) } };
            return (StatusCode::BAD_GATEWAY, layout(&state, &title, body)).into_response();
        }
    };
    let warning = queue_warning(&state, &from).await;
    let peeked = match replay.peek(limit).await {
        Ok(p) => p,
        Err(e) => {
            let body = html! { p.error { "cannot look at " (from) ": " (e.to_string()) } };
            return (StatusCode::BAD_GATEWAY, layout(&state, &title, body)).into_response();
        }
    };
    let bad_age = sel.filter.older_than().err();
    let matched: Vec<&PeekedMessage> = peeked
        .iter()
        .filter(|m| sel.filter.accepts_peeked(m))
        .collect();
    let mut groups: BTreeMap<(String, String), (usize, Option<Duration>)> = BTreeMap::new();
    for m in &matched {
        let key = (
            m.error
                .clone()
                .unwrap_or_else(|| "(no reason recorded)".into()),
            m.message_type.clone().unwrap_or_else(|| "(no type)".into()),
        );
        let g = groups.entry(key).or_insert((0, None));
        g.0 += 1;
        if let Some(a) = m.age {
            g.1 = Some(g.1.map_or(a, |o: Duration| o.max(a)));
        }
    }
    // Largest group first.
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(&b.0)));
    let base = format!("{BASE_PATH}/q/{}", enc(&queue));
    let body = html! {
        p.summary {
            span #pending data-q=(from) data-f="ready" { (pending) } " waiting in " code { (from) }
            " · looked at " (peeked.len())
            @if sel.filter.is_active() { " · " strong #matched { (matched.len()) } " match the filter" }
            " · back to " code { (queue) }
        }
        @if let Some(w) = &warning { p.warn { (w) } }
        @if let Some(e) = &bad_age { p.error { (e) } }
        @if u64::from(pending) > peeked.len() as u64 {
            p.hint { "Groups and the list count the first " (peeked.len()) " messages; a dry run counts them all." }
        }
        h2 { "By reason and type" }
        table.sortable #groups {
            thead { tr { th { "Reason" } th { "Type" } th.num { "Count" } th.num { "Oldest" } th {} } }
            tbody {
                @for ((reason, mtype), (n, oldest)) in &groups {
                    tr.group {
                        td.reason { (reason) }
                        td.type { (mtype) }
                        td.num.count { (n) }
                        td.num data-sort=(oldest.map_or(0, |a| a.as_secs())) { (oldest.map_or_else(|| "–".into(), age)) }
                        td {
                            @let f = Filter { reason: (reason != "(no reason recorded)").then(|| reason.clone()), message_type: (mtype != "(no type)").then(|| mtype.clone()), ..Filter::default() };
                            a href={ (base) "?" (query(sel.parked, &f)) } { "show" }
                        }
                    }
                }
            }
        }
        h2 { "Filter" }
        form.filter method="get" action=(base) {
            input type="hidden" name="from" value=(sel.companion());
            label { "type " input name="type" value=[sel.filter.message_type.as_deref()] placeholder="order.placed"; }
            label { "reason contains " input name="reason" value=[sel.filter.reason.as_deref()] placeholder="timeout"; }
            label { "header " input name="header" value=[sel.filter.header.as_deref()] placeholder="x-tenant=acme"; }
            label { "older than " input name="older" size="5" value=[sel.filter.older.as_deref()] placeholder="10m"; }
            label { "body contains " input name="body" value=[sel.filter.body.as_deref()]; }
            button type="submit" { "Filter" }
            " " a href={ (base) "?from=" (sel.companion()) } { "clear" }
        }
        @if state.allow_mutations {
            h2 { "Replay or purge what matches" }
            form.actions #actions method="post" action={ (base) "/dry-run" } {
                input type="hidden" name="csrf" value=(state.csrf);
                (hidden_filter(&sel))
                label { "at most " input name="max" size="6" placeholder="all"; " messages" }
                button type="submit" name="action" value="replay" { "Dry run: replay to " (queue) }
                button.danger type="submit" name="action" value="purge" { "Dry run: purge" }
                span.hint { " A dry run counts first; nothing moves until you confirm that count. A pass holds at most 100 messages it passes over; beyond that it moves them to the tail of the queue." }
            }
        }
        h2 { "Messages" }
        table.sortable #messages {
            thead { tr { th { "Id" } th { "Type" } th.num { "Attempt" } th { "Reason" } th.num { "Age" } th { "Replays" } } }
            tbody {
                @for m in &matched {
                    tr.msg {
                        td { @if let Some(id) = &m.id { a href={ (base) "/m/" (enc(id)) "?from=" (sel.companion()) } { (id) } } @else { "–" } }
                        td { (m.message_type.as_deref().unwrap_or("–")) }
                        td.num { (m.attempt.map_or_else(|| "–".into(), |a| a.to_string())) }
                        td.reason { (m.error.as_deref().unwrap_or("–")) }
                        td.num data-sort=(m.age.map_or(0, |a| a.as_secs())) { (m.age.map_or_else(|| "–".into(), age)) }
                        td { (m.replay_count.map_or_else(String::new, |n| n.to_string())) }
                    }
                }
            }
        }
    };
    layout(&state, &title, body).into_response()
}

/// A header value as text (tables and arrays written out).
fn header_value(v: &HeaderValue) -> String {
    match v {
        HeaderValue::Str(s) => s.clone(),
        HeaderValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        HeaderValue::Array(a) => {
            let items: Vec<String> = a.iter().map(header_value).collect();
            format!("[{}]", items.join(", "))
        }
        HeaderValue::Table(t) => {
            let items: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k}: {}", header_value(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        HeaderValue::Void => "void".into(),
        other => crate::replay::header_text(other).unwrap_or_else(|| format!("{other:?}")),
    }
}

/// A body: pretty JSON, else text, else a hex dump (at most 64 KiB shown).
fn body_view(body: &[u8]) -> (&'static str, String) {
    const MAX: usize = 64 * 1024;
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body)
        && let Ok(pretty) = serde_json::to_string_pretty(&v)
    {
        return ("JSON", pretty);
    }
    let shown = &body[..body.len().min(MAX)];
    if let Ok(text) = std::str::from_utf8(shown) {
        return ("text", text.to_owned());
    }
    let mut hex = String::new();
    for (i, chunk) in shown.chunks(16).enumerate() {
        let bytes: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() {
                    char::from(b)
                } else {
                    '.'
                }
            })
            .collect();
        hex.push_str(&format!(
            "{:08x}  {:<48} {ascii}\n",
            i * 16,
            bytes.join(" ")
        ));
    }
    ("hex", hex)
}

/// `/q/{queue}/m/{id}`: one message in full.
pub(crate) async fn message(
    AxState(state): AxState<Arc<State>>,
    Path((queue, id)): Path<(String, String)>,
    Query(pairs): Query<HashMap<String, String>>,
) -> Response {
    let sel = Selection::from_pairs(&pairs);
    let replay = state.replay(&queue, sel.parked);
    let from = replay.from_queue().to_owned();
    let found = match replay.peek(state.peek_limit).await {
        Ok(p) => p.into_iter().find(|m| m.id.as_deref() == Some(id.as_str())),
        Err(e) => {
            let body = html! { p.error { "cannot look at " (from) ": " (e.to_string()) } };
            return (StatusCode::BAD_GATEWAY, layout(&state, &id, body)).into_response();
        }
    };
    let Some(m) = found else {
        let body = html! { p.error { "no message " (id) " among the first " (state.peek_limit) " of " (from) "." } };
        return (StatusCode::NOT_FOUND, layout(&state, &id, body)).into_response();
    };
    let (kind, text) = body_view(&m.body);
    let base = format!("{BASE_PATH}/q/{}", enc(&queue));
    let one = Selection {
        parked: sel.parked,
        limit: None,
        filter: Filter {
            id: Some(id.clone()),
            ..Filter::default()
        },
    };
    let row = |k: &str, v: Option<String>| html! { tr { th { (k) } td { (v.unwrap_or_else(|| "–".into())) } } };
    let body = html! {
        p { a href={ (base) "?from=" (sel.companion()) } { "← " (from) } }
        table.fields #envelope {
            (row("Id", m.id.clone()))
            (row("Type", m.message_type.clone()))
            (row("Attempt", m.attempt.map(|a| a.to_string())))
            (row("First seen", m.first_seen.and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())))
            (row("Age", m.age.map(age)))
            (row("Origin", m.origin.clone()))
            (row("Replays", m.replay_count.map(|n| n.to_string())))
            (row("Replayed from", m.replayed_from.clone()))
            (row("Replayed at", m.replayed_at.clone()))
            (row("Content type", m.content_type.clone()))
            (row("Redelivered", Some(m.redelivered.to_string())))
        }
        h2 { "Reason" }
        pre.reason #reason { (m.error.as_deref().unwrap_or("(no reason recorded)")) }
        h2 { "Headers" }
        input #header-filter type="search" placeholder="filter headers by key or value";
        table.sortable #headers {
            thead { tr { th { "Key" } th { "Value" } } }
            tbody { @for (k, v) in &m.all_headers { tr { td.key { (k) } td.value { (header_value(v)) } } } }
        }
        h2 { "Body " span.dim { "(" (kind) ", " (m.body.len()) " bytes)" } }
        pre.body #body { (text) }
        @if state.allow_mutations {
            form.actions method="post" action={ (base) "/dry-run" } {
                input type="hidden" name="csrf" value=(state.csrf);
                (hidden_filter(&one))
                button type="submit" name="action" value="replay" { "Replay this message to " (queue) }
                button.danger type="submit" name="action" value="purge" { "Purge this message" }
            }
        }
    };
    layout(&state, &id, body).into_response()
}
