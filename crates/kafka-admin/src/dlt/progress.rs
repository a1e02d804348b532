//! Replay progress of a partition ([`Progress`]) and how it is kept: committed offsets of the
//! replay group, with the singles replayed above them in the commit's metadata.

use std::collections::BTreeSet;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::{kafka, DeadLetterTopic, DltError, REQUEST_TIMEOUT};

/// Most bytes of replay metadata per partition (the broker's `offset.metadata.max.bytes`
/// default is 4096).
const METADATA_MAX_BYTES: usize = 4000;
const METADATA_PREFIX: &str = "replayed=";

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

impl DeadLetterTopic {
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

    pub(super) fn commit(&self, partition: i32, progress: &Progress) -> Result<(), DltError> {
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
}
