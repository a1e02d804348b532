//! The exactly-once loop: consume, transform, produce and commit the consumed offsets in one
//! Kafka transaction per batch, the canonical way (librdkafka's `examples/transactions.c`,
//! Kafka Streams): after any failure nothing in hand is trusted.
//!
//! One iteration:
//! 1. collect a batch (up to [`Options::batch_records_max`] records, or what arrives within
//!    [`Options::batch_wait_max`] of the first);
//! 2. check that every partition's records start exactly where its last commit (or the last
//!    rewind) left it and run without a hole; a partition not seen since the last rebalance
//!    is checked against the group's committed offset, read from the coordinator;
//! 3. begin, produce one output per record, check that no rebalance happened since the batch
//!    was collected, send the next offsets with the consumer's group metadata, commit (a
//!    commit that fails retriably is called again, [`Options::commit_attempts`] in all).
//!
//! On any failure of 2 or 3: the transaction is aborted (a failed abort, a fatal, fenced or
//! stuck producer, or a commit whose outcome stayed unknown: a new producer registers the
//! `transactional.id`, which fences the old one and completes or aborts what it left open),
//! **every record in hand is discarded**, every assigned partition is rewound to the group's
//! committed offset read from the coordinator (`require_stable`: offsets of transactions
//! still open are waited for; the log start where there is none), and the loop backs off
//! before it reads again. The rewind reads the committed offsets only after the producer's
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
//! failures, ambiguous commits, fenced producers, rebalances mid-batch and fetchers that skip.

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
#[cfg(test)]
mod tests;

pub use client::LibrdkafkaClient;
pub use confluent::{ConfluentClient, ConfluentConfig};

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
    /// transactions still open (`require_stable`); `None` where nothing is committed.
    fn committed(
        &mut self,
        partitions: &[Partition],
    ) -> impl Future<Output = Result<Vec<(Partition, Option<i64>)>, Error>> + Send;

    /// The first offset still in each partition's log.
    fn log_start(
        &mut self,
        partitions: &[Partition],
    ) -> impl Future<Output = Result<Vec<(Partition, i64)>, Error>> + Send;

    /// Moves the fetch position of each partition: the next record received is there.
    fn seek(&mut self, positions: &[(Partition, i64)]) -> impl Future<Output = Result<(), Error>> + Send;
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
}

impl Default for Options {
    fn default() -> Self {
        Self {
            batch_records_max: 500,
            batch_wait_max: Duration::ZERO,
            backoff: Backoff::default(),
            commit_attempts: 3,
        }
    }
}

/// Why a batch was discarded (the `reason` label of `kafka_transaction_rewinds_total`).
#[derive(Debug, thiserror::Error)]
enum Discard {
    #[error("a rebalance happened while the batch was in hand")]
    Rebalanced {
        /// Its transaction was open (to abort).
        begun: bool,
    },
    #[error(
        "{partition} starts at offset {first}, not at {expected} where its last commit or rewind left it"
    )]
    Gap { partition: Partition, expected: i64, first: i64 },
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
            Self::Rebalanced { .. } => "rebalance",
            Self::Gap { .. } => "gap",
            Self::Lookup(_) => "committed_unreadable",
            Self::Transaction { .. } => "transaction_failed",
            Self::CommitUnknown { .. } => "commit_unknown",
        }
    }
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
    /// Per partition, the offset its next record must have: where the last commit or rewind
    /// left it. Valid only at the rebalance tick it was set at.
    expected: BTreeMap<Partition, i64>,
    expected_at: u64,
}

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
                    tracing::warn!(error = %crate::consumer::error_chain(&error), "transactional producer not registered; retrying");
                    if pause(&mut state, options, shutdown).await {
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
                    tracing::warn!(error = %crate::consumer::error_chain(&error), "rewind to the committed offsets failed; retrying");
                    if pause(&mut state, options, shutdown).await {
                        return Ok(());
                    }
                    continue;
                }
            }
        }
        let Some(batch) = collect(client, options, shutdown).await? else {
            return Ok(());
        };
        let started = Instant::now();
        match transact(client, transform, options, &mut state, &batch).await {
            Ok(outputs) => {
                state.failures = 0;
                let took = started.elapsed();
                handling_seconds.record(took.as_secs_f64());
                transform.committed(&outputs, took);
            }
            Err(Failed::Fatal(error)) => return Err(error),
            Err(Failed::Discarded(discard)) => {
                let first = &batch.records[0];
                metrics::counter!("retries_total", "topic" => first.topic().to_owned()).increment(1);
                metrics::counter!("kafka_transaction_rewinds_total", "group" => group.clone(), "reason" => discard.reason())
                    .increment(1);
                let level_error = matches!(discard, Discard::Gap { .. });
                let message = "batch discarded: every record in hand dropped, the assigned partitions rewound to the group's committed offsets";
                if level_error {
                    tracing::error!(error = %crate::consumer::error_chain(&discard), records = batch.records.len(), "{message}");
                } else {
                    tracing::warn!(error = %crate::consumer::error_chain(&discard), records = batch.records.len(), "{message}");
                }
                settle(client, &mut state, &discard).await;
                state.rewind = true;
                if pause(&mut state, options, shutdown).await {
                    return Ok(());
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
        Discard::Rebalanced { begun: false } | Discard::Gap { .. } | Discard::Lookup(_) => return, // nothing begun
        Discard::Rebalanced { begun: true } => Recovery::Abort,
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

/// Backs off after a failure; `true` when shut down meanwhile.
async fn pause(state: &mut State, options: &Options, shutdown: &CancellationToken) -> bool {
    state.failures = state.failures.saturating_add(1);
    let delay = options.backoff.delay(state.failures);
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(delay) => false,
    }
}

/// The next batch, or `None` when shut down first.
async fn collect<C: Client>(
    client: &mut C,
    options: &Options,
    shutdown: &CancellationToken,
) -> Result<Option<Batch>, Error> {
    let first = tokio::select! {
        biased;
        _ = shutdown.cancelled() => return Ok(None),
        record = client.receive() => record?,
    };
    // a rebalance served while the first record was awaited came before it
    let tick = client.rebalances();
    let mut records = Vec::with_capacity(options.batch_records_max.min(64));
    records.push(first);
    let deadline = tokio::time::Instant::now() + options.batch_wait_max;
    while records.len() < options.batch_records_max {
        match tokio::time::timeout_at(deadline, client.receive()).await {
            Ok(record) => records.push(record?),
            Err(_elapsed) => break,
        }
    }
    Ok(Some(Batch { records, tick }))
}

/// One partition's records in a batch.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    partition: Partition,
    first: i64,
    last: i64,
    /// The first record that does not follow its predecessor: (the offset expected, its own).
    hole: Option<(i64, i64)>,
}

/// The runs of `records`, per partition in order of first appearance.
fn runs(records: &[OwnedMessage]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for record in records {
        let offset = record.offset();
        let run = runs.iter_mut().find(|run| {
            run.partition.topic == record.topic() && run.partition.partition == record.partition()
        });
        match run {
            Some(run) => {
                if run.hole.is_none() && offset != run.last + 1 {
                    run.hole = Some((run.last + 1, offset));
                }
                run.last = offset;
            }
            None => {
                runs.push(Run { partition: Partition::of(record), first: offset, last: offset, hole: None })
            }
        }
    }
    runs
}

/// Where `partitions` must start: the group's committed offset, or the log start where
/// nothing is committed (or where retention deleted records past the commit).
async fn committed_or_start<C: Client>(
    client: &mut C,
    partitions: &[Partition],
) -> Result<Vec<(Partition, i64)>, Error> {
    let committed = client.committed(partitions).await?;
    let starts: BTreeMap<Partition, i64> = client.log_start(partitions).await?.into_iter().collect();
    Ok(committed
        .into_iter()
        .map(|(partition, committed)| {
            let start = starts.get(&partition).copied().unwrap_or(0);
            let at = match committed {
                Some(offset) if offset >= start => offset,
                Some(offset) => {
                    tracing::warn!(%partition, committed = offset, log_start = start, "records past the committed offset were deleted by retention before they were read");
                    start
                }
                None => start,
            };
            (partition, at)
        })
        .collect())
}

/// Rewinds every assigned partition to where the group's committed offsets say it stands.
async fn rewind<C: Client>(client: &mut C, state: &mut State) -> Result<(), Error> {
    let tick = client.rebalances();
    let assigned = client.assignment()?;
    let positions =
        if assigned.is_empty() { Vec::new() } else { committed_or_start(client, &assigned).await? };
    if !positions.is_empty() {
        client.seek(&positions).await?;
    }
    tracing::info!(?positions, "partitions rewound to the group's committed offsets");
    state.expected = positions.into_iter().collect();
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
    if client.rebalances() != batch.tick {
        return Err(Discard::Rebalanced { begun: false }.into());
    }
    // where each partition must start: known since the last commit or rewind at this tick,
    // or else the group's committed offset (a partition assigned since)
    if state.expected_at != batch.tick {
        state.expected.clear();
        state.expected_at = batch.tick;
    }
    let runs = runs(&batch.records);
    let unknown: Vec<Partition> = runs
        .iter()
        .map(|run| &run.partition)
        .filter(|partition| !state.expected.contains_key(*partition))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        let known = committed_or_start(client, &unknown).await.map_err(Discard::Lookup)?;
        state.expected.extend(known);
    }
    for run in &runs {
        let expected = state.expected[&run.partition];
        if run.first != expected {
            return Err(Discard::Gap { partition: run.partition.clone(), expected, first: run.first }.into());
        }
        if let Some((expected, first)) = run.hole {
            return Err(Discard::Gap { partition: run.partition.clone(), expected, first }.into());
        }
    }
    let outputs = batch
        .records
        .iter()
        .map(|record| transform.output(record))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| Failed::Fatal(Error::Fatal(Box::new(error))))?;
    let failed = |operation| move |error| Discard::Transaction { operation, error };
    client.begin().await.map_err(failed("begin"))?;
    client.send(&outputs).await.map_err(failed("send"))?;
    // the member's group metadata is read in send_offsets; a rebalance since the batch was
    // collected may have given its partitions to another member, which the broker does not
    // check (only the member epoch): the batch is not this member's to commit any more
    if client.rebalances() != batch.tick {
        return Err(Discard::Rebalanced { begun: true }.into());
    }
    let next: Vec<(Partition, i64)> = runs.iter().map(|run| (run.partition.clone(), run.last + 1)).collect();
    client.send_offsets(&next).await.map_err(failed("send_offsets"))?;
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
        state.expected.insert(partition, next);
    }
    Ok(outputs)
}
