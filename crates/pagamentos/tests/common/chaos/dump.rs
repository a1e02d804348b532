#![allow(dead_code)]
//! What the broker wrote, read from its log directory by Kafka's own `DumpLogSegments`: which
//! transactional offset commit passed a lost transfer's request, and what that transaction wrote.
//!
//! A transfer is lost when antifraude's group committed an offset past its request without an
//! analysis of it. The offset commits of a transaction are records on `__consumer_offsets`
//! (decoded with `--offsets-decoder`), its end a COMMIT or ABORT control record of the same
//! producer id on every partition it wrote, and its outputs the records that producer id wrote
//! on the output topics before those markers (`--print-data-log --deep-iteration`).
//!
//! librdkafka implements transactions version 1 (no KIP-890 part 2): every transaction of a
//! producer instance carries the same producer id and epoch, so (id, epoch) names the instance,
//! not one transaction. The transaction is found through the transaction log (`__transaction_state`,
//! `--transaction-log-decoder`): its PrepareCommit/PrepareAbort entry lists the partitions it
//! wrote, and the coordinator writes its markers between that entry and the CompleteCommit/
//! CompleteAbort that follows, before the producer's next transaction can end; on each partition
//! the transaction's records are that producer's records between its previous marker there and
//! the marker inside that window. (A Java client with transactions version 2 bumps the epoch at
//! every end instead: its markers carry epoch + 1; the same reading covers it.)
//!
//! The broker's log directory is found from the `scripts/stack` state whose broker advertises one
//! of the bootstrap addresses (the local stack's `.stack/`, or a chaos cluster's state directory
//! under `CARGO_TARGET_TMPDIR`); `PAGAMENTOS_KAFKA_LOG_DIRS` names it explicitly. Kafka 4 ships
//! `DumpLogSegments` in `kafka-tools` (`org.apache.kafka.tools.DumpLogSegments`), which the broker's
//! jars lack: `scripts/stack` installs it in a directory of its own beside them
//! (`PAGAMENTOS_KAFKA_TOOLS_JAR` names another). Nothing here panics: it runs on a failing test's way out, so
//! every problem is an `Err` or a note for the report.
//!
//! # Layout
//! - `segments`: DumpLogSegments' text parsed into partition logs of record batches.
//! - `broker`: where the broker keeps its logs, and DumpLogSegments run on them.
//! - `transactions`: offset commits, transaction ends and what a transaction wrote, read from
//!   the parsed logs.
//! - here: [`Evidence`] gathered from a broker, and the commit [`Passing`] a lost request.

// `#[path]`: `tests/loss_diagnosis.rs` includes this file through a `#[path]` of its own, and
// there a plain `mod` here would be looked for beside it (`common/chaos/`), not in `dump/`
#[path = "dump/broker.rs"]
mod broker;
#[path = "dump/segments.rs"]
mod segments;
#[path = "dump/transactions.rs"]
mod transactions;

pub use broker::{Broker, Decoding};
// each test binary including this file uses only some of these
#[allow(unused_imports)]
pub use segments::{parse, Batch, Log, Record};
pub use transactions::{
    offset_commits, transaction_ends, written_in, Marker, OffsetCommit, TransactionEnd, Written,
};

use segments::partition_of;

const OFFSETS_TOPIC: &str = "__consumer_offsets";
const TRANSACTION_TOPIC: &str = "__transaction_state";

/// What the broker's logs say about one group's commits and one producer's outputs.
#[derive(Debug, Default)]
pub struct Evidence {
    pub offsets: Vec<Log>,
    pub transactions: Vec<Log>,
    pub outputs: Vec<Log>,
    /// What could not be read (each a line for the report).
    pub notes: Vec<String>,
}

/// The transactional commit of `group` on `topic`/`partition` that first moved the committed
/// offset past `offset`, and what its transaction wrote.
#[derive(Debug)]
pub struct Passing {
    pub commit: OffsetCommit,
    /// The group's committed offset on the partition just before it took effect (`None`: none).
    pub previous: Option<i64>,
    pub transaction: Option<TransactionEnd>,
    /// Per output partition the transaction wrote: its marker and records there.
    pub outputs: Vec<(String, Marker, Vec<Written>)>,
    pub notes: Vec<String>,
}

impl Evidence {
    /// Dumps `__consumer_offsets`, `__transaction_state` and the `outputs` topics of the broker
    /// at `bootstrap`; what fails becomes a note.
    pub async fn gather(bootstrap: &str, outputs: &[String]) -> Self {
        let mut evidence = Self::default();
        let broker = match Broker::locate(bootstrap) {
            Ok(broker) => broker,
            Err(error) => {
                evidence.notes.push(error);
                return evidence;
            }
        };
        evidence.notes.push(format!("reading the broker's log directories {:?}", broker.log_dirs));
        match broker.dump_topic(OFFSETS_TOPIC, Decoding::Offsets).await {
            Ok(logs) if logs.is_empty() => evidence.notes.push(format!("no {OFFSETS_TOPIC} partition there")),
            Ok(logs) => evidence.offsets = logs,
            Err(error) => evidence.notes.push(error),
        }
        match broker.dump_topic(TRANSACTION_TOPIC, Decoding::TransactionLog).await {
            Ok(logs) => evidence.transactions = logs,
            Err(error) => evidence.notes.push(error),
        }
        for topic in outputs {
            match broker.dump_topic(topic, Decoding::Data).await {
                Ok(logs) if logs.is_empty() => evidence.notes.push(format!("no partition of {topic} there")),
                Ok(logs) => evidence.outputs.extend(logs),
                Err(error) => evidence.notes.push(error),
            }
        }
        evidence
    }

    /// The commit that passed `offset` on `topic`/`partition` for `group` (see [`Passing`]):
    /// the first, in the order they took effect, whose offset is greater than `offset`.
    pub fn passing(&self, group: &str, topic: &str, partition: i32, offset: i64) -> Result<Passing, String> {
        let mut commits: Vec<OffsetCommit> = offset_commits(&self.offsets, group, topic)
            .into_iter()
            .filter(|commit| commit.partition == partition && commit.effective().is_some())
            .collect();
        commits.sort_by_key(|commit| (commit.log.clone(), commit.effective()));
        let Some(index) =
            commits.iter().position(|commit| commit.offset.is_some_and(|committed| committed > offset))
        else {
            return Err(format!(
                "no committed offset commit of {group} on {topic}/{partition} past {offset} in {OFFSETS_TOPIC} \
                 ({} took effect there; compacted away?)",
                commits.len()
            ));
        };
        let commit = commits[index].clone();
        let previous = index.checked_sub(1).and_then(|before| commits[before].offset);
        let mut passing =
            Passing { commit, previous, transaction: None, outputs: Vec::new(), notes: Vec::new() };
        let commit = &passing.commit;
        let Some(end) = commit.end.clone() else {
            passing.notes.push("a plain (non-transactional) commit: no transaction wrote it".into());
            return Ok(passing);
        };
        let (offsets_topic, offsets_partition) = partition_of(&commit.log).unwrap_or((OFFSETS_TOPIC, -1));
        let offsets_partition = (offsets_topic.to_owned(), offsets_partition);
        let ends = transaction_ends(&self.transactions);
        let candidates: Vec<&TransactionEnd> = ends
            .iter()
            .filter(|txn| {
                txn.producer_id == commit.producer_id && txn.partitions.contains(&offsets_partition)
            })
            .filter(|txn| txn.covers(end.time))
            .collect();
        let transaction = match candidates.as_slice() {
            [one] => Some((*one).clone()),
            [] => {
                passing.notes.push(format!(
                    "no entry of producer id {} in {TRANSACTION_TOPIC} ends a transaction around its marker \
                     (written at {}): its outputs are taken by marker time alone",
                    commit.producer_id, end.time
                ));
                None
            }
            several => {
                passing.notes.push(format!(
                    "{} transaction ends of producer id {} around its marker; taking the first",
                    several.len(),
                    commit.producer_id
                ));
                Some(several[0].clone())
            }
        };
        for log in &self.outputs {
            let wrote = match &transaction {
                Some(txn) => {
                    if !txn.partitions.contains(&(log.topic.clone(), log.partition)) {
                        continue;
                    }
                    written_in(log, commit.producer_id, &|time: i64| txn.covers(time))
                }
                None => written_in(log, commit.producer_id, &|time: i64| (time - end.time).abs() <= 5),
            };
            match wrote {
                Some((marker, written)) => passing.outputs.push((log.name.clone(), marker, written)),
                None if transaction.is_some() => passing.notes.push(format!(
                    "the transaction wrote {} but no marker of producer id {} lies in its window there",
                    log.name, commit.producer_id
                )),
                None => {}
            }
        }
        passing.transaction = transaction;
        Ok(passing)
    }
}

impl Passing {
    /// The report's lines; `transfer`: the lost transfer's id, looked for among the outputs.
    pub fn report(&self, transfer: Option<&str>) -> Vec<String> {
        let commit = &self.commit;
        let mut lines = vec![format!(
            "commit that passed it: {}/{} offset {} (previous committed {}: the commit claims [{}, {})), \
             {} at {}/{}, producer id {} epoch {}, {}",
            commit.topic,
            commit.partition,
            commit.offset.map_or("none".into(), |offset| offset.to_string()),
            self.previous.map_or("none".into(), |offset| offset.to_string()),
            self.previous.map_or("?".into(), |offset| offset.to_string()),
            commit.offset.map_or("?".into(), |offset| offset.to_string()),
            if commit.transactional { "TxnOffsetCommit" } else { "OffsetCommit" },
            commit.log,
            commit.at,
            commit.producer_id,
            commit.producer_epoch,
            match &commit.end {
                Some(marker) => format!(
                    "ended by {} marker at {}/{} (epoch {}, written at {})",
                    marker.kind, commit.log, marker.offset, marker.epoch, marker.time
                ),
                None => "no marker".into(),
            }
        )];
        if let Some(txn) = &self.transaction {
            lines.push(format!(
                "its transaction: transactional.id {}, {} of {:?} (prepared at {}, completed at {})",
                txn.transactional_id,
                if txn.commit { "commit" } else { "abort" },
                txn.partitions
                    .iter()
                    .map(|(topic, partition)| format!("{topic}-{partition}"))
                    .collect::<Vec<_>>(),
                txn.prepared_at,
                txn.completed_at.map_or("never".into(), |time| time.to_string())
            ));
        }
        let mut found = false;
        for (log, marker, written) in &self.outputs {
            let transfers: Vec<String> = written
                .iter()
                .map(|record| {
                    let id = record.transfer().unwrap_or_else(|| format!("? ({})", record.payload));
                    found |= transfer.is_some_and(|transfer| id == transfer);
                    format!("{}:{id}", record.offset)
                })
                .collect();
            lines.push(format!(
                "it wrote {} record(s) on {log} ({} marker at {}): {transfers:?}",
                written.len(),
                marker.kind,
                marker.offset
            ));
        }
        if self.outputs.is_empty() {
            lines.push("it wrote no record on the output topics".into());
        }
        if let Some(transfer) = transfer {
            lines.push(format!(
                "lost transfer {transfer} {} among that transaction's outputs",
                if found { "IS" } else { "is NOT" }
            ));
        }
        lines.extend(self.notes.iter().map(|note| format!("note: {note}")));
        lines
    }
}
