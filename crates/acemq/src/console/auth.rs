//! The console's gate: the token on every request (when one is set) and, on every POST,
//! the read-only switch, the CSRF token and a same-origin check.
//!
//! A token comes as `Authorization: Bearer …`, as the `acemq_console` cookie, or once as
//! `?token=…`, which sets that cookie (HTTP-only, same-site strict) and redirects to the
//! same page without it, so the token does not stay in the address bar or in history.

use std::sync::Arc;

use axum::extract::{Request, State as AxState};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::{State, pages};

const COOKIE: &str = "acemq_console";

/// Checks the token (and, for a POST, the read-only switch and the origin) before a
/// handler runs.
pub(crate) async fn guard(
    AxState(state): AxState<Arc<State>>,
    req: Request,
    next: Next,
) -> Response {
    if let Some(token) = &state.token {
        let query_token = req.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("token="))
                .map(percent_decode)
        });
        if let Some(given) = query_token {
            if !same(&given, token) {
                return refused(StatusCode::UNAUTHORIZED, "the token is not right");
            }
            let rest: Vec<&str> = req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .filter(|kv| !kv.starts_with("token=") && !kv.is_empty())
                .collect();
            let to = if rest.is_empty() {
                req.uri().path().to_owned()
            } else {
                format!("{}?{}", req.uri().path(), rest.join("&"))
            };
            let mut resp = Redirect::to(&to).into_response();
            let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                resp.headers_mut().insert(header::SET_COOKIE, v);
            }
            return resp;
        }
        if !presented(req.headers()).is_some_and(|t| same(&t, token)) {
            return refused(
                StatusCode::UNAUTHORIZED,
                "this console needs its token: open it once as …/acemq-console/?token=TOKEN, or send Authorization: Bearer TOKEN",
            );
        }
    }
    if req.method() == Method::POST {
        if !state.allow_mutations {
            return refused(
                StatusCode::FORBIDDEN,
                "this console is read-only: start it with --allow-mutations (ConsoleBuilder::allow_mutations) to replay or purge",
            );
        }
        if !same_origin(req.headers()) {
            return refused(
                StatusCode::FORBIDDEN,
                "cross-site request refused: use the console's own forms",
            );
        }
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// The token a request carries (bearer header or cookie).
fn presented(h: &HeaderMap) -> Option<String> {
    if let Some(b) = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(b.trim().to_owned());
    }
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix("acemq_console=").map(str::to_owned))
}

/// An `Origin` header, when present, names this host (browsers send it on every POST).
fn same_origin(h: &HeaderMap) -> bool {
    let Some(origin) = h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = h.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    host.is_some() && origin_host == host
}

/// Compares without stopping at the first difference.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn refused(status: StatusCode, why: &str) -> Response {
    (status, pages::error_page(status, why)).into_response()
}
