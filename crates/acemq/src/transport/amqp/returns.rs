//! Bookkeeping for `basic.return`: which publish a returned message belongs to, and how
//! long a return that no publish has claimed yet is kept.
//!
//! The confirm collector (see `publisher`) hands every return it finds to [`Returns`]:
//! returns lapin attached to a confirm, and returns carried by confirms that were dropped
//! (handed over by `wait_for_confirms`). A return is matched by `message_id`, exchange and
//! routing key ([`return_key`]); returns without a message id are matched in order.
//!
//! # When a return is dropped
//!
//! A return can ride on a confirm that the collector answers **before** the publish it
//! belongs to has reached the collector: the publisher hands a publish over only after
//! `basic_publish` returned, and by then lapin may already have applied its return and ack.
//! So "the collector's queue is empty" does not mean "no publish can claim this return".
//!
//! Every publish on a channel gets a sequence number ([`Written::begin`]) *before* its frames
//! are handed to lapin, so every publish the broker can have returned has a number no
//! greater than the counter read when the return is seen. That reading is the return's
//! **watermark**:
//!
//! * a publish may claim a return only when its own sequence is at most the watermark
//!   ([`may_claim`]): a later publish with the same key cannot take an older return;
//! * a publish is answered only after every older one with its return key, and the
//!   [`horizon`] is the oldest publish the collector has not answered (or the next to come
//!   when none waits), so once the collector has received every publish up to the
//!   watermark and answered them all, nobody can claim the return and it is dropped
//!   ([`expired`]).
//!
//! The rule is exact (no timer, no guess of how late a hand-over can be) and bounded: a
//! return outlives its last possible claimant only until the next publish reaches the
//! collector (when a publish failed before its hand-over, leaving a gap in the sequence).
//!
//! The other way round, a publish not yet handed over may already be confirmed with the
//! return of a publish about to be answered on its confirm. So before it answers, the
//! collector waits ([`Written::settled`], bounded by the confirm timeout) for the publish
//! being written, if any, to be handed over: its guard ([`InFlight`]) is dropped after the
//! hand-over or when the publish gives up (error, block, cancelled caller).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;
use tokio::sync::Notify;
use tracing::warn;

use crate::transport::Confirmation;

/// What a `basic.return` says: reply code and text.
pub(super) type Returned = (u16, String);

/// The per-channel publish counters shared by the publisher and its collector.
#[derive(Clone, Debug, Default)]
pub(super) struct Written(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    /// The highest number handed out.
    numbered: AtomicU64,
    /// The highest number whose publish call is done with the collector (handed over,
    /// failed or cancelled).
    settled: AtomicU64,
    settle: Notify,
}

impl Written {
    /// Numbers the next publish (from 1). Call before the frames are handed to lapin, and
    /// keep the guard until the publish was handed to the collector (or gave up).
    pub(super) fn begin(&self) -> InFlight {
        InFlight {
            seq: self.0.numbered.fetch_add(1, Ordering::SeqCst) + 1,
            written: self.clone(),
        }
    }

    /// The highest number handed out so far: the watermark of a return seen now.
    pub(super) fn current(&self) -> u64 {
        self.0.numbered.load(Ordering::SeqCst)
    }

    /// Waits until every publish numbered so far is done with the collector: one lapin has
    /// already confirmed may carry the return of a publish about to be answered.
    pub(super) async fn settled(&self) {
        let target = self.current();
        loop {
            let notified = self.0.settle.notified();
            if self.0.settled.load(Ordering::SeqCst) >= target {
                return;
            }
            notified.await;
        }
    }
}

/// A numbered publish that is not yet done with the collector; dropping it says it is.
#[derive(Debug)]
pub(super) struct InFlight {
    seq: u64,
    written: Written,
}

impl InFlight {
    /// The publish's number.
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let counters = &self.written.0;
        counters.settled.fetch_max(self.seq, Ordering::SeqCst);
        counters.settle.notify_waiters();
    }
}

/// Whether the publish numbered `seq` may claim a return whose watermark is `watermark`:
/// only publishes written before the return was seen can be its owner.
pub(super) fn may_claim(watermark: u64, seq: u64) -> bool {
    seq <= watermark
}

/// The lowest sequence that can still claim a return: the oldest publish still in the
/// collector's queue, or, when the queue is empty, the first one it has not received yet.
pub(super) fn horizon(oldest_queued: Option<u64>, received: u64) -> u64 {
    let next = received.saturating_add(1);
    oldest_queued.map_or(next, |oldest| oldest.min(next))
}

/// Whether a return with this watermark can no longer be claimed by any publish: every
/// publish numbered up to the watermark has been received and answered.
pub(super) fn expired(watermark: u64, horizon: u64) -> bool {
    watermark < horizon
}

/// One return waiting for its publish.
#[derive(Debug)]
struct Held {
    watermark: u64,
    returned: Returned,
}

/// The returns collected so far whose publish has not been answered yet.
#[derive(Debug, Default)]
pub(super) struct Returns {
    by_key: HashMap<String, VecDeque<Held>>,
    /// Returns without a message id carried by a publish that has one.
    anonymous: VecDeque<Held>,
    /// No held return has a lower watermark (it may be lower than the true minimum after a
    /// claim; it only decides whether [`Returns::expire`] has anything to look at).
    lowest: Option<u64>,
}

impl Returns {
    /// Keeps a return until a publish claims it or it expires.
    pub(super) fn hold(&mut self, key: Option<String>, returned: Returned, watermark: u64) {
        let held = Held {
            watermark,
            returned,
        };
        match key {
            Some(key) => self.by_key.entry(key).or_default().push_back(held),
            None => self.anonymous.push_back(held),
        }
        self.lowest = Some(self.lowest.map_or(watermark, |l| l.min(watermark)));
    }

    /// Sorts a return lapin attached to the confirm of a publish whose key is `own`: it is
    /// that publish's own when the keys are equal (returned), otherwise it is held.
    pub(super) fn sort(
        &mut self,
        key: Option<String>,
        returned: Returned,
        own: Option<&str>,
        watermark: u64,
    ) -> Option<Returned> {
        if key.as_deref() == own {
            return Some(returned);
        }
        self.hold(key, returned, watermark);
        None
    }

    /// Sorts the return lapin attached to a resolved confirm, if any (see [`Returns::sort`]).
    pub(super) fn carried(
        &mut self,
        confirmation: &mut lapin::Result<lapin::Confirmation>,
        own: Option<&str>,
        watermark: u64,
    ) -> Option<Returned> {
        let Ok(lapin::Confirmation::Ack(ret) | lapin::Confirmation::Nack(ret)) = confirmation
        else {
            return None;
        };
        let (key, returned) = split_return(ret.take()?);
        self.sort(key, returned, own, watermark)
    }

    /// Waits until lapin has finished applying the ack frame it may be applying right now:
    /// the first poll of `wait_for_confirms` takes the acknowledgement lock. The future is
    /// never awaited; when it is ready at once it hands over returns carried by dropped
    /// confirms, which are held (with the watermark read after they were handed over).
    pub(super) fn barrier(&mut self, channel: &lapin::Channel, written: &Written) {
        if let Some(Ok(orphans)) = channel.wait_for_confirms().now_or_never() {
            let watermark = written.current();
            for ret in orphans {
                let (key, returned) = split_return(ret);
                self.hold(key, returned, watermark);
            }
        }
    }

    /// The outcome of an acked publish: unroutable with its own return (the one lapin
    /// attached to its confirm) or one it may claim, routed otherwise.
    pub(super) fn outcome(
        &mut self,
        own: Option<Returned>,
        key: Option<&str>,
        seq: u64,
    ) -> Confirmation {
        match own.or_else(|| self.claim(key, seq)) {
            Some((reply_code, reply_text)) => Confirmation::Unroutable {
                reply_code,
                reply_text,
            },
            None => Confirmation::Routed,
        }
    }

    /// The oldest held return with this key (or, for `None`, the oldest without a message
    /// id) that the publish numbered `seq` may claim.
    pub(super) fn claim(&mut self, key: Option<&str>, seq: u64) -> Option<Returned> {
        let queue = match key {
            Some(key) => self.by_key.get_mut(key)?,
            None => &mut self.anonymous,
        };
        let at = queue.iter().position(|h| may_claim(h.watermark, seq))?;
        let found = queue.remove(at).map(|h| h.returned);
        if let Some(key) = key
            && queue.is_empty()
        {
            self.by_key.remove(key);
        }
        found
    }

    /// Drops every return no publish numbered `horizon` or later may claim; returns how
    /// many were dropped (and logs them: they are returns of publishes that were never
    /// answered through this collector).
    pub(super) fn expire(&mut self, horizon: u64) -> usize {
        if self.lowest.is_none_or(|lowest| !expired(lowest, horizon)) {
            return 0;
        }
        let mut dropped = 0;
        let mut lowest: Option<u64> = None;
        let mut keep = |h: &Held| {
            if expired(h.watermark, horizon) {
                dropped += 1;
                false
            } else {
                lowest = Some(lowest.map_or(h.watermark, |l| l.min(h.watermark)));
                true
            }
        };
        self.by_key.retain(|_, queue| {
            queue.retain(&mut keep);
            !queue.is_empty()
        });
        self.anonymous.retain(&mut keep);
        self.lowest = lowest;
        if dropped > 0 {
            warn!(
                dropped,
                "basic.return for messages no publish awaiting a confirm can claim; dropped"
            );
        }
        dropped
    }

    /// How many returns are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.values().map(VecDeque::len).sum::<usize>() + self.anonymous.len()
    }
}

/// The key a return is matched by (`None` without a message id) and what it says.
pub(super) fn split_return(ret: lapin::message::BasicReturnMessage) -> (Option<String>, Returned) {
    let key = ret.delivery.properties.message_id().as_ref().map(|id| {
        return_key(
            id.as_str(),
            ret.delivery.exchange.as_str(),
            ret.delivery.routing_key.as_str(),
        )
    });
    (key, (ret.reply_code, ret.reply_text.as_str().to_owned()))
}

/// `message_id`, exchange and routing key, joined with a separator no AMQP short string
/// field relies on.
pub(super) fn return_key(message_id: &str, exchange: &str, routing_key: &str) -> String {
    // Once per publish: joined by hand (`format!` costs about 1.8k instructions here, a
    // sized copy of three strings about 0.2k).
    let mut key = String::with_capacity(message_id.len() + exchange.len() + routing_key.len() + 2);
    key.push_str(message_id);
    key.push('\u{0}');
    key.push_str(exchange);
    key.push('\u{0}');
    key.push_str(routing_key);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_route() -> Returned {
        (312, "NO_ROUTE".to_owned())
    }

    fn key(id: &str, routing_key: &str) -> String {
        return_key(id, "", routing_key)
    }

    #[test]
    fn the_key_tells_destinations_apart() {
        assert_ne!(key("m-1", "orders"), key("m-1", "nowhere"));
        assert_ne!(return_key("m-1", "a", "b"), return_key("m-1", "ab", ""));
        assert_eq!(key("m-1", "orders"), key("m-1", "orders"));
        assert_eq!(return_key("m-1", "ex", "rk"), "m-1\u{0}ex\u{0}rk");
    }

    #[test]
    fn the_sequence_counts_from_one_and_the_watermark_follows_it() {
        let written = Written::default();
        assert_eq!(written.current(), 0);
        assert_eq!(written.begin().seq(), 1);
        assert_eq!(written.clone().begin().seq(), 2, "clones share the counter");
        assert_eq!(written.current(), 2);
    }

    #[tokio::test]
    async fn settled_waits_for_the_publish_in_flight_and_not_for_later_ones() {
        let written = Written::default();
        written.settled().now_or_never().expect("nothing in flight");
        let first = written.begin();
        let mut waiting = Box::pin(written.settled());
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "publish 1 in flight"
        );
        drop(first);
        let second = written.begin();
        waiting
            .now_or_never()
            .expect("publish 1 settled; publish 2 was numbered later");
        assert!(
            written.settled().now_or_never().is_none(),
            "publish 2 in flight"
        );
        drop(second);
        written.settled().now_or_never().expect("all settled");
    }

    #[test]
    fn claim_and_expiry_rules() {
        assert!(may_claim(5, 5));
        assert!(may_claim(5, 1));
        assert!(
            !may_claim(5, 6),
            "a publish written after the return was seen"
        );

        assert_eq!(horizon(None, 0), 1);
        assert_eq!(
            horizon(None, 7),
            8,
            "empty queue: the next publish to arrive"
        );
        assert_eq!(
            horizon(Some(3), 7),
            3,
            "the oldest queued publish may still claim"
        );
        assert_eq!(horizon(None, u64::MAX), u64::MAX);

        assert!(!expired(8, horizon(None, 7)), "publish 8 may still arrive");
        assert!(expired(7, horizon(None, 7)), "every claimant was answered");
        assert!(
            !expired(7, horizon(Some(7), 7)),
            "publish 7 is still queued"
        );
    }

    /// The race behind the flaky "one message id sent to two destinations" test, replayed:
    /// publish 1 (routable) and publish 2 (unroutable) are written; lapin hangs publish 2's
    /// return on publish 1's confirm; the collector answers publish 1 while publish 2 has
    /// not been handed to it yet, so its queue is empty. The return must still be there
    /// when publish 2 arrives.
    #[test]
    fn a_return_waits_for_a_publish_not_yet_handed_to_the_collector() {
        let written = Written::default();
        let (first, second) = (written.begin().seq(), written.begin().seq());
        let mut returns = Returns::default();
        let mut received = first;

        // Publish 1's confirm carries publish 2's return.
        let own = key("twin-7", "orders");
        let carried = returns.sort(
            Some(key("twin-7", "nowhere")),
            no_route(),
            Some(&own),
            written.current(),
        );
        assert_eq!(carried, None, "not publish 1's own return");
        assert_eq!(
            returns.claim(Some(&own), first),
            None,
            "publish 1 is routed"
        );

        // The queue is empty now: that is when the collector used to clear the returns.
        assert_eq!(returns.expire(horizon(None, received)), 0);

        // Publish 2 reaches the collector and claims its return.
        received = second;
        assert_eq!(
            returns.claim(Some(&key("twin-7", "nowhere")), second),
            Some(no_route())
        );
        assert_eq!(returns.expire(horizon(None, received)), 0);
        assert_eq!(returns.len(), 0);
    }

    #[test]
    fn an_unclaimable_return_expires_once_every_possible_owner_was_answered() {
        let written = Written::default();
        let mut returns = Returns::default();
        let lost = written.begin().seq(); // written, but never handed to the collector
        returns.hold(Some(key("m-1", "nowhere")), no_route(), written.current());
        returns.hold(None, no_route(), written.current());

        // Nothing received yet: publish 1 may still arrive.
        assert_eq!(returns.expire(horizon(None, 0)), 0);
        assert_eq!(returns.len(), 2);

        // Publish 2 (a retry of the same message to the same place) arrives: it was written
        // after the returns were seen, so they are not its own and it cannot take them.
        let retry = written.begin().seq();
        assert!(retry > lost);
        assert_eq!(returns.claim(Some(&key("m-1", "nowhere")), retry), None);
        assert_eq!(returns.claim(None, retry), None);
        assert_eq!(returns.expire(horizon(Some(retry), retry)), 2);
        assert_eq!(returns.len(), 0);
        assert_eq!(
            returns.expire(horizon(None, retry)),
            0,
            "nothing left to look at"
        );
    }

    #[test]
    fn the_same_key_is_claimed_in_order_and_only_by_earlier_publishes() {
        let mut returns = Returns::default();
        let k = key("m-1", "nowhere");
        returns.hold(Some(k.clone()), (312, "first".into()), 2);
        returns.hold(Some(k.clone()), (312, "second".into()), 4);
        assert_eq!(returns.claim(Some(&k), 3), Some((312, "second".into())));
        // The first one (watermark 2) is dead for publish 3 and later.
        assert_eq!(returns.claim(Some(&k), 3), None);
        assert_eq!(returns.expire(horizon(Some(3), 3)), 1);
        assert_eq!(returns.len(), 0);
    }

    #[test]
    fn a_return_without_message_id_is_its_carriers_own_only_when_the_carrier_has_none() {
        let mut returns = Returns::default();
        assert_eq!(returns.sort(None, no_route(), None, 1), Some(no_route()));
        assert_eq!(returns.sort(None, no_route(), Some("k"), 1), None);
        assert_eq!(returns.claim(None, 1), Some(no_route()));
        let k = key("m-1", "nowhere");
        assert_eq!(
            returns.sort(Some(k.clone()), no_route(), Some(&k), 1),
            Some(no_route())
        );
        assert_eq!(returns.len(), 0);
    }
}
