//! Operators' tools for dead-letter topics (`pagamentos dlt`): list what is parked, re-drive
//! it to where it came from, and count what is still waiting (`dlt_mensagens_retidas`).
//!
//! Works for every `<topic>-dlt` of the system: the blocking handlers' dead letters name their
//! origin in `kafka_dlt-original-topic`, the retry topics' in `kafka_original-topic`. A header
//! that occurs more than once (the retry topics append one value per hop, as Spring does) is
//! read at its last value; a replay copies every value, in order.
//!
//! # Replay goes back only where a letter came from
//! Whoever may write a `-dlt` topic chooses a dead letter's headers, its original-topic header
//! included, while the operator who replays it may write every topic. So a replay sends a
//! letter only to the dead-letter topic's own source (its name without `-dlt`; the topic
//! prefix is part of both names) or to one of that source's retry topics
//! (`<source>-retry-<ms>`), whatever the header or `--to` says ([`check_destination`],
//! `docs/reference/contract.md` §3). A letter asking for any other topic is refused: logged (a warning naming
//! its partition, offset, destination and why), counted in [`REFUSED_METRIC`]`{topic}`, listed
//! in the [`ReplaySummary`], and left in place, not marked replayed (it stays in
//! `dlt_mensagens_retidas` and in `pagamentos dlt list`). `--all` goes on with the other
//! letters; a `--to` elsewhere is refused before anything is read or sent.
//!
//! # Replay progress
//! Kept as committed offsets of the consumer group `pagamentos-dlt-replay` (behind the topic
//! prefix), so a dead letter is never replayed twice by accident: per partition, every offset
//! below the committed one has been replayed, and offsets replayed one by one above it are
//! listed in the commit's metadata (`replayed=5,9-11`). Each record is acknowledged by the
//! broker before its progress is committed: a crash in between replays it once more, which
//! the idempotent consumers absorb.
//!
//! These are blocking calls (a tool's, or a periodic gauge's): run them off the async runtime.
//!
//! # Layout
//! - `destination`: where a letter may be replayed to ([`check_destination`]).
//! - `letter`: a dead letter's headers read, and the record that replays it.
//! - `progress`: replay progress ([`Progress`]) and its commits in [`REPLAY_GROUP`].
//! - `topic`: a [`DeadLetterTopic`] opened, read and listed.
//! - `replay`: [`DeadLetterTopic::replay`] and its [`ReplaySummary`].
//! - `retained`: the `dlt_mensagens_retidas` count and gauge ([`report_retained`]).

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

mod destination;
mod letter;
mod progress;
mod replay;
mod retained;
mod topic;

pub use destination::{check_destination, replay_destination, source_of, Refusal};
pub use letter::{original_timestamp, original_topic, replay_record, Letter};
pub use progress::Progress;
pub use replay::{RefusedLetter, ReplaySummary, Selection};
pub use retained::report_retained;
pub use topic::DeadLetterTopic;

/// The consumer group whose commits record replay progress.
pub const REPLAY_GROUP: &str = "pagamentos-dlt-replay";
/// Header on a replayed record: `<dlt topic>/<partition>/<offset>` it was replayed from.
pub const REPLAYED_FROM: &str = "pagamentos_dlt-replayed-from";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Counter of replays refused because of where they would go, by dead-letter topic: one per
/// refused letter, one per refused `--to` (dry runs count nothing).
pub const REFUSED_METRIC: &str = "dlt_replay_refused_total";

/// What can go wrong with a dead-letter topic.
#[derive(Debug, thiserror::Error)]
pub enum DltError {
    #[error("topic {0} does not exist")]
    UnknownTopic(String),
    #[error("{topic} has no partition {partition}")]
    UnknownPartition { topic: String, partition: i32 },
    #[error(
        "{topic} partition {partition} has no record at offset {offset} (retained offsets: {low}..{high})"
    )]
    NoRecord { topic: String, partition: i32, offset: i64, low: i64, high: i64 },
    #[error("{topic} partition {partition} offset {offset} was replayed already; nothing sent")]
    AlreadyReplayed { topic: String, partition: i32, offset: i64 },
    #[error("{topic} partition {partition} offset {offset} refused: {refusal}; left in place, not replayed")]
    Refused { topic: String, partition: i32, offset: i64, refusal: Refusal },
    #[error("replay of {topic} refused: {refusal}; nothing read or sent")]
    DestinationRefused { topic: String, refusal: Refusal },
    #[error("too many single replays on {topic} partition {partition} to record; replay the partition with --all first")]
    TooManySingles { topic: String, partition: i32 },
    #[error("Kafka {operation} failed")]
    Kafka {
        operation: &'static str,
        #[source]
        source: KafkaError,
    },
    #[error(transparent)]
    Produce(#[from] kafka::Error),
}

fn kafka(operation: &'static str) -> impl FnOnce(KafkaError) -> DltError {
    move |source| DltError::Kafka { operation, source }
}

/// True when `error` means the topic or partition is not there (for exit codes).
pub fn is_not_found(error: &DltError) -> bool {
    matches!(error, DltError::UnknownTopic(_) | DltError::UnknownPartition { .. } | DltError::NoRecord { .. })
        || matches!(error, DltError::Kafka { source, .. } if source.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition))
}

#[cfg(test)]
mod tests;
