//! Records that are not to be handled yet ([`super::Verdict::NotBefore`]), held per partition
//! with only that partition paused until the first of them is due.
//!
//! librdkafka resumes a paused partition from the position after the last record it handed to
//! the application (pausing discards what it fetched beyond), so a held record is neither
//! fetched twice nor skipped. Held records are never stored: after a shutdown, a crash or a
//! revocation they come again from the committed offset.

use std::collections::BTreeMap;

use rdkafka::message::{Message, OwnedMessage};
use tokio::time::Instant;

use crate::context::Revocations;

use super::batch::Batch;
use super::io::Io;

/// The held partitions.
#[derive(Debug, Default)]
pub(super) struct Held {
    partitions: BTreeMap<(String, i32), Partition>,
}

#[derive(Debug)]
struct Partition {
    /// When the first record is due; the rest wait behind it (order within a partition).
    due: Instant,
    /// In offset order, each with the [`Revocations`] tick at which it was taken.
    records: Batch,
    /// The tick at which the partition was paused; `None` when the pause was refused.
    paused_at: Option<u64>,
}

impl Held {
    /// Every held record with the tick at which it was taken (for the loop's invariants).
    pub fn records(&self) -> impl Iterator<Item = (&OwnedMessage, u64)> {
        self.partitions.values().flat_map(|partition| {
            partition.records.records.iter().zip(partition.records.taken.iter().copied())
        })
    }

    pub fn holds(&self, topic: &str, partition: i32) -> bool {
        // (no allocation: the map is small and this runs per record taken)
        self.partitions.keys().any(|(held, number)| held == topic && *number == partition)
    }

    /// When the earliest held record is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.partitions.values().map(|held| held.due).min()
    }

    /// Holds `records` (of the partition `key`, in offset order, the first due at `due`) and
    /// pauses the partition.
    pub fn hold(&mut self, io: &impl Io, key: (String, i32), due: Instant, records: Batch) {
        if records.records.is_empty() {
            return;
        }
        tracing::debug!(
            topic = key.0,
            partition = key.1,
            offset = records.records[0].offset(),
            wait_ms = due.saturating_duration_since(Instant::now()).as_millis() as u64,
            "record not due; partition paused"
        );
        match self.partitions.get_mut(&key) {
            // (not expected: a held partition's records reach the handler only once released)
            Some(held) => {
                for taken in records.into_taken() {
                    held.push_behind(taken);
                }
            }
            None => {
                let paused_at = io.pause(&key.0, key.1).then(|| io.revocations().now());
                self.partitions.insert(key, Partition { due, records, paused_at });
            }
        }
    }

    /// Keeps a record taken from the consumer behind the held records of its partition;
    /// gives it back when its partition holds none.
    pub fn push(
        &mut self,
        revocations: &Revocations,
        taken: (OwnedMessage, u64),
    ) -> Option<(OwnedMessage, u64)> {
        let found = self
            .partitions
            .iter_mut()
            .find(|((topic, partition), _)| topic == taken.0.topic() && *partition == taken.0.partition());
        let Some((key, held)) = found else { return Some(taken) };
        // the partition was revoked (and assigned again, fetched anew from its committed
        // offset) since its records were taken: those are stale, the new record is not
        if held.records.taken.first().is_some_and(|tick| revocations.revoked_since(&key.0, key.1, *tick)) {
            let key = key.clone();
            self.partitions.remove(&key);
            return Some(taken);
        }
        held.push_behind(taken);
        None
    }

    /// Takes the records of every partition whose first record is due at `now`, in order, and
    /// resumes those partitions (unless revoked since they were paused).
    pub fn release_due(&mut self, io: &impl Io, now: Instant) -> Batch {
        let due: Vec<(String, i32)> =
            self.partitions.iter().filter(|(_, held)| held.due <= now).map(|(key, _)| key.clone()).collect();
        let mut released = Batch::default();
        let mut resumed = Vec::new();
        for key in due {
            let Some(held) = self.partitions.remove(&key) else { continue };
            if held.paused_at.is_some_and(|tick| !io.revocations().revoked_since(&key.0, key.1, tick)) {
                resumed.push(key);
            }
            released.append(held.records);
        }
        io.resume(&resumed);
        released
    }

    /// Drops the held records whose partition was revoked after they were taken (the context
    /// unpaused the partition as it went); returns how many.
    pub fn drop_revoked(&mut self, revocations: &Revocations) -> usize {
        let mut dropped = 0;
        self.partitions.retain(|(topic, partition), held| {
            let before = held.records.records.len();
            held.records.retain(|_, taken| !revocations.revoked_since(topic, *partition, taken));
            dropped += before - held.records.records.len();
            !held.records.records.is_empty()
        });
        dropped
    }
}

impl Partition {
    /// Adds a record behind the held ones, unless one at or past its offset is held already.
    fn push_behind(&mut self, taken: (OwnedMessage, u64)) {
        if self.records.records.last().is_none_or(|last| last.offset() < taken.0.offset()) {
            self.records.push(taken);
        }
    }
}
