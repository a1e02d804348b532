//! An in-memory broker behind [`Client`]: one input topic `in`, a consumer group with one
//! member under test, its transactional producer, and faults injected before the n-th call of
//! an operation. It behaves as the loop must expect of a real client, not as the loop would
//! like: the broker accepts offsets for a partition the member lost (it checks the member
//! epoch, read at `send_offsets`, not ownership), a refused unassign keeps the fetch position,
//! a partition can come back with its fetcher past records, a commit can apply while its
//! answer is lost, a committed offset can be unreadable, and the log has holes: offsets that
//! hold no readable record (transaction markers, aborted records, compacted or deleted
//! ranges), which the fetcher steps over as a real consumer does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use rdkafka::message::{OwnedMessage, Timestamp};
use tokio_util::sync::CancellationToken;

use super::{Bounds, Client, Committed, Partition, Recovery, TxnError};
use crate::producer::OutgoingRecord;
use crate::Error;

pub(super) const TOPIC: &str = "in";

/// A fault, applied once, before the `nth` call (from 1) of operation `op`.
#[derive(Debug, Clone)]
pub(super) enum Fault {
    /// The call fails with `recovery`; a failed `send` leaves the transaction abortable only.
    Fail { op: &'static str, nth: usize, recovery: Recovery },
    /// The commit applies at the broker, then its answer is lost `times` times: this commit
    /// call and the next `times - 1` fail retriably, later ones succeed (as librdkafka
    /// answers a commit retried after it went through).
    CommitAnswerLost { nth: usize, times: u32 },
    /// The commit reaches the coordinator but its answer does not come (a timeout): the
    /// transaction completes later, when a new producer registering the `transactional.id`
    /// waits for it; until then every commit call times out again and an abort is refused.
    CommitLate { nth: usize },
    /// A newer instance with the same `transactional.id` fences the producer (and aborts its
    /// open transaction): every transactional call fails until the producer is renewed.
    Fence { op: &'static str, nth: usize },
    /// `partition` is revoked and comes back (the clock ticks); meanwhile another member
    /// analyses it to its end and commits, if `other_member_commits`. The fetch position is
    /// kept (a refused unassign) if `keep_position`, else reset to the committed offset.
    Rebalance {
        op: &'static str,
        nth: usize,
        partition: i32,
        other_member_commits: bool,
        keep_position: bool,
    },
    /// `partition` is revoked and given back (the clock ticks) with its fetcher `by` offsets
    /// past the group's committed offset: a fetch position the client did not reset.
    Skip { op: &'static str, nth: usize, partition: i32, by: i64 },
    /// The `nth` committed-offsets read answers for `partition` with an error of its own
    /// (`UNSTABLE_OFFSET_COMMIT`), the other partitions with their offsets.
    Unreadable { nth: usize, partition: i32 },
}

impl Fault {
    fn at(&self) -> (&'static str, usize) {
        match self {
            Self::Fail { op, nth, .. }
            | Self::Fence { op, nth }
            | Self::Rebalance { op, nth, .. }
            | Self::Skip { op, nth, .. } => (op, *nth),
            Self::CommitAnswerLost { nth, .. } | Self::CommitLate { nth } => ("commit", *nth),
            Self::Unreadable { nth, .. } => ("committed", *nth),
        }
    }
}

#[derive(Debug, Default)]
struct Txn {
    outputs: Vec<(Partition, i64)>,
    offsets: Vec<(Partition, i64)>,
    /// A send failed: only an abort ends it.
    abortable: bool,
}

#[derive(Debug, Default)]
pub(super) struct Inner {
    /// Records per partition of `in`: the offset after the last.
    pub ends: BTreeMap<Partition, i64>,
    /// Offsets that hold no readable record (markers, aborted, compacted): never delivered.
    pub holes: BTreeSet<(Partition, i64)>,
    /// The first offset still in each partition's log (retention deleted what lies below).
    pub starts: BTreeMap<Partition, i64>,
    /// The partition whose committed offset the pending read cannot read.
    unreadable: Option<Partition>,
    /// The last renew failed (a broker away): receives meanwhile are counted.
    renew_failing: bool,
    /// Receives made while renew was failing (the consumer polled through an outage).
    pub receives_while_renew_failing: usize,
    pub assigned: BTreeSet<Partition>,
    position: BTreeMap<Partition, i64>,
    pub committed: BTreeMap<Partition, i64>,
    /// Every committed output: the input record it was made from.
    pub outputs: Vec<(Partition, i64)>,
    txn: Option<Txn>,
    /// Whether the member under test has a producer registered (and not fenced).
    producer: bool,
    /// The next commit applies, then its answer is lost this many times.
    lose_answers: Option<u32>,
    /// The last commit went through but its caller was not told.
    unanswered: bool,
    lost_answers: u32,
    /// The next commit reaches the coordinator but is not answered.
    commit_late: bool,
    /// The open transaction's commit is with the coordinator, its answer not come.
    late: bool,
    /// The coordinator fenced the member (it gave a partition away without the member's
    /// acknowledgement): its offsets are refused until it polls again.
    member_fenced: bool,
    clock: u64,
    /// The clock's tick of each partition's last revocation.
    pub revoked_at: BTreeMap<Partition, u64>,
    pub calls: BTreeMap<&'static str, usize>,
    faults: Vec<Fault>,
    next: usize,
}

impl Inner {
    /// The faults due before this call of `op`.
    fn call(&mut self, op: &'static str) -> Vec<Fault> {
        let count = self.calls.entry(op).or_default();
        *count += 1;
        let nth = *count;
        let (due, rest) =
            std::mem::take(&mut self.faults).into_iter().partition(|fault| fault.at() == (op, nth));
        self.faults = rest;
        due
    }

    fn fenced(&self) -> Result<(), TxnError> {
        if self.producer {
            Ok(())
        } else {
            Err(txn_error(Recovery::NewProducer, "producer fenced or not registered"))
        }
    }

    /// Applies the faults due before `op`; returns the failure one of them injects.
    fn inject(&mut self, op: &'static str) -> Option<Recovery> {
        if op == "receive" {
            self.member_fenced = false; // a poll re-joins the group
        }
        let mut failure = None;
        for fault in self.call(op) {
            match fault {
                Fault::Fail { recovery, .. } => failure = Some(recovery),
                Fault::CommitAnswerLost { times, .. } => {
                    assert!(times > 0, "an answer lost at least once");
                    self.lose_answers = Some(times);
                }
                Fault::CommitLate { .. } => self.commit_late = true,
                Fault::Fence { .. } => {
                    // the newer instance's registration waits for a commit under way
                    self.complete_late();
                    self.producer = false;
                    self.txn = None;
                }
                Fault::Rebalance { partition, other_member_commits, keep_position, .. } => {
                    let partition = Partition::new(TOPIC, partition);
                    self.clock += 1;
                    self.revoked_at.insert(partition.clone(), self.clock);
                    // outside a poll the member cannot have acknowledged the revocation: the
                    // coordinator gave its partition away because it fenced the member, whose
                    // next offsets it refuses until the member polls (and joins) again
                    if op != "receive" {
                        self.member_fenced = true;
                    }
                    // offsets of this member's open transaction are pending: the other member's
                    // committed-offset read (require_stable) waits for them, so it has not
                    // started when the partition comes back
                    let pending = self
                        .txn
                        .as_ref()
                        .is_some_and(|txn| txn.offsets.iter().any(|(sent, _)| *sent == partition));
                    if other_member_commits && !pending {
                        let from = self.committed.get(&partition).copied().unwrap_or(0);
                        let end = self.ends[&partition];
                        let read = self.readable(&partition).into_iter().filter(|offset| *offset >= from);
                        self.outputs.extend(read.map(|offset| (partition.clone(), offset)));
                        self.committed.insert(partition.clone(), end);
                    }
                    if !keep_position {
                        let committed = self.committed.get(&partition).copied().unwrap_or(0);
                        self.position.insert(partition, committed);
                    }
                }
                Fault::Skip { partition, by, .. } => {
                    let partition = Partition::new(TOPIC, partition);
                    self.clock += 1;
                    self.revoked_at.insert(partition.clone(), self.clock);
                    if op != "receive" {
                        self.member_fenced = true;
                    }
                    let committed = self.committed.get(&partition).copied().unwrap_or(0);
                    self.position.insert(partition, committed + by);
                }
                Fault::Unreadable { partition, .. } => {
                    self.unreadable = Some(Partition::new(TOPIC, partition));
                }
            }
        }
        failure
    }

    /// Completes a commit the coordinator has (a producer registering the id waits for it).
    fn complete_late(&mut self) {
        if std::mem::take(&mut self.late) {
            let txn = self.txn.take().expect("a late commit has its transaction");
            self.outputs.extend(txn.outputs);
            for (partition, offset) in txn.offsets {
                self.committed.insert(partition, offset);
            }
        }
    }

    /// The readable records of `partition`: in its log, not a hole.
    pub fn readable(&self, partition: &Partition) -> Vec<i64> {
        let start = self.starts.get(partition).copied().unwrap_or(0);
        (start..self.ends[partition])
            .filter(|offset| !self.holes.contains(&(partition.clone(), *offset)))
            .collect()
    }

    /// Where a partition is done: past its last readable record (what the loop commits).
    pub fn readable_end(&self, partition: &Partition) -> i64 {
        self.readable(partition).last().map_or(0, |last| last + 1)
    }

    /// Everything read and committed, no transaction open.
    fn done(&self) -> bool {
        self.txn.is_none()
            && self.ends.keys().all(|partition| {
                let readable_end = self.readable_end(partition);
                readable_end == 0
                    || self.committed.get(partition).is_some_and(|committed| *committed >= readable_end)
            })
    }
}

fn txn_error(recovery: Recovery, what: &str) -> TxnError {
    TxnError { recovery, source: Error::Fatal(what.to_owned().into()) }
}

fn failure(recovery: Recovery, op: &str) -> TxnError {
    txn_error(recovery, &format!("injected {op} failure"))
}

/// What a partition's log holds besides records: per partition number, holes (offsets with
/// no readable record), a log start (offsets below it deleted) and a committed offset from
/// before the test.
#[derive(Debug, Clone, Default)]
pub(super) struct Log {
    pub holes: Vec<(i32, i64)>,
    pub starts: BTreeMap<i32, i64>,
    pub committed: BTreeMap<i32, i64>,
}

/// The broker, shared by the client under test and the test.
#[derive(Clone)]
pub(super) struct Fake {
    pub inner: Arc<Mutex<Inner>>,
    /// Cancelled once everything is committed (the test's end), or by a livelock guard.
    pub shutdown: CancellationToken,
    receive_limit: usize,
}

impl Fake {
    /// `partitions` partitions of `records` records each, all assigned to the member, and
    /// `faults` to inject.
    pub fn new(partitions: i32, records: i64, faults: Vec<Fault>) -> Self {
        Self::with_log(partitions, records, &Log::default(), faults)
    }

    /// As [`Fake::new`], with `log`'s holes, deleted ranges and earlier commits.
    pub fn with_log(partitions: i32, records: i64, log: &Log, faults: Vec<Fault>) -> Self {
        let mut inner = Inner { faults, ..Inner::default() };
        for partition in 0..partitions {
            let partition = Partition::new(TOPIC, partition);
            inner.ends.insert(partition.clone(), records);
            inner.assigned.insert(partition.clone());
            let start = log.starts.get(&partition.partition).copied().unwrap_or(0);
            inner.starts.insert(partition.clone(), start);
            for hole in log.holes.iter().filter(|(of, _)| *of == partition.partition) {
                inner.holes.insert((partition.clone(), hole.1));
            }
            // the client positions the partition at the committed offset, or (out of range,
            // auto.offset.reset=earliest) at the log start
            let position = match log.committed.get(&partition.partition) {
                Some(&committed) => {
                    inner.committed.insert(partition.clone(), committed);
                    if (start..=records).contains(&committed) {
                        committed
                    } else {
                        start
                    }
                }
                None => start,
            };
            inner.position.insert(partition, position);
        }
        let receive_limit = (partitions as usize * records as usize + 1) * 50;
        Self { inner: Arc::new(Mutex::new(inner)), shutdown: CancellationToken::new(), receive_limit }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("fake broker")
    }

    /// Faults that never came due (a test whose fault did not fire proves nothing).
    pub fn unfired(&self) -> Vec<Fault> {
        self.lock().faults.clone()
    }

    fn record(partition: &Partition, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            Some(format!("{}/{offset}", partition.partition).into_bytes()),
            None,
            partition.topic.clone(),
            Timestamp::NotAvailable,
            partition.partition,
            offset,
            None,
        )
    }
}

/// The input record an output was made from: its payload is `partition/offset`.
fn source(record: &OutgoingRecord) -> (Partition, i64) {
    let text = std::str::from_utf8(&record.payload).expect("utf-8");
    let (partition, offset) = text.split_once('/').expect("partition/offset");
    (Partition::new(TOPIC, partition.parse().expect("partition")), offset.parse().expect("offset"))
}

impl Client for Fake {
    fn group(&self) -> &str {
        "fake"
    }

    async fn receive(&mut self) -> Result<OwnedMessage, Error> {
        let next = {
            let mut inner = self.lock();
            inner.inject("receive");
            if inner.renew_failing {
                inner.receives_while_renew_failing += 1;
            }
            let received = inner.calls["receive"];
            assert!(received < self.receive_limit, "livelock: {received} receives without finishing");
            let assigned: Vec<Partition> = inner.assigned.iter().cloned().collect();
            let mut found = None;
            // round robin over the partitions with records left
            for step in 0..assigned.len() {
                let partition = &assigned[(inner.next + step) % assigned.len()];
                let mut position = inner.position[partition].max(inner.starts[partition]);
                // the fetcher steps over what holds no readable record
                while position < inner.ends[partition] && inner.holes.contains(&(partition.clone(), position))
                {
                    position += 1;
                }
                inner.position.insert(partition.clone(), position);
                if position < inner.ends[partition] {
                    inner.position.insert(partition.clone(), position + 1);
                    found = Some(Fake::record(partition, position));
                    inner.next = (inner.next + step + 1) % assigned.len();
                    break;
                }
            }
            if found.is_none() && inner.done() {
                self.shutdown.cancel();
            }
            found
        };
        match next {
            Some(record) => Ok(record),
            None => std::future::pending().await,
        }
    }

    fn rebalances(&self) -> u64 {
        self.lock().clock
    }

    async fn begin(&mut self) -> Result<(), TxnError> {
        let mut inner = self.lock();
        if let Some(recovery) = inner.inject("begin") {
            return Err(failure(recovery, "begin"));
        }
        inner.fenced()?;
        if inner.txn.is_some() {
            return Err(txn_error(Recovery::NewProducer, "a transaction is already open"));
        }
        inner.unanswered = false;
        inner.txn = Some(Txn::default());
        Ok(())
    }

    async fn send(&mut self, records: &[OutgoingRecord]) -> Result<(), TxnError> {
        let mut inner = self.lock();
        let injected = inner.inject("send");
        inner.fenced()?;
        let txn =
            inner.txn.as_mut().ok_or_else(|| txn_error(Recovery::NewProducer, "no open transaction"))?;
        if let Some(recovery) = injected {
            txn.abortable = true;
            return Err(failure(recovery, "send"));
        }
        txn.outputs.extend(records.iter().map(source));
        Ok(())
    }

    async fn send_offsets(&mut self, next: &[(Partition, i64)]) -> Result<(), TxnError> {
        let mut inner = self.lock();
        let injected = inner.inject("send_offsets");
        inner.fenced()?;
        let member_fenced = inner.member_fenced;
        let txn =
            inner.txn.as_mut().ok_or_else(|| txn_error(Recovery::NewProducer, "no open transaction"))?;
        if let Some(recovery) = injected {
            txn.abortable = true;
            return Err(failure(recovery, "send_offsets"));
        }
        if member_fenced {
            txn.abortable = true;
            return Err(txn_error(Recovery::Abort, "FENCED_MEMBER_EPOCH"));
        }
        // no ownership check: the coordinator checks the member epoch, not the partitions
        txn.offsets.extend(next.iter().cloned());
        Ok(())
    }

    async fn commit(&mut self) -> Result<(), TxnError> {
        let mut inner = self.lock();
        let injected = inner.inject("commit");
        if inner.late {
            return Err(failure(Recovery::Retry, "commit (timed out, still with the coordinator)"));
        }
        if inner.unanswered {
            // called again after it went through: its answer is lost again, or it succeeds
            if inner.lost_answers > 0 {
                inner.lost_answers -= 1;
                return Err(failure(Recovery::Retry, "commit (answer lost)"));
            }
            inner.unanswered = false;
            return Ok(());
        }
        inner.fenced()?;
        if let Some(recovery) = injected {
            if let Some(txn) = inner.txn.as_mut() {
                txn.abortable |= recovery == Recovery::Abort;
            }
            return Err(failure(recovery, "commit"));
        }
        let txn = inner.txn.take().ok_or_else(|| txn_error(Recovery::NewProducer, "no open transaction"))?;
        if txn.abortable {
            inner.txn = Some(txn);
            return Err(txn_error(Recovery::Abort, "the transaction must be aborted"));
        }
        if std::mem::take(&mut inner.commit_late) {
            inner.late = true;
            inner.txn = Some(txn);
            return Err(failure(Recovery::Retry, "commit (timed out, still with the coordinator)"));
        }
        inner.outputs.extend(txn.outputs);
        for (partition, offset) in txn.offsets {
            inner.committed.insert(partition, offset);
        }
        if let Some(times) = inner.lose_answers.take() {
            inner.unanswered = true;
            inner.lost_answers = times - 1;
            return Err(failure(Recovery::Retry, "commit (answer lost)"));
        }
        Ok(())
    }

    async fn abort(&mut self) -> Result<(), TxnError> {
        let mut inner = self.lock();
        if let Some(recovery) = inner.inject("abort") {
            return Err(failure(recovery, "abort"));
        }
        inner.fenced()?;
        if inner.late {
            return Err(txn_error(Recovery::NewProducer, "abort refused: a commit is under way"));
        }
        inner.txn = None;
        inner.unanswered = false;
        Ok(())
    }

    async fn renew(&mut self) -> Result<(), Error> {
        let mut inner = self.lock();
        if inner.inject("renew").is_some() {
            inner.renew_failing = true;
            return Err(Error::Fatal("injected renew failure".into()));
        }
        inner.renew_failing = false;
        // registering the transactional id again waits for a commit the coordinator already
        // has, and aborts whatever else the old producer left open
        inner.complete_late();
        inner.txn = None;
        inner.unanswered = false;
        inner.producer = true;
        Ok(())
    }

    fn assignment(&mut self) -> Result<Vec<Partition>, Error> {
        Ok(self.lock().assigned.iter().cloned().collect())
    }

    async fn committed(&mut self, partitions: &[Partition]) -> Result<Vec<(Partition, Committed)>, Error> {
        let mut inner = self.lock();
        if inner.inject("committed").is_some() {
            return Err(Error::Fatal("injected committed failure".into()));
        }
        let unreadable = inner.unreadable.take();
        Ok(partitions
            .iter()
            .map(|partition| {
                let offset = if unreadable.as_ref() == Some(partition) {
                    Err(Error::Fatal("UNSTABLE_OFFSET_COMMIT (injected)".into()))
                } else {
                    Ok(inner.committed.get(partition).copied())
                };
                (partition.clone(), offset)
            })
            .collect())
    }

    async fn bounds(&mut self, partitions: &[Partition]) -> Result<Vec<(Partition, Bounds)>, Error> {
        let inner = self.lock();
        Ok(partitions
            .iter()
            .map(|partition| {
                (partition.clone(), Bounds { start: inner.starts[partition], end: inner.ends[partition] })
            })
            .collect())
    }

    async fn seek(&mut self, positions: &[(Partition, i64)]) -> Result<(), Error> {
        let mut inner = self.lock();
        if inner.inject("seek").is_some() {
            return Err(Error::Fatal("injected seek failure".into()));
        }
        for (partition, offset) in positions {
            if !inner.assigned.contains(partition) {
                return Err(Error::Fatal(format!("seek of {partition}, not assigned").into()));
            }
            inner.position.insert(partition.clone(), *offset);
        }
        Ok(())
    }
}
