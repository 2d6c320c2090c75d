//! `acemq health [SERVICE_URL]`: a service's `/acemq-health` as a readable summary.
//!
//! The document is read tolerantly: a top-level `status` (`UP`, `DEGRADED`, `DOWN`, any
//! case) and, when present, `components` keyed by name, each with a `status` and
//! `details` whose values may be strings, numbers or booleans (both the Spring-like shape
//! the Java member serves and the earlier string-only one). Nested `components` are
//! listed as `parent/child`.

use std::time::Duration;

use serde_json::{Value, json};
use ureq::Agent;

use crate::Context;
use crate::cli::HealthArgs;
use crate::fail::{ERROR, OK, Outcome, PARTIAL};
use crate::output::{print_table, table};

/// Runs `acemq health`.
pub async fn run(args: HealthArgs, ctx: &Context) -> Outcome {
    let url = health_url(&args.service_url);
    let fetched = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || fetch(&url, args.timeout))
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    };
    let (http_status, doc) = match fetched {
        Ok(x) => x,
        Err(e) => {
            if ctx.out.json {
                ctx.out
                    .print_json(&json!({"url": url, "status": "UNREACHABLE", "error": e}));
            } else {
                println!("{} {url}: {e}", ctx.out.status("UNREACHABLE"));
            }
            return Ok(ERROR);
        }
    };
    let status = doc
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("UNKNOWN")
        .to_ascii_uppercase();
    let code = match status.as_str() {
        "UP" => OK,
        "DEGRADED" | "OUT_OF_SERVICE" | "UNKNOWN" => PARTIAL,
        _ => ERROR,
    };
    if ctx.out.json {
        ctx.out
            .print_json(&json!({"url": url, "http_status": http_status, "health": doc}));
        return Ok(code);
    }
    println!("{} {url}", ctx.out.status(&status));
    let mut rows = Vec::new();
    if let Some(c) = doc.get("components").and_then(Value::as_object) {
        collect(c, "", &mut rows);
    }
    if let Some(n) = doc.get("inFlight") {
        println!("in flight: {n}");
    }
    if !rows.is_empty() {
        let mut t = table(&["COMPONENT", "STATUS", "DETAILS"]);
        for (name, st, details) in rows {
            t.add_row(vec![name, st, details]);
        }
        print_table(&t);
    }
    Ok(code)
}

/// `http://host:9464` -> `http://host:9464/acemq-health`; a URL with a path is kept.
fn health_url(s: &str) -> String {
    let s = if s.contains("://") {
        s.to_owned()
    } else {
        format!("http://{s}")
    };
    match url::Url::parse(&s) {
        Ok(u) if u.path() == "/" || u.path().is_empty() => {
            format!("{}/acemq-health", s.trim_end_matches('/'))
        }
        _ => s,
    }
}

fn fetch(url: &str, timeout: Duration) -> Result<(u16, Value), String> {
    let agent: Agent = Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent.get(url).call().map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    let doc: Value = serde_json::from_str(&body).map_err(|e| {
        format!("answered {code} with something that is not a health document: {e}")
    })?;
    Ok((code, doc))
}

fn collect(
    components: &serde_json::Map<String, Value>,
    prefix: &str,
    rows: &mut Vec<(String, String, String)>,
) {
    for (name, c) in components {
        let full = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let st = c
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_ascii_uppercase();
        let details = c
            .get("details")
            .and_then(Value::as_object)
            .map(|d| {
                d.iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => format!("{k}={s}"),
                        other => format!("{k}={other}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        rows.push((full.clone(), st, details));
        if let Some(sub) = c.get("components").and_then(Value::as_object) {
            collect(sub, &full, rows);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_health_path_is_added_only_when_missing() {
        assert_eq!(
            health_url("http://127.0.0.1:9464"),
            "http://127.0.0.1:9464/acemq-health"
        );
        assert_eq!(
            health_url("127.0.0.1:9464/"),
            "http://127.0.0.1:9464/acemq-health"
        );
        assert_eq!(
            health_url("http://svc/custom/health"),
            "http://svc/custom/health"
        );
    }

    #[test]
    fn both_document_shapes_are_read() {
        let doc = json!({"status":"UP","components":{"acemq":{"status":"UP","details":{"transport":"rabbitmq","open":true,"inFlight":0}},
            "db":{"status":"down","components":{"primary":{"status":"DOWN"}}}}});
        let mut rows = Vec::new();
        collect(doc["components"].as_object().unwrap(), "", &mut rows);
        assert_eq!(rows[0].2, "inFlight=0 open=true transport=rabbitmq");
        assert_eq!(rows[1].1, "DOWN");
        assert_eq!(rows[2].0, "db/primary");
    }
}
