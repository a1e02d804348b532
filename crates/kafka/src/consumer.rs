//! The one consumer runtime: services supply a [`Handler`], never a poll loop of their own.
//!
//! The loop collects a batch (up to `batch_records_max` records or `batch_wait_max` after the
//! first), hands it to the handler, and gets a [`Verdict`] per record. Records done, forwarded
//! or dead-lettered (the runtime publishes the forwards and dead letters and waits for the
//! broker's acknowledgement) have their partition's next offset stored only then: the
//! handler's work is durable by then, so a crash at any point redelivers, never loses.
//! librdkafka commits stored offsets in the background and once more at shutdown.
//!
//! The runtime owns the retries: a record the handler calls [`Verdict::Retry`] is retried in
//! place after [`LoopOptions::record_retry`]'s backoff and dead-lettered once its retries run
//! out; a batch the handler fails as a whole (`Err`) is retried in place with
//! [`LoopOptions::backoff`], without a cap. Both are blocking retries: per-partition order is
//! kept. A non-blocking retry is a [`Verdict::Forward`] to a retry topic, whose consumer
//! answers [`Verdict::NotBefore`] for a record not yet due: that record and the rest of its
//! partition are held (`held`) with only that partition paused, and handed again at the
//! instant; every other partition keeps flowing. While anything waits (a retry, an
//! unacknowledged output, a held record) the consumer is still polled: the group protocol
//! needs the application to poll (a member that must re-join after a broker restart, a
//! rebalance to acknowledge, `max.poll.interval.ms`), and a loop that only slept through a
//! long outage would be fenced or stuck, its retries failing on a stale member.
//!
//! Revocations ([`crate::context::Revocations`]): before every attempt the batch loses the
//! records whose partition was revoked after they were received, held records too, and after
//! the handler ran nothing of a partition revoked meanwhile is published or stored. A member
//! fenced while it was paused or partitioned away learns of it only when it polls, and by then
//! the partition's new owner may have handled them.
//!
//! Shutdown is watched only between batches and during waits, never while a handler runs:
//! the batch in hand finishes, its offsets are stored and committed, then the loop returns. A
//! shutdown during a backoff, during an unacknowledged publish or while records are held ends
//! the wait at once and commits nothing of the waiting records. A handler error that
//! [`Handler::is_fatal`] calls fatal ends the loop with [`Error::Fatal`].
//!
//! The loop reaches Kafka through a seam (`io`), so its unit tests (`loop_tests`) run it on
//! tokio's paused clock against an in-memory broker.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::context::{Context, Revocations};
use crate::dead_letter::{DeadLetterPublisher, Failure};
use crate::producer::{OutgoingRecord, Producer};
use crate::Error;

mod held;
mod io;
#[cfg(test)]
mod loop_tests;

use held::Held;
use io::{Io, KafkaIo, Route};

/// A consumer built with [`crate::context::Context`].
pub type KafkaConsumer = StreamConsumer<Context>;

/// Creates a consumer from `config` and subscribes it to `topics`.
pub fn subscribe(config: &ClientConfig, topics: &[&str]) -> Result<Arc<KafkaConsumer>, Error> {
    let consumer: KafkaConsumer = crate::context::create(config).map_err(Error::Config)?;
    consumer.subscribe(topics).map_err(|source| Error::Consumer { operation: "subscribe", source })?;
    Ok(Arc::new(consumer))
}

/// What became of one record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Handled (its effects durable, or not needed).
    Done,
    /// Failed in a way a later attempt may fix: the runtime retries it after a backoff, in
    /// place, up to [`LoopOptions::record_retry`]'s cap, then dead-letters it with this failure.
    Retry(Failure),
    /// Can never be handled: the runtime publishes its dead letter with this failure.
    DeadLetter(Failure),
    /// Handled once this record is published: the runtime publishes it (with
    /// [`LoopOptions::forwards`]) and stores the offset only after the broker acknowledged it
    /// (a non-blocking retry through a retry topic, or a dead letter of the handler's own
    /// making).
    Forward(Forward),
    /// Not to be handled before this instant (a retry record whose backoff timestamp lies
    /// ahead). The runtime holds the record, and every later record of its partition, with only
    /// that partition paused; other partitions keep flowing and the consumer keeps being
    /// polled. At the instant it hands them to the handler again, in order. Nothing of them is
    /// stored meanwhile: a shutdown or a revocation leaves them to be redelivered.
    NotBefore(tokio::time::Instant),
}

/// What a [`Verdict::Forward`] publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub record: OutgoingRecord,
    /// What the forward counts as once acknowledged.
    pub kind: ForwardKind,
    /// Why the record was forwarded, for the log.
    pub reason: String,
}

/// How an acknowledged [`Forward`] is counted and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardKind {
    /// A later attempt elsewhere: `retries_total{topic}` of the source topic.
    Retry,
    /// A dead letter: `dlt_mensagens_total{topic}` of the destination.
    DeadLetter,
}

impl Verdict {
    /// `Done` for every record of `batch`.
    pub fn all_done(batch: &[OwnedMessage]) -> Vec<Verdict> {
        vec![Verdict::Done; batch.len()]
    }
}

/// What a handler does with a batch. Implementations make the effects of the records they
/// call [`Verdict::Done`] durable before returning.
pub trait Handler: Send {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Processes `batch` (records of any assigned partitions, in partition order) and returns
    /// one verdict per record, in order. A handler may stop at the first [`Verdict::Retry`]
    /// and return fewer verdicts: the records after it are handed again, after the retried
    /// one, so an account's records are never reordered (verdicts after the first `Retry` are
    /// ignored for the same reason). Likewise the verdicts after a [`Verdict::NotBefore`] of
    /// the same partition are ignored: those records wait behind it, so a handler must not act
    /// on them. `retrying` is true when the batch starts with a record
    /// that failed before (the ledger then settles one record per transaction). `Err` means
    /// nothing of the batch may be considered done (the database or broker is away): the
    /// whole batch is retried after a backoff, without a cap.
    fn handle(
        &mut self,
        batch: &[OwnedMessage],
        retrying: bool,
    ) -> impl Future<Output = Result<Vec<Verdict>, Self::Error>> + Send;

    /// `true` when `error` is one that no retry can fix and that is no record's fault (the
    /// service and its database disagree on the schema, say): the loop stops without storing
    /// the batch's offsets and returns [`Error::Fatal`], and the service shell then stops the
    /// process with a non-zero exit. Every other error is retried.
    fn is_fatal(&self, _error: &Self::Error) -> bool {
        false
    }
}

/// Blocking retries of one record that failed ([`Verdict::Retry`]).
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub backoff: Backoff,
    /// Retries after the first attempt before the record is dead-lettered.
    pub retries: u32,
}

impl Default for RetryPolicy {
    /// The reference article's error handler: 500 ms, doubling, at most 15 s, 5 retries.
    fn default() -> Self {
        Self { backoff: Backoff::default(), retries: 5 }
    }
}

impl RetryPolicy {
    /// After a failure of a record already retried `retried` times: the pause before the next
    /// retry, or `None` when the retries are used up (dead-letter it).
    pub fn after_failure(&self, retried: u32) -> Option<Duration> {
        (retried < self.retries).then(|| self.backoff.delay(retried + 1))
    }

    /// The longest a record can spend in its retries.
    pub fn worst_case(&self) -> Duration {
        (1..=self.retries).map(|attempt| self.backoff.delay(attempt)).sum()
    }
}

/// Exponential backoff of the blocking retries.
#[derive(Debug, Clone)]
pub struct Backoff {
    pub initial: Duration,
    pub multiplier: f64,
    pub max: Duration,
}

impl Backoff {
    /// The pause before retry number `attempt` (1 = the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.powi(attempt.saturating_sub(1).min(64) as i32);
        self.initial.mul_f64(factor).min(self.max)
    }
}

impl Default for Backoff {
    /// The reference article's handler: 500 ms, doubling, at most 15 s.
    fn default() -> Self {
        Self { initial: Duration::from_millis(500), multiplier: 2.0, max: Duration::from_secs(15) }
    }
}

/// Limits of the loop.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Most records handed to the handler at once.
    pub batch_records_max: usize,
    /// How long to keep filling a batch after its first record.
    pub batch_wait_max: Duration,
    /// Pauses between attempts at a batch whose handler returned `Err` (no cap).
    pub backoff: Backoff,
    /// Retries of a record the handler gave [`Verdict::Retry`], and their pauses.
    pub record_retry: RetryPolicy,
    /// Where [`Verdict::DeadLetter`] records (and records out of retries) go; a handler that
    /// returns such verdicts without one stops the loop ([`Error::Fatal`]).
    pub dead_letters: Option<DeadLetterPublisher>,
    /// Publishes the records of [`Verdict::Forward`]; a handler that forwards without one
    /// stops the loop ([`Error::Fatal`]).
    pub forwards: Option<Producer>,
}

impl Default for LoopOptions {
    fn default() -> Self {
        Self {
            batch_records_max: 500,
            batch_wait_max: Duration::from_millis(5),
            backoff: Backoff::default(),
            record_retry: RetryPolicy::default(),
            dead_letters: None,
            forwards: None,
        }
    }
}

/// Runs until `shutdown` is cancelled; returns after committing what was handled.
pub async fn run<H: Handler>(
    consumer: Arc<KafkaConsumer>,
    mut handler: H,
    options: LoopOptions,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    assert!(options.batch_records_max > 0, "a batch holds at least one record");
    let io = KafkaIo {
        consumer: &consumer,
        dead_letters: options.dead_letters.as_ref().map(DeadLetterPublisher::producer),
        forwards: options.forwards.as_ref(),
    };
    let result = consume(&io, &mut handler, &options, &shutdown).await;
    // whatever ended the loop, commit the offsets stored so far (all of them handled)
    commit_stored(consumer).await?;
    result
}

/// Commits the offsets stored so far, synchronously and off the runtime: what a loop does when
/// it ends. A failure is logged, not returned: the records since the last commit are redelivered.
async fn commit_stored(consumer: Arc<KafkaConsumer>) -> Result<(), Error> {
    let final_commit =
        tokio::task::spawn_blocking(move || consumer.commit_consumer_state(CommitMode::Sync)).await?;
    match final_commit {
        // nothing stored since the last background commit, or no partitions left
        Ok(()) | Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
        Err(error) => {
            tracing::warn!(%error, "final offset commit failed; records since the last commit will be redelivered")
        }
    }
    Ok(())
}

async fn consume<H: Handler>(
    io: &impl Io,
    handler: &mut H,
    options: &LoopOptions,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let revocations = io.revocations();
    // per group, so that a process running several consumers (`pagamentos all`) tells them apart
    let handling_seconds =
        metrics::histogram!("kafka_batch_handling_seconds", "group" => io.group().to_owned());
    // records taken while a failed batch waited for its retry (their partitions then paused),
    // and released records beyond one batch
    let mut carried = Batch::default();
    let mut paused = Paused::default();
    // records not due yet, their partitions paused (`Verdict::NotBefore`)
    let mut held = Held::default();
    loop {
        let dropped = held.drop_revoked(revocations);
        if dropped > 0 {
            tracing::info!(dropped, "held records of partitions revoked since they were received dropped");
        }
        let mut batch = if carried.records.is_empty() {
            let Some(mut next) = next_batch(io, options, &mut held, shutdown).await? else {
                return Ok(()); // held records stay uncommitted: redelivered
            };
            if next.records.len() > options.batch_records_max {
                let front = next.split_off_front(options.batch_records_max);
                carried = next;
                front
            } else {
                next
            }
        } else {
            carried.split_off_front(options.batch_records_max)
        };
        // attempts at the batch that failed as a whole; retries of its first record
        let mut attempt = 0u32;
        let mut head_retries = 0u32;
        // the record those retries were of: a record dropped meanwhile (its partition revoked)
        // takes its count away with it
        let mut head: Option<(String, i32, i64)> = None;
        let mut retrying = false;
        loop {
            // before every attempt: what a rebalance took away since it was received is not
            // this consumer's any more (see `Revocations`)
            let dropped = batch.drop_revoked(revocations);
            if dropped > 0 {
                tracing::info!(
                    dropped,
                    "records of partitions revoked since they were received dropped from the batch"
                );
            }
            if batch.records.is_empty() {
                break;
            }
            let started = Instant::now();
            let verdicts = match handler.handle(&batch.records, retrying).await {
                Ok(verdicts) => verdicts,
                Err(error) if handler.is_fatal(&error) => {
                    let first = &batch.records[0];
                    tracing::error!(
                        error = %error_chain(&error),
                        records = batch.records.len(),
                        topic = first.topic(),
                        partition = first.partition(),
                        offset = first.offset(),
                        "batch failed fatally; the loop stops (the batch is not committed)"
                    );
                    return Err(Error::Fatal(Box::new(error)));
                }
                Err(error) => {
                    attempt += 1;
                    let delay = options.backoff.delay(attempt);
                    let first = &batch.records[0];
                    metrics::counter!("retries_total", "topic" => first.topic().to_owned()).increment(1);
                    tracing::warn!(
                        error = %error_chain(&error),
                        attempt,
                        records = batch.records.len(),
                        topic = first.topic(),
                        partition = first.partition(),
                        offset = first.offset(),
                        retry_in_ms = delay.as_millis() as u64,
                        "batch failed; retrying"
                    );
                    paused.pause_consumed(io);
                    // the batch stays unacknowledged: it is redelivered after restart
                    if wait_polling(io, delay, shutdown, &mut carried, &mut paused, &mut held).await? {
                        return Ok(());
                    }
                    continue;
                }
            };
            handling_seconds.record(started.elapsed().as_secs_f64());
            attempt = 0;
            let Walk { mut fates, retry } =
                walk(&batch.records, verdicts).map_err(|error| Error::Fatal(Box::new(error)))?;
            // the record to retry is the first handed again; the same as last time only if it
            // was the batch's first record
            let retry = match retry {
                Some((index, failure)) => {
                    let record = &batch.records[index];
                    let same = head.as_ref().is_some_and(|(topic, partition, offset)| {
                        record.topic() == topic
                            && record.partition() == *partition
                            && record.offset() == *offset
                    });
                    let prior = if index == 0 && same { head_retries } else { 0 };
                    match options.record_retry.after_failure(prior) {
                        Some(delay) => Some((failure, delay, prior)),
                        None => {
                            let record = &batch.records[index];
                            tracing::warn!(
                                topic = record.topic(),
                                partition = record.partition(),
                                offset = record.offset(),
                                attempts = prior + 1,
                                reason = failure.message,
                                "retries exhausted; dead-lettering the record"
                            );
                            fates[index] = Fate::DeadLetter(failure);
                            None
                        }
                    }
                }
                None => None,
            };
            // a partition revoked while the handler ran is someone else's now: its records are
            // redelivered there, so nothing of them is published or stored here
            let Sorted { mut finished, outputs, held_now, again, revoked } =
                sort(std::mem::take(&mut batch), fates, revocations, options)?;
            if revoked > 0 {
                tracing::info!(
                    revoked,
                    "records of partitions revoked while they were handled: nothing of them published or stored"
                );
            }
            for (key, due, records) in held_now {
                // what came after them from the consumer waits behind them
                let mut records = records;
                records.append(carried.take_partition(&key.0, key.1));
                held.hold(io, key, due, records);
            }
            if !outputs.is_empty() {
                let outputs: Vec<Output<'_>> = outputs
                    .into_iter()
                    .map(|(index, output)| output.from(&finished.records[index], finished.taken[index]))
                    .collect();
                if !publish_all(io, &outputs, options, shutdown, &mut carried, &mut paused, &mut held).await?
                {
                    return Ok(()); // shut down before the outputs were acknowledged: redelivered
                }
                // a partition revoked while its outputs waited for the broker (the consumer is
                // polled meanwhile) is someone else's now: publish_all dropped its outputs, so
                // its offsets must not move, even if the partition came back since
                let dropped = finished.drop_revoked(revocations);
                if dropped > 0 {
                    tracing::info!(
                        dropped,
                        "records of partitions revoked while their outputs waited: not stored"
                    );
                }
            }
            if !finished.records.is_empty() {
                io.store(&next_offsets(&finished.records));
                carried.drop_handled(&finished.records);
            }
            batch = again;
            let Some((failure, delay, prior)) = retry else {
                if batch.records.is_empty() {
                    if carried.records.is_empty() {
                        paused.resume_all(io, &held);
                    }
                    break;
                }
                // a record out of retries was dead-lettered: the rest of the batch comes next,
                // still one by one
                head_retries = 0;
                continue;
            };
            head_retries = prior + 1;
            head = batch
                .records
                .first()
                .map(|record| (record.topic().to_owned(), record.partition(), record.offset()));
            retrying = true;
            let record = &batch.records[0];
            metrics::counter!("retries_total", "topic" => record.topic().to_owned()).increment(1);
            tracing::info!(
                topic = record.topic(),
                partition = record.partition(),
                offset = record.offset(),
                attempt = head_retries,
                retry_in_ms = delay.as_millis() as u64,
                reason = failure.message,
                "record failed; retrying it in place"
            );
            paused.pause_consumed(io);
            if wait_polling(io, delay, shutdown, &mut carried, &mut paused, &mut held).await? {
                return Ok(()); // the record and those after it stay uncommitted
            }
        }
        if carried.records.is_empty() {
            paused.resume_all(io, &held); // the whole batch was revoked during the retries
        }
    }
}

/// What became of one record of a batch, read from the handler's verdicts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    Done,
    DeadLetter(Failure),
    Forward(Forward),
    /// Held until the instant: the record said [`Verdict::NotBefore`], or an earlier one of its
    /// partition did.
    Held(tokio::time::Instant),
    /// Handed to the handler again: the record to retry and those after it (or records the
    /// handler gave no verdict).
    Again,
}

/// A handler's verdicts on a batch, read in order.
#[derive(Debug, PartialEq, Eq)]
struct Walk {
    /// One per record of the batch.
    fates: Vec<Fate>,
    /// The index and failure of the record to retry: the first [`Verdict::Retry`] not in a
    /// held partition. Every record after it that is not held is [`Fate::Again`].
    retry: Option<(usize, Failure)>,
}

/// The handler broke [`Handler::handle`]'s contract.
#[derive(Debug, thiserror::Error)]
#[error(
    "the handler returned {verdicts} verdicts for {records} records (fewer only when the last is a retry)"
)]
struct VerdictCount {
    verdicts: usize,
    records: usize,
}

fn walk(records: &[OwnedMessage], verdicts: Vec<Verdict>) -> Result<Walk, VerdictCount> {
    let (count, len) = (verdicts.len(), records.len());
    let last_is_retry = matches!(verdicts.last(), Some(Verdict::Retry(_)));
    if count > len || (count < len && !last_is_retry) {
        return Err(VerdictCount { verdicts: count, records: len });
    }
    let mut held: Vec<((&str, i32), tokio::time::Instant)> = Vec::new();
    let mut fates = Vec::with_capacity(len);
    let mut retry = None;
    let mut verdicts = verdicts.into_iter();
    for (index, record) in records.iter().enumerate() {
        let verdict = verdicts.next();
        let key = (record.topic(), record.partition());
        // behind a record of its partition that is not due: whatever its verdict says
        if let Some((_, due)) = held.iter().find(|(held, _)| *held == key) {
            fates.push(Fate::Held(*due));
            continue;
        }
        if retry.is_some() {
            fates.push(Fate::Again);
            continue;
        }
        fates.push(match verdict {
            Some(Verdict::Done) => Fate::Done,
            Some(Verdict::DeadLetter(failure)) => Fate::DeadLetter(failure),
            Some(Verdict::Forward(forward)) => Fate::Forward(forward),
            Some(Verdict::NotBefore(due)) => {
                held.push((key, due));
                Fate::Held(due)
            }
            Some(Verdict::Retry(failure)) => {
                retry = Some((index, failure));
                Fate::Again
            }
            None => Fate::Again,
        });
    }
    Ok(Walk { fates, retry })
}

/// A batch split by the fates of its records.
struct Sorted {
    /// Done, dead-lettered or forwarded: stored once `outputs` are acknowledged.
    finished: Batch,
    /// (index in `finished`, what to publish for it).
    outputs: Vec<(usize, Pending)>,
    /// Per partition: when its first held record is due, and the held records.
    held_now: Vec<((String, i32), tokio::time::Instant, Batch)>,
    /// To hand to the handler again, in order.
    again: Batch,
    /// Records dropped: their partition was revoked while the handler ran.
    revoked: usize,
}

/// An output before it is tied to its record.
enum Pending {
    DeadLetter(Failure),
    Forward(Forward),
}

impl Pending {
    fn from(self, source: &OwnedMessage, taken: u64) -> Output<'_> {
        match self {
            Pending::DeadLetter(failure) => Output {
                source,
                taken,
                record: None,
                route: Route::DeadLetters,
                kind: ForwardKind::DeadLetter,
                failure: Some(failure),
                reason: String::new(),
            },
            Pending::Forward(forward) => Output {
                source,
                taken,
                record: Some(forward.record),
                route: Route::Forwards,
                kind: forward.kind,
                failure: None,
                reason: forward.reason,
            },
        }
    }
}

fn sort(
    batch: Batch,
    fates: Vec<Fate>,
    revocations: &Revocations,
    options: &LoopOptions,
) -> Result<Sorted, Error> {
    let mut sorted = Sorted {
        finished: Batch::default(),
        outputs: Vec::new(),
        held_now: Vec::new(),
        again: Batch::default(),
        revoked: 0,
    };
    for ((record, taken), fate) in batch.records.into_iter().zip(batch.taken).zip(fates) {
        if revocations.revoked_since(record.topic(), record.partition(), taken) {
            sorted.revoked += 1;
            continue;
        }
        let pending = match fate {
            Fate::Again => {
                sorted.again.push((record, taken));
                continue;
            }
            Fate::Held(due) => {
                let key = (record.topic().to_owned(), record.partition());
                match sorted.held_now.iter_mut().find(|(held, _, _)| *held == key) {
                    Some((_, _, records)) => records.push((record, taken)),
                    None => {
                        let mut records = Batch::default();
                        records.push((record, taken));
                        sorted.held_now.push((key, due, records));
                    }
                }
                continue;
            }
            Fate::Done => None,
            Fate::DeadLetter(failure) => {
                if options.dead_letters.is_none() {
                    return Err(Error::Fatal(
                        "the handler dead-lettered a record but the loop has no dead-letter publisher".into(),
                    ));
                }
                Some(Pending::DeadLetter(failure))
            }
            Fate::Forward(forward) => {
                if options.forwards.is_none() {
                    return Err(Error::Fatal(
                        "the handler forwarded a record but the loop has no producer for forwards".into(),
                    ));
                }
                Some(Pending::Forward(forward))
            }
        };
        if let Some(pending) = pending {
            sorted.outputs.push((sorted.finished.records.len(), pending));
        }
        sorted.finished.push((record, taken));
    }
    Ok(sorted)
}

/// A record the loop publishes for a record it handled, which counts as handled only once the
/// broker acknowledged it.
struct Output<'a> {
    source: &'a OwnedMessage,
    /// The [`Revocations`] tick at which `source` was taken.
    taken: u64,
    /// The forward, or `None` for a dead letter (written by the publisher from `failure`).
    record: Option<OutgoingRecord>,
    route: Route,
    kind: ForwardKind,
    failure: Option<Failure>,
    reason: String,
}

impl Output<'_> {
    /// Logs and counts the output once acknowledged.
    fn acknowledged(&self, topic: &str) {
        let source = self.source;
        let reason = self.failure.as_ref().map_or(self.reason.as_str(), |failure| failure.message.as_str());
        match self.kind {
            ForwardKind::Retry => {
                metrics::counter!("retries_total", "topic" => source.topic().to_owned()).increment(1);
                tracing::info!(
                    topic = source.topic(),
                    partition = source.partition(),
                    offset = source.offset(),
                    retry_topic = topic,
                    reason,
                    "attempt failed; forwarded to retry topic"
                );
            }
            ForwardKind::DeadLetter => {
                metrics::counter!("dlt_mensagens_total", "topic" => topic.to_owned()).increment(1);
                tracing::warn!(
                    dead_letter_topic = topic,
                    topic = source.topic(),
                    partition = source.partition(),
                    offset = source.offset(),
                    reason,
                    "record sent to dead-letter topic"
                );
            }
        }
    }
}

/// Publishes `outputs` (all at once) until the broker acknowledged each, backing off (and
/// polling, paused) between tries; the outputs of a partition revoked meanwhile are dropped.
/// `false` when `shutdown` came first.
async fn publish_all(
    io: &impl Io,
    outputs: &[Output<'_>],
    options: &LoopOptions,
    shutdown: &CancellationToken,
    carried: &mut Batch,
    paused: &mut Paused,
    held: &mut Held,
) -> Result<bool, Error> {
    let records: Vec<OutgoingRecord> = outputs
        .iter()
        .map(|output| match (&output.record, &output.failure, &options.dead_letters) {
            (Some(record), _, _) => record.clone(),
            (None, Some(failure), Some(publisher)) => publisher.letter(output.source, failure),
            _ => unreachable!("`sort` made sure of a publisher for every dead letter"),
        })
        .collect();
    let revocations = io.revocations();
    let mut pending: Vec<usize> = (0..outputs.len()).collect();
    let mut attempt = 0u32;
    while !pending.is_empty() {
        // the consumer was polled during the last wait: a partition revoked meanwhile is
        // someone else's, who publishes its outputs
        let before = pending.len();
        pending.retain(|&index| {
            let output = &outputs[index];
            !revocations.revoked_since(output.source.topic(), output.source.partition(), output.taken)
        });
        if pending.len() < before {
            tracing::info!(
                dropped = before - pending.len(),
                "outputs of partitions revoked while they waited dropped"
            );
            if pending.is_empty() {
                break;
            }
        }
        let sent = futures::future::join_all(
            pending.iter().map(|&index| io.publish(&records[index], outputs[index].route)),
        )
        .await;
        let mut failed = Vec::new();
        for (index, result) in pending.into_iter().zip(sent) {
            match result {
                Ok(()) => outputs[index].acknowledged(&records[index].topic),
                Err(Error::Fatal(error)) => return Err(Error::Fatal(error)),
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), topic = records[index].topic, "output not published; retrying");
                    failed.push(index);
                }
            }
        }
        pending = failed;
        if !pending.is_empty() {
            attempt += 1;
            let delay = options.backoff.delay(attempt);
            tracing::warn!(
                unpublished = pending.len(),
                attempt,
                retry_in_ms = delay.as_millis() as u64,
                "outputs not published; retrying"
            );
            paused.pause_consumed(io);
            if wait_polling(io, delay, shutdown, carried, paused, held).await? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// How a backoff wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    Elapsed,
    Shutdown,
}

/// Waits `delay` unless `shutdown` comes first, meanwhile taking whatever `poll` yields and
/// handing it to `taken`: the runtime's one backoff wait. `poll` must be cancel-safe.
pub(crate) async fn backoff<T, E, Fut>(
    delay: Duration,
    shutdown: &CancellationToken,
    mut poll: impl FnMut() -> Fut,
    mut taken: impl FnMut(T),
) -> Result<Waited, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(Waited::Shutdown),
            _ = &mut sleep => return Ok(Waited::Elapsed),
            item = poll() => taken(item?),
        }
    }
}

/// Records taken from the consumer, each with the [`Revocations`] tick at which it was taken.
#[derive(Debug, Default)]
struct Batch {
    records: Vec<OwnedMessage>,
    taken: Vec<u64>,
}

impl Batch {
    fn push(&mut self, (record, taken): (OwnedMessage, u64)) {
        self.records.push(record);
        self.taken.push(taken);
    }

    /// Each record with the tick at which it was taken, in order.
    fn into_taken(self) -> impl Iterator<Item = (OwnedMessage, u64)> {
        self.records.into_iter().zip(self.taken)
    }

    /// Takes the records of one partition, in order.
    fn take_partition(&mut self, topic: &str, partition: i32) -> Batch {
        let mut taken = Batch::default();
        if self.records.iter().any(|record| record.topic() == topic && record.partition() == partition) {
            let mut kept = Batch::default();
            for (record, tick) in
                std::mem::take(&mut self.records).into_iter().zip(std::mem::take(&mut self.taken))
            {
                if record.topic() == topic && record.partition() == partition {
                    taken.push((record, tick));
                } else {
                    kept.push((record, tick));
                }
            }
            *self = kept;
        }
        taken
    }

    /// Moves `other`'s records behind these.
    fn append(&mut self, mut other: Batch) {
        self.records.append(&mut other.records);
        self.taken.append(&mut other.taken);
    }

    /// The first `count` records as a batch of their own.
    fn split_off_front(&mut self, count: usize) -> Batch {
        let count = count.min(self.records.len());
        Batch { records: self.records.drain(..count).collect(), taken: self.taken.drain(..count).collect() }
    }

    fn retain(&mut self, mut keep: impl FnMut(&OwnedMessage, u64) -> bool) {
        let records = std::mem::take(&mut self.records);
        let taken = std::mem::take(&mut self.taken);
        for (record, tick) in records.into_iter().zip(taken) {
            if keep(&record, tick) {
                self.push((record, tick));
            }
        }
    }

    /// Drops the records whose partition was revoked after they were taken; returns how many.
    fn drop_revoked(&mut self, revocations: &Revocations) -> usize {
        let before = self.records.len();
        self.retain(|record, taken| !revocations.revoked_since(record.topic(), record.partition(), taken));
        before - self.records.len()
    }

    /// Drops the records at or below an offset `handled` covered in their partition: a
    /// partition lost and assigned again while a batch waited for its retry is fetched anew
    /// from its committed offset, so what the batch just handled may come again.
    fn drop_handled(&mut self, handled: &[OwnedMessage]) {
        if self.records.is_empty() {
            return;
        }
        let next = next_offsets(handled);
        self.retain(|record, _| match next.find_partition(record.topic(), record.partition()) {
            Some(element) => match element.offset() {
                Offset::Offset(next) => record.offset() >= next,
                _ => true,
            },
            None => true,
        });
    }
}

/// Sleeps `delay` while polling the consumer, whose partitions are paused: a record that was
/// already on its way is kept in `carried` (in order, handled after the failed batch) and its
/// partition paused, so at most a few records are held (or behind the held records of its
/// partition, if it has any). `true` when `shutdown` came first.
async fn wait_polling(
    io: &impl Io,
    delay: Duration,
    shutdown: &CancellationToken,
    carried: &mut Batch,
    paused: &mut Paused,
    held: &mut Held,
) -> Result<bool, Error> {
    let waited = backoff(
        delay,
        shutdown,
        || receive_taken(io),
        |taken: (OwnedMessage, u64)| {
            if let Some(taken) = held.push(io.revocations(), taken) {
                // e.g. a partition assigned by a rebalance during the wait
                paused.pause(io, taken.0.topic(), taken.0.partition());
                carried.push(taken);
            }
        },
    )
    .await?;
    Ok(waited == Waited::Shutdown)
}

/// The partitions this loop paused while a batch waited for its retry, each with the
/// [`Revocations`] tick at which it was paused.
///
/// Only partitions that have handed out records are paused (librdkafka then resumes them from
/// the position after the last one), and only those are resumed, unless they were revoked
/// since (the context unpauses a partition as it is revoked). Pausing or resuming any other
/// partition is not harmless: librdkafka bumps the partition's op version either way, which
/// discards a committed-offset lookup still in flight for a newly assigned partition, and the
/// partition then starts from `auto.offset.reset` (the earliest offset): everything again.
#[derive(Debug, Default)]
struct Paused(Vec<(String, i32, u64)>);

impl Paused {
    /// Pauses every assigned partition that has a position (it handed out records).
    fn pause_consumed(&mut self, io: &impl Io) {
        for (topic, partition, _) in io.positions() {
            self.pause(io, &topic, partition);
        }
    }

    fn pause(&mut self, io: &impl Io, topic: &str, partition: i32) {
        if self.0.iter().any(|(paused, number, _)| paused == topic && *number == partition) {
            return;
        }
        if io.pause(topic, partition) {
            self.0.push((topic.to_owned(), partition, io.revocations().now()));
        }
    }

    /// Resumes what [`Self::pause`] paused and was not revoked since, except the partitions
    /// whose records are `held` (they resume when their records are due).
    fn resume_all(&mut self, io: &impl Io, held: &Held) {
        let revocations = io.revocations();
        let mut resumed = Vec::new();
        for (topic, partition, paused_at) in self.0.drain(..) {
            if !revocations.revoked_since(&topic, partition, paused_at) && !held.holds(&topic, partition) {
                resumed.push((topic, partition));
            }
        }
        io.resume(&resumed);
    }
}

/// How long the loop waits idle before storing the consumer's position (see [`store_position`]).
const IDLE_POSITION_STORE: Duration = Duration::from_millis(500);

/// The next batch: the held records that came due, or else a record and more until the batch
/// is full or `batch_wait_max` passed (records of held partitions go behind the held ones).
/// `None` when `shutdown` came first.
async fn next_batch(
    io: &impl Io,
    options: &LoopOptions,
    held: &mut Held,
    shutdown: &CancellationToken,
) -> Result<Option<Batch>, Error> {
    loop {
        let due = held.next_due();
        let first = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(None),
            _ = sleep_until(due) => {
                let released = held.release_due(io, tokio::time::Instant::now());
                if released.records.is_empty() {
                    continue;
                }
                return Ok(Some(released));
            }
            taken = receive_taken(io) => taken?,
            _ = tokio::time::sleep(IDLE_POSITION_STORE) => {
                store_position(io, held);
                continue;
            }
        };
        let filled = fill_taken(io, first, options.batch_records_max, options.batch_wait_max).await?;
        let mut batch = Batch::default();
        for taken in filled.into_taken() {
            if let Some(taken) = held.push(io.revocations(), taken) {
                batch.push(taken);
            }
        }
        if !batch.records.is_empty() {
            return Ok(Some(batch));
        }
    }
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Takes more records after `first` until `records_max` or `wait_max` after it, each with the
/// tick at which it was taken. Not cancel-safe: records taken are lost if the future is dropped,
/// so never race it in a `select!` (race [`receive_taken`] for the first record instead, which
/// is).
async fn fill_taken(
    io: &impl Io,
    first: (OwnedMessage, u64),
    records_max: usize,
    wait_max: Duration,
) -> Result<Batch, Error> {
    let capacity = records_max.min(64);
    let mut batch = Batch { records: Vec::with_capacity(capacity), taken: Vec::with_capacity(capacity) };
    batch.push(first);
    let deadline = tokio::time::Instant::now() + wait_max;
    while batch.records.len() < records_max {
        match tokio::time::timeout_at(deadline, receive_taken(io)).await {
            Ok(taken) => batch.push(taken?),
            Err(_elapsed) => break,
        }
    }
    Ok(batch)
}

/// The next record ([`Io::receive`], cancel-safe), with the [`Revocations`] tick right after it
/// was taken (a revocation served while polling for it came before it). Every wait of the loop
/// polls through here, so a rebalance librdkafka refused ([`Revocations::refuse`]) ends it with
/// [`Error::Fatal`]: the member would never fetch again.
async fn receive_taken(io: &impl Io) -> Result<(OwnedMessage, u64), Error> {
    let revocations = io.revocations();
    tokio::select! {
        biased;
        why = revocations.wait_refused() => {
            tracing::error!(reason = why, "librdkafka refused a rebalance: the consumer loop stops (a fresh member recovers)");
            Err(Error::Fatal(why.into()))
        }
        record = io.receive() => {
            let record = record?;
            let tick = revocations.now();
            revocations.taken(record.topic(), record.partition(), tick);
            Ok((record, tick))
        }
    }
}

/// Per partition, the offset after its last record in `records`: what a consumer commits (or
/// a transaction sends) once those records are handled.
pub fn next_offsets<'a>(records: impl IntoIterator<Item = &'a OwnedMessage>) -> TopicPartitionList {
    let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for record in records {
        let entry = next.entry((record.topic(), record.partition())).or_insert(0);
        *entry = (*entry).max(record.offset() + 1);
    }
    let mut offsets = TopicPartitionList::with_capacity(next.len());
    for ((topic, partition), offset) in next {
        if let Err(error) = offsets.add_partition_offset(topic, partition, Offset::Offset(offset)) {
            tracing::warn!(%error, topic, partition, "bad offset");
        }
    }
    offsets
}

/// While idle, every record delivered so far has been handled (batches are handled before the
/// next is taken, and a failed one never leaves the retry loop), except the held ones, so the
/// consumer's position may be stored for every partition that holds none. It matters on transactional topics: the position moves past the commit markers,
/// which are never delivered, so the committed offset reaches the end of the partition and
/// `kafka_consumer_lag` reads exactly 0 once the group has drained its input.
///
/// A partition revoked after the last record taken from it is skipped: assigned again at once,
/// its position can still be the one from before the revocation (librdkafka resets it only
/// once the old fetcher has stopped), past records the loop dropped as revoked.
fn store_position(io: &impl Io, held: &Held) {
    let positions = io.positions();
    let mut offsets = TopicPartitionList::with_capacity(positions.len());
    let revocations = io.revocations();
    // a held partition's position is past its held records, which are not handled yet
    let unheld = positions.into_iter().filter(|(topic, partition, _)| {
        !held.holds(topic, *partition) && revocations.taken_since_revoked(topic, *partition)
    });
    for (topic, partition, offset) in unheld {
        if offsets.add_partition_offset(&topic, partition, Offset::Offset(offset)).is_err() {
            return;
        }
    }
    io.store(&offsets);
}

pub use telemetry::error_chain;

/// The value of the **last** header called `name` of `message`, as Kafka's
/// `Headers.lastHeader` reads it: Spring's retry topics append the `retry_topic-*` and
/// exception headers at every hop, so the last value is the newest hop's (the first one would
/// release a record before its due time).
pub fn header<'a>(message: &'a impl Message, name: &str) -> Option<&'a [u8]> {
    message.headers()?.iter().filter(|header| header.key == name).last().and_then(|header| header.value)
}

/// Every value of the headers called `name`, oldest first (an absent value reads as empty).
pub fn header_values<'a>(message: &'a impl Message, name: &str) -> Vec<&'a [u8]> {
    let Some(headers) = message.headers() else { return Vec::new() };
    headers
        .iter()
        .filter(|header| header.key == name)
        .map(|header| header.value.unwrap_or_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders};

    #[test]
    fn a_header_that_occurs_more_than_once_reads_as_its_last_value() {
        let headers = OwnedHeaders::new()
            .insert(Header { key: "retry_topic-attempts", value: Some(&[0u8, 0, 0, 2][..]) })
            .insert(Header { key: "traceparent", value: Some(&b"00-abc"[..]) })
            .insert(Header { key: "retry_topic-attempts", value: Some(&[0u8, 0, 0, 3][..]) });
        let record =
            OwnedMessage::new(None, None, "t".into(), rdkafka::Timestamp::NotAvailable, 0, 0, Some(headers));
        assert_eq!(header(&record, "retry_topic-attempts"), Some(&[0u8, 0, 0, 3][..]));
        assert_eq!(header(&record, "traceparent"), Some(&b"00-abc"[..]));
        assert_eq!(header(&record, "missing"), None);
        assert_eq!(header_values(&record, "retry_topic-attempts"), vec![&[0u8, 0, 0, 2][..], &[0, 0, 0, 3]]);
        assert!(header_values(&record, "missing").is_empty());
        // like lastHeader: a last header without a value hides the earlier ones
        let nulled = OwnedHeaders::new()
            .insert(Header { key: "x", value: Some(&b"1"[..]) })
            .insert(Header::<&[u8]> { key: "x", value: None });
        let record =
            OwnedMessage::new(None, None, "t".into(), rdkafka::Timestamp::NotAvailable, 0, 0, Some(nulled));
        assert_eq!(header(&record, "x"), None);
    }

    fn record(topic: &str, partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(None, None, topic.into(), rdkafka::Timestamp::NotAvailable, partition, offset, None)
    }

    fn batch(records: &[(&str, i32, i64, u64)]) -> Batch {
        let mut batch = Batch::default();
        for (topic, partition, offset, taken) in records {
            batch.push((record(topic, *partition, *offset), *taken));
        }
        batch
    }

    fn left(batch: &Batch) -> Vec<(&str, i32, i64, u64)> {
        batch
            .records
            .iter()
            .zip(&batch.taken)
            .map(|(record, taken)| (record.topic(), record.partition(), record.offset(), *taken))
            .collect()
    }

    #[test]
    fn records_carried_through_a_retry_that_the_batch_already_handled_are_dropped() {
        let handled = vec![record("a", 0, 5), record("a", 0, 6), record("a", 1, 9)];
        let mut carried =
            batch(&[("a", 0, 6, 0), ("a", 0, 7, 1), ("a", 1, 3, 2), ("a", 2, 0, 3), ("b", 0, 1, 4)]);
        carried.drop_handled(&handled);
        assert_eq!(left(&carried), [("a", 0, 7, 1), ("a", 2, 0, 3), ("b", 0, 1, 4)]);
        let front = carried.split_off_front(2);
        assert_eq!(left(&front), [("a", 0, 7, 1), ("a", 2, 0, 3)]);
        assert_eq!(left(&carried), [("b", 0, 1, 4)]);
    }

    #[test]
    fn records_of_a_partition_revoked_after_they_were_taken_are_dropped() {
        let revocations = Revocations::default();
        let t0 = revocations.now();
        let mut taken = batch(&[("a", 0, 5, t0), ("a", 1, 7, t0)]);
        assert_eq!(taken.drop_revoked(&revocations), 0, "nothing revoked");
        let mut revoked = TopicPartitionList::new();
        revoked.add_partition("a", 0);
        // a rebalance served while polling: partition 0 revoked, then assigned again and
        // fetched anew from its committed offset
        revocations.record(&revoked);
        let t1 = revocations.now();
        taken.push((record("a", 0, 5), t1));
        assert_eq!(taken.drop_revoked(&revocations), 1);
        assert_eq!(left(&taken), [("a", 1, 7, t0), ("a", 0, 5, t1)]);
    }

    fn failure(message: &str) -> Failure {
        Failure {
            exception_fqcn: "test::Failed".into(),
            cause_fqcn: "test::Cause".into(),
            message: message.into(),
            stacktrace: message.into(),
        }
    }

    #[test]
    fn verdicts_are_read_in_order_up_to_the_first_retry() {
        use Verdict::{DeadLetter, Done, Retry};
        let three = [record("a", 0, 1), record("a", 0, 2), record("a", 1, 3)];
        let walked = walk(&three, vec![Done, DeadLetter(failure("poison")), Done]).expect("complete");
        assert_eq!(
            walked,
            Walk { fates: vec![Fate::Done, Fate::DeadLetter(failure("poison")), Fate::Done], retry: None }
        );
        // a retry ends the walk: what follows it waits for it, whatever its verdict
        let walked = walk(&three, vec![Done, Retry(failure("busy")), Done]).expect("retry");
        assert_eq!(
            walked,
            Walk { fates: vec![Fate::Done, Fate::Again, Fate::Again], retry: Some((1, failure("busy"))) }
        );
        let walked = walk(&three, vec![Retry(failure("busy"))]).expect("a handler may stop at a retry");
        assert_eq!(walked.fates, [Fate::Again, Fate::Again, Fate::Again]);
        // too few verdicts without a retry, or too many: the handler is broken
        assert!(walk(&three[..2], vec![Done]).is_err());
        assert!(walk(&three[..1], vec![Done, Done]).is_err());
    }

    #[test]
    fn a_record_not_due_holds_the_rest_of_its_partition_and_nothing_else() {
        use Verdict::{Done, NotBefore, Retry};
        let due = tokio::time::Instant::now() + Duration::from_secs(4);
        let batch =
            [record("a", 0, 1), record("a", 1, 7), record("a", 0, 2), record("a", 1, 8), record("a", 0, 3)];
        // the verdicts behind a NotBefore of the same partition mean nothing, a retry included
        let walked =
            walk(&batch, vec![NotBefore(due), Done, Done, Done, Retry(failure("busy"))]).expect("walk");
        assert_eq!(
            walked,
            Walk {
                fates: vec![Fate::Held(due), Fate::Done, Fate::Held(due), Fate::Done, Fate::Held(due)],
                retry: None
            }
        );
        // a retry of another partition still holds back what follows it, except the held ones
        let walked = walk(&batch, vec![Done, NotBefore(due), Retry(failure("busy"))]).expect("walk");
        assert_eq!(
            walked,
            Walk {
                fates: vec![Fate::Done, Fate::Held(due), Fate::Again, Fate::Held(due), Fate::Again],
                retry: Some((2, failure("busy")))
            }
        );
    }

    #[test]
    fn record_retries_follow_the_articles_schedule_then_dead_letter() {
        let policy = RetryPolicy::default();
        let schedule: Vec<Option<u64>> =
            (0..=5).map(|retried| policy.after_failure(retried).map(|d| d.as_millis() as u64)).collect();
        assert_eq!(schedule, [Some(500), Some(1_000), Some(2_000), Some(4_000), Some(8_000), None]);
        assert_eq!(policy.worst_case(), Duration::from_millis(15_500));
        let none = RetryPolicy { retries: 0, ..RetryPolicy::default() };
        assert_eq!(none.after_failure(0), None);
    }

    /// A source with nothing to deliver (a paused consumer).
    async fn nothing() -> Result<(), std::convert::Infallible> {
        std::future::pending().await
    }

    #[tokio::test(start_paused = true)]
    async fn a_backoff_wait_lasts_its_delay_on_the_clock() {
        let shutdown = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let wait = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { backoff(Duration::from_secs(15), &shutdown, nothing, |()| {}).await }
        });
        tokio::task::yield_now().await; // the wait starts its clock
        tokio::time::advance(Duration::from_millis(14_999)).await;
        tokio::task::yield_now().await;
        assert!(!wait.is_finished(), "the wait ended before its delay");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(wait.await.expect("join"), Ok(Waited::Elapsed));
        assert_eq!(started.elapsed(), Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_ends_a_backoff_wait_at_once() {
        let shutdown = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let wait = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { backoff(Duration::from_secs(15), &shutdown, nothing, |()| {}).await }
        });
        tokio::task::yield_now().await; // the wait starts its clock
        tokio::time::advance(Duration::from_secs(1)).await;
        shutdown.cancel();
        assert_eq!(wait.await.expect("join"), Ok(Waited::Shutdown));
        assert_eq!(started.elapsed(), Duration::from_secs(1), "the shutdown waited for the clock");
    }

    #[tokio::test(start_paused = true)]
    async fn a_backoff_wait_keeps_polling() {
        let shutdown = CancellationToken::new();
        let mut delivered = vec![1, 2, 3].into_iter();
        let mut taken = Vec::new();
        let poll = || {
            let next = delivered.next();
            async move {
                match next {
                    Some(item) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::convert::Infallible>(item)
                    }
                    None => std::future::pending().await,
                }
            }
        };
        let waited = backoff(Duration::from_secs(1), &shutdown, poll, |item| taken.push(item)).await;
        assert_eq!(waited, Ok(Waited::Elapsed));
        assert_eq!(taken, [1, 2, 3], "records arriving during the wait are taken, not left unpolled");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let backoff = Backoff::default();
        assert_eq!(backoff.delay(1), Duration::from_millis(500));
        assert_eq!(backoff.delay(2), Duration::from_millis(1000));
        assert_eq!(backoff.delay(5), Duration::from_millis(8000));
        assert_eq!(backoff.delay(6), Duration::from_secs(15));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(15));
    }
}
