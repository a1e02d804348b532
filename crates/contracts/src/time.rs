//! Timestamps on the wire: RFC 3339 in UTC with `Z`, at most microsecond precision.
//!
//! PostgreSQL stores microseconds, so an event's timestamp and the timestamp of its row must be
//! the same value; [`Timestamp`] truncates to microseconds on construction. It prints like
//! Java's `DateTimeFormatter.ISO_INSTANT` (what Jackson writes for an `Instant`): no fraction
//! when it is zero, else 3 or 6 digits.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};

/// An instant in UTC, truncated to whole microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(OffsetDateTime);

/// A timestamp that is not RFC 3339.
#[derive(Debug, thiserror::Error)]
#[error("not an RFC 3339 timestamp: {0}")]
pub struct InvalidTimestamp(String);

impl Timestamp {
    /// The current time, truncated to microseconds.
    pub fn now() -> Self {
        Self::from(OffsetDateTime::now_utc())
    }

    /// Parses any RFC 3339 timestamp (any offset, any precision) and normalises it to UTC
    /// microseconds.
    pub fn parse(text: &str) -> Result<Self, InvalidTimestamp> {
        OffsetDateTime::parse(text, &Rfc3339)
            .map(Self::from)
            .map_err(|error| InvalidTimestamp(format!("{text:?}: {error}")))
    }

    pub fn as_offset_date_time(&self) -> OffsetDateTime {
        self.0
    }

    /// Milliseconds since the Unix epoch, as Kafka record timestamps count.
    pub fn unix_millis(&self) -> i64 {
        (self.0.unix_timestamp_nanos() / 1_000_000) as i64
    }
}

impl From<OffsetDateTime> for Timestamp {
    fn from(value: OffsetDateTime) -> Self {
        let utc = value.to_offset(UtcOffset::UTC);
        let micros = utc.microsecond();
        // `replace_microsecond` only fails for values >= 1_000_000, which microsecond() never is
        Self(utc.replace_microsecond(micros).unwrap_or(utc))
    }
}

impl From<Timestamp> for OffsetDateTime {
    fn from(value: Timestamp) -> Self {
        value.0
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.0;
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        )?;
        let micros = t.microsecond();
        if micros == 0 {
        } else if micros.is_multiple_of(1000) {
            write!(f, ".{:03}", micros / 1000)?;
        } else {
            write!(f, ".{micros:06}")?;
        }
        f.write_str("Z")
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_java_iso_instant() {
        let cases = [
            ("2026-12-03T07:45:21Z", "2026-12-03T07:45:21Z"),
            ("2026-12-03T07:45:21.120Z", "2026-12-03T07:45:21.120Z"),
            ("2026-12-03T07:45:21.123456Z", "2026-12-03T07:45:21.123456Z"),
            ("2026-12-03T07:45:21.000100Z", "2026-12-03T07:45:21.000100Z"),
            // nanoseconds are truncated: PostgreSQL keeps microseconds
            ("2026-12-03T07:45:21.123456789Z", "2026-12-03T07:45:21.123456Z"),
            // other offsets are normalised to UTC
            ("2026-12-03T04:45:21-03:00", "2026-12-03T07:45:21Z"),
        ];
        for (input, expected) in cases {
            let parsed = Timestamp::parse(input).expect("valid timestamp");
            assert_eq!(parsed.to_string(), expected, "input {input}");
        }
    }

    #[test]
    fn rejects_what_is_not_rfc3339() {
        for input in ["", "yesterday", "2026-12-03", "2026-12-03 07:45:21", "2026-13-03T07:45:21Z"] {
            assert!(Timestamp::parse(input).is_err(), "accepted {input:?}");
        }
    }

    #[test]
    fn now_has_microsecond_precision_and_round_trips() {
        let now = Timestamp::now();
        assert_eq!(now.as_offset_date_time().nanosecond() % 1000, 0);
        let json = serde_json::to_string(&now).expect("serialize");
        let back: Timestamp = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, now);
    }

    #[test]
    fn unix_millis() {
        let t = Timestamp::parse("1970-01-01T00:00:01.5Z").expect("valid");
        assert_eq!(t.unix_millis(), 1500);
    }
}
