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
//! `CONTRACT.md` §3). A letter asking for any other topic is refused: logged (a warning naming
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

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use contracts::headers::{decode_long, decode_timestamp_type, dlt, retry, TimestampType};

use kafka::config::{base_consumer_settings, KafkaArgs};
use kafka::consumer::header;
use kafka::context::Context;
use kafka::metadata::End;
use kafka::producer::{OutgoingRecord, Producer};

/// The consumer group whose commits record replay progress.
pub const REPLAY_GROUP: &str = "pagamentos-dlt-replay";
/// Header on a replayed record: `<dlt topic>/<partition>/<offset>` it was replayed from.
pub const REPLAYED_FROM: &str = "pagamentos_dlt-replayed-from";
/// Most bytes of replay metadata per partition (the broker's `offset.metadata.max.bytes`
/// default is 4096).
const METADATA_MAX_BYTES: usize = 4000;
const METADATA_PREFIX: &str = "replayed=";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Counter of replays refused because of where they would go, by dead-letter topic: one per
/// refused letter, one per refused `--to` (dry runs count nothing).
pub const REFUSED_METRIC: &str = "dlt_replay_refused_total";
/// Between a source topic and a retry topic's delay: `<source>-retry-<ms>`.
const RETRY_INFIX: &str = "-retry-";
/// How long a read may see nothing before the partitions count as read to their end.
const IDLE_END: Duration = Duration::from_secs(10);

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

/// Why a replay will not send a dead letter where it asks to go.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The destination is neither the dead-letter topic's source nor one of its retry topics.
    #[error("{destination} is neither {origin} nor one of its retry topics ({origin}-retry-<ms>): a dead letter goes back only where it came from")]
    Elsewhere { origin: String, destination: String },
    /// The dead-letter topic's name does not end in `-dlt`: it has no source to go back to.
    #[error("{dlt_topic} is not a dead-letter topic (<source>-dlt): nowhere to replay to")]
    NoSource { dlt_topic: String },
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
/// operator's replay (`CONTRACT.md` §3).
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
    let destination = match to {
        Some(to) => to.to_owned(),
        None => original_topic(record).ok_or(Refusal::NoOriginalTopic)?,
    };
    check_destination(dlt_topic, &destination)?;
    Ok(destination)
}

/// Replay progress of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every offset below this one has been replayed (or was never a record).
    pub next: i64,
    /// Offsets at or above `next` replayed one by one.
    pub singles: BTreeSet<i64>,
}

impl Progress {
    pub fn is_replayed(&self, offset: i64) -> bool {
        offset < self.next || self.singles.contains(&offset)
    }

    /// Marks `offset` replayed, folding singles into `next` where they join it.
    pub fn mark(&mut self, offset: i64) {
        if offset >= self.next {
            self.singles.insert(offset);
        }
        self.advance_to(self.next);
    }

    /// Moves `next` to `offset` (everything before it handled), keeping later singles.
    pub fn advance_to(&mut self, offset: i64) {
        if offset > self.next {
            self.next = offset;
        }
        while self.singles.remove(&self.next) {
            self.next += 1;
        }
        let next = self.next;
        self.singles.retain(|&single| single >= next);
    }

    /// The commit metadata: `replayed=5,9-11` (ranges of singles).
    pub fn metadata(&self) -> String {
        let mut text = String::from(METADATA_PREFIX);
        let mut singles = self.singles.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = singles.next() {
            let mut end = start;
            while singles.peek() == Some(&(end + 1)) {
                end += 1;
                singles.next();
            }
            if !first {
                text.push(',');
            }
            first = false;
            if start == end {
                text.push_str(&start.to_string());
            } else {
                text.push_str(&format!("{start}-{end}"));
            }
        }
        text
    }

    /// Reads a committed offset and its metadata; unreadable metadata counts as no singles
    /// (the committed offset alone is still exact about everything below it).
    pub fn parse(next: i64, metadata: &str) -> Self {
        let mut singles = BTreeSet::new();
        if let Some(list) = metadata.strip_prefix(METADATA_PREFIX) {
            for part in list.split(',').filter(|part| !part.is_empty()) {
                let parsed = match part.split_once('-') {
                    Some((start, end)) => start.parse::<i64>().ok().zip(end.parse::<i64>().ok()),
                    None => part.parse::<i64>().ok().map(|offset| (offset, offset)),
                };
                if let Some((start, end)) = parsed {
                    if end >= start && end - start < 1_000_000 {
                        singles.extend(start..=end);
                    }
                }
            }
        }
        let mut progress = Self { next, singles };
        progress.advance_to(next);
        progress
    }
}

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
    fn new(record: OwnedMessage, replayed: bool) -> Self {
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

/// What to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    One { partition: i32, offset: i64 },
    All,
}

/// A dead letter a replay refused (left in place, not marked replayed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedLetter {
    pub partition: i32,
    pub offset: i64,
    pub refusal: Refusal,
}

impl fmt::Display for RefusedLetter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "partition {} offset {} refused: {}", self.partition, self.offset, self.refusal)
    }
}

/// The outcome of a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Records re-published (or, in a dry run, that would be).
    pub replayed: u64,
    /// Records skipped because they were replayed before.
    pub skipped: u64,
    /// Records refused for where they would go (or, in a dry run, that would be), in the
    /// order read; left in place.
    pub refused: Vec<RefusedLetter>,
}

impl fmt::Display for ReplaySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} replayed, {} already replayed before, {} refused",
            self.replayed,
            self.skipped,
            self.refused.len()
        )
    }
}

/// One dead-letter topic, opened for reading and for recording replay progress.
pub struct DeadLetterTopic {
    consumer: BaseConsumer<Context>,
    topic: String,
    partitions: Vec<i32>,
}

impl fmt::Debug for DeadLetterTopic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterTopic").field("topic", &self.topic).finish_non_exhaustive()
    }
}

impl DeadLetterTopic {
    /// Opens `topic` (its full name, prefix included) with the replay group of `args`.
    pub fn open(args: &KafkaArgs, topic: &str) -> Result<Self, DltError> {
        let mut config = base_consumer_settings(args, "pagamentos-dlt");
        config
            .set("group.id", args.group(REPLAY_GROUP))
            // never joins the group: partitions are assigned by hand
            .set("group.protocol", "classic")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true");
        let consumer: BaseConsumer<Context> =
            kafka::context::create(&config).map_err(kafka("create consumer"))?;
        let partitions = kafka::metadata::partitions(consumer.client(), topic, REQUEST_TIMEOUT)
            .map_err(kafka("metadata"))?;
        if partitions.is_empty() {
            return Err(DltError::UnknownTopic(topic.to_owned()));
        }
        Ok(Self { consumer, topic: topic.to_owned(), partitions })
    }

    pub fn partitions(&self) -> &[i32] {
        &self.partitions
    }

    fn watermarks(&self, partition: i32) -> Result<(i64, i64), DltError> {
        self.consumer.fetch_watermarks(&self.topic, partition, REQUEST_TIMEOUT).map_err(kafka("watermarks"))
    }

    /// Replay progress of every partition.
    pub fn progress(&self) -> Result<Vec<(i32, Progress)>, DltError> {
        let mut list = TopicPartitionList::new();
        for &partition in &self.partitions {
            list.add_partition(&self.topic, partition);
        }
        let committed =
            self.consumer.committed_offsets(list, REQUEST_TIMEOUT).map_err(kafka("committed offsets"))?;
        Ok(self
            .partitions
            .iter()
            .map(|&partition| {
                let progress = committed
                    .find_partition(&self.topic, partition)
                    .map(|element| match element.offset() {
                        Offset::Offset(next) => Progress::parse(next, element.metadata()),
                        _ => Progress::default(),
                    })
                    .unwrap_or_default();
                (partition, progress)
            })
            .collect())
    }

    fn commit(&self, partition: i32, progress: &Progress) -> Result<(), DltError> {
        let metadata = progress.metadata();
        if metadata.len() > METADATA_MAX_BYTES {
            return Err(DltError::TooManySingles { topic: self.topic.clone(), partition });
        }
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&self.topic, partition, Offset::Offset(progress.next))
            .map_err(kafka("offset"))?;
        if let Some(mut element) = list.find_partition(&self.topic, partition) {
            element.set_metadata(metadata);
        }
        self.consumer.commit(&list, CommitMode::Sync).map_err(kafka("commit replay progress"))
    }

    /// Dead letters not yet replayed, per partition summed (the `dlt_mensagens_retidas`
    /// gauge). Counts offsets, so on a topic written inside Kafka transactions the commit
    /// markers count too until replayed past; exactly 0 when nothing is left.
    ///
    /// Asks for every partition's start and end at once (two `ListOffsets`, not two per
    /// partition: every service refreshes the gauge every few seconds).
    pub fn retained(&self) -> Result<u64, DltError> {
        let partitions: Vec<(String, i32)> =
            self.partitions.iter().map(|&partition| (self.topic.clone(), partition)).collect();
        let offsets_at = |end| {
            kafka::metadata::offsets_at(&self.consumer, &partitions, end, REQUEST_TIMEOUT)
                .map_err(kafka("watermarks"))
        };
        let (starts, ends) = (offsets_at(End::Start)?, offsets_at(End::Last)?);
        let mut total = 0u64;
        for (partition, progress) in self.progress()? {
            let key = (self.topic.clone(), partition);
            let (low, high) = match (starts.get(&key), ends.get(&key)) {
                (Some(&low), Some(&high)) => (low, high),
                _ => return Err(DltError::UnknownPartition { topic: self.topic.clone(), partition }),
            };
            let from = progress.next.max(low);
            let singles = progress.singles.range(from..high).count() as i64;
            total += (high - from - singles).max(0) as u64;
        }
        Ok(total)
    }

    /// Reads every record from `from` (per partition) to the end, handing each to `visit`
    /// until it returns false. Returns the end offset reached per partition (the position
    /// after the last record or commit marker read).
    fn read(
        &self,
        from: &[(i32, i64)],
        mut visit: impl FnMut(OwnedMessage) -> Result<bool, DltError>,
    ) -> Result<Vec<(i32, i64)>, DltError> {
        let mut ends = Vec::new();
        let mut open = BTreeSet::new();
        let mut assignment = TopicPartitionList::new();
        for &(partition, start) in from {
            let (_, high) = self.watermarks(partition)?;
            if start >= high {
                ends.push((partition, start));
                continue;
            }
            assignment
                .add_partition_offset(&self.topic, partition, Offset::Offset(start))
                .map_err(kafka("offset"))?;
            open.insert(partition);
        }
        if open.is_empty() {
            return Ok(ends);
        }
        self.consumer.assign(&assignment).map_err(kafka("assign"))?;
        let mut idle_since = std::time::Instant::now();
        let mut stopped = false;
        while !open.is_empty() && !stopped {
            match self.consumer.poll(Duration::from_millis(200)) {
                None => {
                    if idle_since.elapsed() > IDLE_END {
                        break;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    open.remove(&partition);
                }
                Some(Err(error)) => return Err(DltError::Kafka { operation: "read", source: error }),
                Some(Ok(message)) => {
                    idle_since = std::time::Instant::now();
                    stopped = !visit(message.detach())?;
                }
            }
        }
        let position = self.consumer.position().map_err(kafka("position"))?;
        for element in position.elements_for_topic(&self.topic) {
            if let Offset::Offset(offset) = element.offset() {
                ends.push((element.partition(), offset));
            }
        }
        self.consumer.unassign().map_err(kafka("unassign"))?;
        Ok(ends)
    }

    /// Every retained dead letter, oldest first per partition; replayed ones only with
    /// `include_replayed`. At most `limit`; the second value counts the rest.
    pub fn list(&self, include_replayed: bool, limit: usize) -> Result<(Vec<Letter>, u64), DltError> {
        let progress = self.progress()?;
        let mut from = Vec::new();
        for (partition, state) in &progress {
            let (low, _) = self.watermarks(*partition)?;
            from.push((*partition, if include_replayed { low } else { state.next.max(low) }));
        }
        let mut letters = Vec::new();
        let mut more = 0u64;
        self.read(&from, |record| {
            let replayed = progress
                .iter()
                .find(|(partition, _)| *partition == record.partition())
                .is_some_and(|(_, state)| state.is_replayed(record.offset()));
            if replayed && !include_replayed {
                return Ok(true);
            }
            if letters.len() < limit {
                letters.push(Letter::new(record, replayed));
            } else {
                more += 1;
            }
            Ok(true)
        })?;
        letters.sort_by_key(|letter| (letter.partition, letter.offset));
        Ok((letters, more))
    }

    /// Replays `selection` to each record's original topic (or `to`), recording progress.
    /// `dry_run` sends and records nothing. `progress` is told (done, total) as records go.
    ///
    /// Only to this topic's source or its retry topics ([`check_destination`]): a `to`
    /// elsewhere is refused before anything is read ([`DltError::DestinationRefused`]); one
    /// record whose header names another topic is refused ([`DltError::Refused`]); with
    /// [`Selection::All`] such records are refused one by one, listed in the summary, and the
    /// others replayed. Every refusal is logged and counted ([`REFUSED_METRIC`]).
    pub fn replay(
        &self,
        producer: &Producer,
        runtime: &tokio::runtime::Handle,
        selection: Selection,
        to: Option<&str>,
        dry_run: bool,
        mut on_progress: impl FnMut(u64, u64),
    ) -> Result<ReplaySummary, DltError> {
        if let Some(to) = to {
            if let Err(refusal) = check_destination(&self.topic, to) {
                tracing::warn!(topic = %self.topic, destination = to, reason = %refusal, "dead-letter replay refused: --to names a topic the letters did not come from; nothing sent");
                if !dry_run {
                    metrics::counter!(REFUSED_METRIC, "topic" => self.topic.clone()).increment(1);
                }
                return Err(DltError::DestinationRefused { topic: self.topic.clone(), refusal });
            }
        }
        match selection {
            Selection::One { partition, offset } => {
                self.replay_one(producer, runtime, partition, offset, to, dry_run)?;
                on_progress(1, 1);
                Ok(ReplaySummary { replayed: 1, ..ReplaySummary::default() })
            }
            Selection::All => self.replay_all(producer, runtime, to, dry_run, on_progress),
        }
    }

    fn destination(&self, record: &OwnedMessage, to: Option<&str>) -> Result<String, Refusal> {
        replay_destination(&self.topic, record, to)
    }

    /// Logs and counts the refusal of `record` (what it asked for, and why not).
    fn refuse(&self, record: &OwnedMessage, refusal: &Refusal, dry_run: bool) -> RefusedLetter {
        tracing::warn!(
            topic = %self.topic,
            partition = record.partition(),
            offset = record.offset(),
            destination = original_topic(record).as_deref().unwrap_or("-"),
            reason = %refusal,
            dry_run,
            "dead letter refused: left in place, not replayed"
        );
        if !dry_run {
            metrics::counter!(REFUSED_METRIC, "topic" => self.topic.clone()).increment(1);
        }
        RefusedLetter { partition: record.partition(), offset: record.offset(), refusal: refusal.clone() }
    }

    fn replay_one(
        &self,
        producer: &Producer,
        runtime: &tokio::runtime::Handle,
        partition: i32,
        offset: i64,
        to: Option<&str>,
        dry_run: bool,
    ) -> Result<(), DltError> {
        let mut progress = self
            .progress()?
            .into_iter()
            .find(|(candidate, _)| *candidate == partition)
            .map(|(_, progress)| progress)
            .ok_or_else(|| DltError::UnknownPartition { topic: self.topic.clone(), partition })?;
        if progress.is_replayed(offset) {
            return Err(DltError::AlreadyReplayed { topic: self.topic.clone(), partition, offset });
        }
        let (low, high) = self.watermarks(partition)?;
        let missing = || DltError::NoRecord { topic: self.topic.clone(), partition, offset, low, high };
        if offset < low || offset >= high {
            return Err(missing());
        }
        let mut found = None;
        self.read(&[(partition, offset)], |record| {
            if record.offset() == offset {
                found = Some(record);
            }
            Ok(false) // the first record at or after `offset` decides
        })?;
        let record = found.ok_or_else(missing)?;
        let destination = self.destination(&record, to).map_err(|refusal| {
            let refused = self.refuse(&record, &refusal, dry_run);
            DltError::Refused { topic: self.topic.clone(), partition, offset, refusal: refused.refusal }
        })?;
        if dry_run {
            return Ok(());
        }
        runtime.block_on(producer.send(&replay_record(&self.topic, &record, &destination)))?;
        progress.mark(offset);
        self.commit(partition, &progress)
    }

    fn replay_all(
        &self,
        producer: &Producer,
        runtime: &tokio::runtime::Handle,
        to: Option<&str>,
        dry_run: bool,
        mut on_progress: impl FnMut(u64, u64),
    ) -> Result<ReplaySummary, DltError> {
        let mut summary = ReplaySummary::default();
        let mut states = self.progress()?;
        let mut total = 0u64;
        let mut from = Vec::new();
        for (partition, state) in &states {
            let (low, high) = self.watermarks(*partition)?;
            let start = state.next.max(low);
            total += (high - start - state.singles.range(start..high).count() as i64).max(0) as u64;
            from.push((*partition, start));
        }
        on_progress(0, total);
        // sent in groups; progress committed after each group's acknowledgements
        const GROUP: usize = 256;
        let mut pending: Vec<(OwnedMessage, String)> = Vec::with_capacity(GROUP);
        let mut flush = |pending: &mut Vec<(OwnedMessage, String)>,
                         states: &mut Vec<(i32, Progress)>,
                         summary: &mut ReplaySummary|
         -> Result<(), DltError> {
            if pending.is_empty() {
                return Ok(());
            }
            if !dry_run {
                let records: Vec<OutgoingRecord> = pending
                    .iter()
                    .map(|(record, destination)| replay_record(&self.topic, record, destination))
                    .collect();
                let results = runtime
                    .block_on(futures::future::join_all(records.iter().map(|record| producer.send(record))));
                for result in results {
                    result?;
                }
            }
            let mut touched = BTreeSet::new();
            for (record, _) in pending.drain(..) {
                if let Some((_, state)) =
                    states.iter_mut().find(|(partition, _)| *partition == record.partition())
                {
                    state.mark(record.offset());
                    touched.insert(record.partition());
                }
                summary.replayed += 1;
            }
            if !dry_run {
                for (partition, state) in states.iter().filter(|(partition, _)| touched.contains(partition)) {
                    self.commit(*partition, state)?;
                }
            }
            on_progress(summary.replayed + summary.refused.len() as u64, total);
            Ok(())
        };
        let snapshot = states.clone();
        let ends = self.read(&from, |record| {
            let replayed_before = snapshot
                .iter()
                .find(|(partition, _)| *partition == record.partition())
                .is_some_and(|(_, state)| state.is_replayed(record.offset()));
            if replayed_before {
                summary.skipped += 1;
                return Ok(true);
            }
            match self.destination(&record, to) {
                Ok(destination) => pending.push((record, destination)),
                // not marked: the progress stops below it, the letter stays retained
                Err(refusal) => summary.refused.push(self.refuse(&record, &refusal, dry_run)),
            }
            if pending.len() >= GROUP {
                flush(&mut pending, &mut states, &mut summary)?;
            }
            Ok(true)
        })?;
        flush(&mut pending, &mut states, &mut summary)?;
        if !dry_run {
            // past trailing commit markers and skipped singles too (nothing there to replay),
            // but never past a refused letter: it stays unreplayed
            for (partition, end) in ends {
                let first_refused = summary
                    .refused
                    .iter()
                    .filter(|refused| refused.partition == partition)
                    .map(|refused| refused.offset)
                    .min();
                let end = first_refused.map_or(end, |refused| refused.min(end));
                if let Some((_, state)) = states.iter_mut().find(|(candidate, _)| *candidate == partition) {
                    let before = state.clone();
                    state.advance_to(end);
                    if *state != before {
                        self.commit(partition, state)?;
                    }
                }
            }
        }
        Ok(summary)
    }
}

/// Refreshes `dlt_mensagens_retidas{topic}` for `topics` every `interval` until `shutdown`.
pub async fn report_retained(
    args: KafkaArgs,
    topics: Vec<String>,
    interval: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut opened: Vec<DeadLetterTopic> = Vec::new();
    loop {
        let task_args = args.clone();
        let task_topics = topics.clone();
        let mut handles = std::mem::take(&mut opened);
        let measured = tokio::task::spawn_blocking(move || {
            if handles.is_empty() {
                for topic in &task_topics {
                    match DeadLetterTopic::open(&task_args, topic) {
                        Ok(handle) => handles.push(handle),
                        Err(error) => tracing::debug!(error = %kafka::consumer::error_chain(&error), topic, "dead-letter topic not opened"),
                    }
                }
            }
            let counts: Vec<(String, Option<u64>)> =
                handles.iter().map(|handle| (handle.topic.clone(), handle.retained().ok())).collect();
            (handles, counts)
        })
        .await;
        if let Ok((handles, counts)) = measured {
            // a topic that failed to open is tried again next time
            opened = if handles.len() == topics.len() { handles } else { Vec::new() };
            for (topic, count) in counts {
                if let Some(count) = count {
                    metrics::gauge!("dlt_mensagens_retidas", "topic" => topic).set(count as f64);
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// True when `error` means the topic or partition is not there (for exit codes).
pub fn is_not_found(error: &DltError) -> bool {
    matches!(error, DltError::UnknownTopic(_) | DltError::UnknownPartition { .. } | DltError::NoRecord { .. })
        || matches!(error, DltError::Kafka { source, .. } if source.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders, Timestamp};

    #[test]
    fn progress_folds_singles_into_the_committed_offset() {
        let mut progress = Progress::default();
        progress.mark(3);
        progress.mark(5);
        progress.mark(6);
        assert_eq!(progress, Progress { next: 0, singles: [3, 5, 6].into() });
        assert!(progress.is_replayed(5) && !progress.is_replayed(4) && !progress.is_replayed(0));
        for offset in 0..3 {
            progress.mark(offset);
        }
        assert_eq!(progress, Progress { next: 4, singles: [5, 6].into() });
        progress.mark(4);
        assert_eq!(progress, Progress { next: 7, singles: BTreeSet::new() });
        progress.mark(2); // below next: nothing changes
        assert_eq!(progress.next, 7);
        progress.mark(9);
        progress.advance_to(8);
        assert_eq!(progress, Progress { next: 8, singles: [9].into() });
        progress.mark(8);
        assert_eq!(progress, Progress { next: 10, singles: BTreeSet::new() });
    }

    #[test]
    fn metadata_round_trips_as_ranges() {
        let progress = Progress { next: 4, singles: [5, 9, 10, 11, 20].into() };
        assert_eq!(progress.metadata(), "replayed=5,9-11,20");
        assert_eq!(Progress::parse(4, &progress.metadata()), progress);
        assert_eq!(Progress::parse(10, "replayed=5,9-11,20"), Progress { next: 12, singles: [20].into() });
        assert_eq!(Progress::parse(7, ""), Progress { next: 7, singles: BTreeSet::new() });
        assert_eq!(Progress::parse(7, "garbage,1-x"), Progress { next: 7, singles: BTreeSet::new() });
        assert_eq!(Progress::default().metadata(), "replayed=");
    }

    #[test]
    fn replay_goes_to_the_original_topic_with_a_marker() {
        let headers = OwnedHeaders::new()
            .insert(Header { key: "kafka_original-topic", value: Some(b"transferencias.liquidada") })
            .insert(Header { key: "traceparent", value: Some(b"00-abc-def-01") });
        let record = OwnedMessage::new(
            Some(b"{}".to_vec()),
            Some(b"CC-1".to_vec()),
            "transferencias.liquidada-dlt".into(),
            Timestamp::CreateTime(1),
            2,
            17,
            Some(headers),
        );
        assert_eq!(original_topic(&record).as_deref(), Some("transferencias.liquidada"));
        let out = replay_record("transferencias.liquidada-dlt", &record, "transferencias.liquidada");
        assert_eq!(out.topic, "transferencias.liquidada");
        assert_eq!(out.partition, None);
        assert_eq!(out.key.as_deref(), Some(&b"CC-1"[..]));
        assert_eq!(out.header_value("traceparent"), Some(&b"00-abc-def-01"[..]));
        assert_eq!(out.header_value(REPLAYED_FROM), Some(&b"transferencias.liquidada-dlt/2/17"[..]));

        let dlt_headers = OwnedHeaders::new()
            .insert(Header { key: "kafka_dlt-original-topic", value: Some(b"transferencias.analisada") });
        let blocking =
            OwnedMessage::new(None, None, "x-dlt".into(), Timestamp::NotAvailable, 1, 0, Some(dlt_headers));
        assert_eq!(original_topic(&blocking).as_deref(), Some("transferencias.analisada"));
        assert_eq!(replay_record("x-dlt", &blocking, "y").partition, Some(1));
        let bare = OwnedMessage::new(None, None, "x-dlt".into(), Timestamp::NotAvailable, 0, 0, None);
        assert_eq!(original_topic(&bare), None);
    }

    /// A letter of `dlt_topic` whose `header` names `original`.
    fn naming(dlt_topic: &str, header: &str, original: &str) -> OwnedMessage {
        let headers = OwnedHeaders::new().insert(Header { key: header, value: Some(original.as_bytes()) });
        OwnedMessage::new(
            Some(br#"{"transferenciaId":"x"}"#.to_vec()),
            Some(b"SEC-A".to_vec()),
            dlt_topic.into(),
            Timestamp::CreateTime(1),
            0,
            3,
            Some(headers),
        )
    }

    fn elsewhere(source: &str, destination: &str) -> Refusal {
        Refusal::Elsewhere { origin: source.into(), destination: destination.into() }
    }

    const SETTLED_DLT: &str = "transferencias.liquidada-dlt";
    const SETTLED: &str = "transferencias.liquidada";

    #[test]
    fn a_letter_whose_header_names_another_topic_is_refused() {
        // notificacoes may write transferencias.liquidada-dlt: an analysis addressed to the
        // ledger's input, in either family of headers
        for header in ["kafka_dlt-original-topic", "kafka_original-topic"] {
            let forged = naming(SETTLED_DLT, header, "transferencias.analisada");
            assert_eq!(
                replay_destination(SETTLED_DLT, &forged, None),
                Err(elsewhere(SETTLED, "transferencias.analisada")),
                "{header}"
            );
        }
        // lookalikes of the source and of its retry topics
        for destination in [
            "transferencias.solicitada",
            "transferencias.rejeitada",
            "transferencias.rejeitada-retry-1000",
            "transferencias.liquidada-dlt",
            "transferencias.liquidadaX",
            "transferencias.liquidada-retry-",
            "transferencias.liquidada-retry-0",
            "transferencias.liquidada-retry-01000",
            "transferencias.liquidada-retry-+1000",
            "transferencias.liquidada-retry--1000",
            "transferencias.liquidada-retry-1000x",
            "transferencias.liquidada-retry-1000-dlt",
            "transferencias.liquidada-retry-99999999999",
            "transferencias.liquidada-retry-1000.transferencias.analisada",
            "x.transferencias.liquidada",
            "transferencias.liquidada ",
        ] {
            let forged = naming(SETTLED_DLT, "kafka_dlt-original-topic", destination);
            assert_eq!(replay_destination(SETTLED_DLT, &forged, None), Err(elsewhere(SETTLED, destination)));
        }
        // no header and no --to: nowhere to go
        let bare = OwnedMessage::new(None, None, SETTLED_DLT.into(), Timestamp::NotAvailable, 0, 0, None);
        assert_eq!(replay_destination(SETTLED_DLT, &bare, None), Err(Refusal::NoOriginalTopic));
        let empty = naming(SETTLED_DLT, "kafka_original-topic", "");
        assert_eq!(replay_destination(SETTLED_DLT, &empty, None), Err(Refusal::NoOriginalTopic));
    }

    #[test]
    fn to_elsewhere_is_refused_whatever_the_letter_says() {
        let legit = naming(SETTLED_DLT, "kafka_original-topic", SETTLED);
        for to in
            ["transferencias.analisada", "transferencias.solicitada", "transferencias.rejeitada-retry-1000"]
        {
            assert_eq!(replay_destination(SETTLED_DLT, &legit, Some(to)), Err(elsewhere(SETTLED, to)));
        }
        // --to overrides a forged header only towards the source's own topics
        let forged = naming(SETTLED_DLT, "kafka_dlt-original-topic", "transferencias.analisada");
        assert_eq!(
            replay_destination(SETTLED_DLT, &forged, Some("transferencias.liquidada-retry-1000")).as_deref(),
            Ok("transferencias.liquidada-retry-1000")
        );
        assert_eq!(replay_destination(SETTLED_DLT, &forged, Some(SETTLED)).as_deref(), Ok(SETTLED));
    }

    #[test]
    fn the_source_and_its_retry_topics_are_allowed_and_nothing_else_of_the_plan() {
        let legit = |destination: &str| naming(SETTLED_DLT, "kafka_original-topic", destination);
        for destination in [
            SETTLED,
            "transferencias.liquidada-retry-1000",
            "transferencias.liquidada-retry-2000",
            "transferencias.liquidada-retry-4000",
        ] {
            assert_eq!(
                replay_destination(SETTLED_DLT, &legit(destination), None).as_deref(),
                Ok(destination)
            );
        }
        // a blocking handler's letter of the ledger's input goes back to it
        let analysed =
            naming("transferencias.analisada-dlt", "kafka_dlt-original-topic", "transferencias.analisada");
        assert_eq!(
            replay_destination("transferencias.analisada-dlt", &analysed, None).as_deref(),
            Ok("transferencias.analisada")
        );
        // every pair of the topic plan, with and without a prefix
        for prefix in ["", "it-7."] {
            let plan = contracts::topics::plan(prefix);
            for dead_letters in &plan {
                let contracts::topics::TopicKind::DeadLetter { source } = &dead_letters.kind else {
                    continue;
                };
                for other in &plan {
                    let own = other.name == *source
                        || matches!(&other.kind, contracts::topics::TopicKind::Retry { source: of, .. } if of == source);
                    assert_eq!(
                        check_destination(&dead_letters.name, &other.name).is_ok(),
                        own,
                        "{} → {}",
                        dead_letters.name,
                        other.name
                    );
                }
            }
        }
    }

    #[test]
    fn the_topic_prefix_is_part_of_both_names() {
        let dlt = "it-7.transferencias.liquidada-dlt";
        assert_eq!(source_of(dlt), Some("it-7.transferencias.liquidada"));
        assert_eq!(check_destination(dlt, "it-7.transferencias.liquidada"), Ok(()));
        assert_eq!(check_destination(dlt, "it-7.transferencias.liquidada-retry-1000"), Ok(()));
        // the unprefixed (production) topics, another prefix's, another topic behind the same
        for destination in [
            SETTLED,
            "transferencias.liquidada-retry-1000",
            "it-8.transferencias.liquidada",
            "it-7.transferencias.analisada",
        ] {
            assert_eq!(
                check_destination(dlt, destination),
                Err(elsewhere("it-7.transferencias.liquidada", destination))
            );
        }
        // and a letter of the production set cannot reach a prefixed one either
        assert_eq!(
            check_destination(SETTLED_DLT, "it-7.transferencias.liquidada"),
            Err(elsewhere(SETTLED, "it-7.transferencias.liquidada"))
        );
        // a topic that is no dead-letter topic has no source
        for topic in [SETTLED, "-dlt", ""] {
            assert_eq!(check_destination(topic, SETTLED), Err(Refusal::NoSource { dlt_topic: topic.into() }));
        }
    }

    fn letter(headers: &[(&str, &[u8])]) -> OwnedMessage {
        let headers = headers.iter().fold(OwnedHeaders::new(), |headers, (key, value)| {
            headers.insert(Header { key, value: Some(*value) })
        });
        OwnedMessage::new(
            Some(b"{}".to_vec()),
            None,
            "t-dlt".into(),
            Timestamp::CreateTime(9),
            0,
            4,
            Some(headers),
        )
    }

    #[test]
    fn the_original_timestamp_type_is_read_in_both_spellings() {
        let at = 1_733_212_800_123i64.to_be_bytes();
        let old = letter(&[
            ("kafka_dlt-original-timestamp", &at),
            ("kafka_dlt-original-timestamp-type", b"CREATE_TIME"),
        ]);
        assert_eq!(original_timestamp(&old), Some((1_733_212_800_123, TimestampType::CreateTime)));
        let new =
            letter(&[("kafka_original-timestamp", &at), ("kafka_original-timestamp-type", b"LogAppendTime")]);
        assert_eq!(original_timestamp(&new), Some((1_733_212_800_123, TimestampType::LogAppendTime)));
        let unknown =
            letter(&[("kafka_original-timestamp", &at), ("kafka_original-timestamp-type", b"Later")]);
        assert_eq!(original_timestamp(&unknown), None);
        assert_eq!(
            Letter::new(old, false).original_timestamp.map(|(_, kind)| kind.as_str()),
            Some("CreateTime")
        );
    }

    #[test]
    fn a_letter_with_a_value_per_hop_is_listed_by_its_last_and_replayed_with_all() {
        let record = letter(&[
            ("kafka_original-topic", b"transferencias.liquidada"),
            ("kafka_exception-message", b"first"),
            ("retry_topic-attempts", &[0, 0, 0, 2]),
            ("kafka_exception-message", b"last"),
            ("retry_topic-attempts", &[0, 0, 0, 3]),
        ]);
        let listed = Letter::new(record.clone(), false);
        assert_eq!(listed.exception_message.as_deref(), Some("last"));
        let out = replay_record("t-dlt", &record, "transferencias.liquidada-retry-1000");
        let names: Vec<&str> = out.headers.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "kafka_original-topic",
                "kafka_exception-message",
                "retry_topic-attempts",
                "kafka_exception-message",
                "retry_topic-attempts",
                REPLAYED_FROM
            ]
        );
        assert_eq!(out.header_values("retry_topic-attempts"), [&[0u8, 0, 0, 2][..], &[0, 0, 0, 3]]);
    }

    /// `out` as the next stage receives it: its topic, a new offset and timestamp.
    fn received(out: &OutgoingRecord, offset: i64, timestamp_ms: i64) -> OwnedMessage {
        OwnedMessage::new(
            Some(out.payload.clone()),
            out.key.clone(),
            out.topic.clone(),
            Timestamp::CreateTime(timestamp_ms),
            out.partition.unwrap_or(0), // a replay leaves it to the partitioner
            offset,
            Some(out.owned_headers()),
        )
    }

    #[test]
    fn a_dead_letter_redriven_to_a_retry_topic_is_due_at_once() {
        use kafka::dead_letter::Failure;
        use kafka::retry_topic::{due_at_ms, forwarded, now_ms, Chain};

        let chain = Chain { delays_ms: vec![1000, 2000, 4000] };
        let failure = Failure {
            exception_fqcn: "notifications::webhook::Unavailable".into(),
            cause_fqcn: "http::status::StatusCode".into(),
            message: "503".into(),
            stacktrace: "503".into(),
        };
        let now = now_ms();
        let mut current = OwnedMessage::new(
            Some(br#"{"eventoId":"x"}"#.to_vec()),
            Some(b"CC-1".to_vec()),
            "t".into(),
            Timestamp::CreateTime(1_800_000_000_000),
            0,
            1,
            None,
        );
        for failed in 1..=4 {
            let out = forwarded(&current, "g", &failure, failed, &chain.after_failure("t", failed), now);
            current = received(&out, i64::from(failed), now);
        }
        assert_eq!(current.topic(), "t-dlt");
        // `pagamentos dlt replay --to t-retry-1000` copies every header, in order
        let replayed = replay_record("t-dlt", &current, "t-retry-1000");
        let on_retry = received(&replayed, 0, now + 10);
        let due = due_at_ms(&on_retry).expect("a backoff timestamp");
        assert!(due <= now, "due {} ms after it was dead-lettered", due - now);
        // the first value (1 s after the first failure) would hold it back
        assert_eq!(
            contracts::headers::decode_big_integer(
                replayed.header_values("retry_topic-backoff-timestamp")[0]
            ),
            Ok(now + 1000)
        );
    }
}
