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
use std::sync::Arc;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::dead_letter::DeadLetterPublisher;
use crate::Error;

mod batch;
mod fate;
mod held;
mod io;
#[cfg(test)]
mod loop_tests;
mod publish;
mod steps;
mod stored;
mod verdict;
mod wait;

use io::KafkaIo;
use steps::consume;
pub use verdict::{Backoff, Forward, ForwardKind, Handler, LoopOptions, RetryPolicy, Verdict};

/// A consumer built with [`crate::context::Context`].
pub type KafkaConsumer = StreamConsumer<Context>;

/// Creates a consumer from `config` and subscribes it to `topics`.
pub fn subscribe(config: &ClientConfig, topics: &[&str]) -> Result<Arc<KafkaConsumer>, Error> {
    let consumer: KafkaConsumer = crate::context::create(config).map_err(Error::Config)?;
    consumer.subscribe(topics).map_err(|source| Error::Consumer { operation: "subscribe", source })?;
    Ok(Arc::new(consumer))
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
}
