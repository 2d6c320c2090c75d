//! RabbitMQ streams: declaring one ([`StreamRetention`]) and reading it with a typed
//! [`StreamReader`] from a chosen [`StreamOffset`].
//!
//! This module owns the stream's queue arguments, the `x-stream-offset` consumer argument
//! in the AMQP type the broker reads for each start (java.md §2.12: a string keyword for
//! `first`/`last`/`next`, a long for an absolute offset, a timestamp for a point in time,
//! the string `"{seconds}s"` for an interval), and the reader's position across
//! reconnects ([`position`]). A stream is a log, not a queue: nothing is removed by an ack,
//! there is no retry, dead-letter queue or requeue. A failing handler stops the reader at
//! that entry (nothing is republished into the stream) unless the reader
//! [skips failures](StreamReader::skip_failures).
//!
//! `memory://` has no streams: declaring one and reading one are refused with an error
//! that says so.
//!
//! ```no_run
//! # async fn demo(mq: acemq::Connection) -> Result<(), acemq::Error> {
//! use std::time::Duration;
//! use acemq::stream::StreamRetention;
//! mq.declare_stream("orders.events", StreamRetention::new().max_age(Duration::from_secs(7 * 86_400))).await?;
//! let reader = mq
//!     .stream::<serde_json::Value>("orders.events")
//!     .from_last_duration(Duration::from_secs(600))
//!     .consume(|m: acemq::consume::Message<serde_json::Value>| async move {
//!         println!("{} at offset {:?}", m.payload(), m.stream_offset());
//!         Ok(())
//!     })
//!     .await?;
//! # let _ = reader.last_handled_offset();
//! # Ok(()) }
//! ```

use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::headers::{HeaderValue, Headers};
use crate::topology::QueueDecl;

mod offsets;
pub mod position;
mod reader;

pub use offsets::{MemoryOffsetStore, OffsetStore};
pub use reader::{StreamConsumer, StreamReader};

pub use crate::headers::STREAM_OFFSET;

/// The default prefetch of a stream reader (Java and .NET; Go, Python and Ruby use 10).
pub const DEFAULT_STREAM_PREFETCH: u16 = 100;

/// How much a stream keeps. With nothing set the stream grows without bound (a warning is
/// logged when it is declared).
///
/// ```
/// use std::time::Duration;
/// use acemq::stream::StreamRetention;
/// let r = StreamRetention::new().max_age(Duration::from_secs(36 * 3600)).max_length_bytes(1 << 30);
/// let args = r.arguments().unwrap();
/// assert_eq!(args["x-queue-type"].as_str(), Some("stream"));
/// assert_eq!(args["x-max-age"].as_str(), Some("36h"));
/// assert_eq!(args["x-max-length-bytes"].as_i64(), Some(1 << 30));
/// assert!(!args.contains_key("x-stream-max-segment-size-bytes"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamRetention {
    max_age: Option<Duration>,
    max_length_bytes: Option<u64>,
    segment_bytes: Option<u64>,
}

impl StreamRetention {
    /// No retention limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries older than this are removed (`x-max-age`, whole seconds, at least 1 s).
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }

    /// The stream keeps at most this many bytes (`x-max-length-bytes`).
    pub fn max_length_bytes(mut self, bytes: u64) -> Self {
        self.max_length_bytes = Some(bytes);
        self
    }

    /// The size of a segment file (`x-stream-max-segment-size-bytes`, sent only when set).
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = Some(bytes);
        self
    }

    /// Whether nothing limits the stream.
    pub fn is_unbounded(&self) -> bool {
        self.max_age.is_none() && self.max_length_bytes.is_none()
    }

    /// The queue arguments of a stream with this retention.
    pub fn arguments(&self) -> Result<Headers, Error> {
        let mut args = Headers::new();
        args.insert("x-queue-type".into(), HeaderValue::from("stream"));
        if let Some(age) = self.max_age {
            args.insert("x-max-age".into(), HeaderValue::Str(render_max_age(age)?));
        }
        if let Some(bytes) = self.max_length_bytes {
            args.insert("x-max-length-bytes".into(), HeaderValue::I64(long(bytes)?));
        }
        if let Some(bytes) = self.segment_bytes {
            args.insert(
                "x-stream-max-segment-size-bytes".into(),
                HeaderValue::I64(long(bytes)?),
            );
        }
        Ok(args)
    }

    /// The declaration of stream `name` (durable, as streams must be).
    pub fn declaration(&self, name: &str) -> Result<QueueDecl, Error> {
        let mut decl = QueueDecl::classic(name);
        decl.arguments = self.arguments()?;
        Ok(decl)
    }
}

fn long(v: u64) -> Result<i64, Error> {
    i64::try_from(v).map_err(|_| Error::InvalidArgument(format!("{v} does not fit a long")))
}

/// `x-max-age` in the largest unit that states it exactly: `2D`, `36h`, `90m`, `45s`
/// (sub-second parts are dropped, as Java does; less than a second is refused).
///
/// ```
/// use std::time::Duration;
/// use acemq::stream::render_max_age;
/// assert_eq!(render_max_age(Duration::from_secs(3600)).unwrap(), "1h");
/// assert_eq!(render_max_age(Duration::from_secs(90 * 60)).unwrap(), "90m");
/// assert_eq!(render_max_age(Duration::from_secs(2 * 86_400)).unwrap(), "2D");
/// assert_eq!(render_max_age(Duration::from_millis(90_500)).unwrap(), "90s");
/// assert!(render_max_age(Duration::from_millis(500)).is_err());
/// ```
pub fn render_max_age(age: Duration) -> Result<String, Error> {
    let s = age.as_secs();
    if s == 0 {
        return Err(Error::InvalidArgument(format!(
            "a stream's max age must be at least 1 s, not {age:?}"
        )));
    }
    Ok(match s {
        s if s % 86_400 == 0 => format!("{}D", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    })
}

/// Where a stream reader starts.
///
/// ```
/// use std::time::Duration;
/// use acemq::headers::HeaderValue;
/// use acemq::stream::StreamOffset;
/// assert_eq!(StreamOffset::First.argument(), HeaderValue::Str("first".into()));
/// assert_eq!(StreamOffset::Offset(42).argument(), HeaderValue::I64(42));
/// assert_eq!(StreamOffset::Interval(Duration::from_secs(600)).argument(), HeaderValue::Str("600s".into()));
/// let t = std::time::UNIX_EPOCH + Duration::from_secs(1_770_091_506);
/// assert_eq!(StreamOffset::Timestamp(t).argument(), HeaderValue::Timestamp(1_770_091_506));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamOffset {
    /// The oldest entry the stream still holds (`"first"`).
    First,
    /// The last chunk written (`"last"`).
    Last,
    /// Only entries written from now on (`"next"`, the default).
    Next,
    /// The entry at this offset (a long).
    Offset(u64),
    /// The first chunk written at or after this time (an AMQP timestamp, whole seconds).
    Timestamp(SystemTime),
    /// The entries of the last period (`"{seconds}s"`, e.g. the last 10 minutes).
    Interval(Duration),
}

impl StreamOffset {
    /// The `x-stream-offset` value in the AMQP type the broker reads for this start.
    pub fn argument(&self) -> HeaderValue {
        match self {
            StreamOffset::First => HeaderValue::Str("first".into()),
            StreamOffset::Last => HeaderValue::Str("last".into()),
            StreamOffset::Next => HeaderValue::Str("next".into()),
            StreamOffset::Offset(n) => HeaderValue::I64(i64::try_from(*n).unwrap_or(i64::MAX)),
            StreamOffset::Timestamp(t) => HeaderValue::Timestamp(
                t.duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
            ),
            StreamOffset::Interval(d) => HeaderValue::Str(format!("{}s", d.as_secs().max(1))),
        }
    }
}

/// The offset of a delivered stream entry, from its `x-stream-offset` header (any integer
/// width); `None` when the header is absent (not a stream delivery).
pub fn offset_of(headers: &Headers) -> Option<u64> {
    crate::headers::stream_offset(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_uses_the_largest_exact_unit() {
        for (secs, want) in [
            (3600, "1h"),
            (5400, "90m"),
            (172_800, "2D"),
            (90, "90s"),
            (129_600, "36h"),
            (604_800, "7D"),
            (45, "45s"),
            (86_400 + 1, "86401s"),
        ] {
            assert_eq!(render_max_age(Duration::from_secs(secs)).unwrap(), want);
        }
    }

    #[test]
    fn segment_size_is_sent_only_when_given() {
        let args = StreamRetention::new()
            .segment_bytes(1 << 20)
            .arguments()
            .unwrap();
        assert_eq!(
            args["x-stream-max-segment-size-bytes"].as_i64(),
            Some(1 << 20)
        );
        assert!(!args.contains_key("x-max-age"));
        assert!(!args.contains_key("x-max-length-bytes"));
        assert!(StreamRetention::new().is_unbounded());
    }

    #[test]
    fn the_offset_header_is_read_at_any_width() {
        let mut h = Headers::new();
        assert_eq!(offset_of(&h), None);
        h.insert(STREAM_OFFSET.into(), HeaderValue::I64(7));
        assert_eq!(offset_of(&h), Some(7));
        h.insert(STREAM_OFFSET.into(), HeaderValue::U32(8));
        assert_eq!(offset_of(&h), Some(8));
    }
}
