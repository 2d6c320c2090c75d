//! A minimal `tracing` subscriber that keeps the fields of every span, so a test can check
//! the span tree the library builds (the `publish` and `process` spans, their `trace_id`,
//! `span_id` and `parent_span_id`) without a tracing-subscriber dependency. Installed
//! globally, once per test binary: a consumer's spans are created on worker threads.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// One captured span: its static name and its fields as text.
#[derive(Clone, Debug)]
pub struct Captured {
    pub name: &'static str,
    pub fields: HashMap<String, String>,
}

impl Captured {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

static SPANS: Mutex<Vec<Captured>> = Mutex::new(Vec::new());

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

struct Capture;

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = HashMap::new();
        span.record(&mut Fields(&mut fields));
        let mut all = SPANS.lock().unwrap();
        all.push(Captured {
            name: span.metadata().name(),
            fields,
        });
        Id::from_u64(all.len() as u64)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut all = SPANS.lock().unwrap();
        if let Some(c) = all.get_mut(span.into_u64() as usize - 1) {
            values.record(&mut Fields(&mut c.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Installs the capture as the global default (once per binary).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(Capture).expect("no other subscriber");
    });
}

/// Every captured span named `name` whose field `field` is `value`.
pub fn find(name: &str, field: &str, value: &str) -> Vec<Captured> {
    SPANS
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.name == name && c.field(field) == Some(value))
        .cloned()
        .collect()
}
