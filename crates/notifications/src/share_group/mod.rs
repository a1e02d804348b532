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

mod connection;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use krafka::share_consumer::{AcknowledgementCommit, AcknowledgementMode, AcquireMode, ShareConsumer};
use krafka::{ConsumerRecord, KrafkaError, ProtocolErrorKind};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use contracts::topics::dead_letter_topic;
use kafka::dead_letter::Failure;
use kafka::producer::Producer;
use kafka::retry_topic::{Attempt, Chain, Destination, Verdict};
use kafka::KafkaArgs;
use telemetry::supervisor::Supervisor;

use crate::notifier::Notifier;

/// The share group's id, behind `PAGAMENTOS_TOPIC_PREFIX`. Not `notificacoes`: a share group
/// cannot take the id of the consumer group the retry-topic mode uses.
pub const GROUP: &str = "notificacoes-share";

/// Deliveries beyond the attempts before the broker archives a record on its own, for the
/// deliveries crashes spend (see the module's documentation); 4 + 6 is the broker's default
/// `group.share.max.delivery.count.limit`.
pub const SPARE_DELIVERIES: u32 = 6;

/// How long one poll waits for a record.
const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Renewals of a record's lock when the broker has not said how long it lasts (it does in
/// every fetch answer from Kafka 4.2 on); the broker's smallest default lock is 15 s.
const DEFAULT_LOCK: Duration = Duration::from_secs(15);
/// Between tries to join, poll or write a dead letter while Kafka is away.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Leaving the group at shutdown: the last acknowledgements and the leave heartbeat.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

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
        running.spawn(member(shared.clone(), index, shutdown.clone()));
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

/// One member: joins, works one record at a time until `shutdown`, leaves.
async fn member(shared: Arc<Shared>, index: usize, shutdown: CancellationToken) -> Result<(), Error> {
    let Some(consumer) = join(&shared, index, &shutdown).await? else {
        return Ok(()); // shut down before it joined
    };
    let mut assigned = false;
    let result = consume(&shared, index, &consumer, &mut assigned, &shutdown).await;
    shared.assigned.update(assigned, false);
    // sends what is acknowledged, the broker releases anything still held, then leave
    let options = krafka::CloseOptions::new().timeout(CLOSE_TIMEOUT);
    if let Err(error) = consumer.close_with(options).await {
        tracing::info!(member = index, error = %error, "share group member left uncleanly");
    }
    result
}

/// A member of the group, subscribed to the outcome topics; `None` if `shutdown` came first.
/// Kafka being away is waited out; what no retry fixes is an error.
async fn join(
    shared: &Shared,
    index: usize,
    shutdown: &CancellationToken,
) -> Result<Option<ShareConsumer>, Error> {
    let mut backoff = Backoff::default();
    loop {
        let attempt = async {
            let kafka = connection::connect(&shared.kafka, "notificacoes").await?;
            let consumer = kafka
                .share_consumer(shared.group.clone())
                .acknowledgement_mode(AcknowledgementMode::Explicit)
                .acquire_mode(AcquireMode::RecordLimit)
                .max_poll_records(1)
                .batch_size(1)
                .metrics_push(false)
                .acknowledgement_commit_callback(count_failed_acknowledgements)
                .build()
                .await
                .map_err(|source| Error::Join { group: shared.group.clone(), source })?;
            consumer
                .subscribe(&shared.topics)
                .await
                .map_err(|source| Error::Join { group: shared.group.clone(), source })?;
            Ok::<_, Error>(consumer)
        };
        let joined = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(None),
            joined = attempt => joined,
        };
        match joined {
            Ok(consumer) => return Ok(Some(consumer)),
            Err(error) if error.is_fatal() => return Err(error),
            Err(error) => {
                tracing::warn!(member = index, error = %telemetry::error_chain(&error), "share group member could not join; retrying");
                if !backoff.wait(shutdown).await {
                    return Ok(None);
                }
            }
        }
    }
}

/// Polls one record at a time and settles it, until `shutdown`.
async fn consume(
    shared: &Shared,
    index: usize,
    consumer: &ShareConsumer,
    assigned: &mut bool,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let mut backoff = Backoff::default();
    loop {
        let now = !consumer.assignment().is_empty();
        shared.assigned.update(*assigned, now);
        *assigned = now;
        let polled = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            // cancel safe: a dropped poll returns nothing and acquires nothing for us
            polled = consumer.poll(POLL_TIMEOUT) => polled,
        };
        let records = match polled {
            Ok(records) => {
                backoff = Backoff::default();
                records
            }
            Err(source) if is_fatal(&source) => {
                return Err(Error::Consume { group: shared.group.clone(), source })
            }
            Err(error) => {
                tracing::warn!(error = %error, group = shared.group, "share group poll failed; retrying");
                if !backoff.wait(shutdown).await {
                    return Ok(());
                }
                continue;
            }
        };
        // one record with the record limit; should the broker hand out more, none waits on another
        futures::future::join_all(
            records.iter().map(|record| shared.handle(index, consumer, record, shutdown)),
        )
        .await;
    }
}

/// How a record is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Accept,
    Release,
    Reject,
}

impl Shared {
    /// One attempt at `record`, then its acknowledgement (see the module's documentation).
    async fn handle(
        &self,
        member: usize,
        consumer: &ShareConsumer,
        record: &ConsumerRecord,
        shutdown: &CancellationToken,
    ) {
        let message = connection::to_message(record);
        let delivery = record.delivery_count.map_or(1, |count| u32::try_from(count.max(1)).unwrap_or(1));
        // for the log lines below (the notifier's own span names it too)
        let event = self.notifier.decode(&message).ok().map(|outcome| outcome.event_id);
        tracing::debug!(
            member,
            topic = &*record.topic,
            partition = record.partition,
            offset = record.offset,
            delivery,
            event_id = ?event,
            "record acquired"
        );
        let mut lease = Lease::new(consumer, record);
        let verdict = lease.hold(self.notifier.attempt(&message)).await;
        let settle = match verdict {
            Verdict::Done => Settle::Accept,
            Verdict::Retry(failure) if delivery < self.chain.attempts() => {
                let delay = self.delay_after(delivery);
                metrics::counter!("retries_total", "topic" => record.topic.to_string()).increment(1);
                tracing::info!(
                    member,
                    topic = &*record.topic,
                    partition = record.partition,
                    offset = record.offset,
                    delivery,
                    event_id = ?event,
                    delay_ms = delay.as_millis() as u64,
                    reason = failure.message,
                    "attempt failed; released for redelivery after its delay"
                );
                // on shutdown: released at once, redelivered to whoever is still running
                lease.hold(wait(delay, shutdown)).await;
                Settle::Release
            }
            Verdict::Retry(failure) | Verdict::Reject(failure) => {
                if self.dead_letter(&mut lease, &message, &failure, delivery, shutdown).await {
                    Settle::Reject
                } else {
                    Settle::Release // shut down before the dead letter was written: redelivered
                }
            }
        };
        let settled = match settle {
            Settle::Accept => consumer.ack(record),
            Settle::Release => consumer.release(record),
            Settle::Reject => consumer.reject(record),
        };
        if let Err(error) = settled {
            // the member lost the record meanwhile (its assignment changed): the broker hands
            // it out again when its lock ends, so it is repeated, never lost
            tracing::warn!(
                topic = &*record.topic,
                partition = record.partition,
                offset = record.offset,
                event_id = ?event,
                ?settle,
                error = %error,
                "acknowledgement refused"
            );
        } else if settle == Settle::Release {
            // Sent and applied now, not with the next fetch: the broker runs a fetch's
            // acknowledgements and its acquisition side by side, so a release riding on it is
            // seen only by the fetch after (up to the 500 ms a fetch waits for records): the
            // first retry came 1.5 s after its failure instead of 1 s.
            if let Err(error) = consumer.commit().await {
                tracing::info!(error = %error, "release not confirmed; it goes with the next fetch");
            }
        }
    }

    /// The contract's delay after failed attempt `delivery` (1 s after the first, 2 s, 4 s).
    fn delay_after(&self, delivery: u32) -> Duration {
        let delays = &self.chain.delays_ms;
        let index = (delivery.saturating_sub(1) as usize).min(delays.len().saturating_sub(1));
        Duration::from_millis(u64::from(delays.get(index).copied().unwrap_or(0)))
    }

    /// Writes `message`'s dead letter to `<topic>-dlt` and waits for the broker's
    /// acknowledgement, trying again while Kafka refuses it; false if `shutdown` came first.
    async fn dead_letter(
        &self,
        lease: &mut Lease<'_>,
        message: &kafka::rdkafka::message::OwnedMessage,
        failure: &Failure,
        delivery: u32,
        shutdown: &CancellationToken,
    ) -> bool {
        use kafka::rdkafka::message::Message as _;
        let topic = dead_letter_topic(message.topic());
        let destination = Destination::DeadLetter { topic: topic.clone() };
        let letter = kafka::retry_topic::forwarded(
            message,
            &self.group,
            failure,
            delivery,
            &destination,
            kafka::retry_topic::now_ms(),
        );
        let mut backoff = Backoff::default();
        loop {
            let sent = lease
                .hold(async {
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => None,
                        sent = self.producer.send(&letter) => Some(sent),
                    }
                })
                .await;
            match sent {
                None => return false,
                Some(Ok(_)) => break,
                Some(Err(error)) => {
                    tracing::warn!(error = %telemetry::error_chain(&error), topic, "dead letter not written; retrying");
                    if !lease.hold(backoff.wait(shutdown)).await {
                        return false;
                    }
                }
            }
        }
        metrics::counter!("dlt_mensagens_total", "topic" => topic.clone()).increment(1);
        tracing::warn!(
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset(),
            delivery,
            dead_letter_topic = topic,
            reason = failure.message,
            "record sent to dead-letter topic"
        );
        true
    }
}

/// Keeps a record's acquisition lock while the member works on it: renews it every half
/// lock (KIP-1222) from when it was polled, across every step of its handling.
struct Lease<'a> {
    consumer: &'a ShareConsumer,
    record: &'a ConsumerRecord,
    every: Duration,
    next: Instant,
    /// False once the broker said it cannot renew (older than Kafka 4.2).
    renewable: bool,
}

impl<'a> Lease<'a> {
    fn new(consumer: &'a ShareConsumer, record: &'a ConsumerRecord) -> Self {
        // the lock started when the broker built the fetch answer, a little before now
        let every = consumer.acquisition_lock_timeout().unwrap_or(DEFAULT_LOCK) / 2;
        Self { consumer, record, every, next: Instant::now() + every, renewable: true }
    }

    async fn hold<F: Future>(&mut self, work: F) -> F::Output {
        tokio::pin!(work);
        loop {
            tokio::select! {
                output = &mut work => return output,
                _ = tokio::time::sleep_until(self.next), if self.renewable => self.renew(),
            }
        }
    }

    fn renew(&mut self) {
        self.next = Instant::now() + self.every;
        match self.consumer.renew(self.record) {
            Ok(()) => tracing::debug!(offset = self.record.offset, "acquisition lock renewed"),
            Err(error) => {
                if error.protocol_error_kind() == Some(ProtocolErrorKind::UnknownApiVersion) {
                    self.renewable = false;
                }
                tracing::warn!(
                    topic = &*self.record.topic,
                    partition = self.record.partition,
                    offset = self.record.offset,
                    error = %error,
                    "acquisition lock not renewed: the record may be handed to another member when it ends"
                );
            }
        }
    }
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

/// The broker's answer to acknowledgements it did not apply (a record whose lock ended is
/// answered `INVALID_RECORD_STATE`: it went, or goes, to another member). Counted and logged:
/// such a record is delivered again, which receivers absorb by `Idempotency-Key`.
fn count_failed_acknowledgements(commit: &AcknowledgementCommit) {
    if let Err(error) = &commit.result {
        metrics::counter!("notifications_acknowledgement_failures_total").increment(1);
        tracing::warn!(
            topic = commit.topic,
            partition = commit.partition,
            offsets = ?commit.offsets,
            error = %error,
            "share group acknowledgement failed"
        );
    }
}

/// Whether `error` is one no retry fixes: wrong settings, refused credentials or
/// permissions, or a broker that has no share groups.
fn is_fatal(error: &KrafkaError) -> bool {
    use krafka::error::ErrorCode;
    matches!(error, KrafkaError::Config { .. } | KrafkaError::Auth { .. })
        || error.protocol_error_kind() == Some(ProtocolErrorKind::UnknownApiVersion)
        || matches!(
            error,
            KrafkaError::Broker {
                code: ErrorCode::GroupAuthorizationFailed
                    | ErrorCode::TopicAuthorizationFailed
                    | ErrorCode::ClusterAuthorizationFailed
                    | ErrorCode::SaslAuthenticationFailed,
                ..
            }
        )
}

/// What stops the share-group mode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to Kafka at {bootstrap}")]
    Connect {
        bootstrap: String,
        #[source]
        source: KrafkaError,
    },
    #[error("Kafka security settings: {0}")]
    Security(String),
    #[error(
        "cannot configure share group {group} (share groups need Kafka 4.2 or later with the \
         share.version feature enabled, and, with ACLs, ALTER_CONFIGS on the group)"
    )]
    GroupConfig {
        group: String,
        #[source]
        source: KrafkaError,
    },
    #[error("cannot join share group {group}")]
    Join {
        group: String,
        #[source]
        source: KrafkaError,
    },
    #[error("share group {group} cannot consume")]
    Consume {
        group: String,
        #[source]
        source: KrafkaError,
    },
    #[error("a share group member panicked: {0}")]
    Panicked(String),
}

impl Error {
    /// Whether trying again cannot help.
    fn is_fatal(&self) -> bool {
        match self {
            Self::Connect { source, .. }
            | Self::Join { source, .. }
            | Self::Consume { source, .. }
            | Self::GroupConfig { source, .. } => is_fatal(source),
            Self::Security(_) | Self::Panicked(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_spaced_as_the_contract_chain() {
        let shared = Shared {
            kafka: KafkaArgs::new("127.0.0.1:1"),
            group: GROUP.into(),
            topics: Vec::new(),
            notifier: Arc::new(Notifier::new(None, "t".into())),
            producer: Producer::new(&kafka::config::producer_config(
                &KafkaArgs::new("127.0.0.1:1"),
                "test",
                Duration::ZERO,
            ))
            .expect("producer"),
            chain: crate::chain(),
            assigned: Members::new(GROUP),
        };
        assert_eq!(shared.chain.attempts(), 4);
        let delays: Vec<u64> =
            (1..=5).map(|delivery| shared.delay_after(delivery).as_millis() as u64).collect();
        assert_eq!(delays, [1000, 2000, 4000, 4000, 4000]);
    }

    /// Tests run many services in one process, and the test of two instances two in one
    /// group: each group counts its own members, summed over the services that have them.
    #[test]
    fn members_with_partitions_are_counted_per_group_over_the_process() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let (one, other, second) =
                (Members::new("g-one"), Members::new("g-other"), Members::new("g-one"));
            one.update(false, true);
            one.update(false, true);
            let fresh = Members::new("g-other"); // a service starting later counts from its own 0
            other.update(false, true);
            second.update(false, true);
            one.update(true, false);
            one.update(true, true); // no change
            drop(fresh);
        });
        let text = handle.render();
        for expected in [
            "notifications_members_with_partitions{group=\"g-one\"} 2\n",
            "notifications_members_with_partitions{group=\"g-other\"} 1\n",
        ] {
            assert!(text.contains(expected), "{expected} missing from:\n{text}");
        }
    }

    #[test]
    fn only_what_no_retry_fixes_is_fatal() {
        assert!(is_fatal(&KrafkaError::config("bad")));
        assert!(is_fatal(&KrafkaError::protocol_kind(
            ProtocolErrorKind::UnknownApiVersion,
            "no share groups"
        )));
        assert!(is_fatal(&KrafkaError::broker(krafka::error::ErrorCode::GroupAuthorizationFailed, "acl")));
        assert!(!is_fatal(&KrafkaError::timeout("poll")));
        assert!(!is_fatal(&KrafkaError::broker(krafka::error::ErrorCode::CoordinatorNotAvailable, "moving")));
        assert!(!is_fatal(&KrafkaError::network(std::io::Error::other("refused"))));
    }
}
