//! Consumer groups: competing consumers of one queue, each its own subscription (its own
//! channel and prefetch on RabbitMQ), scaled while they run.
//!
//! A group starts its members the way one consumer starts (the same options and handler),
//! so a member is an ordinary consumer on the one delivery path. `scale_to` grows at once
//! and shrinks by closing the newest members, each draining what it holds (running
//! handlers finish, buffered deliveries go back to the queue); `set_prefetch` replaces the
//! members one by one (a new one with the new window first), so the queue is never left
//! without a consumer; `close` closes every member at once, so the group shares one drain
//! budget instead of one per member. Resizes are serialised.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::Mutex;

use super::{Consumer, ConsumerOptions, ConsumerStats};
use crate::error::Error;
use crate::transport::Transport;

/// Starts one member with these options.
pub(crate) type StartMember =
    Arc<dyn Fn(ConsumerOptions) -> BoxFuture<'static, Result<Consumer, Error>> + Send + Sync>;

/// Gauge: members of a consumer group now (Rust only). Tags: `queue`.
pub use crate::observe::metrics::CONSUMER_GROUP_MEMBERS;

/// One member, as [`ConsumerGroup::members`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberStats {
    /// Its place in the group (0 = the oldest).
    pub index: usize,
    /// Deliveries it is handling now.
    pub in_flight: usize,
    /// Its outcome counts since it started.
    pub stats: ConsumerStats,
}

/// How deep the group's queue is, for an autoscaler.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct GroupDepth {
    /// Ready messages in the queue.
    pub ready: u32,
    /// Consumers the broker lists on it (this group's and any other).
    pub consumers: u32,
    /// This group's members.
    pub members: usize,
    /// Ready messages per member of this group (0 when it has none).
    pub ready_per_member: f64,
}

/// Competing consumers of one queue, scaled while they run. Made by
/// [`crate::Connection::consume_group`] (and one per pipeline step).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), acemq::Error> {
/// use acemq::consume::{ConsumerOptions, Message};
/// let mq = acemq::Connection::connect("memory://doc-group").await?;
/// mq.declare(&acemq::topology::Topology::define().queue("jobs").build()?).await?;
/// let group = mq
///     .consume_group("jobs", 2, ConsumerOptions::default(), |_: Message<u32>| async { Ok(()) })
///     .await?;
/// group.scale_to(4).await?;
/// assert_eq!(group.size().await, 4);
/// group.scale_to(1).await?;
/// group.close().await;
/// # Ok(()) }
/// ```
pub struct ConsumerGroup {
    queue: String,
    transport: Arc<dyn Transport>,
    start: StartMember,
    state: Mutex<State>,
}

struct State {
    options: ConsumerOptions,
    members: Vec<Consumer>,
}

impl std::fmt::Debug for ConsumerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerGroup")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl ConsumerGroup {
    /// Starts `size` members; when one fails to start, those started are closed and the
    /// error returned.
    pub(crate) async fn start(
        queue: &str,
        transport: Arc<dyn Transport>,
        size: usize,
        options: ConsumerOptions,
        start: StartMember,
    ) -> Result<ConsumerGroup, Error> {
        let group = ConsumerGroup {
            queue: queue.to_owned(),
            transport,
            start,
            state: Mutex::new(State {
                options,
                members: Vec::new(),
            }),
        };
        group.scale_to(size).await?;
        Ok(group)
    }

    /// The consumed queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Grows (at once) or shrinks (closing the newest members, each draining what it
    /// holds) to `n` members; `n` must be at least 1.
    pub async fn scale_to(&self, n: usize) -> Result<(), Error> {
        if n == 0 {
            return Err(Error::InvalidArgument(
                "a consumer group needs at least one member: close it instead".into(),
            ));
        }
        let mut state = self.state.lock().await;
        while state.members.len() < n {
            match (self.start)(state.options.clone()).await {
                Ok(member) => state.members.push(member),
                Err(e) => {
                    self.gauge(state.members.len());
                    return Err(e);
                }
            }
        }
        let removed: Vec<Consumer> = state.members.drain(n..).collect();
        futures::future::join_all(removed.iter().map(Consumer::close)).await;
        self.gauge(state.members.len());
        Ok(())
    }

    /// Changes every member's prefetch: each is replaced by one with the new window (the
    /// new member subscribes before the old one drains), so the queue always has a
    /// consumer.
    pub async fn set_prefetch(&self, prefetch: u16) -> Result<(), Error> {
        if prefetch == 0 {
            return Err(Error::InvalidArgument("prefetch must be at least 1".into()));
        }
        let mut state = self.state.lock().await;
        state.options = state.options.clone().prefetch(prefetch);
        for i in 0..state.members.len() {
            let fresh = (self.start)(state.options.clone()).await?;
            let old = std::mem::replace(&mut state.members[i], fresh);
            old.close().await;
        }
        Ok(())
    }

    /// Members now.
    pub async fn size(&self) -> usize {
        self.state.lock().await.members.len()
    }

    /// Each member's in-flight count and outcome counts.
    pub async fn members(&self) -> Vec<MemberStats> {
        let state = self.state.lock().await;
        state
            .members
            .iter()
            .enumerate()
            .map(|(index, m)| MemberStats {
                index,
                in_flight: m.in_flight(),
                stats: m.stats(),
            })
            .collect()
    }

    /// The members' outcome counts together (members closed by a scale-down no longer
    /// count).
    pub async fn stats(&self) -> ConsumerStats {
        self.members()
            .await
            .iter()
            .fold(ConsumerStats::default(), |all, m| all + m.stats)
    }

    /// Deliveries being handled by the group now.
    pub async fn in_flight(&self) -> usize {
        self.members().await.iter().map(|m| m.in_flight).sum()
    }

    /// The queue's depth and the group's size, asked of the broker.
    pub async fn depth(&self) -> Result<GroupDepth, Error> {
        let info = self.transport.inspect_queue(&self.queue).await?;
        let members = self.size().await;
        let ready_per_member = if members == 0 {
            0.0
        } else {
            f64::from(info.message_count) / members as f64
        };
        Ok(GroupDepth {
            ready: info.message_count,
            consumers: info.consumer_count,
            members,
            ready_per_member,
        })
    }

    /// Closes every member at once (one shared drain, not one per member).
    pub async fn close(&self) {
        let mut state = self.state.lock().await;
        futures::future::join_all(state.members.iter().map(Consumer::close)).await;
        state.members.clear();
        self.gauge(0);
    }

    fn gauge(&self, n: usize) {
        metrics::gauge!(CONSUMER_GROUP_MEMBERS, "queue" => self.queue.clone()).set(n as f64);
    }
}
