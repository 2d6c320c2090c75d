//! The bounded pass behind [`Replay::replay_matching`], [`Replay::dry_run_matching`] and
//! [`Replay::purge_matching`], and the two ways held messages go back: returned to their
//! places ([`give_back`]) or moved to the tail ([`to_tail`]).
//!
//! A pass examines at most the queue's ready count at its start (capped by the scan
//! limit), one basic.get at a time, so each message is examined at most once. Messages
//! it passes over are held unacked; when [`Replay::hold_limit`] of them are held they are
//! moved to the tail (republished byte for byte through the default exchange to the same
//! queue, each original acked after its copy is confirmed), and from then on the pass ends
//! by moving the rest to the tail too, so the passed-over messages keep their relative
//! order. A pass that never filled its hold returns them to their places.

use bytes::Bytes;

use super::{DeadLetter, Replay, ReplayProgress, ReplayReport};
use crate::envelope::{Envelope, application_headers};
use crate::error::Error;
use crate::transport::{Confirmation, Delivery, Outbound, Settlement, TransportError};

/// What a pass does with a message the filter accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// Moves it back to the source queue.
    Replay,
    /// Notes its id and leaves it where it is.
    DryRun,
    /// Drops it (ack).
    Purge,
}

/// One pass's state: the report so far and what it holds.
struct Pass<'r> {
    replay: &'r Replay,
    report: ReplayReport,
    held: Vec<Delivery>,
    /// Some held messages were moved to the tail already.
    rotated: bool,
    total_hint: u64,
}

impl Replay {
    /// One bounded pass (see the module docs).
    pub(super) async fn pass<F>(
        &self,
        mode: Mode,
        max: usize,
        mut filter: F,
    ) -> Result<ReplayReport, Error>
    where
        F: FnMut(&DeadLetter<'_>) -> bool,
    {
        let _one_at_a_time = self.engine.gets.lock().await;
        let at_start = self.pending().await? as usize;
        let budget = self
            .scan_limit
            .map_or(at_start, |limit| limit.min(at_start));
        let mut pass = Pass {
            replay: self,
            report: ReplayReport::default(),
            held: Vec::new(),
            rotated: false,
            total_hint: budget as u64,
        };
        let ran = pass.run(mode, max, budget, &mut filter).await;
        let ended = pass.finish().await;
        ran.and(ended).map(|()| pass.report)
    }
}

impl Pass<'_> {
    async fn run<F>(
        &mut self,
        mode: Mode,
        max: usize,
        budget: usize,
        filter: &mut F,
    ) -> Result<(), Error>
    where
        F: FnMut(&DeadLetter<'_>) -> bool,
    {
        let replay = self.replay;
        while self.report.scanned < budget && self.taken(mode) < max {
            let Some(d) = replay.engine.transport.get(&replay.from).await? else {
                break;
            };
            self.report.scanned += 1;
            let envelope = Envelope::read(&d.properties, &d.routing_key);
            let headers = application_headers(&d.properties.headers);
            let accepted = filter(&DeadLetter {
                envelope: &envelope,
                headers: &headers,
                body: &d.body,
            });
            let id = envelope.id().to_owned();
            match (accepted, mode) {
                (false, _) => {
                    self.report.declined += 1;
                    self.hold(d).await?;
                }
                (true, Mode::DryRun) => {
                    self.report.matched_ids.push(id);
                    self.hold(d).await?;
                }
                (true, Mode::Purge) => {
                    d.acker.ack().await?;
                    self.report.purged += 1;
                    self.report.matched_ids.push(id);
                }
                (true, Mode::Replay) => match replay.move_back(&d, envelope).await {
                    Ok(true) => {
                        self.report.replayed += 1;
                        self.report.matched_ids.push(id);
                    }
                    Ok(false) => {
                        self.report.failed += 1;
                        self.hold(d).await?;
                    }
                    Err(e) => {
                        // It goes back with the others.
                        self.held.push(d);
                        return Err(e);
                    }
                },
            }
            self.progress();
        }
        Ok(())
    }

    /// How many accepted messages count against `max`.
    fn taken(&self, mode: Mode) -> usize {
        match mode {
            Mode::Replay => self.report.replayed,
            Mode::DryRun => self.report.matched_ids.len(),
            Mode::Purge => 0,
        }
    }

    /// Holds a passed-over message; a full hold goes to the tail.
    async fn hold(&mut self, d: Delivery) -> Result<(), Error> {
        self.held.push(d);
        if self.held.len() >= self.replay.hold_limit {
            self.rotated = true;
            let held = std::mem::take(&mut self.held);
            to_tail(self.replay, held).await?;
        }
        Ok(())
    }

    /// Hands back what the pass still holds: to the tail behind the ones already moved
    /// there, or to their places when none were.
    async fn finish(&mut self) -> Result<(), Error> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return Ok(());
        }
        if self.rotated {
            to_tail(self.replay, held).await
        } else {
            give_back(held).await;
            Ok(())
        }
    }

    fn progress(&self) {
        if let Some(f) = &self.replay.progress {
            f(&ReplayProgress {
                scanned: self.report.scanned,
                replayed: self.report.replayed + self.report.purged,
                declined: self.report.declined,
                failed: self.report.failed,
                total_hint: Some(self.total_hint),
            });
        }
    }
}

/// Moves held messages to the tail of the queue they came from, in their order: each is
/// republished byte for byte (same properties, headers and body) through the default
/// exchange, the copies pipelined, and each original acked once its copy is confirmed and
/// routed. A message whose copy did not land is returned to its place instead.
pub(super) async fn to_tail(replay: &Replay, held: Vec<Delivery>) -> Result<(), Error> {
    let transport = &replay.engine.transport;
    let mut sent = Vec::with_capacity(held.len());
    let mut back = Vec::new();
    let mut failure: Option<Error> = None;
    let mut rest = held.into_iter();
    for d in rest.by_ref() {
        let copy = Outbound {
            exchange: String::new(),
            routing_key: replay.from.clone(),
            mandatory: true,
            properties: crate::transport::Properties::clone(&d.properties),
            body: Bytes::clone(&d.body),
        };
        match transport.publish(copy).await {
            Ok(confirm) => sent.push((d, confirm)),
            Err(e) => {
                back.push(d);
                failure = Some(e.into());
                break;
            }
        }
    }
    back.extend(rest);
    for (d, confirm) in sent {
        match confirm.await {
            Ok(Confirmation::Routed) => {
                if let Err(e) = d.acker.ack().await {
                    // Its channel is gone: the broker has returned the original, and the
                    // copy is in the queue too (a duplicate, never a loss).
                    failure.get_or_insert(e.into());
                }
            }
            Ok(refused) => {
                // The original goes back to its place; the pass stops with what the broker
                // said.
                let message_id = d.properties.message_id.clone().unwrap_or_default();
                failure.get_or_insert(match refused {
                    Confirmation::Unroutable { reply_text, .. } => Error::Unroutable {
                        exchange: String::new(),
                        routing_key: replay.from.clone(),
                        message_id,
                        reply_text,
                    },
                    _ => Error::Nacked { message_id },
                });
                back.push(d);
            }
            Err(e) => {
                failure.get_or_insert(e.into());
                back.push(d);
            }
        }
    }
    give_back(back).await;
    failure.map_or(Ok(()), Err)
}

/// Returns held messages to their places, in their order, with one basic.nack
/// (`multiple`, requeue) on the last of them: every earlier unsettled delivery of the
/// basic.get channel is one of them, since one pass or peek at a time uses it
/// ([`crate::engine::Engine`]'s `gets` lock). RabbitMQ classic queues (what `{q}.dlq` and
/// `{q}.parked` are) and `memory://` put them back at the head in their order; a RabbitMQ
/// 3.10 quorum queue puts returned messages behind the others, in their order. A nack that
/// cannot be sent means the channel is gone, and the broker has returned them already.
pub(super) async fn give_back(held: Vec<Delivery>) {
    let Some(last) = held.last() else {
        return;
    };
    let requeue = Settlement::Nack {
        multiple: true,
        requeue: true,
    };
    if let Err(e) = last.acker.settle(requeue).await
        && !matches!(e, TransportError::AckNotSent)
    {
        tracing::debug!(error = %e, "held messages go back when their channel closes");
    }
}
