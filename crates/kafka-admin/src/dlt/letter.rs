//! A dead letter read: its headers (original topic, timestamp, exception) as listed, and the
//! record that replays it.

use rdkafka::message::{Headers, Message, OwnedMessage};

use contracts::headers::{decode_long, decode_timestamp_type, dlt, retry, TimestampType};

use kafka::consumer::header;
use kafka::producer::OutgoingRecord;

use super::REPLAYED_FROM;

/// One dead letter, as `pagamentos dlt list` shows it.
#[derive(Debug, Clone)]
pub struct Letter {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub original_topic: Option<String>,
    pub exception_message: Option<String>,
    /// The original record's timestamp (epoch ms) and its type, when the headers say.
    pub original_timestamp: Option<(i64, TimestampType)>,
    /// Record timestamp, epoch ms.
    pub timestamp_ms: Option<i64>,
    pub replayed: bool,
    pub record: OwnedMessage,
}

fn text_header(record: &OwnedMessage, name: &str) -> Option<String> {
    header(record, name).map(|value| String::from_utf8_lossy(value).into_owned())
}

impl Letter {
    pub(super) fn new(record: OwnedMessage, replayed: bool) -> Self {
        Self {
            partition: record.partition(),
            offset: record.offset(),
            key: record.key().map(|key| String::from_utf8_lossy(key).into_owned()),
            original_topic: original_topic(&record),
            exception_message: text_header(&record, dlt::EXCEPTION_MESSAGE)
                .or_else(|| text_header(&record, retry::EXCEPTION_MESSAGE)),
            original_timestamp: original_timestamp(&record),
            timestamp_ms: record.timestamp().to_millis(),
            replayed,
            record,
        }
    }
}

/// Where a dead letter came from: `kafka_dlt-original-topic`, else `kafka_original-topic`.
pub fn original_topic(record: &OwnedMessage) -> Option<String> {
    text_header(record, dlt::ORIGINAL_TOPIC)
        .or_else(|| text_header(record, retry::ORIGINAL_TOPIC))
        .filter(|topic| !topic.is_empty())
}

/// When the original record of a dead letter was stamped, and how: `kafka_dlt-original-
/// timestamp(-type)`, else `kafka_original-timestamp(-type)`. Both spellings of the type are
/// read (`CreateTime`, and `CREATE_TIME` of dead letters written before we wrote Java's name).
pub fn original_timestamp(record: &OwnedMessage) -> Option<(i64, TimestampType)> {
    let read = |timestamp: &str, kind: &str| {
        let at = decode_long(header(record, timestamp)?).ok()?;
        let kind = decode_timestamp_type(header(record, kind)?).ok()?;
        Some((at, kind))
    };
    read(dlt::ORIGINAL_TIMESTAMP, dlt::ORIGINAL_TIMESTAMP_TYPE)
        .or_else(|| read(retry::ORIGINAL_TIMESTAMP, retry::ORIGINAL_TIMESTAMP_TYPE))
}

/// The record replaying `record` (read from `dlt_topic`) to `destination`: same key, payload
/// and headers (every value of a header that occurs more than once, in order), plus
/// [`REPLAYED_FROM`]; the partitioner places it by key, as the original. Replayed to a retry
/// topic (`--to …-retry-1000`) it is due at once: the last `retry_topic-backoff-timestamp` of
/// a dead letter is the time it was dead-lettered (Spring's and ours alike).
pub fn replay_record(dlt_topic: &str, record: &OwnedMessage, destination: &str) -> OutgoingRecord {
    let mut headers: Vec<(String, Vec<u8>)> = record
        .headers()
        .map(|headers| {
            headers
                .iter()
                .filter(|header| header.key != REPLAYED_FROM)
                .map(|header| (header.key.to_owned(), header.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    headers.push((
        REPLAYED_FROM.into(),
        format!("{dlt_topic}/{}/{}", record.partition(), record.offset()).into_bytes(),
    ));
    OutgoingRecord {
        topic: destination.to_owned(),
        partition: if record.key().is_some() { None } else { Some(record.partition()) },
        key: record.key().map(<[u8]>::to_vec),
        payload: record.payload().unwrap_or_default().to_vec(),
        headers,
    }
}
