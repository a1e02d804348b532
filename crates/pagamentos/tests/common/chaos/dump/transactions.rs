//! What the parsed logs say of transactions: a group's offset commits and the markers that
//! ended them, the transaction log's ends, and the records a transaction wrote.

use std::collections::BTreeSet;

use super::segments::{Batch, Log};

/// How a transaction ended on one partition: its control record there.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub kind: String,
    pub offset: i64,
    pub epoch: i64,
    pub time: i64,
}

/// One offset-commit record on `__consumer_offsets` and how it took effect.
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetCommit {
    /// The `__consumer_offsets` partition and the record's offset there.
    pub log: String,
    pub at: i64,
    pub producer_id: i64,
    pub producer_epoch: i64,
    pub transactional: bool,
    pub group: String,
    pub topic: String,
    pub partition: i32,
    /// The committed offset (the next one to read); `None` for a tombstone.
    pub offset: Option<i64>,
    pub commit_time: i64,
    /// The marker that ended its transaction on this partition (`None`: still open, or not
    /// transactional).
    pub end: Option<Marker>,
}

impl OffsetCommit {
    /// Where on its `__consumer_offsets` partition it took effect: a plain commit at its record,
    /// a transactional one at its COMMIT marker; `None` if it never did (aborted or open).
    pub fn effective(&self) -> Option<i64> {
        if !self.transactional {
            return Some(self.at);
        }
        self.end.as_ref().filter(|marker| marker.kind == "COMMIT").map(|marker| marker.offset)
    }
}

/// The marker after batch `index` of `log` from the same producer id: the end of that batch's
/// transaction on this partition (a producer has one transaction open at a time).
fn marker_after(log: &Log, index: usize) -> Option<Marker> {
    let producer = log.batches[index].producer_id;
    log.batches[index + 1..].iter().filter(|batch| batch.producer_id == producer && batch.control).find_map(
        |batch| {
            Some(Marker {
                kind: batch.marker()?.to_owned(),
                offset: batch.base_offset,
                epoch: batch.producer_epoch,
                time: batch.create_time,
            })
        },
    )
}

/// Every offset commit of `group` on `topic` in the dumped `__consumer_offsets` logs.
pub fn offset_commits(logs: &[Log], group: &str, topic: &str) -> Vec<OffsetCommit> {
    let mut commits = Vec::new();
    for log in logs {
        for (index, batch) in log.batches.iter().enumerate() {
            if batch.control {
                continue;
            }
            for record in &batch.records {
                let Some(key) =
                    record.key.as_deref().and_then(|key| serde_json::from_str::<serde_json::Value>(key).ok())
                else {
                    continue;
                };
                // OffsetCommitKey: record types 0 and 1
                let data = &key["data"];
                if !matches!(key["type"].as_str(), Some("0" | "1"))
                    || data["group"] != group
                    || data["topic"] != topic
                {
                    continue;
                }
                let value = record
                    .payload
                    .as_deref()
                    .and_then(|payload| serde_json::from_str::<serde_json::Value>(payload).ok());
                commits.push(OffsetCommit {
                    log: log.name.clone(),
                    at: record.offset,
                    producer_id: batch.producer_id,
                    producer_epoch: batch.producer_epoch,
                    transactional: batch.transactional,
                    group: group.to_owned(),
                    topic: topic.to_owned(),
                    partition: data["partition"].as_i64().unwrap_or(-1) as i32,
                    offset: value.as_ref().and_then(|value| value["data"]["offset"].as_i64()),
                    commit_time: value
                        .as_ref()
                        .and_then(|value| value["data"]["commitTimestamp"].as_i64())
                        .unwrap_or(record.create_time),
                    end: if batch.transactional { marker_after(log, index) } else { None },
                });
            }
        }
    }
    commits
}

/// One ending of a transaction, from the transaction log: its PrepareCommit or PrepareAbort
/// entry (the partitions it wrote) and when the coordinator finished writing its markers.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionEnd {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i64,
    pub commit: bool,
    pub partitions: BTreeSet<(String, i32)>,
    /// CreateTime of the Prepare entry: its markers are written after it…
    pub prepared_at: i64,
    /// …and before the Complete entry that follows it (`None`: not completed yet).
    pub completed_at: Option<i64>,
}

impl TransactionEnd {
    /// Whether a marker written at `time` (ms) lies within its markers' window.
    pub fn covers(&self, time: i64) -> bool {
        self.prepared_at <= time && self.completed_at.is_none_or(|completed| time <= completed)
    }
}

/// Every transaction end the dumped `__transaction_state` logs hold, in log order per id.
pub fn transaction_ends(logs: &[Log]) -> Vec<TransactionEnd> {
    let mut ends: Vec<TransactionEnd> = Vec::new();
    for log in logs {
        for batch in &log.batches {
            for record in &batch.records {
                let parse = |text: Option<&str>| {
                    text.and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
                };
                let (Some(key), Some(value)) =
                    (parse(record.key.as_deref()), parse(record.payload.as_deref()))
                else {
                    continue;
                };
                let Some(id) = key["data"]["transactionalId"].as_str() else { continue };
                let data = &value["data"];
                // TransactionState: 2 PrepareCommit, 3 PrepareAbort, 4 CompleteCommit, 5 CompleteAbort
                match data["transactionStatus"].as_i64() {
                    Some(status @ (2 | 3)) => {
                        let partitions = data["transactionPartitions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .flat_map(|entry| {
                                let topic = entry["topic"].as_str().unwrap_or_default().to_owned();
                                entry["partitionIds"]
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                    .filter_map(|id| id.as_i64())
                                    .map(move |id| (topic.clone(), id as i32))
                            })
                            .collect();
                        ends.push(TransactionEnd {
                            transactional_id: id.to_owned(),
                            producer_id: data["producerId"].as_i64().unwrap_or(-1),
                            producer_epoch: data["producerEpoch"].as_i64().unwrap_or(-1),
                            commit: status == 2,
                            partitions,
                            prepared_at: record.create_time,
                            completed_at: None,
                        });
                    }
                    Some(4 | 5) => {
                        if let Some(end) = ends
                            .iter_mut()
                            .rev()
                            .find(|end| end.transactional_id == id && end.completed_at.is_none())
                        {
                            end.completed_at = Some(record.create_time);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    ends
}

/// A record one transaction wrote on an output partition.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub log: String,
    pub offset: i64,
    pub producer_epoch: i64,
    pub payload: String,
    pub marker: Marker,
}

impl Written {
    /// The payload's `transferenciaId`.
    pub fn transfer(&self) -> Option<String> {
        let value: serde_json::Value = serde_json::from_str(&self.payload).ok()?;
        value["transferenciaId"].as_str().map(str::to_owned)
    }
}

/// What `producer_id` wrote on `log` in the transaction whose markers lie in `window` (its
/// first marker there inside the window; the records after its previous marker there), with
/// that marker; `None` when no marker of that producer id on `log` lies in the window.
pub fn written_in(
    log: &Log,
    producer_id: i64,
    window: &dyn Fn(i64) -> bool,
) -> Option<(Marker, Vec<Written>)> {
    let mut pending: Vec<&Batch> = Vec::new();
    for batch in log.batches.iter().filter(|batch| batch.producer_id == producer_id) {
        if !batch.control {
            pending.push(batch);
            continue;
        }
        let Some(kind) = batch.marker() else { continue };
        let marker = Marker {
            kind: kind.to_owned(),
            offset: batch.base_offset,
            epoch: batch.producer_epoch,
            time: batch.create_time,
        };
        if window(batch.create_time) {
            let written = pending
                .iter()
                .flat_map(|batch| {
                    let marker = marker.clone();
                    batch.records.iter().map(move |record| Written {
                        log: log.name.clone(),
                        offset: record.offset,
                        producer_epoch: batch.producer_epoch,
                        payload: record.payload.clone().unwrap_or_default(),
                        marker: marker.clone(),
                    })
                })
                .collect();
            return Some((marker, written));
        }
        pending.clear();
    }
    None
}
