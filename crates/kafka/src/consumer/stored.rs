//! [`StoredOffsets`]: every offset the loop stores goes through here, and moves only forward in
//! its partition while the partition stays assigned.

use std::collections::HashMap;

use rdkafka::{Offset, TopicPartitionList};

use super::io::Io;

/// The last offset stored per partition, with the revocation tick at which it was stored.
#[derive(Debug, Default)]
pub(super) struct StoredOffsets(HashMap<(String, i32), (i64, u64)>);

impl StoredOffsets {
    /// Stores `offsets` (librdkafka commits them later).
    ///
    /// Asserted: an offset never moves back in its partition unless the partition was revoked
    /// since the last store (a partition assigned again is fetched anew from its committed
    /// offset, so what is stored there can lawfully be lower). A step back otherwise would
    /// commit records as unhandled that were handled, or worse, the other way round on the next
    /// store: a bug in the loop, stopped here before it reaches the broker.
    pub(super) fn store(&mut self, io: &impl Io, offsets: &TopicPartitionList) {
        let revocations = io.revocations();
        let now = revocations.now();
        for element in offsets.elements() {
            let Offset::Offset(offset) = element.offset() else { continue };
            let key = (element.topic().to_owned(), element.partition());
            if let Some(&(before, at)) = self.0.get(&key) {
                assert!(
                    offset >= before || revocations.revoked_since(&key.0, key.1, at),
                    "stored offset of {}/{} moved back from {before} to {offset}",
                    key.0,
                    key.1
                );
            }
            self.0.insert(key, (offset, now));
        }
        io.store(offsets);
    }
}
