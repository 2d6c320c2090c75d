//! The declared routing slip a pipeline's message carries (`docs/wire.md` §14): the route
//! (`x-acemq-route`, step names joined by `,`), the position of the step the message is
//! *for* (`x-acemq-route-position`, a signed 32-bit integer from 0, written even when 0),
//! and the run id (`x-acemq-route-id`, stable across hops, dead letters and replays).
//! Reserved headers: they are envelope fields, never seen by a handler as headers.

use std::ops::Bound;

use crate::headers::{HeaderValue, Headers};

/// Header: the route's step names, joined by `,`.
pub const ROUTE: &str = "x-acemq-route";
/// Header: the index of the step the message is for (int32, from 0).
pub const ROUTE_POSITION: &str = "x-acemq-route-position";
/// Header: the run id (a UUID).
pub const ROUTE_ID: &str = "x-acemq-route-id";

/// A declared route and where the message is on it.
///
/// ```
/// use acemq::envelope::Route;
/// let r = Route::start(["validate", "reserve"]);
/// assert_eq!(r.current(), Some("validate"));
/// let next = r.advanced();
/// assert_eq!((next.current(), next.position()), (Some("reserve"), 1));
/// assert!(next.advanced().is_finished());
/// assert_eq!(next.id(), r.id()); // one run id all the way
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    steps: Vec<String>,
    position: i32,
    id: String,
}

impl Route {
    /// A new run along `steps`, at the first, with a fresh run id.
    pub fn start<S: Into<String>>(steps: impl IntoIterator<Item = S>) -> Route {
        Route {
            steps: steps.into_iter().map(Into::into).collect(),
            position: 0,
            id: uuid::Uuid::new_v4().to_string(),
        }
    }

    /// This route at `position`.
    pub fn at(mut self, position: i32) -> Route {
        self.position = position;
        self
    }

    /// This route with the run id `id`.
    pub fn with_id(mut self, id: impl Into<String>) -> Route {
        self.id = id.into();
        self
    }

    /// The step names.
    pub fn steps(&self) -> &[String] {
        &self.steps
    }

    /// The index of the step the message is for.
    pub fn position(&self) -> i32 {
        self.position
    }

    /// The run id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The step the message is for; `None` when the route is finished (the position is
    /// past the end, or negative).
    pub fn current(&self) -> Option<&str> {
        usize::try_from(self.position)
            .ok()
            .and_then(|p| self.steps.get(p))
            .map(String::as_str)
    }

    /// Whether no step is left.
    pub fn is_finished(&self) -> bool {
        self.current().is_none()
    }

    /// The route one step further (same steps, same run id).
    pub fn advanced(&self) -> Route {
        Route {
            steps: self.steps.clone(),
            position: self.position.saturating_add(1),
            id: self.id.clone(),
        }
    }

    /// Reads the three headers, tolerantly as the family does: no route (or an empty one)
    /// is `None`; a position that is a string is parsed, an unparseable or missing one is
    /// 0; a missing run id is a new one.
    pub(crate) fn read(h: &Headers) -> Option<Route> {
        let steps: Vec<String> = match h.get(ROUTE)? {
            HeaderValue::Str(s) => s.clone(),
            HeaderValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            _ => return None,
        }
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
        if steps.is_empty() {
            return None;
        }
        let position = h
            .get(ROUTE_POSITION)
            .and_then(HeaderValue::as_i64)
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or(0);
        let id = match h.get(ROUTE_ID) {
            Some(HeaderValue::Str(s)) if !s.is_empty() => s.clone(),
            _ => uuid::Uuid::new_v4().to_string(),
        };
        Some(Route {
            steps,
            position,
            id,
        })
    }

    /// Writes the three headers (the position as an int32, also when 0).
    pub(crate) fn write(&self, h: &mut Headers) {
        h.insert(ROUTE.into(), HeaderValue::Str(self.steps.join(",")));
        h.insert(ROUTE_POSITION.into(), HeaderValue::I32(self.position));
        h.insert(ROUTE_ID.into(), HeaderValue::Str(self.id.clone()));
    }

    /// Removes the three headers.
    pub(crate) fn clear(h: &mut Headers) {
        // The three names share ROUTE as a prefix and sort together: one lookup says
        // whether any is there (on almost every message, none is).
        let present = h
            .range::<str, _>((Bound::Included(ROUTE), Bound::Unbounded))
            .next()
            .is_some_and(|(name, _)| name.starts_with(ROUTE));
        if !present {
            return;
        }
        for name in [ROUTE, ROUTE_POSITION, ROUTE_ID] {
            h.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, HeaderValue)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned().into(), v.clone()))
            .collect()
    }

    #[test]
    fn read_tolerantly_as_the_family_does() {
        let r = Route::read(&headers(&[
            (ROUTE, HeaderValue::from("validate,reserve,dispatch")),
            (ROUTE_POSITION, HeaderValue::from("1")),
            (ROUTE_ID, HeaderValue::from("run-1")),
        ]))
        .unwrap();
        assert_eq!(r.current(), Some("reserve"));
        assert_eq!(r.id(), "run-1");
        let bad = Route::read(&headers(&[
            (ROUTE, HeaderValue::from("a,b")),
            (ROUTE_POSITION, HeaderValue::from("x")),
        ]))
        .unwrap();
        assert_eq!(bad.position(), 0);
        assert_eq!(bad.id().len(), 36, "a missing run id is minted");
        let past = Route::read(&headers(&[
            (ROUTE, HeaderValue::from("a,b")),
            (ROUTE_POSITION, HeaderValue::I32(2)),
        ]))
        .unwrap();
        assert!(past.is_finished());
        assert!(Route::read(&headers(&[(ROUTE, HeaderValue::from(""))])).is_none());
        assert!(Route::read(&Headers::new()).is_none());
    }

    #[test]
    fn written_with_javas_types_position_even_when_zero() {
        let mut h = Headers::new();
        Route::start(["one", "two"]).with_id("r").write(&mut h);
        assert_eq!(h[ROUTE], HeaderValue::from("one,two"));
        assert_eq!(h[ROUTE_POSITION], HeaderValue::I32(0));
        assert_eq!(h[ROUTE_ID], HeaderValue::from("r"));
    }

    #[test]
    fn clear_removes_each_route_header_even_alone_and_nothing_else() {
        for name in [ROUTE, ROUTE_POSITION, ROUTE_ID] {
            let mut h = headers(&[
                (name, HeaderValue::from("x")),
                ("x-acemq-id", HeaderValue::from("m")),
                ("x-acemq-routes", HeaderValue::from("not ours")),
                ("z", HeaderValue::from("kept")),
            ]);
            Route::clear(&mut h);
            let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
            assert_eq!(left, ["x-acemq-id", "x-acemq-routes", "z"], "{name}");
        }
        let mut none = headers(&[("x-acemq-routes", HeaderValue::from("not ours"))]);
        Route::clear(&mut none);
        assert_eq!(none.len(), 1);
    }
}
