//! What became of each record of a handled batch: the handler's verdicts read in order
//! ([`walk`]) and the batch split by them ([`sort`]).

use rdkafka::message::{Message, OwnedMessage};

use super::batch::Batch;
use super::io::Route;
use super::publish::Output;
#[allow(unused_imports)] // named by the docs
use super::verdict::Handler;
use super::verdict::{Forward, ForwardKind, LoopOptions, Verdict};
use crate::context::Revocations;
use crate::dead_letter::Failure;
use crate::Error;

/// What became of one record of a batch, read from the handler's verdicts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fate {
    Done,
    DeadLetter(Failure),
    Forward(Forward),
    /// Held until the instant: the record said [`Verdict::NotBefore`], or an earlier one of its
    /// partition did.
    Held(tokio::time::Instant),
    /// Handed to the handler again: the record to retry and those after it (or records the
    /// handler gave no verdict).
    Again,
}

/// A handler's verdicts on a batch, read in order.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Walk {
    /// One per record of the batch.
    pub(super) fates: Vec<Fate>,
    /// The index and failure of the record to retry: the first [`Verdict::Retry`] not in a
    /// held partition. Every record after it that is not held is [`Fate::Again`].
    pub(super) retry: Option<(usize, Failure)>,
}

/// The handler broke [`Handler::handle`]'s contract.
#[derive(Debug, thiserror::Error)]
#[error(
    "the handler returned {verdicts} verdicts for {records} records (fewer only when the last is a retry)"
)]
pub(super) struct VerdictCount {
    verdicts: usize,
    records: usize,
}

pub(super) fn walk(records: &[OwnedMessage], verdicts: Vec<Verdict>) -> Result<Walk, VerdictCount> {
    let (count, len) = (verdicts.len(), records.len());
    let last_is_retry = matches!(verdicts.last(), Some(Verdict::Retry(_)));
    if count > len || (count < len && !last_is_retry) {
        return Err(VerdictCount { verdicts: count, records: len });
    }
    let mut held: Vec<((&str, i32), tokio::time::Instant)> = Vec::new();
    let mut fates = Vec::with_capacity(len);
    let mut retry = None;
    let mut verdicts = verdicts.into_iter();
    for (index, record) in records.iter().enumerate() {
        let verdict = verdicts.next();
        let key = (record.topic(), record.partition());
        // behind a record of its partition that is not due: whatever its verdict says
        if let Some((_, due)) = held.iter().find(|(held, _)| *held == key) {
            fates.push(Fate::Held(*due));
            continue;
        }
        if retry.is_some() {
            fates.push(Fate::Again);
            continue;
        }
        fates.push(match verdict {
            Some(Verdict::Done) => Fate::Done,
            Some(Verdict::DeadLetter(failure)) => Fate::DeadLetter(failure),
            Some(Verdict::Forward(forward)) => Fate::Forward(forward),
            Some(Verdict::NotBefore(due)) => {
                held.push((key, due));
                Fate::Held(due)
            }
            Some(Verdict::Retry(failure)) => {
                retry = Some((index, failure));
                Fate::Again
            }
            None => Fate::Again,
        });
    }
    Ok(Walk { fates, retry })
}

/// A batch split by the fates of its records.
pub(super) struct Sorted {
    /// Done, dead-lettered or forwarded: stored once `outputs` are acknowledged.
    pub(super) finished: Batch,
    /// (index in `finished`, what to publish for it).
    pub(super) outputs: Vec<(usize, Pending)>,
    /// Per partition: when its first held record is due, and the held records.
    pub(super) held_now: Vec<((String, i32), tokio::time::Instant, Batch)>,
    /// To hand to the handler again, in order.
    pub(super) again: Batch,
    /// Records dropped: their partition was revoked while the handler ran.
    pub(super) revoked: usize,
}

/// An output before it is tied to its record.
pub(super) enum Pending {
    DeadLetter(Failure),
    Forward(Forward),
}

impl Pending {
    pub(super) fn from(self, source: &OwnedMessage, taken: u64) -> Output<'_> {
        match self {
            Pending::DeadLetter(failure) => Output {
                source,
                taken,
                record: None,
                route: Route::DeadLetters,
                kind: ForwardKind::DeadLetter,
                failure: Some(failure),
                reason: String::new(),
            },
            Pending::Forward(forward) => Output {
                source,
                taken,
                record: Some(forward.record),
                route: Route::Forwards,
                kind: forward.kind,
                failure: None,
                reason: forward.reason,
            },
        }
    }
}

pub(super) fn sort(
    batch: Batch,
    fates: Vec<Fate>,
    revocations: &Revocations,
    options: &LoopOptions,
) -> Result<Sorted, Error> {
    let mut sorted = Sorted {
        finished: Batch::default(),
        outputs: Vec::new(),
        held_now: Vec::new(),
        again: Batch::default(),
        revoked: 0,
    };
    for ((record, taken), fate) in batch.records.into_iter().zip(batch.taken).zip(fates) {
        if revocations.revoked_since(record.topic(), record.partition(), taken) {
            sorted.revoked += 1;
            continue;
        }
        let pending = match fate {
            Fate::Again => {
                sorted.again.push((record, taken));
                continue;
            }
            Fate::Held(due) => {
                let key = (record.topic().to_owned(), record.partition());
                match sorted.held_now.iter_mut().find(|(held, _, _)| *held == key) {
                    Some((_, _, records)) => records.push((record, taken)),
                    None => {
                        let mut records = Batch::default();
                        records.push((record, taken));
                        sorted.held_now.push((key, due, records));
                    }
                }
                continue;
            }
            Fate::Done => None,
            Fate::DeadLetter(failure) => {
                if options.dead_letters.is_none() {
                    return Err(Error::Fatal(
                        "the handler dead-lettered a record but the loop has no dead-letter publisher".into(),
                    ));
                }
                Some(Pending::DeadLetter(failure))
            }
            Fate::Forward(forward) => {
                if options.forwards.is_none() {
                    return Err(Error::Fatal(
                        "the handler forwarded a record but the loop has no producer for forwards".into(),
                    ));
                }
                Some(Pending::Forward(forward))
            }
        };
        if let Some(pending) = pending {
            sorted.outputs.push((sorted.finished.records.len(), pending));
        }
        sorted.finished.push((record, taken));
    }
    Ok(sorted)
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn record(topic: &str, partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(None, None, topic.into(), rdkafka::Timestamp::NotAvailable, partition, offset, None)
    }

    fn failure(message: &str) -> Failure {
        Failure {
            exception_fqcn: "test::Failed".into(),
            cause_fqcn: "test::Cause".into(),
            message: message.into(),
            stacktrace: message.into(),
        }
    }

    #[test]
    fn verdicts_are_read_in_order_up_to_the_first_retry() {
        use Verdict::{DeadLetter, Done, Retry};
        let three = [record("a", 0, 1), record("a", 0, 2), record("a", 1, 3)];
        let walked = walk(&three, vec![Done, DeadLetter(failure("poison")), Done]).expect("complete");
        assert_eq!(
            walked,
            Walk { fates: vec![Fate::Done, Fate::DeadLetter(failure("poison")), Fate::Done], retry: None }
        );
        // a retry ends the walk: what follows it waits for it, whatever its verdict
        let walked = walk(&three, vec![Done, Retry(failure("busy")), Done]).expect("retry");
        assert_eq!(
            walked,
            Walk { fates: vec![Fate::Done, Fate::Again, Fate::Again], retry: Some((1, failure("busy"))) }
        );
        let walked = walk(&three, vec![Retry(failure("busy"))]).expect("a handler may stop at a retry");
        assert_eq!(walked.fates, [Fate::Again, Fate::Again, Fate::Again]);
        // too few verdicts without a retry, or too many: the handler is broken
        assert!(walk(&three[..2], vec![Done]).is_err());
        assert!(walk(&three[..1], vec![Done, Done]).is_err());
    }

    #[test]
    fn a_record_not_due_holds_the_rest_of_its_partition_and_nothing_else() {
        use Verdict::{Done, NotBefore, Retry};
        let due = tokio::time::Instant::now() + Duration::from_secs(4);
        let batch =
            [record("a", 0, 1), record("a", 1, 7), record("a", 0, 2), record("a", 1, 8), record("a", 0, 3)];
        // the verdicts behind a NotBefore of the same partition mean nothing, a retry included
        let walked =
            walk(&batch, vec![NotBefore(due), Done, Done, Done, Retry(failure("busy"))]).expect("walk");
        assert_eq!(
            walked,
            Walk {
                fates: vec![Fate::Held(due), Fate::Done, Fate::Held(due), Fate::Done, Fate::Held(due)],
                retry: None
            }
        );
        // a retry of another partition still holds back what follows it, except the held ones
        let walked = walk(&batch, vec![Done, NotBefore(due), Retry(failure("busy"))]).expect("walk");
        assert_eq!(
            walked,
            Walk {
                fates: vec![Fate::Done, Fate::Held(due), Fate::Again, Fate::Held(due), Fate::Again],
                retry: Some((2, failure("busy")))
            }
        );
    }
}
