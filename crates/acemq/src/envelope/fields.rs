//! Reading an envelope off a header table, tolerantly: every field found in one pass, and
//! the family's lenient readings of a value (text from strings, UTF-8 byte arrays or
//! integers; attempts and versions below 1 as 1).

use super::{
    ATTEMPT, CAUSATION, CLAIM, CORRELATION, ERROR, FIRST_SEEN, ID, ORIGIN, REPLAY_COUNT,
    REPLAYED_AT, REPLAYED_FROM, REPLY_TO, ROUTE, TYPE, VERSION, non_empty,
};
use crate::headers::{HeaderValue, Headers};

/// The envelope's headers of one table, found in one pass over it (a lookup per field
/// would search the table a dozen times per delivery).
#[derive(Default)]
pub(super) struct Fields<'a> {
    pub(super) id: Option<&'a HeaderValue>,
    pub(super) message_type: Option<&'a HeaderValue>,
    pub(super) version: Option<&'a HeaderValue>,
    pub(super) correlation: Option<&'a HeaderValue>,
    pub(super) causation: Option<&'a HeaderValue>,
    pub(super) attempt: Option<&'a HeaderValue>,
    pub(super) first_seen: Option<&'a HeaderValue>,
    pub(super) origin: Option<&'a HeaderValue>,
    pub(super) error: Option<&'a HeaderValue>,
    pub(super) claim: Option<&'a HeaderValue>,
    pub(super) replayed_from: Option<&'a HeaderValue>,
    pub(super) replayed_at: Option<&'a HeaderValue>,
    pub(super) replay_count: Option<&'a HeaderValue>,
    pub(super) reply_to: Option<&'a HeaderValue>,
    /// A routing slip's header is there (read by [`super::Route::read`]).
    pub(super) route: bool,
}

impl<'a> Fields<'a> {
    pub(super) fn of(h: &'a Headers) -> Self {
        let mut f = Fields::default();
        for (name, value) in h {
            let slot = match name.as_str() {
                ID => &mut f.id,
                TYPE => &mut f.message_type,
                VERSION => &mut f.version,
                CORRELATION => &mut f.correlation,
                CAUSATION => &mut f.causation,
                ATTEMPT => &mut f.attempt,
                FIRST_SEEN => &mut f.first_seen,
                ORIGIN => &mut f.origin,
                ERROR => &mut f.error,
                CLAIM => &mut f.claim,
                REPLAYED_FROM => &mut f.replayed_from,
                REPLAYED_AT => &mut f.replayed_at,
                REPLAY_COUNT => &mut f.replay_count,
                REPLY_TO => &mut f.reply_to,
                ROUTE => {
                    f.route = true;
                    continue;
                }
                _ => continue,
            };
            *slot = Some(value);
        }
        f
    }
}

/// A header's value as text: strings (empty reads as absent), UTF-8 byte arrays, integers.
pub(super) fn text(value: &HeaderValue) -> Option<String> {
    match value {
        HeaderValue::Str(s) => non_empty(s.clone()),
        HeaderValue::Bytes(b) => non_empty(String::from_utf8_lossy(b).into_owned()),
        other => other.as_i64().map(|v| v.to_string()),
    }
}

pub(super) fn positive(value: Option<&HeaderValue>) -> i32 {
    value
        .and_then(HeaderValue::as_i64)
        .and_then(|v| i32::try_from(v).ok())
        .filter(|v| *v >= 1)
        .unwrap_or(1)
}
