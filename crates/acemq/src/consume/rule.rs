//! What differs between consumer kinds, passed to the one delivery path as a [`Rule`].
//!
//! Every consumer kind (a plain consumer, a responder, an ordered partition, a stream
//! reader, and the patterns built on them) runs the same steps on a delivery (`handle`):
//! admit, crash-loop check, decode, interceptors, claim, handler, decide, settle. A kind
//! differs only in its rule:
//!
//! - how a delivery's fate is decided (the retry ladder of a plain consumer, [`Rules`]; a
//!   retry in place then a halt or a skip for an ordered partition or a stream, whose
//!   order a republish would break: `decide::InPlace`);
//! - what it looks at before anything runs ([`Rule::begin`]: a stream entry below the
//!   reader's position is acked unseen, a halted partition's message is held again);
//! - how a delivery is held while its partition is halted ([`Rule::hold`]);
//! - what it keeps track of once a delivery is decided ([`Rule::decided`]: an ordered
//!   queue's counters, a stream reader's position).
//!
//! The rule is a type parameter (tower's `Retry<P, S>` takes its `Policy` the same way), so
//! the plain consumer pays nothing for the hooks it does not use.

use std::future::Future;

use super::decide::{Decision, Facts, Outcome, Rules, crash_loop, decide};
use crate::envelope::Envelope;
use crate::transport::Delivery;

/// What to do with a delivery before anything runs.
#[derive(Debug)]
pub(crate) enum Begin {
    /// Go through the steps.
    Run,
    /// Ack it without running anything or counting it (a stream entry already handled).
    AckUnseen,
    /// Hold it until the rule lets it run ([`Rule::hold`]), then go through the steps.
    Hold(String),
    /// Stop the consumer here, leaving the delivery unsettled.
    Stop(String),
}

/// How the consumer goes on after a delivery.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Take the next delivery.
    Next,
    /// The consumer stops: closed by its user, or on the rule's word (the reason).
    Stop(Option<String>),
    /// The delivery's channel is gone: subscribe again.
    Lost(String),
}

/// A consumer kind's rule. Only `crash_loop` and `decide` have no default.
pub(crate) trait Rule: Send + Sync + 'static {
    /// Before admission; the default runs every delivery.
    fn begin(&self, _d: &Delivery, _envelope: &Envelope) -> Begin {
        Begin::Run
    }

    /// The crash-loop check, before decoding: `Some` decides without running the handler.
    fn crash_loop(&self, facts: Facts) -> Option<Decision>;

    /// The fate of a delivery from what happened to it.
    fn decide(&self, outcome: &Outcome, facts: Facts) -> Decision;

    /// Holds `d` (unacked, nothing behind it handed over) after [`Decision::Hold`] or
    /// [`Begin::Hold`]: [`Flow::Next`] runs it again from attempt 1; anything else ends the
    /// delivery unsettled. Only rules that decide `Hold` override it.
    fn hold(
        &self,
        _d: &Delivery,
        _message_id: &str,
        reason: &str,
    ) -> impl Future<Output = Flow> + Send {
        let reason = reason.to_owned();
        async move { Flow::Stop(Some(reason)) }
    }

    /// Told every decision about to be carried out (and every hold), with the delivery's
    /// envelope.
    fn decided(&self, _decision: &Decision, _envelope: &Envelope) {}

    /// Whether a delivery caught by the consumer's close is handed back with requeue
    /// (`true`) or left for the channel's close to return (`false`: the broker then puts
    /// the whole window back in order).
    fn requeue_on_close(&self) -> bool {
        true
    }
}

/// The plain consumer's rule: the retry ladder of its policy (wire.md §5–§6).
impl Rule for Rules {
    fn crash_loop(&self, facts: Facts) -> Option<Decision> {
        crash_loop(facts, self)
    }

    fn decide(&self, outcome: &Outcome, facts: Facts) -> Decision {
        decide(outcome, facts, self, &mut rand::rng())
    }
}
