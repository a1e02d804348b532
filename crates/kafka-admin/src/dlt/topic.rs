//! One dead-letter topic opened with the replay group's consumer: its partitions, reading its
//! records from given offsets, and listing its letters.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};

use kafka::config::{base_consumer_settings, KafkaArgs};
use kafka::context::Context;

use super::{kafka, DltError, Letter, REPLAY_GROUP, REQUEST_TIMEOUT};

/// How long a read may see nothing before the partitions count as read to their end.
const IDLE_END: Duration = Duration::from_secs(10);

/// One dead-letter topic, opened for reading and for recording replay progress.
pub struct DeadLetterTopic {
    pub(super) consumer: BaseConsumer<Context>,
    pub(super) topic: String,
    pub(super) partitions: Vec<i32>,
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

    pub(super) fn watermarks(&self, partition: i32) -> Result<(i64, i64), DltError> {
        self.consumer.fetch_watermarks(&self.topic, partition, REQUEST_TIMEOUT).map_err(kafka("watermarks"))
    }

    /// Reads every record from `from` (per partition) to the end, handing each to `visit`
    /// until it returns false. Returns the end offset reached per partition (the position
    /// after the last record or commit marker read).
    pub(super) fn read(
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
}
