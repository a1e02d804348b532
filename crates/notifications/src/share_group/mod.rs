//! `NOTIFICACOES_CONSUMPTION=share-group`: notifications read by a Kafka share group (KIP-932)
//! instead of the contract's retry topics. Issue #29; the evaluation of the client and its
//! verdict are in docs/architecture.md ("Kafka clients").
//!
//! The process runs `NOTIFICACOES_WEBHOOK_CONCURRENCY` members of share group
//! `<prefix>notificacoes-share` on the two outcome topics. Each member holds **one** record at
//! a time (`max_poll_records` 1 with KIP-1206's record limit, so the broker acquires no record
//! the member is not working on), so the members are the concurrency: a slow receiver call,
//! or a retry waiting out its delay, holds one member and nothing else. The broker shares a
//! partition between members once there are more members than partitions, so deliveries run
//! in parallel beyond the partition count, across processes too.
//!
//! Per record (explicit acknowledgement, the broker's delivery count says which attempt it is):
//! - a 2xx (or, with no webhook URL, the log line): **ACCEPT**;
//! - a failure that may pass (5xx, 408, 429, timeout, connection) on delivery 1–3: wait the
//!   contract's delay for that attempt (1 s, 2 s, 4 s) holding the record, then **RELEASE** it:
//!   the broker hands it out again at once, to any member, with its delivery count one higher.
//!   KIP-932 has no per-record delay, and a released record comes back within milliseconds,
//!   so the spacing is this wait;
//! - such a failure on delivery 4 or later (the last attempt), or a permanent one (another
//!   4xx, a redirect, an unreadable event) on any delivery: the dead letter is written to
//!   `<topic>-dlt` with the headers the retry-topic chain writes (`kafka::retry_topic::
//!   forwarded`, so `pagamentos dlt list|replay` reads it), and only once the broker
//!   acknowledged it the record is **REJECT**ed (archived, never delivered again).
//!
//! The attempts are counted by the application, from the broker's delivery count: the fourth
//! delivery is the last attempt, whatever the group's `share.delivery.count.limit` says. That
//! limit is set higher, to 4 + [`SPARE_DELIVERIES`] = 10 (the broker's default maximum,
//! `group.share.max.delivery.count.limit`): the broker archives, telling no one, a record whose
//! last allowed delivery ends without an acknowledgement, and a process that dies spends
//! deliveries without an attempt. A SIGKILL spends the delivery in hand and, seen on Kafka
//! 4.3.1, more: fetches the dead members left waiting in the broker (up to 500 ms) still
//! acquire records after the broker released the dead members' own, and give them back only
//! later. One record went from its fourth delivery, in hand at the kill, to its seventh before
//! anyone worked on it. With the limit at 4, a SIGKILL during fourth attempts lost 4 of 30
//! records (neither delivered nor dead-lettered); at 5, 3 of 30 (archived on a fifth delivery
//! taken by a dead member's fetch); at 8 and 10, none (`crates/pagamentos/tests/
//! share_group_faults.rs`, the SIGKILL test). Delivery counts also restart at 1 when the broker
//! itself restarts (it does not persist the counts of records in flight). So a record can get
//! more than four attempts in all, never fewer; and crashes during its retries that spend six
//! deliveries more can still have the broker archive it without a dead letter.
//!
//! While a member works on a record (the call, the wait, the dead letter) it renews the
//! record's acquisition lock (KIP-1222) every half lock, so a call longer than the lock
//! (`NOTIFICACOES_WEBHOOK_TIMEOUT_MS` up to 120 s, the lock 30 s by default) is not handed to
//! a second member meanwhile. On shutdown a member finishes the call in hand, releases a
//! record still waiting for its retry (redelivered at once elsewhere), and leaves the group.
//!
//! # Architecture invariant
//! `krafka` is confined to this module: everything else of pagamentos, the dead letters this
//! module writes included, goes through `rdkafka` (`kafka::producer`). A record reaches the
//! notifier as an `rdkafka` message ([`connection::to_message`]).
//!
//! # Layout
//! - here: the settings, [`start`], what the members share, and the waits they use.
//! - `member`: one member's life: join, poll one record at a time, leave.
//! - `handle`: one record's attempt and how it is settled (accept, release, dead letter).
//! - `lease`: the record's acquisition lock, renewed while a member works on it.
//! - `error`: [`Error`], and which failures no retry fixes.
//! - [`connection`]: krafka's connection, the group's configuration, records as `rdkafka`
//!   messages.

mod connection;
mod error;
mod handle;
mod lease;
mod member;

pub use error::Error;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use kafka::producer::Producer;
use kafka::retry_topic::Chain;
use kafka::KafkaArgs;
use service::supervisor::Supervisor;

use crate::notifier::Notifier;

/// The share group's id, behind `PAGAMENTOS_TOPIC_PREFIX`. Not `notificacoes`: a share group
/// cannot take the id of the consumer group the retry-topic mode uses.
pub const GROUP: &str = "notificacoes-share";

/// Deliveries beyond the attempts before the broker archives a record on its own, for the
/// deliveries crashes spend (see the module's documentation); 4 + 6 is the broker's default
/// `group.share.max.delivery.count.limit`.
pub const SPARE_DELIVERIES: u32 = 6;

/// Between tries to join, poll or write a dead letter while Kafka is away.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What the share-group mode is given by `notifications::start`.
#[derive(Debug)]
pub struct ShareGroupSettings {
    pub kafka: KafkaArgs,
    /// The outcome topics, prefix included.
    pub topics: Vec<String>,
    pub notifier: Arc<Notifier>,
    /// Writes the dead letters (rdkafka's idempotent `acks=all` producer).
    pub producer: Producer,
    /// The attempts and their delays: the contract's retry-topic chain (1 s, 2 s, 4 s).
    pub chain: Chain,
    /// Members of this process: records worked on at once.
    pub members: usize,
}

/// Sets the share group's configuration (refusing to start when the broker does not take it),
/// then spawns the members on `supervisor` as the critical task `notificacoes/share-group`.
pub async fn start(settings: ShareGroupSettings, supervisor: &Supervisor) -> Result<(), Error> {
    let group = settings.kafka.group(GROUP);
    let admin = connection::connect(&settings.kafka, "notificacoes").await?;
    let delivery_count_limit = settings.chain.attempts() + SPARE_DELIVERIES;
    connection::configure_group(&admin, &group, delivery_count_limit).await?;
    tracing::info!(
        group,
        members = settings.members,
        delivery_count_limit,
        "notificacoes consumes through a share group"
    );
    let members = settings.members.max(1);
    let shared = Arc::new(Shared {
        assigned: Members::new(&group),
        kafka: settings.kafka,
        group,
        topics: settings.topics,
        notifier: settings.notifier,
        producer: settings.producer,
        chain: settings.chain,
    });
    supervisor.spawn_fallible("notificacoes/share-group", run(shared, members, supervisor.shutdown_token()));
    Ok(())
}

/// What every member shares.
#[derive(Debug)]
struct Shared {
    kafka: KafkaArgs,
    group: String,
    topics: Vec<String>,
    notifier: Arc<Notifier>,
    producer: Producer,
    chain: Chain,
    assigned: Members,
}

/// `notifications_members_with_partitions{group}`: members in `group` the broker has given
/// partitions, of all the services of this process (one in a deployment; tests run many, each
/// with its own group but for the test of two instances). Below
/// `NOTIFICACOES_WEBHOOK_CONCURRENCY` while members join, and for good when there are more
/// members in the group than the broker shares partitions with. Each member adds itself when
/// it gets partitions and takes itself off when it has none left or leaves.
#[derive(Debug)]
struct Members {
    gauge: metrics::Gauge,
}

impl Members {
    fn new(group: &str) -> Self {
        let gauge = metrics::gauge!("notifications_members_with_partitions", "group" => group.to_owned());
        gauge.increment(0.0); // shown at 0 before any member has partitions
        Self { gauge }
    }

    /// Records whether one member has partitions (`was`: what it had before).
    fn update(&self, was: bool, now: bool) {
        match (was, now) {
            (false, true) => self.gauge.increment(1.0),
            (true, false) => self.gauge.decrement(1.0),
            _ => {}
        }
    }
}

/// Runs `members` members until `shutdown`. The first member that cannot go on (a broker
/// without share groups, refused credentials) shuts the service down; the others drain.
async fn run(shared: Arc<Shared>, members: usize, shutdown: CancellationToken) -> Result<(), Error> {
    let mut running = tokio::task::JoinSet::new();
    for index in 0..members {
        running.spawn(member::member(shared.clone(), index, shutdown.clone()));
    }
    let mut first_error = None;
    while let Some(joined) = running.join_next().await {
        let error = match joined {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error,
            Err(join_error) => Error::Panicked(join_error.to_string()),
        };
        shutdown.cancel();
        first_error.get_or_insert(error);
    }
    first_error.map_or(Ok(()), Err)
}

/// Waits `delay`, or until `shutdown`.
async fn wait(delay: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(delay) => {}
    }
}

/// Doubling waits between tries while Kafka is away.
#[derive(Debug, Clone, Copy)]
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(BACKOFF_MIN)
    }
}

impl Backoff {
    /// Waits the current backoff and doubles it; false if `shutdown` came first.
    async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        let delay = self.0;
        self.0 = (self.0 * 2).min(BACKOFF_MAX);
        tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

#[cfg(test)]
mod tests;
