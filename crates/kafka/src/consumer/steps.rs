//! The loop as explicit steps. [`consume`] repeats two: **collect** a batch, then **work
//! through** it, which repeats, until nothing of the batch is left:
//!
//! 1. **handle**: the handler's verdicts, or a failure of the whole batch (after a backoff,
//!    again; a fatal one stops the loop);
//! 2. **decide**: each record's [`Fate`] from its verdict, and whether the record to retry
//!    still has retries (else it is dead-lettered);
//! 3. **finish**: the records held back ([`Verdict::NotBefore`]) go to [`Held`], the loop's
//!    outputs are published until acknowledged, the finished records' offsets are stored;
//! 4. **retry**: what is left (the record to retry and those after it) waits its backoff.
//!
//! Invariants, asserted: every record of a batch ends in exactly one of finished, handed
//! again, held or dropped as revoked; a record not revoked since it was taken is in exactly
//! one of the batch, the carried records or the held ones (checked in debug builds: it costs a
//! set per attempt); stored offsets only move forward per partition ([`StoredOffsets`]).
//!
//! [`Verdict::NotBefore`]: super::Verdict::NotBefore

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use super::batch::Batch;
use super::error_chain;
use super::fate::{sort, walk, Fate, Sorted, Walk};
use super::held::Held;
use super::io::Io;
use super::next_offsets;
use super::publish::{publish_all, Output};
use super::stored::StoredOffsets;
use super::verdict::{Handler, LoopOptions, Verdict};
use super::wait::{next_batch, wait_polling, Paused};
use crate::dead_letter::Failure;
use crate::Error;

/// Runs the loop until `shutdown`; records not finished by then stay uncommitted.
pub(super) async fn consume<H: Handler>(
    io: &impl Io,
    handler: &mut H,
    options: &LoopOptions,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let mut steps = Steps::new(io, options, shutdown);
    while let Some(batch) = steps.collect().await? {
        if steps.work_through(handler, batch).await? == Flow::Shutdown {
            break;
        }
    }
    Ok(())
}

/// Whether the loop goes on after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Shutdown,
}

/// What one call of the handler gave.
enum Handled {
    Verdicts(Vec<Verdict>),
    /// The whole batch failed: again after this pause.
    Failed(Duration),
}

/// A record to retry in place, still within its retries.
struct Retry {
    failure: Failure,
    delay: Duration,
    /// Retries it had before this failure.
    prior: u32,
}

/// The retries of the record at the head of the batch: a record dropped meanwhile (its
/// partition revoked) takes its count away with it.
#[derive(Debug, Default)]
struct HeadRetries {
    record: Option<(String, i32, i64)>,
    retries: u32,
}

impl HeadRetries {
    /// The retries `record` already had, at `index` in the batch: it is the same record as last
    /// time only if it is still the batch's first.
    fn prior(&self, index: usize, record: &OwnedMessage) -> u32 {
        let same = self.record.as_ref().is_some_and(|(topic, partition, offset)| {
            record.topic() == topic && record.partition() == *partition && record.offset() == *offset
        });
        if index == 0 && same {
            self.retries
        } else {
            0
        }
    }
}

/// The loop's state between steps: what outlives one batch.
pub(super) struct Steps<'a, I: Io> {
    io: &'a I,
    options: &'a LoopOptions,
    shutdown: &'a CancellationToken,
    handling_seconds: metrics::Histogram,
    /// Records taken while a batch waited (their partitions then paused), and those beyond
    /// one batch: handed on before anything new is taken.
    pub(super) carried: Batch,
    paused: Paused,
    /// Records not due yet, their partitions paused ([`Verdict::NotBefore`]).
    held: Held,
    stored: StoredOffsets,
}

impl<'a, I: Io> Steps<'a, I> {
    pub(super) fn new(io: &'a I, options: &'a LoopOptions, shutdown: &'a CancellationToken) -> Self {
        // per group, so that a process running several consumers (`pagamentos all`) tells them apart
        let handling_seconds =
            metrics::histogram!("kafka_batch_handling_seconds", "group" => io.group().to_owned());
        Self {
            io,
            options,
            shutdown,
            handling_seconds,
            carried: Batch::default(),
            paused: Paused::default(),
            held: Held::default(),
            stored: StoredOffsets::default(),
        }
    }

    /// Step 0, **collect**: the carried records first, else the next batch from the consumer
    /// (the held records that came due, or new ones). `None` at shutdown; held records stay
    /// uncommitted then, to be redelivered.
    async fn collect(&mut self) -> Result<Option<Batch>, Error> {
        let dropped = self.held.drop_revoked(self.io.revocations());
        if dropped > 0 {
            tracing::info!(dropped, "held records of partitions revoked since they were received dropped");
        }
        let max = self.options.batch_records_max;
        if !self.carried.records.is_empty() {
            return Ok(Some(self.carried.split_off_front(max)));
        }
        let Some(mut next) =
            next_batch(self.io, self.options, &mut self.held, &mut self.stored, self.shutdown).await?
        else {
            return Ok(None);
        };
        if next.records.len() > max {
            let front = next.split_off_front(max);
            self.carried = next;
            return Ok(Some(front));
        }
        Ok(Some(next))
    }

    /// Steps 1–4 on `batch` until nothing of it is left (or shutdown).
    async fn work_through<H: Handler>(&mut self, handler: &mut H, mut batch: Batch) -> Result<Flow, Error> {
        let mut failures = 0u32;
        let mut head = HeadRetries::default();
        let mut retrying = false;
        loop {
            // before every attempt: what a rebalance took away since it was received is not
            // this consumer's any more (see `Revocations`)
            let dropped = batch.drop_revoked(self.io.revocations());
            if dropped > 0 {
                tracing::info!(
                    dropped,
                    "records of partitions revoked since they were received dropped from the batch"
                );
            }
            if batch.records.is_empty() {
                break;
            }
            debug_assert!(self.each_record_once(&batch), "a record in two places at once");
            let verdicts = match self.handle(handler, &batch, retrying, &mut failures).await? {
                Handled::Verdicts(verdicts) => verdicts,
                Handled::Failed(delay) => {
                    // the batch stays unacknowledged: it is redelivered after restart
                    if self.wait(delay).await? == Flow::Shutdown {
                        return Ok(Flow::Shutdown);
                    }
                    continue;
                }
            };
            let (fates, retry) = self.decide(&batch, verdicts, &head)?;
            let Some(again) = self.finish(std::mem::take(&mut batch), fates).await? else {
                return Ok(Flow::Shutdown); // outputs not acknowledged: redelivered
            };
            batch = again;
            let Some(retry) = retry else {
                if batch.records.is_empty() {
                    break;
                }
                // a record out of retries was dead-lettered: the rest of the batch comes next,
                // still one by one
                head.retries = 0;
                continue;
            };
            head = HeadRetries {
                record: batch
                    .records
                    .first()
                    .map(|record| (record.topic().to_owned(), record.partition(), record.offset())),
                retries: retry.prior + 1,
            };
            retrying = true;
            if self.retry(&batch, &retry, head.retries).await? == Flow::Shutdown {
                return Ok(Flow::Shutdown); // the record and those after it stay uncommitted
            }
        }
        if self.carried.records.is_empty() {
            self.paused.resume_all(self.io, &self.held);
        }
        Ok(Flow::Continue)
    }

    /// Step 1, **handle**: the handler's verdicts on `batch`, or the pause before the next
    /// attempt at a batch that failed as a whole (`failures` in a row); a fatal failure stops
    /// the loop with [`Error::Fatal`], nothing of the batch stored.
    async fn handle<H: Handler>(
        &mut self,
        handler: &mut H,
        batch: &Batch,
        retrying: bool,
        failures: &mut u32,
    ) -> Result<Handled, Error> {
        let started = Instant::now();
        let first = &batch.records[0];
        match handler.handle(&batch.records, retrying).await {
            Ok(verdicts) => {
                self.handling_seconds.record(started.elapsed().as_secs_f64());
                *failures = 0;
                Ok(Handled::Verdicts(verdicts))
            }
            Err(error) if handler.is_fatal(&error) => {
                tracing::error!(
                    error = %error_chain(&error),
                    records = batch.records.len(),
                    topic = first.topic(),
                    partition = first.partition(),
                    offset = first.offset(),
                    "batch failed fatally; the loop stops (the batch is not committed)"
                );
                Err(Error::Fatal(Box::new(error)))
            }
            Err(error) => {
                *failures += 1;
                let delay = self.options.backoff.delay(*failures);
                metrics::counter!("retries_total", "topic" => first.topic().to_owned()).increment(1);
                tracing::warn!(
                    error = %error_chain(&error),
                    attempt = *failures,
                    records = batch.records.len(),
                    topic = first.topic(),
                    partition = first.partition(),
                    offset = first.offset(),
                    retry_in_ms = delay.as_millis() as u64,
                    "batch failed; retrying"
                );
                Ok(Handled::Failed(delay))
            }
        }
    }

    /// Step 2, **decide**: each record's fate from the verdicts, and the record to retry if it
    /// has retries left (one out of them is dead-lettered instead).
    fn decide(
        &self,
        batch: &Batch,
        verdicts: Vec<Verdict>,
        head: &HeadRetries,
    ) -> Result<(Vec<Fate>, Option<Retry>), Error> {
        let Walk { mut fates, retry } =
            walk(&batch.records, verdicts).map_err(|error| Error::Fatal(Box::new(error)))?;
        assert_eq!(fates.len(), batch.records.len(), "one fate per record");
        let Some((index, failure)) = retry else { return Ok((fates, None)) };
        let record = &batch.records[index];
        let prior = head.prior(index, record);
        if let Some(delay) = self.options.record_retry.after_failure(prior) {
            return Ok((fates, Some(Retry { failure, delay, prior })));
        }
        tracing::warn!(
            topic = record.topic(),
            partition = record.partition(),
            offset = record.offset(),
            attempts = prior + 1,
            reason = failure.message,
            "retries exhausted; dead-lettering the record"
        );
        fates[index] = Fate::DeadLetter(failure);
        Ok((fates, None))
    }

    /// Step 3, **finish**: held records to [`Held`], the outputs published until acknowledged,
    /// the finished records' offsets stored. Returns the records to hand again, or `None` when
    /// shutdown came before the outputs were acknowledged.
    async fn finish(&mut self, batch: Batch, fates: Vec<Fate>) -> Result<Option<Batch>, Error> {
        let revocations = self.io.revocations();
        let records = batch.records.len();
        // a partition revoked while the handler ran is someone else's now: its records are
        // redelivered there, so nothing of them is published or stored here
        let Sorted { mut finished, outputs, held_now, again, revoked } =
            sort(batch, fates, revocations, self.options)?;
        let held_records: usize = held_now.iter().map(|(_, _, held)| held.records.len()).sum();
        assert_eq!(
            finished.records.len() + again.records.len() + held_records + revoked,
            records,
            "every record of the batch finished, handed again, held or dropped as revoked"
        );
        if revoked > 0 {
            tracing::info!(
                revoked,
                "records of partitions revoked while they were handled: nothing of them published or stored"
            );
        }
        for (key, due, mut records) in held_now {
            // what came after them from the consumer waits behind them
            records.append(self.carried.take_partition(&key.0, key.1));
            self.held.hold(self.io, key, due, records);
        }
        if !outputs.is_empty() {
            let outputs: Vec<Output<'_>> = outputs
                .into_iter()
                .map(|(index, output)| output.from(&finished.records[index], finished.taken[index]))
                .collect();
            let published = publish_all(
                self.io,
                &outputs,
                self.options,
                self.shutdown,
                &mut self.carried,
                &mut self.paused,
                &mut self.held,
            )
            .await?;
            if !published {
                return Ok(None);
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
            self.stored.store(self.io, &next_offsets(&finished.records));
            self.carried.drop_handled(&finished.records);
        }
        Ok(Some(again))
    }

    /// Step 4, **retry**: the batch's first record failed (its `attempt`-th retry comes next);
    /// it and the rest wait `retry.delay`.
    async fn retry(&mut self, batch: &Batch, retry: &Retry, attempt: u32) -> Result<Flow, Error> {
        let record = &batch.records[0];
        metrics::counter!("retries_total", "topic" => record.topic().to_owned()).increment(1);
        tracing::info!(
            topic = record.topic(),
            partition = record.partition(),
            offset = record.offset(),
            attempt,
            retry_in_ms = retry.delay.as_millis() as u64,
            reason = retry.failure.message,
            "record failed; retrying it in place"
        );
        self.wait(retry.delay).await
    }

    /// A backoff with the consumed partitions paused, still polling (see [`wait_polling`]).
    async fn wait(&mut self, delay: Duration) -> Result<Flow, Error> {
        self.paused.pause_consumed(self.io);
        let shut_down =
            wait_polling(self.io, delay, self.shutdown, &mut self.carried, &mut self.paused, &mut self.held)
                .await?;
        Ok(if shut_down { Flow::Shutdown } else { Flow::Continue })
    }

    /// No record not revoked since it was taken is in two of `batch`, the carried records and
    /// the held ones.
    pub(super) fn each_record_once(&self, batch: &Batch) -> bool {
        let revocations = self.io.revocations();
        let mut seen = HashSet::new();
        let carried = self.carried.records.iter().zip(self.carried.taken.iter().copied());
        let batch_records = batch.records.iter().zip(batch.taken.iter().copied());
        batch_records.chain(carried).chain(self.held.records()).all(|(record, taken)| {
            revocations.revoked_since(record.topic(), record.partition(), taken)
                || seen.insert((record.topic().to_owned(), record.partition(), record.offset()))
        })
    }
}
