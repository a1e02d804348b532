//! Where a dead letter may be replayed to: only back to its dead-letter topic's source or one
//! of that source's retry topics.

use rdkafka::message::OwnedMessage;

use kafka::consumer::{header, header_values};

use super::original_topic;

/// Between a source topic and a retry topic's delay: `<source>-retry-<ms>`.
const RETRY_INFIX: &str = "-retry-";

/// Why a replay will not send a dead letter where it asks to go.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The destination is neither the dead-letter topic's source nor one of its retry topics.
    #[error("{destination} is neither {origin} nor one of its retry topics ({origin}-retry-<ms>): a dead letter goes back only where it came from")]
    Elsewhere { origin: String, destination: String },
    /// The dead-letter topic's name does not end in `-dlt`: it has no source to go back to.
    #[error("{dlt_topic} is not a dead-letter topic (<source>-dlt): nowhere to replay to")]
    NoSource { dlt_topic: String },
    /// Its payload was cut to fit the dead-letter topic: replaying it would publish a record
    /// that is not the one that failed.
    #[error("its payload was cut from {original_bytes} bytes to fit the dead-letter topic: re-drive the whole record from {origin}")]
    PayloadCut { original_bytes: i64, origin: String },
    /// No original-topic header, and no `--to`.
    #[error("it names no original topic (no kafka_dlt-original-topic or kafka_original-topic header); give --to TOPIC")]
    NoOriginalTopic,
}

/// The topic `dlt_topic` (a full name, prefix included) collects dead letters of: its name
/// without `-dlt`.
pub fn source_of(dlt_topic: &str) -> Option<&str> {
    dlt_topic.strip_suffix(contracts::topics::DEAD_LETTER_SUFFIX).filter(|source| !source.is_empty())
}

/// Whether a letter of `dlt_topic` may be replayed to `destination` (both full names, the
/// topic prefix included, as on the broker): only to the source of `dlt_topic` or to one of
/// its retry topics, `<source>-retry-<ms>` with `<ms>` a positive number written plainly.
/// Anything else would let whoever writes the dead-letter topic reach another topic through an
/// operator's replay (`docs/reference/contract.md` §3).
pub fn check_destination(dlt_topic: &str, destination: &str) -> Result<(), Refusal> {
    let source = source_of(dlt_topic).ok_or_else(|| Refusal::NoSource { dlt_topic: dlt_topic.to_owned() })?;
    if destination == source {
        return Ok(());
    }
    let delay = destination.strip_prefix(source).and_then(|rest| rest.strip_prefix(RETRY_INFIX));
    let plain_delay =
        delay.and_then(|delay| delay.parse::<u32>().ok().filter(|ms| *ms > 0 && ms.to_string() == delay));
    match plain_delay {
        Some(_) => Ok(()),
        None => Err(Refusal::Elsewhere { origin: source.to_owned(), destination: destination.to_owned() }),
    }
}

/// Where a replay sends `record`, read from `dlt_topic`: `to`, else its original-topic header
/// ([`original_topic`]); refused unless that is the source of `dlt_topic` or one of its retry
/// topics ([`check_destination`]).
pub fn replay_destination(
    dlt_topic: &str,
    record: &OwnedMessage,
    to: Option<&str>,
) -> Result<String, Refusal> {
    if let Some(original_bytes) = payload_cut_from(record) {
        return Err(Refusal::PayloadCut { original_bytes, origin: original_position(record) });
    }
    let destination = match to {
        Some(to) => to.to_owned(),
        None => original_topic(record).ok_or(Refusal::NoOriginalTopic)?,
    };
    check_destination(dlt_topic, &destination)?;
    Ok(destination)
}

/// The original payload's size, on a letter whose payload was cut (a header without a
/// readable size still marks it cut: -1).
fn payload_cut_from(record: &OwnedMessage) -> Option<i64> {
    let value = *header_values(record, contracts::headers::PAYLOAD_CUT_FROM).last()?;
    Some(contracts::headers::decode_long(value).unwrap_or(-1))
}

/// Where the whole record of a letter is: `topic partition P offset O` from its original headers.
fn original_position(record: &OwnedMessage) -> String {
    use contracts::headers::{decode_int, decode_long, dlt};
    let topic = header(record, dlt::ORIGINAL_TOPIC).map(|value| String::from_utf8_lossy(value).into_owned());
    let partition = header(record, dlt::ORIGINAL_PARTITION).and_then(|value| decode_int(value).ok());
    let offset = header(record, dlt::ORIGINAL_OFFSET).and_then(|value| decode_long(value).ok());
    match (topic, partition, offset) {
        (Some(topic), Some(partition), Some(offset)) => {
            format!("{topic} partition {partition} offset {offset}")
        }
        _ => "its original topic (no original-position headers)".into(),
    }
}
