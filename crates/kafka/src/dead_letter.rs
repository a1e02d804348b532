//! Dead letters of the blocking error handlers, as Spring Kafka's `DeadLetterPublishingRecoverer`
//! writes them (`docs/reference/contract.md` §3, *Headers*).
//!
//! A dead letter keeps its original key, payload (byte for byte, even if it is not UTF-8),
//! headers and partition number, and goes to `<topic>-dlt`. As the recoverer's defaults do,
//! every `kafka_dlt-*` header occurs once: the `kafka_dlt-original-*` headers are written on
//! the first failure only and kept, the exception headers (`kafka_dlt-exception-*`, the cause
//! type always among them) are replaced on a later failure. `kafka_dlt-original-timestamp-type`
//! is Java's `TimestampType.toString()` (`CreateTime`), what kafka-clients'
//! `TimestampType.forName` reads back; dead letters written before carry `CREATE_TIME`, which
//! [`contracts::headers::decode_timestamp_type`] reads too.
//!
//! (The retry topics' records follow another rule: see [`crate::retry_topic`].)

use rdkafka::message::{Headers, Message, OwnedMessage, Timestamp};

use contracts::headers::{dlt, encode_int, encode_long, TimestampType};
use contracts::topics::dead_letter_topic;

use crate::producer::{Delivered, OutgoingRecord, Producer};
use crate::Error;

/// Why a record is dead: what Spring would take from the exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Our error's type path, e.g. `ledger::settler::MalformedEvent`.
    pub exception_fqcn: String,
    /// The type path of its cause; never empty: Spring always writes
    /// `*exception-cause-fqcn`, so a failure with no underlying error names the type that
    /// stands for what went wrong (e.g. the HTTP status of a webhook's answer).
    pub cause_fqcn: String,
    /// What was wrong, for an operator.
    pub message: String,
    /// The error and its causes, one per line (Rust has no stack trace to give).
    pub stacktrace: String,
}

impl Failure {
    /// Describes `error`, naming it `exception_fqcn` and its cause `cause_fqcn`.
    pub fn new(
        exception_fqcn: impl Into<String>,
        cause_fqcn: impl Into<String>,
        error: &(dyn std::error::Error + 'static),
    ) -> Self {
        let exception_fqcn = exception_fqcn.into();
        let mut stacktrace = format!("{exception_fqcn}: {error}");
        let mut source = error.source();
        while let Some(cause) = source {
            stacktrace.push_str("\nCaused by: ");
            stacktrace.push_str(&cause.to_string());
            source = cause.source();
        }
        Self {
            exception_fqcn,
            cause_fqcn: cause_fqcn.into(),
            message: crate::consumer::error_chain(error),
            stacktrace,
        }
    }
}

const EXCEPTION_HEADERS: [&str; 4] =
    [dlt::EXCEPTION_FQCN, dlt::EXCEPTION_CAUSE_FQCN, dlt::EXCEPTION_MESSAGE, dlt::EXCEPTION_STACKTRACE];

/// The most bytes of key, payload and headers a dead letter holds: below librdkafka's
/// `message.max.bytes` (1 000 000) and the broker's default `max.message.bytes` (1 048 588),
/// with room for the record's framing. A letter that would be larger (a record near the limit
/// plus its dead-letter headers) could never be written, and its loop would retry it for ever.
pub const DEAD_LETTER_MAX_BYTES: usize = 900_000;

/// The most bytes an exception's message or stack trace keeps in a dead letter.
const EXCEPTION_TEXT_MAX_BYTES: usize = 16 * 1024;

/// The dead letter of `record`, failed in consumer group `group`. Within
/// [`DEAD_LETTER_MAX_BYTES`]: a larger one keeps a prefix of its payload and says so in
/// [`contracts::headers::PAYLOAD_CUT_FROM`] (its original-topic, -partition and -offset headers
/// say where the whole record is).
pub fn dead_letter(record: &OwnedMessage, group: &str, failure: &Failure) -> OutgoingRecord {
    let mut letter = whole_dead_letter(record, group, failure);
    let size = |letter: &OutgoingRecord| {
        letter.key.as_ref().map_or(0, Vec::len)
            + letter.payload.len()
            + letter.headers.iter().map(|(name, value)| name.len() + value.len()).sum::<usize>()
    };
    let total = size(&letter);
    if total > DEAD_LETTER_MAX_BYTES {
        let original = letter.payload.len();
        letter
            .headers
            .push((contracts::headers::PAYLOAD_CUT_FROM.into(), encode_long(original as i64).to_vec()));
        let over = size(&letter) - DEAD_LETTER_MAX_BYTES;
        letter.payload.truncate(original.saturating_sub(over));
        tracing::warn!(
            topic = record.topic(),
            partition = record.partition(),
            offset = record.offset(),
            bytes = total,
            kept = letter.payload.len(),
            "dead letter over {DEAD_LETTER_MAX_BYTES} bytes: its payload is cut (the whole record stays at its original offset)"
        );
    }
    letter
}

fn whole_dead_letter(record: &OwnedMessage, group: &str, failure: &Failure) -> OutgoingRecord {
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(original) = record.headers() {
        for header in original.iter() {
            if EXCEPTION_HEADERS.contains(&header.key) {
                continue;
            }
            headers.push((header.key.to_owned(), header.value.unwrap_or_default().to_vec()));
        }
    }
    let already_dead = headers.iter().any(|(name, _)| name == dlt::ORIGINAL_TOPIC);
    if !already_dead {
        let (timestamp, timestamp_type) = original_timestamp(record);
        headers.push((dlt::ORIGINAL_TOPIC.into(), record.topic().as_bytes().to_vec()));
        headers.push((dlt::ORIGINAL_PARTITION.into(), encode_int(record.partition()).to_vec()));
        headers.push((dlt::ORIGINAL_OFFSET.into(), encode_long(record.offset()).to_vec()));
        headers.push((dlt::ORIGINAL_TIMESTAMP.into(), encode_long(timestamp).to_vec()));
        headers.push((dlt::ORIGINAL_TIMESTAMP_TYPE.into(), timestamp_type.as_bytes().to_vec()));
        headers.push((dlt::ORIGINAL_CONSUMER_GROUP.into(), group.as_bytes().to_vec()));
    }
    push_exception(&mut headers, failure, &EXCEPTION_HEADERS);
    OutgoingRecord {
        topic: dead_letter_topic(record.topic()),
        partition: Some(record.partition()),
        key: record.key().map(<[u8]>::to_vec),
        payload: record.payload().unwrap_or_default().to_vec(),
        headers,
    }
}

/// Appends `failure` as `names` (fqcn, cause-fqcn, message, stacktrace: one family's).
pub(crate) fn push_exception(headers: &mut Vec<(String, Vec<u8>)>, failure: &Failure, names: &[&str; 4]) {
    let [fqcn, cause, message, stacktrace] = *names;
    headers.push((fqcn.into(), failure.exception_fqcn.as_bytes().to_vec()));
    headers.push((cause.into(), failure.cause_fqcn.as_bytes().to_vec()));
    headers.push((message.into(), bounded(&failure.message)));
    headers.push((stacktrace.into(), bounded(&failure.stacktrace)));
}

/// `text` within [`EXCEPTION_TEXT_MAX_BYTES`], cut at a character boundary.
fn bounded(text: &str) -> Vec<u8> {
    let mut end = text.len().min(EXCEPTION_TEXT_MAX_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.as_bytes()[..end].to_vec()
}

/// The record's timestamp (epoch ms, -1 when it has none) and its type, as Spring writes them
/// in `*-original-timestamp` and `*-original-timestamp-type` (`record.timestampType()
/// .toString()`: `CreateTime`, `LogAppendTime`, `NoTimestampType`).
pub(crate) fn original_timestamp(record: &OwnedMessage) -> (i64, &'static str) {
    match record.timestamp() {
        Timestamp::CreateTime(ms) => (ms, TimestampType::CreateTime.as_str()),
        Timestamp::LogAppendTime(ms) => (ms, TimestampType::LogAppendTime.as_str()),
        Timestamp::NotAvailable => (-1, TimestampType::NoTimestampType.as_str()),
    }
}

/// Publishes dead letters for one consumer group and counts them (`dlt_mensagens_total`).
#[derive(Debug, Clone)]
pub struct DeadLetterPublisher {
    producer: Producer,
    group: String,
}

impl DeadLetterPublisher {
    pub fn new(producer: Producer, group: impl Into<String>) -> Self {
        Self { producer, group: group.into() }
    }

    /// The producer the dead letters go out with.
    pub(crate) fn producer(&self) -> &Producer {
        &self.producer
    }

    /// `record`'s dead letter.
    pub(crate) fn letter(&self, record: &OwnedMessage, failure: &Failure) -> OutgoingRecord {
        dead_letter(record, &self.group, failure)
    }

    /// Sends `record`'s dead letter and waits for the broker's acknowledgement.
    pub async fn publish(&self, record: &OwnedMessage, failure: &Failure) -> Result<Delivered, Error> {
        let letter = dead_letter(record, &self.group, failure);
        let delivered = self.producer.send(&letter).await?;
        metrics::counter!("dlt_mensagens_total", "topic" => letter.topic.clone()).increment(1);
        tracing::warn!(
            dead_letter_topic = letter.topic,
            topic = record.topic(),
            partition = record.partition(),
            offset = record.offset(),
            reason = failure.message,
            "record sent to dead-letter topic"
        );
        Ok(delivered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contracts::headers::{decode_int, decode_long};
    use rdkafka::message::{Header, OwnedHeaders};

    #[derive(Debug, thiserror::Error)]
    #[error("missing field `valorEmCentavos`")]
    struct Malformed(#[source] std::io::Error);

    fn failure() -> Failure {
        let error = Malformed(std::io::Error::other("line 1 column 9"));
        Failure::new("ledger::error::MalformedEvent", "serde_json::Error", &error)
    }

    fn source(headers: OwnedHeaders) -> OwnedMessage {
        OwnedMessage::new(
            Some(vec![0xff, 0x00, b'{']),
            Some(b"CC-001".to_vec()),
            "transferencias.analisada".into(),
            Timestamp::CreateTime(1_733_212_800_123),
            7,
            42,
            Some(headers),
        )
    }

    fn value<'a>(record: &'a OutgoingRecord, name: &str) -> &'a [u8] {
        record.header_value(name).unwrap_or_else(|| panic!("header {name} missing"))
    }

    /// A record near the broker's limit plus its dead-letter headers could never be written:
    /// its letter keeps a prefix of the payload within the bound, says how large the payload
    /// was, and keeps where the whole record is. A small one is untouched.
    #[test]
    fn a_dead_letter_over_the_record_limit_keeps_a_cut_payload_and_says_so() {
        let big = OwnedMessage::new(
            Some(vec![b'x'; 1_000_000]),
            Some(b"CC-001".to_vec()),
            "transferencias.solicitada".into(),
            Timestamp::CreateTime(1),
            3,
            77,
            None,
        );
        let huge_failure = Failure { stacktrace: "y".repeat(2_000_000), ..failure() };
        let letter = dead_letter(&big, "antifraude", &huge_failure);
        let size = letter.key.as_ref().map_or(0, Vec::len)
            + letter.payload.len()
            + letter.headers.iter().map(|(name, value)| name.len() + value.len()).sum::<usize>();
        assert!(size <= DEAD_LETTER_MAX_BYTES, "{size} bytes");
        assert!(letter.payload.len() > 800_000 && letter.payload.iter().all(|byte| *byte == b'x'));
        assert_eq!(decode_long(value(&letter, contracts::headers::PAYLOAD_CUT_FROM)).ok(), Some(1_000_000));
        assert_eq!(value(&letter, dlt::ORIGINAL_TOPIC), b"transferencias.solicitada");
        assert_eq!(decode_int(value(&letter, dlt::ORIGINAL_PARTITION)).ok(), Some(3));
        assert_eq!(decode_long(value(&letter, dlt::ORIGINAL_OFFSET)).ok(), Some(77));
        assert_eq!(value(&letter, dlt::EXCEPTION_STACKTRACE).len(), EXCEPTION_TEXT_MAX_BYTES);

        let small = dead_letter(&source(OwnedHeaders::new()), "ledger", &failure());
        assert_eq!(small.payload, vec![0xff, 0x00, b'{']);
        assert!(small.header_value(contracts::headers::PAYLOAD_CUT_FROM).is_none());
    }

    #[test]
    fn first_failure_writes_springs_headers() {
        let original =
            OwnedHeaders::new().insert(Header { key: "traceparent", value: Some("00-abc".as_bytes()) });
        let letter = dead_letter(&source(original), "ledger", &failure());
        assert_eq!(letter.topic, "transferencias.analisada-dlt");
        assert_eq!(letter.partition, Some(7));
        assert_eq!(letter.key.as_deref(), Some(b"CC-001".as_slice()));
        assert_eq!(letter.payload, vec![0xff, 0x00, b'{']);
        assert_eq!(value(&letter, "traceparent"), b"00-abc");
        assert_eq!(value(&letter, "kafka_dlt-original-topic"), b"transferencias.analisada");
        assert_eq!(value(&letter, "kafka_dlt-original-partition"), [0, 0, 0, 7]);
        assert_eq!(decode_long(value(&letter, "kafka_dlt-original-offset")), Ok(42));
        assert_eq!(decode_long(value(&letter, "kafka_dlt-original-timestamp")), Ok(1_733_212_800_123));
        assert_eq!(value(&letter, "kafka_dlt-original-timestamp-type"), b"CreateTime");
        assert_eq!(value(&letter, "kafka_dlt-original-consumer-group"), b"ledger");
        assert_eq!(value(&letter, "kafka_dlt-exception-fqcn"), b"ledger::error::MalformedEvent");
        assert_eq!(value(&letter, "kafka_dlt-exception-cause-fqcn"), b"serde_json::Error");
        assert_eq!(
            value(&letter, "kafka_dlt-exception-message"),
            b"missing field `valorEmCentavos`: line 1 column 9"
        );
        assert_eq!(
            value(&letter, "kafka_dlt-exception-stacktrace"),
            b"ledger::error::MalformedEvent: missing field `valorEmCentavos`\nCaused by: line 1 column 9"
        );
    }

    #[test]
    fn timestamp_types_are_written_as_java_names_them() {
        let at = |timestamp| OwnedMessage::new(None, None, "t".into(), timestamp, 0, 0, None);
        assert_eq!(original_timestamp(&at(Timestamp::CreateTime(5))), (5, "CreateTime"));
        assert_eq!(original_timestamp(&at(Timestamp::LogAppendTime(6))), (6, "LogAppendTime"));
        assert_eq!(original_timestamp(&at(Timestamp::NotAvailable)), (-1, "NoTimestampType"));
        let letter = dead_letter(&at(Timestamp::LogAppendTime(6)), "ledger", &failure());
        assert_eq!(value(&letter, "kafka_dlt-original-timestamp-type"), b"LogAppendTime");
    }

    #[test]
    fn a_replayed_dead_letter_keeps_its_origin_and_replaces_the_exception() {
        let first = dead_letter(&source(OwnedHeaders::new()), "ledger", &failure());
        let replayed = OwnedMessage::new(
            Some(first.payload.clone()),
            first.key.clone(),
            "transferencias.analisada".into(),
            Timestamp::CreateTime(1_800_000_000_000),
            3,
            99,
            Some(first.owned_headers()),
        );
        let again = Failure {
            exception_fqcn: "ledger::error::Other".into(),
            cause_fqcn: "sqlx::Error".into(),
            message: "second".into(),
            stacktrace: "second".into(),
        };
        let letter = dead_letter(&replayed, "ledger", &again);
        let count = |name: &str| letter.headers.iter().filter(|(key, _)| key == name).count();
        assert_eq!(count("kafka_dlt-original-offset"), 1);
        assert_eq!(decode_long(value(&letter, "kafka_dlt-original-offset")), Ok(42));
        assert_eq!(decode_int(value(&letter, "kafka_dlt-original-partition")), Ok(7));
        for name in EXCEPTION_HEADERS {
            assert_eq!(count(name), 1, "{name}");
        }
        assert_eq!(count("kafka_dlt-original-timestamp-type"), 1);
        assert_eq!(value(&letter, "kafka_dlt-exception-message"), b"second");
        assert_eq!(value(&letter, "kafka_dlt-exception-cause-fqcn"), b"sqlx::Error");
    }
}
