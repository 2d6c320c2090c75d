//! An exchange's bindings ([`Bindings`]): in the order they were made, indexed so that
//! binding many queues to one exchange (every consumer's `.dlq` and `.parked` to
//! `acemq.dlx`, every retried queue to `acemq.retry`) and routing a direct publish cost
//! the same with 10 bindings as with 10,000.

use std::collections::HashSet;

use super::hash::FastMap;
use crate::headers::Headers;

/// One binding.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Binding {
    pub queue: String,
    pub key: String,
    pub args: Headers,
}

/// The bindings of one exchange.
#[derive(Debug, Default)]
pub(crate) struct Bindings {
    list: Vec<Binding>,
    /// Which `(queue, key)` pairs have a binding: a binding whose pair is new is new.
    pairs: HashSet<(String, String)>,
    /// Positions in `list` by binding key, in order: a direct exchange's routing.
    by_key: FastMap<String, Vec<usize>>,
}

impl Bindings {
    /// Adds `b` unless an equal binding exists (a redeclaration is a no-op).
    pub(crate) fn add(&mut self, b: Binding) {
        let new_pair = self.pairs.insert((b.queue.clone(), b.key.clone()));
        if new_pair || !self.list.contains(&b) {
            self.by_key
                .entry(b.key.clone())
                .or_default()
                .push(self.list.len());
            self.list.push(b);
        }
    }

    /// Keeps the bindings `keep` says yes to; `true` when any went.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&Binding) -> bool) -> bool {
        let before = self.list.len();
        self.list.retain(keep);
        if self.list.len() == before {
            return false;
        }
        self.pairs = self
            .list
            .iter()
            .map(|b| (b.queue.clone(), b.key.clone()))
            .collect();
        self.by_key.clear();
        for (i, b) in self.list.iter().enumerate() {
            self.by_key.entry(b.key.clone()).or_default().push(i);
        }
        true
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Every binding, in the order made.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, Binding> {
        self.list.iter()
    }

    /// The bindings whose key is exactly `key`, in the order made.
    pub(crate) fn with_key<'a>(&'a self, key: &str) -> impl Iterator<Item = &'a Binding> + 'a {
        self.by_key
            .get(key)
            .into_iter()
            .flatten()
            .map(|&i| &self.list[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(queue: &str, key: &str) -> Binding {
        Binding {
            queue: queue.into(),
            key: key.into(),
            args: Headers::new(),
        }
    }

    #[test]
    fn bindings_are_kept_once_in_order_and_found_by_key() {
        let mut x = Bindings::default();
        x.add(b("a", "k1"));
        x.add(b("b", "k2"));
        x.add(b("a", "k1"));
        x.add(b("c", "k1"));
        let mut with_args = b("a", "k1");
        with_args.args.insert("x".into(), "y".into());
        x.add(with_args.clone());
        let all: Vec<_> = x
            .iter()
            .map(|b| (b.queue.as_str(), b.key.as_str()))
            .collect();
        assert_eq!(all, [("a", "k1"), ("b", "k2"), ("c", "k1"), ("a", "k1")]);
        let k1: Vec<_> = x.with_key("k1").map(|b| b.queue.as_str()).collect();
        assert_eq!(k1, ["a", "c", "a"]);
        assert!(x.retain(|b| b.queue != "a"));
        assert!(!x.retain(|_| true));
        let k1: Vec<_> = x.with_key("k1").map(|b| b.queue.as_str()).collect();
        assert_eq!(k1, ["c"]);
        x.add(b("a", "k1"));
        assert_eq!(
            x.with_key("k1").count(),
            2,
            "a pair removed can be bound again"
        );
        assert_eq!(x.with_key("none").count(), 0);
        assert!(!x.is_empty());
    }
}
