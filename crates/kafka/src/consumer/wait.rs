//! Every wait of the loop, each polling the consumer: the backoff between attempts
//! ([`backoff`], [`wait_polling`]), the wait for the next batch ([`next_batch`]) and what the
//! loop pauses meanwhile ([`Paused`]).

use std::future::Future;
use std::time::Duration;

use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::batch::Batch;
use super::held::Held;
use super::io::Io;
use super::stored::StoredOffsets;
use super::verdict::LoopOptions;
#[allow(unused_imports)] // named by the docs
use crate::context::Revocations;
use crate::Error;

/// How a backoff wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waited {
    Elapsed,
    Shutdown,
}

/// Waits `delay` unless `shutdown` comes first, meanwhile taking whatever `poll` yields and
/// handing it to `taken`: the runtime's one backoff wait. `poll` must be cancel-safe.
pub(super) async fn backoff<T, E, Fut>(
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

/// Sleeps `delay` while polling the consumer, whose partitions are paused: a record that was
/// already on its way is kept in `carried` (in order, handled after the failed batch) and its
/// partition paused, so at most a few records are held (or behind the held records of its
/// partition, if it has any). `true` when `shutdown` came first.
pub(super) async fn wait_polling(
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
pub(super) struct Paused(Vec<(String, i32, u64)>);

impl Paused {
    /// Pauses every assigned partition that has a position (it handed out records).
    pub(super) fn pause_consumed(&mut self, io: &impl Io) {
        for (topic, partition, _) in io.positions() {
            self.pause(io, &topic, partition);
        }
    }

    pub(super) fn pause(&mut self, io: &impl Io, topic: &str, partition: i32) {
        if self.0.iter().any(|(paused, number, _)| paused == topic && *number == partition) {
            return;
        }
        if io.pause(topic, partition) {
            self.0.push((topic.to_owned(), partition, io.revocations().now()));
        }
    }

    /// Resumes what [`Self::pause`] paused and was not revoked since, except the partitions
    /// whose records are `held` (they resume when their records are due).
    pub(super) fn resume_all(&mut self, io: &impl Io, held: &Held) {
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
pub(super) async fn next_batch(
    io: &impl Io,
    options: &LoopOptions,
    held: &mut Held,
    stored: &mut StoredOffsets,
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
                store_position(io, held, stored);
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

/// While idle, every record delivered so far has been handled (batches are handled before the
/// next is taken, and a failed one never leaves the retry loop), except the held ones, so the
/// consumer's position may be stored for every partition that holds none. It matters on
/// transactional topics: the position moves past the commit markers, which are never delivered, so the committed offset reaches the end of the partition and
/// `kafka_consumer_lag` reads exactly 0 once the group has drained its input.
///
/// A partition revoked after the last record taken from it is skipped: assigned again at once,
/// its position can still be the one from before the revocation (librdkafka resets it only
/// once the old fetcher has stopped), past records the loop dropped as revoked.
fn store_position(io: &impl Io, held: &Held, stored: &mut StoredOffsets) {
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
    stored.store(io, &offsets);
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
