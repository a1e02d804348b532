//! The exactly-once loop: consume, transform, produce and commit the consumed offsets in one
//! Kafka transaction per batch, the canonical way (librdkafka's `examples/transactions.c`,
//! Kafka Streams): after any failure nothing in hand is trusted.
//!
//! One iteration:
//! 1. collect a batch (up to [`Options::batch_records_max`] records, or what arrives within
//!    [`Options::batch_wait_max`] of the first);
//! 2. check each partition's records against where the loop last positioned the consumer
//!    (its own seek, or its own last commit): never behind it, in increasing order; holes
//!    between offsets are the log's own (transaction markers, aborted records, compaction,
//!    deleted records) and are not gaps. A partition the client positioned by itself (one
//!    assigned since the last rewind) must start exactly at the group's committed offset,
//!    or it is sought there first (decision 0041);
//! 3. begin, send the next offsets with the consumer's group metadata, produce one output per
//!    record, commit (a commit that fails retriably is called again,
//!    [`Options::commit_attempts`] in all). Offsets go first: they are the transaction's
//!    first request, so the next transaction's `CONCURRENT_TRANSACTIONS` answer is retried
//!    on librdkafka's short `AddOffsetsToTxn` back-off, not on its 20 ms one.
//!
//! On any failure of 2 or 3: the transaction is aborted (a failed abort, a fatal, fenced or
//! stuck producer, or a commit whose outcome stayed unknown: a new producer registers the
//! `transactional.id`, which fences the old one and completes or aborts what it left open),
//! **every record in hand is discarded**, every assigned partition is rewound to the group's
//! committed offset read from the coordinator (`require_stable`: offsets of transactions
//! still open are waited for; the log start where there is none; an offset that cannot be
//! read is an error, never "none"), and the loop backs off before it reads again. The rewind reads the committed offsets only after the producer's
//! last transaction is final (aborted, or its producer fenced), so the offsets it reads are
//! the ones that stay.
//!
//! Nothing in the loop decides from memory which records are done: the coordinator's
//! committed offsets do. A record leaves the loop only inside a committed transaction, or by
//! being discarded and read again.
//!
//! The loop reaches Kafka through [`Client`], a seam over the consumer and the transactional
//! producer: [`client::LibrdkafkaClient`] in production, [`confluent::ConfluentClient`]
//! (Confluent's `confluent-kafka`, transactions v2; under evaluation, issue #45) when
//! antifraude is started with `ANTIFRAUDE_KAFKA_CLIENT=confluent`, an in-memory broker in the
//! unit tests (`tests`), which run the loop deterministically on tokio's paused clock through commit
//! failures, ambiguous commits, fenced producers, rebalances, stale fetch positions, holes in
//! the log and committed offsets that cannot be read.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use crate::consumer::Backoff;
use crate::producer::OutgoingRecord;
use crate::Error;

pub mod client;
pub mod confluent;
#[cfg(test)]
mod fake;
mod liveness;
#[cfg(test)]
mod tests;

pub use client::LibrdkafkaClient;
pub use confluent::{ConfluentClient, ConfluentConfig};
pub use liveness::{Liveness, Stalled};

/// A topic partition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Partition {
    pub topic: String,
    pub partition: i32,
}

impl Partition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self { topic: topic.into(), partition }
    }

    fn of(record: &OwnedMessage) -> Self {
        Self::new(record.topic(), record.partition())
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// What a failed transactional call leaves the producer able to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// The same call may be made again (a commit whose answer timed out).
    Retry,
    /// The transaction must be aborted; the producer goes on.
    Abort,
    /// The producer cannot go on (fenced, fatal, stuck): a new one must be registered.
    NewProducer,
}

/// A transactional call that failed, and what the producer can do next.
#[derive(Debug, thiserror::Error)]
#[error("{source} (then: {recovery:?})")]
pub struct TxnError {
    pub recovery: Recovery,
    #[source]
    pub source: Error,
}

/// The consumer and the transactional producer under the loop.
pub trait Client: Send {
    /// The consumer group, for the metrics' `group` label.
    fn group(&self) -> &str;

    /// The next record. Cancel-safe: a record is taken only when this returns it. A client
    /// that can no longer fetch (a rebalance it could not apply) returns [`Error::Fatal`].
    fn receive(&mut self) -> impl Future<Output = Result<OwnedMessage, Error>> + Send;

    /// A clock that ticks at every rebalance that takes partitions away (revocation, loss,
    /// a partition assigned again while held): records taken at one tick and checked at
    /// another may no longer be this member's.
    fn rebalances(&self) -> u64;

    /// Begins a transaction, registering a producer first if there is none.
    fn begin(&mut self) -> impl Future<Output = Result<(), TxnError>> + Send;

    /// Produces `records` in the open transaction and waits for every acknowledgement.
    fn send(&mut self, records: &[OutgoingRecord]) -> impl Future<Output = Result<(), TxnError>> + Send;

    /// Adds the consumed offsets (the next offset to read, per partition) to the open
    /// transaction, with the consumer's group metadata read at this moment.
    fn send_offsets(
        &mut self,
        next: &[(Partition, i64)],
    ) -> impl Future<Output = Result<(), TxnError>> + Send;

    fn commit(&mut self) -> impl Future<Output = Result<(), TxnError>> + Send;

    fn abort(&mut self) -> impl Future<Output = Result<(), TxnError>> + Send;

    /// Lets the producer go and registers a new one with the same `transactional.id`, which
    /// fences the old one and completes or aborts its open transaction.
    fn renew(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// The partitions assigned now.
    fn assignment(&mut self) -> Result<Vec<Partition>, Error>;

    /// The group's committed offsets, from the coordinator, waiting for offsets of
    /// transactions still open (`require_stable`), in one request: per partition `Ok(None)`
    /// where nothing is committed, an error where its offset could not be read (an unstable
    /// offset commit, an authorization refusal): never mistaken for "nothing committed".
    fn committed(
        &mut self,
        partitions: &[Partition],
    ) -> impl Future<Output = Result<Vec<(Partition, Committed)>, Error>> + Send;

    /// Each partition's log start offset and end offset (the consumer's isolation level's),
    /// asked for all partitions at once.
    fn bounds(
        &mut self,
        partitions: &[Partition],
    ) -> impl Future<Output = Result<Vec<(Partition, Bounds)>, Error>> + Send;

    /// Moves the fetch position of each partition: the next record received is there.
    fn seek(&mut self, positions: &[(Partition, i64)]) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A group's committed offset of one partition: `None` where nothing is committed, an error
/// where it could not be read.
pub type Committed = Result<Option<i64>, Error>;

/// A partition's log: the first offset still in it and the offset after its last record
/// (for a `read_committed` consumer, the last stable offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub start: i64,
    pub end: i64,
}

/// What the loop's caller does with each record.
pub trait Transform: Send + Sync {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The one output of `record` (a dead letter for a record that is not valid). An error
    /// is no record's fault (the output cannot be encoded): the loop stops with
    /// [`Error::Fatal`].
    fn output(&self, record: &OwnedMessage) -> Result<OutgoingRecord, Self::Error>;

    /// Called once a transaction with these outputs committed, `took` after it began.
    fn committed(&self, _outputs: &[OutgoingRecord], _took: Duration) {}
}

/// Limits of the loop.
#[derive(Debug, Clone)]
pub struct Options {
    /// Most records in one transaction.
    pub batch_records_max: usize,
    /// How long to keep collecting after the first record (0: only what was already fetched).
    pub batch_wait_max: Duration,
    /// Pauses after consecutive failures.
    pub backoff: Backoff,
    /// Calls of `commit` for one transaction while it fails retriably; after the last the
    /// outcome is unknown and a new producer settles it.
    pub commit_attempts: u32,
    /// Where the loop reports failing without a commit (for `/readyz` and
    /// `kafka_transaction_failing_seconds`).
    pub liveness: Liveness,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            batch_records_max: 500,
            batch_wait_max: Duration::ZERO,
            backoff: Backoff::default(),
            commit_attempts: 3,
            liveness: Liveness::default(),
        }
    }
}

/// Why a batch was discarded (the `reason` label of `kafka_transaction_rewinds_total`).
#[derive(Debug, thiserror::Error)]
enum Discard {
    #[error("a rebalance happened while the batch was being collected")]
    Rebalanced,
    #[error(
        "{partition} starts at offset {first}, below {expected} where the loop's last commit or seek left it: those records were read before"
    )]
    Behind { partition: Partition, expected: i64, first: i64 },
    #[error("{partition} delivered offset {offset} after offset {previous}: out of order")]
    OutOfOrder { partition: Partition, previous: i64, offset: i64 },
    #[error(
        "{partition} starts at offset {first}, past the group's committed offset {committed}, at a position the client chose: it is sought to the committed offset first"
    )]
    Unverified { partition: Partition, committed: i64, first: i64 },
    #[error("the group's committed offsets could not be read")]
    Lookup(#[source] Error),
    #[error("transaction {operation} failed")]
    Transaction {
        operation: &'static str,
        #[source]
        error: TxnError,
    },
    #[error("commit still failing after {attempts} attempts: its outcome is unknown")]
    CommitUnknown {
        attempts: u32,
        #[source]
        error: TxnError,
    },
}

impl Discard {
    fn reason(&self) -> &'static str {
        match self {
            Self::Rebalanced => "rebalance",
            Self::Behind { .. } => "behind",
            Self::OutOfOrder { .. } => "out_of_order",
            Self::Unverified { .. } => "unverified_start",
            Self::Lookup(_) => "committed_unreadable",
            Self::Transaction { .. } => "transaction_failed",
            Self::CommitUnknown { .. } => "commit_unknown",
        }
    }

    /// Something failed (the loop backs off), rather than the consumer having to be put where
    /// the loop can vouch for it (a rebalance, a start the client chose).
    fn is_failure(&self) -> bool {
        !matches!(self, Self::Rebalanced | Self::Unverified { .. })
    }

    /// The client delivered what it must not: records already read, or out of order.
    fn is_client_fault(&self) -> bool {
        matches!(self, Self::Behind { .. } | Self::OutOfOrder { .. })
    }
}

/// Where a partition's next record may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    /// No record below this offset may come: where the loop's last commit or seek left it.
    next: i64,
    /// The loop put the consumer here itself (its own seek, or its own commit of the records
    /// delivered before): the consumer reads on from here in the log's order, so a first
    /// record past `next` means the offsets between hold nothing readable. `false` for a
    /// position the client chose (a partition assigned since the last rewind).
    vouched: bool,
}

/// What the loop must settle before it reads again.
#[derive(Debug, Default)]
struct State {
    /// The producer must be replaced before anything else (its last transaction is not final).
    renew: bool,
    /// Every assigned partition must be rewound to its committed offset.
    rewind: bool,
    /// Consecutive failures, for the backoff.
    failures: u32,
    /// Per partition, where its next record may start. Valid only at the rebalance tick it
    /// was set at.
    expected: BTreeMap<Partition, Cursor>,
    expected_at: u64,
    /// Per partition, the committed offset whose records deleted before they were read were
    /// counted already (a rewind repeated before the next commit counts them once).
    deleted_counted: BTreeMap<Partition, i64>,
    /// Per partition, consecutive reads that found its committed offset past its log's end.
    beyond_end: BTreeMap<Partition, u32>,
}

/// Reads in a row that must find a committed offset past the log's end before the loop takes
/// the log as recreated (or truncated) and starts at its start: a new leader's end offset can
/// lag the old one's for a moment.
const BEYOND_END_READS: u32 = 5;

/// A batch and the rebalance tick right after its first record was taken.
struct Batch {
    records: Vec<OwnedMessage>,
    tick: u64,
}

/// Runs until `shutdown` is cancelled, between batches or during a backoff; a transaction
/// under way is finished (or aborted) first. Returns [`Error::Fatal`] when the client can no
/// longer fetch or an output cannot be encoded.
pub async fn run<C: Client, T: Transform>(
    client: &mut C,
    transform: &T,
    options: &Options,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    assert!(options.batch_records_max > 0, "a batch holds at least one record");
    assert!(options.commit_attempts > 0, "a commit is attempted at least once");
    let group = client.group().to_owned();
    let handling_seconds = metrics::histogram!("kafka_batch_handling_seconds", "group" => group.clone());
    let mut state = State { renew: true, rewind: false, ..State::default() };
    loop {
        if state.renew {
            // a broker that is down makes registration wait up to its call timeout: a stop
            // request meanwhile is not held up by it
            let renewed = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                renewed = client.renew() => renewed,
            };
            match renewed {
                Ok(()) => state.renew = false,
                Err(error) => {
                    let error = crate::consumer::error_chain(&error);
                    tracing::warn!(%error, "transactional producer not registered; retrying");
                    let failure = format!("transactional producer not registered: {error}");
                    if pause(client, &mut state, options, shutdown, failure).await? {
                        return Ok(());
                    }
                    continue;
                }
            }
        }
        if state.rewind {
            match rewind(client, &mut state).await {
                Ok(()) => state.rewind = false,
                Err(error) => {
                    let error = crate::consumer::error_chain(&error);
                    tracing::warn!(%error, "rewind to the committed offsets failed; retrying");
                    let failure = format!("rewind to the committed offsets failed: {error}");
                    if pause(client, &mut state, options, shutdown, failure).await? {
                        return Ok(());
                    }
                    continue;
                }
            }
        }
        let batch = match collect(client, options, shutdown, state.expected_at).await? {
            Collected::Batch(batch) => batch,
            Collected::Rebalanced => {
                tracing::info!(
                    "a rebalance was served while no record came: the assigned partitions are rewound"
                );
                metrics::counter!("kafka_transaction_rewinds_total", "group" => group.clone(), "reason" => "rebalance")
                    .increment(1);
                state.rewind = true;
                continue;
            }
            Collected::Shutdown => return Ok(()),
        };
        let started = Instant::now();
        match transact(client, transform, options, &mut state, &batch).await {
            Ok(outputs) => {
                state.failures = 0;
                options.liveness.committed(&group);
                let took = started.elapsed();
                handling_seconds.record(took.as_secs_f64());
                transform.committed(&outputs, took);
            }
            Err(Failed::Fatal(error)) => return Err(error),
            Err(Failed::Discarded(discard)) => {
                let first = &batch.records[0];
                metrics::counter!("kafka_transaction_rewinds_total", "group" => group.clone(), "reason" => discard.reason())
                    .increment(1);
                let message = "batch discarded: every record in hand dropped, the assigned partitions rewound to the group's committed offsets";
                let error = crate::consumer::error_chain(&discard);
                if discard.is_client_fault() {
                    tracing::error!(%error, records = batch.records.len(), "{message}");
                } else if discard.is_failure() {
                    tracing::warn!(%error, records = batch.records.len(), "{message}");
                } else {
                    tracing::info!(%error, records = batch.records.len(), "{message}");
                }
                settle(client, &mut state, &discard).await;
                state.rewind = true;
                if discard.is_failure() {
                    metrics::counter!("retries_total", "topic" => first.topic().to_owned()).increment(1);
                    if pause(client, &mut state, options, shutdown, format!("batch discarded: {error}"))
                        .await?
                    {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// How a batch ended other than committed.
enum Failed {
    Discarded(Discard),
    Fatal(Error),
}

impl From<Discard> for Failed {
    fn from(discard: Discard) -> Self {
        Self::Discarded(discard)
    }
}

/// After a discarded batch: makes the producer's last transaction final, aborting it where
/// it can go on, otherwise marking the producer for renewal (before the rewind reads offsets).
async fn settle<C: Client>(client: &mut C, state: &mut State, discard: &Discard) {
    let then = match discard {
        // nothing begun
        Discard::Rebalanced
        | Discard::Behind { .. }
        | Discard::OutOfOrder { .. }
        | Discard::Unverified { .. }
        | Discard::Lookup(_) => return,
        Discard::CommitUnknown { .. } => Recovery::NewProducer,
        Discard::Transaction { error, .. } => error.recovery,
    };
    if then != Recovery::NewProducer {
        match client.abort().await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(error = %crate::consumer::error_chain(&error), "abort failed; a new producer settles the transaction");
            }
        }
    }
    state.renew = true;
}

/// Backs off after `failure` (reported to [`Options::liveness`]); `true` when shut down meanwhile. The consumer is polled through
/// the pause, as it is while idle: a client that is not polled for `max.poll.interval.ms`
/// leaves its group (and librdkafka 2.12 under KIP-848 may not rejoin cleanly), and a long
/// outage is a series of pauses between renew or rewind attempts that block for up to their
/// call timeout. Records it hands out meanwhile are dropped, and every partition is rewound
/// before the next batch.
async fn pause<C: Client>(
    client: &mut C,
    state: &mut State,
    options: &Options,
    shutdown: &CancellationToken,
    failure: String,
) -> Result<bool, Error> {
    options.liveness.failed(client.group(), failure);
    state.failures = state.failures.saturating_add(1);
    let deadline = tokio::time::Instant::now() + options.backoff.delay(state.failures);
    let mut dropped = 0_usize;
    let stopped = loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break true,
            _ = tokio::time::sleep_until(deadline) => break false,
            // cancel-safe: a record is taken only when receive returns it
            received = client.receive() => {
                received?;
                dropped += 1;
            }
        }
    };
    if dropped > 0 {
        tracing::debug!(
            dropped,
            "records received during a back-off dropped: the partitions are rewound first"
        );
        state.rewind = true;
    }
    Ok(stopped)
}

/// What [`collect`] came back with.
enum Collected {
    Batch(Batch),
    /// A rebalance that took partitions away was served while no record came: the client
    /// may have positioned a partition given back anywhere (past its last records, where no
    /// record would ever come to show it), so the loop rewinds without waiting for one.
    Rebalanced,
    Shutdown,
}

/// How often the loop, waiting for a first record, looks whether a rebalance was served.
const IDLE_REBALANCE_CHECK: Duration = Duration::from_secs(1);

/// The next batch, or what came first: a rebalance while idle, or a shutdown.
async fn collect<C: Client>(
    client: &mut C,
    options: &Options,
    shutdown: &CancellationToken,
    expected_at: u64,
) -> Result<Collected, Error> {
    let first = loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(Collected::Shutdown),
            // cancel-safe: a record is taken only when receive returns it
            record = client.receive() => break record?,
            _ = tokio::time::sleep(IDLE_REBALANCE_CHECK) => {
                if client.rebalances() != expected_at {
                    return Ok(Collected::Rebalanced);
                }
            }
        }
    };
    let mut records = Vec::with_capacity(options.batch_records_max.min(64));
    records.push(first);
    let deadline = tokio::time::Instant::now() + options.batch_wait_max;
    while records.len() < options.batch_records_max {
        match tokio::time::timeout_at(deadline, client.receive()).await {
            Ok(record) => records.push(record?),
            Err(_elapsed) => break,
        }
    }
    // read after the last record: a rebalance served by any receive of the batch moves it
    // past the tick the loop's cursors were set at
    let tick = client.rebalances();
    Ok(Collected::Batch(Batch { records, tick }))
}

/// One partition's records in a batch.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    partition: Partition,
    first: i64,
    last: i64,
    /// The first record not past its predecessor: (the predecessor's offset, its own).
    backwards: Option<(i64, i64)>,
}

/// The runs of `records`, per partition in order of first appearance. Offsets may skip
/// (the log's holes); a record at or below its predecessor's offset is noted.
fn runs(records: &[OwnedMessage]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for record in records {
        let offset = record.offset();
        let run = runs.iter_mut().find(|run| {
            run.partition.topic == record.topic() && run.partition.partition == record.partition()
        });
        match run {
            Some(run) => {
                if run.backwards.is_none() && offset <= run.last {
                    run.backwards = Some((run.last, offset));
                }
                run.last = run.last.max(offset);
            }
            None => runs.push(Run {
                partition: Partition::of(record),
                first: offset,
                last: offset,
                backwards: None,
            }),
        }
    }
    runs
}

/// Where a partition must be read from, given the group's committed offset and its log.
#[derive(Debug, PartialEq, Eq)]
enum Start {
    /// At this offset (the committed one, or the log start where nothing is committed).
    At(i64),
    /// At the log start: retention deleted `deleted` offsets past the committed one before
    /// they were read.
    Deleted { at: i64, deleted: i64 },
    /// The committed offset lies past the log's end (a recreated or truncated log, or a new
    /// leader whose end has not caught up yet): read again before deciding.
    BeyondEnd { committed: i64, end: i64 },
}

fn start(committed: Option<i64>, bounds: Bounds) -> Start {
    match committed {
        None => Start::At(bounds.start),
        Some(offset) if offset < bounds.start => {
            Start::Deleted { at: bounds.start, deleted: bounds.start - offset }
        }
        Some(offset) if offset > bounds.end => Start::BeyondEnd { committed: offset, end: bounds.end },
        Some(offset) => Start::At(offset),
    }
}

/// Where `partitions` must be read from: the group's committed offsets and the logs' bounds,
/// each read for all partitions in one call. An unreadable committed offset fails the lookup
/// (the caller backs off and reads again); records deleted before they were read are counted
/// (`kafka_records_deleted_unread_total`) and skipped, as the consumer itself would.
async fn positions<C: Client>(
    client: &mut C,
    partitions: &[Partition],
    state: &mut State,
) -> Result<Vec<(Partition, i64)>, Error> {
    let committed = client.committed(partitions).await?;
    let mut unreadable = Vec::new();
    let mut offsets = Vec::with_capacity(committed.len());
    for (partition, offset) in committed {
        match offset {
            Ok(offset) => offsets.push((partition, offset)),
            Err(error) => unreadable.push(format!("{partition} ({})", crate::consumer::error_chain(&error))),
        }
    }
    if !unreadable.is_empty() {
        return Err(Error::CommittedUnreadable(unreadable.join(", ")));
    }
    let bounds: BTreeMap<Partition, Bounds> = client.bounds(partitions).await?.into_iter().collect();
    let group = client.group().to_owned();
    let mut positions = Vec::with_capacity(offsets.len());
    for (partition, committed) in offsets {
        let bounds = *bounds
            .get(&partition)
            .ok_or_else(|| Error::Fatal(format!("no log bounds returned for {partition}").into()))?;
        let decided = start(committed, bounds);
        if !matches!(decided, Start::BeyondEnd { .. }) {
            state.beyond_end.remove(&partition);
        }
        let at = match decided {
            Start::At(at) => at,
            Start::Deleted { at, deleted } => {
                let committed = committed.unwrap_or_default();
                if state.deleted_counted.insert(partition.clone(), committed) != Some(committed) {
                    metrics::counter!(
                        "kafka_records_deleted_unread_total",
                        "group" => group.clone(),
                        "topic" => partition.topic.clone(),
                        "partition" => partition.partition.to_string(),
                    )
                    .increment(u64::try_from(deleted).unwrap_or_default());
                    tracing::error!(%partition, committed, log_start = at, deleted, "records past the group's committed offset were deleted by retention before they were read: never analysed (offsets of transaction markers included in the count)");
                }
                at
            }
            Start::BeyondEnd { committed, end } => {
                let reads = state.beyond_end.entry(partition.clone()).or_default();
                *reads += 1;
                if *reads < BEYOND_END_READS {
                    return Err(Error::CommittedUnreadable(format!(
                        "{partition} (committed offset {committed} past the log's end {end}, read {reads} times in a row)"
                    )));
                }
                tracing::error!(%partition, committed, log_start = bounds.start, log_end = end, "the group's committed offset lies past the log's end (the topic was recreated or its log truncated): reading from the log start");
                bounds.start
            }
        };
        positions.push((partition, at));
    }
    Ok(positions)
}

/// Rewinds every assigned partition to where the group's committed offsets say it stands.
async fn rewind<C: Client>(client: &mut C, state: &mut State) -> Result<(), Error> {
    let tick = client.rebalances();
    let assigned = client.assignment()?;
    let positions =
        if assigned.is_empty() { Vec::new() } else { positions(client, &assigned, state).await? };
    if !positions.is_empty() {
        client.seek(&positions).await?;
    }
    tracing::info!(?positions, "partitions rewound to the group's committed offsets");
    state.expected =
        positions.into_iter().map(|(partition, next)| (partition, Cursor { next, vouched: true })).collect();
    state.expected_at = tick;
    Ok(())
}

/// Checks `batch` against where its partitions must start, then commits it in one
/// transaction; returns its outputs.
async fn transact<C: Client, T: Transform>(
    client: &mut C,
    transform: &T,
    options: &Options,
    state: &mut State,
    batch: &Batch,
) -> Result<Vec<OutgoingRecord>, Failed> {
    // a rebalance since the cursors were set: the client may have positioned any partition
    // (a partition given back keeps a fetch position librdkafka could not reset)
    if state.expected_at != batch.tick {
        return Err(Discard::Rebalanced.into());
    }
    let runs = runs(&batch.records);
    // partitions assigned since the last rewind without a rebalance that took any away: the
    // client positioned them, at the group's committed offset if it behaves
    let unknown: Vec<Partition> = runs
        .iter()
        .map(|run| &run.partition)
        .filter(|partition| !state.expected.contains_key(*partition))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        let known = positions(client, &unknown, state).await.map_err(Discard::Lookup)?;
        state
            .expected
            .extend(known.into_iter().map(|(partition, next)| (partition, Cursor { next, vouched: false })));
    }
    for run in &runs {
        let cursor = state.expected[&run.partition];
        if let Some((previous, offset)) = run.backwards {
            return Err(Discard::OutOfOrder { partition: run.partition.clone(), previous, offset }.into());
        }
        if run.first < cursor.next {
            return Err(Discard::Behind {
                partition: run.partition.clone(),
                expected: cursor.next,
                first: run.first,
            }
            .into());
        }
        if run.first > cursor.next && !cursor.vouched {
            return Err(Discard::Unverified {
                partition: run.partition.clone(),
                committed: cursor.next,
                first: run.first,
            }
            .into());
        }
    }
    let outputs = batch
        .records
        .iter()
        .map(|record| transform.output(record))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| Failed::Fatal(Error::Fatal(Box::new(error))))?;
    let failed = |operation| move |error| Discard::Transaction { operation, error };
    let next: Vec<(Partition, i64)> = runs.iter().map(|run| (run.partition.clone(), run.last + 1)).collect();
    client.begin().await.map_err(failed("begin"))?;
    // the offsets first (the transaction's first request): see the module's documentation.
    // The group metadata is read in send_offsets; no rebalance can have been served since the
    // batch was checked (a client serves rebalances only inside receive)
    client.send_offsets(&next).await.map_err(failed("send_offsets"))?;
    client.send(&outputs).await.map_err(failed("send"))?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match client.commit().await {
            Ok(()) => break,
            Err(error) if error.recovery == Recovery::Retry && attempts < options.commit_attempts => {
                tracing::warn!(error = %crate::consumer::error_chain(&error), attempts, "commit failed retriably; calling it again");
            }
            Err(error) if error.recovery == Recovery::Retry => {
                return Err(Discard::CommitUnknown { attempts, error }.into());
            }
            Err(error) => return Err(Discard::Transaction { operation: "commit", error }.into()),
        }
    }
    for (partition, next) in next {
        state.expected.insert(partition, Cursor { next, vouched: true });
    }
    Ok(outputs)
}
