//! The ids this process is working on, per store: what tells "our claim, running right
//! now" from "our claim, whose reply was lost".

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

use super::IdempotencyStore;
use crate::util::lock;

/// `(store address, id)` of every delivery in this process between its claim attempt and
/// the end of its handling.
static IN_HAND: LazyLock<Mutex<HashSet<(usize, String)>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));

/// One delivery's hold on an id of one store in this process; released on drop.
///
/// A consumer takes it before asking the store: a second delivery of the same id (through
/// the same store instance) while the first is held is "in progress" without asking the
/// store, so two deliveries of one id never run at once in this process, and giving back a
/// claim whose reply was lost can never give back one that a running delivery holds.
#[derive(Debug)]
pub(crate) struct InHand {
    key: (usize, String),
}

impl InHand {
    /// Holds `id` for `store`; `None` when this process already holds it.
    pub(crate) fn enter(store: &Arc<dyn IdempotencyStore>, id: &str) -> Option<InHand> {
        let key = (Arc::as_ptr(store).cast::<()>() as usize, id.to_owned());
        let fresh = lock(&IN_HAND).insert(key.clone());
        // (Built only when fresh: dropping a hold that was not taken would free another's.)
        if fresh { Some(InHand { key }) } else { None }
    }
}

impl Drop for InHand {
    fn drop(&mut self) {
        lock(&IN_HAND).remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::InMemoryIdempotencyStore;

    #[test]
    fn one_hold_per_id_and_store() {
        let a: Arc<dyn IdempotencyStore> = Arc::new(InMemoryIdempotencyStore::for_one_day());
        let b: Arc<dyn IdempotencyStore> = Arc::new(InMemoryIdempotencyStore::for_one_day());
        let held = InHand::enter(&a, "m-1").expect("free");
        assert!(InHand::enter(&a, "m-1").is_none(), "held already");
        assert!(InHand::enter(&b, "m-1").is_some(), "another store's id");
        assert!(InHand::enter(&a, "m-2").is_some(), "another id");
        drop(held);
        assert!(InHand::enter(&a, "m-1").is_some(), "free again");
    }
}
