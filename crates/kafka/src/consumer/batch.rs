//! [`Batch`]: records taken from the consumer, each with the revocation tick it was taken at.

use rdkafka::message::{Message, OwnedMessage};
use rdkafka::Offset;

use super::next_offsets;
use crate::context::Revocations;

/// Records taken from the consumer, each with the [`Revocations`] tick at which it was taken.
#[derive(Debug, Default)]
pub(super) struct Batch {
    pub(super) records: Vec<OwnedMessage>,
    pub(super) taken: Vec<u64>,
}

impl Batch {
    pub(super) fn push(&mut self, (record, taken): (OwnedMessage, u64)) {
        self.records.push(record);
        self.taken.push(taken);
    }

    /// Each record with the tick at which it was taken, in order.
    pub(super) fn into_taken(self) -> impl Iterator<Item = (OwnedMessage, u64)> {
        self.records.into_iter().zip(self.taken)
    }

    /// Takes the records of one partition, in order.
    pub(super) fn take_partition(&mut self, topic: &str, partition: i32) -> Batch {
        let mut taken = Batch::default();
        if self.records.iter().any(|record| record.topic() == topic && record.partition() == partition) {
            let mut kept = Batch::default();
            for (record, tick) in
                std::mem::take(&mut self.records).into_iter().zip(std::mem::take(&mut self.taken))
            {
                if record.topic() == topic && record.partition() == partition {
                    taken.push((record, tick));
                } else {
                    kept.push((record, tick));
                }
            }
            *self = kept;
        }
        taken
    }

    /// Moves `other`'s records behind these.
    pub(super) fn append(&mut self, mut other: Batch) {
        self.records.append(&mut other.records);
        self.taken.append(&mut other.taken);
    }

    /// The first `count` records as a batch of their own.
    pub(super) fn split_off_front(&mut self, count: usize) -> Batch {
        let count = count.min(self.records.len());
        Batch { records: self.records.drain(..count).collect(), taken: self.taken.drain(..count).collect() }
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&OwnedMessage, u64) -> bool) {
        let records = std::mem::take(&mut self.records);
        let taken = std::mem::take(&mut self.taken);
        for (record, tick) in records.into_iter().zip(taken) {
            if keep(&record, tick) {
                self.push((record, tick));
            }
        }
    }

    /// Drops the records whose partition was revoked after they were taken; returns how many.
    pub(super) fn drop_revoked(&mut self, revocations: &Revocations) -> usize {
        let before = self.records.len();
        self.retain(|record, taken| !revocations.revoked_since(record.topic(), record.partition(), taken));
        before - self.records.len()
    }

    /// Drops the records at or below an offset `handled` covered in their partition: a
    /// partition lost and assigned again while a batch waited for its retry is fetched anew
    /// from its committed offset, so what the batch just handled may come again.
    pub(super) fn drop_handled(&mut self, handled: &[OwnedMessage]) {
        if self.records.is_empty() {
            return;
        }
        let next = next_offsets(handled);
        self.retain(|record, _| match next.find_partition(record.topic(), record.partition()) {
            Some(element) => match element.offset() {
                Offset::Offset(next) => record.offset() >= next,
                _ => true,
            },
            None => true,
        });
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::TopicPartitionList;

    fn record(topic: &str, partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(None, None, topic.into(), rdkafka::Timestamp::NotAvailable, partition, offset, None)
    }

    fn batch(records: &[(&str, i32, i64, u64)]) -> Batch {
        let mut batch = Batch::default();
        for (topic, partition, offset, taken) in records {
            batch.push((record(topic, *partition, *offset), *taken));
        }
        batch
    }

    fn left(batch: &Batch) -> Vec<(&str, i32, i64, u64)> {
        batch
            .records
            .iter()
            .zip(&batch.taken)
            .map(|(record, taken)| (record.topic(), record.partition(), record.offset(), *taken))
            .collect()
    }

    #[test]
    fn records_carried_through_a_retry_that_the_batch_already_handled_are_dropped() {
        let handled = vec![record("a", 0, 5), record("a", 0, 6), record("a", 1, 9)];
        let mut carried =
            batch(&[("a", 0, 6, 0), ("a", 0, 7, 1), ("a", 1, 3, 2), ("a", 2, 0, 3), ("b", 0, 1, 4)]);
        carried.drop_handled(&handled);
        assert_eq!(left(&carried), [("a", 0, 7, 1), ("a", 2, 0, 3), ("b", 0, 1, 4)]);
        let front = carried.split_off_front(2);
        assert_eq!(left(&front), [("a", 0, 7, 1), ("a", 2, 0, 3)]);
        assert_eq!(left(&carried), [("b", 0, 1, 4)]);
    }

    #[test]
    fn records_of_a_partition_revoked_after_they_were_taken_are_dropped() {
        let revocations = Revocations::default();
        let t0 = revocations.now();
        let mut taken = batch(&[("a", 0, 5, t0), ("a", 1, 7, t0)]);
        assert_eq!(taken.drop_revoked(&revocations), 0, "nothing revoked");
        let mut revoked = TopicPartitionList::new();
        revoked.add_partition("a", 0);
        // a rebalance served while polling: partition 0 revoked, then assigned again and
        // fetched anew from its committed offset
        revocations.record(&revoked);
        let t1 = revocations.now();
        taken.push((record("a", 0, 5), t1));
        assert_eq!(taken.drop_revoked(&revocations), 1);
        assert_eq!(left(&taken), [("a", 1, 7, t0), ("a", 0, 5, t1)]);
    }
}
