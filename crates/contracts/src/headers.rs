//! Kafka header names and Spring Kafka's binary encodings (`docs/reference/contract.md` §3, *Headers*).
//!
//! Dead letters and retry records carry the headers Spring Kafka's
//! `DeadLetterPublishingRecoverer` and retry topics write, encoded the way Spring writes them,
//! so existing Spring tooling and listeners read ours and ours read theirs.
//!
//! A header may occur more than once on a record: Spring's retry topics append the
//! `retry_topic-*` and exception headers at every hop (`retainAllRetryHeaderValues`), one value
//! per hop. Readers take the **last** value (Kafka's `Headers.lastHeader`); the first one is
//! the oldest hop's.

/// `evento-id`: the payload's `eventoId`. Informational: readers never require it.
pub const EVENT_ID: &str = "evento-id";
/// `evento-tipo`: e.g. `TransferenciaSolicitada`. Informational: readers never require it.
pub const EVENT_TYPE: &str = "evento-tipo";
/// W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
/// On a dead letter whose payload was cut to fit the topic's record size: the original
/// payload's size in bytes (8-byte big-endian long). Its `*-original-topic`, `-partition` and
/// `-offset` headers say where the whole record still is; such a letter is never replayed.
pub const PAYLOAD_CUT_FROM: &str = "payload-cortado-de";
pub const TRACESTATE: &str = "tracestate";

/// Headers of the blocking error handlers' dead letters (antifraud, ledger, the projection),
/// as Spring's `DeadLetterPublishingRecoverer` writes them by default: each occurs once; the
/// `original` ones are written on the first failure and kept, the exception ones replaced.
pub mod dlt {
    pub const ORIGINAL_TOPIC: &str = "kafka_dlt-original-topic";
    pub const ORIGINAL_PARTITION: &str = "kafka_dlt-original-partition";
    pub const ORIGINAL_OFFSET: &str = "kafka_dlt-original-offset";
    pub const ORIGINAL_TIMESTAMP: &str = "kafka_dlt-original-timestamp";
    pub const ORIGINAL_TIMESTAMP_TYPE: &str = "kafka_dlt-original-timestamp-type";
    pub const ORIGINAL_CONSUMER_GROUP: &str = "kafka_dlt-original-consumer-group";
    pub const EXCEPTION_FQCN: &str = "kafka_dlt-exception-fqcn";
    pub const EXCEPTION_CAUSE_FQCN: &str = "kafka_dlt-exception-cause-fqcn";
    pub const EXCEPTION_MESSAGE: &str = "kafka_dlt-exception-message";
    pub const EXCEPTION_STACKTRACE: &str = "kafka_dlt-exception-stacktrace";
}

/// Headers that Spring's retry topics write on every forwarded record. The `kafka_original-*`
/// family and `kafka_dlt-original-consumer-group` are written once, on the first hop, and kept;
/// the `retry_topic-*` and `kafka_exception-*` headers get one more value at every hop (the
/// hop to `-dlt` included): read the last.
pub mod retry {
    pub const ORIGINAL_TOPIC: &str = "kafka_original-topic";
    pub const ORIGINAL_PARTITION: &str = "kafka_original-partition";
    pub const ORIGINAL_OFFSET: &str = "kafka_original-offset";
    pub const ORIGINAL_TIMESTAMP: &str = "kafka_original-timestamp";
    pub const ORIGINAL_TIMESTAMP_TYPE: &str = "kafka_original-timestamp-type";
    pub const EXCEPTION_FQCN: &str = "kafka_exception-fqcn";
    pub const EXCEPTION_CAUSE_FQCN: &str = "kafka_exception-cause-fqcn";
    pub const EXCEPTION_MESSAGE: &str = "kafka_exception-message";
    pub const EXCEPTION_STACKTRACE: &str = "kafka_exception-stacktrace";
    /// Written on retry records as on dead letters.
    pub const ORIGINAL_CONSUMER_GROUP: &str = super::dlt::ORIGINAL_CONSUMER_GROUP;
    /// The attempt the record is on its way to (2 on the first retry topic; on `-dlt`, one past
    /// the last attempt made): 4-byte int.
    pub const ATTEMPTS: &str = "retry_topic-attempts";
    /// Not to be processed before this epoch-ms instant (failure time + the destination's
    /// delay; the failure time itself on the hop to `-dlt`): `BigInteger.toByteArray()`.
    pub const BACKOFF_TIMESTAMP: &str = "retry_topic-backoff-timestamp";
    /// The original record's timestamp, carried down the chain: `BigInteger.toByteArray()`.
    pub const ORIGINAL_TIMESTAMP_RETRY: &str = "retry_topic-original-timestamp";
}

/// `*-original-timestamp-type`: Java's `TimestampType.toString()`, the name that kafka-clients'
/// `TimestampType.forName` reads back.
pub const CREATE_TIME: &str = "CreateTime";
pub const LOG_APPEND_TIME: &str = "LogAppendTime";
pub const NO_TIMESTAMP_TYPE: &str = "NoTimestampType";

/// The kind of a record's timestamp, as `*-original-timestamp-type` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimestampType {
    NoTimestampType,
    CreateTime,
    LogAppendTime,
}

impl TimestampType {
    /// The name Spring writes (`TimestampType.toString()`): `CreateTime`, `LogAppendTime`,
    /// `NoTimestampType`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoTimestampType => NO_TIMESTAMP_TYPE,
            Self::CreateTime => CREATE_TIME,
            Self::LogAppendTime => LOG_APPEND_TIME,
        }
    }
}

impl std::fmt::Display for TimestampType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads `*-original-timestamp-type`: Java's names (`CreateTime`, what Spring writes and we
/// write now) and the enum constants (`CREATE_TIME`, what our dead letters carried before;
/// they stay in the `-dlt` topics for 30 days).
pub fn decode_timestamp_type(bytes: &[u8]) -> Result<TimestampType, HeaderDecodeError> {
    match decode_text(bytes)? {
        CREATE_TIME | "CREATE_TIME" => Ok(TimestampType::CreateTime),
        LOG_APPEND_TIME | "LOG_APPEND_TIME" => Ok(TimestampType::LogAppendTime),
        NO_TIMESTAMP_TYPE | "NO_TIMESTAMP_TYPE" => Ok(TimestampType::NoTimestampType),
        other => Err(HeaderDecodeError::TimestampType(other.to_owned())),
    }
}

/// A header value that is not in the expected encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderDecodeError {
    #[error("expected {expected} bytes, got {actual}")]
    Length { expected: usize, actual: usize },
    #[error("a BigInteger needs 1 to 8 bytes here, got {0}")]
    BigIntegerLength(usize),
    #[error("not UTF-8")]
    Utf8(#[from] std::str::Utf8Error),
    #[error("unknown timestamp type {0:?}")]
    TimestampType(String),
}

/// `*-original-partition`, `retry_topic-attempts`: 4-byte big-endian signed int
/// (Java `ByteBuffer.putInt`).
pub fn encode_int(value: i32) -> [u8; 4] {
    value.to_be_bytes()
}

pub fn decode_int(bytes: &[u8]) -> Result<i32, HeaderDecodeError> {
    let array: [u8; 4] =
        bytes.try_into().map_err(|_| HeaderDecodeError::Length { expected: 4, actual: bytes.len() })?;
    Ok(i32::from_be_bytes(array))
}

/// `*-original-offset`, `*-original-timestamp`: 8-byte big-endian signed long.
pub fn encode_long(value: i64) -> [u8; 8] {
    value.to_be_bytes()
}

pub fn decode_long(bytes: &[u8]) -> Result<i64, HeaderDecodeError> {
    let array: [u8; 8] =
        bytes.try_into().map_err(|_| HeaderDecodeError::Length { expected: 8, actual: bytes.len() })?;
    Ok(i64::from_be_bytes(array))
}

/// Java's `BigInteger.valueOf(value).toByteArray()`: the minimal big-endian two's complement,
/// never empty (used for `retry_topic-backoff-timestamp` and `retry_topic-original-timestamp`).
pub fn encode_big_integer(value: i64) -> Vec<u8> {
    let bytes = value.to_be_bytes();
    let mut start = 0;
    // drop a leading byte while it only repeats the sign of the next one
    while start < bytes.len() - 1 {
        let redundant = (bytes[start] == 0x00 && bytes[start + 1] & 0x80 == 0)
            || (bytes[start] == 0xff && bytes[start + 1] & 0x80 != 0);
        if !redundant {
            break;
        }
        start += 1;
    }
    bytes[start..].to_vec()
}

/// Java's `new BigInteger(bytes).longValueExact()` for up to 8 bytes.
pub fn decode_big_integer(bytes: &[u8]) -> Result<i64, HeaderDecodeError> {
    if bytes.is_empty() || bytes.len() > 8 {
        return Err(HeaderDecodeError::BigIntegerLength(bytes.len()));
    }
    let fill = if bytes[0] & 0x80 != 0 { 0xff } else { 0x00 };
    let mut array = [fill; 8];
    array[8 - bytes.len()..].copy_from_slice(bytes);
    Ok(i64::from_be_bytes(array))
}

/// UTF-8 text headers (topics, groups, class names, messages).
pub fn decode_text(bytes: &[u8]) -> Result<&str, HeaderDecodeError> {
    Ok(std::str::from_utf8(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn int_and_long_are_big_endian() {
        assert_eq!(encode_int(1), [0, 0, 0, 1]);
        assert_eq!(encode_int(-1), [0xff; 4]);
        assert_eq!(encode_int(258), [0, 0, 1, 2]);
        assert_eq!(encode_long(1_733_212_800_123), [0, 0, 0x01, 0x93, 0x8b, 0x88, 0x84, 0x7b]);
        assert_eq!(decode_int(&[0, 0, 0, 7]), Ok(7));
        assert_eq!(decode_long(&encode_long(i64::MIN)), Ok(i64::MIN));
        assert_eq!(decode_int(&[0, 1]), Err(HeaderDecodeError::Length { expected: 4, actual: 2 }));
        assert_eq!(decode_long(&[0; 4]), Err(HeaderDecodeError::Length { expected: 8, actual: 4 }));
    }

    #[test]
    fn big_integer_matches_java_to_byte_array() {
        // values checked against java.math.BigInteger.valueOf(v).toByteArray()
        assert_eq!(encode_big_integer(0), vec![0x00]);
        assert_eq!(encode_big_integer(1), vec![0x01]);
        assert_eq!(encode_big_integer(127), vec![0x7f]);
        assert_eq!(encode_big_integer(128), vec![0x00, 0x80]);
        assert_eq!(encode_big_integer(255), vec![0x00, 0xff]);
        assert_eq!(encode_big_integer(256), vec![0x01, 0x00]);
        assert_eq!(encode_big_integer(-1), vec![0xff]);
        assert_eq!(encode_big_integer(-128), vec![0x80]);
        assert_eq!(encode_big_integer(-129), vec![0xff, 0x7f]);
        // an epoch-ms timestamp of today: 6 bytes, as the contract says is usual
        assert_eq!(encode_big_integer(1_733_212_800_123), vec![0x01, 0x93, 0x8b, 0x88, 0x84, 0x7b]);
        assert_eq!(encode_big_integer(i64::MAX).len(), 8);
        assert_eq!(encode_big_integer(i64::MIN), vec![0x80, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn big_integer_rejects_bad_lengths() {
        assert_eq!(decode_big_integer(&[]), Err(HeaderDecodeError::BigIntegerLength(0)));
        assert_eq!(decode_big_integer(&[1; 9]), Err(HeaderDecodeError::BigIntegerLength(9)));
        assert_eq!(decode_big_integer(&[0x80]), Ok(-128));
    }

    /// Each encoding of the contract's table (`docs/reference/contract.md` §3), against literal bytes.
    #[test]
    fn encodings_match_the_contracts_table_byte_for_byte() {
        // *-original-timestamp-type: Java's TimestampType.toString()
        assert_eq!(CREATE_TIME.as_bytes(), b"CreateTime");
        assert_eq!(LOG_APPEND_TIME.as_bytes(), b"LogAppendTime");
        assert_eq!(NO_TIMESTAMP_TYPE.as_bytes(), b"NoTimestampType");
        assert_eq!(TimestampType::CreateTime.as_str().as_bytes(), b"CreateTime");
        assert_eq!(TimestampType::LogAppendTime.to_string(), "LogAppendTime");
        // *-original-partition, retry_topic-attempts: 4-byte big-endian int
        assert_eq!(encode_int(5), [0, 0, 0, 5]);
        assert_eq!(encode_int(2), [0x00, 0x00, 0x00, 0x02]);
        assert_eq!(decode_int(&[0, 0, 0, 5]), Ok(5));
        // *-original-offset, *-original-timestamp: 8-byte big-endian long
        assert_eq!(encode_long(42), [0, 0, 0, 0, 0, 0, 0, 42]);
        assert_eq!(encode_long(-1), [0xff; 8]);
        // 2024-12-03T08:00:00.123Z = 1 733 212 800 123 ms = 0x0193_8b88_847b
        assert_eq!(encode_long(1_733_212_800_123), [0x00, 0x00, 0x01, 0x93, 0x8b, 0x88, 0x84, 0x7b]);
        // retry_topic-*-timestamp: BigInteger.toByteArray(), 6 bytes for today's epoch ms
        assert_eq!(encode_big_integer(1_733_212_800_123), [0x01, 0x93, 0x8b, 0x88, 0x84, 0x7b]);
        assert_eq!(decode_big_integer(&[0x01, 0x93, 0x8b, 0x88, 0x84, 0x7b]), Ok(1_733_212_800_123));
        // text headers: UTF-8, e.g. a Rust type path
        assert_eq!(decode_text(b"http::status::StatusCode"), Ok("http::status::StatusCode"));
    }

    #[test]
    fn timestamp_types_are_read_in_both_spellings() {
        assert_eq!(decode_timestamp_type(b"CreateTime"), Ok(TimestampType::CreateTime));
        assert_eq!(decode_timestamp_type(b"LogAppendTime"), Ok(TimestampType::LogAppendTime));
        assert_eq!(decode_timestamp_type(b"NoTimestampType"), Ok(TimestampType::NoTimestampType));
        // what our dead letters carried before (Java's enum constants)
        assert_eq!(decode_timestamp_type(b"CREATE_TIME"), Ok(TimestampType::CreateTime));
        assert_eq!(decode_timestamp_type(b"LOG_APPEND_TIME"), Ok(TimestampType::LogAppendTime));
        assert_eq!(decode_timestamp_type(b"NO_TIMESTAMP_TYPE"), Ok(TimestampType::NoTimestampType));
        assert_eq!(
            decode_timestamp_type(b"createtime"),
            Err(HeaderDecodeError::TimestampType("createtime".into()))
        );
        assert!(decode_timestamp_type(&[0xff]).is_err());
    }

    #[test]
    fn text_must_be_utf8() {
        assert_eq!(decode_text(b"transferencias.analisada"), Ok("transferencias.analisada"));
        assert!(decode_text(&[0xff, 0xfe]).is_err());
    }

    proptest! {
        #[test]
        fn big_integer_round_trips_minimally(value in any::<i64>()) {
            let bytes = encode_big_integer(value);
            prop_assert_eq!(decode_big_integer(&bytes), Ok(value));
            // minimal: dropping the first byte would change the value or leave nothing
            if bytes.len() > 1 {
                prop_assert_ne!(decode_big_integer(&bytes[1..]), Ok(value));
            }
        }

        #[test]
        fn int_and_long_round_trip(i in any::<i32>(), l in any::<i64>()) {
            prop_assert_eq!(decode_int(&encode_int(i)), Ok(i));
            prop_assert_eq!(decode_long(&encode_long(l)), Ok(l));
        }
    }
}
