//! What a handler says of each record ([`Verdict`]), the [`Handler`] trait, and the loop's
//! limits and retry schedules ([`LoopOptions`], [`RetryPolicy`], [`Backoff`]).

use std::future::Future;
use std::time::Duration;

use rdkafka::message::OwnedMessage;

use crate::dead_letter::{DeadLetterPublisher, Failure};
use crate::producer::{OutgoingRecord, Producer};
#[allow(unused_imports)] // named by the docs
use crate::Error;

/// What became of one record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Handled (its effects durable, or not needed).
    Done,
    /// Failed in a way a later attempt may fix: the runtime retries it after a backoff, in
    /// place, up to [`LoopOptions::record_retry`]'s cap, then dead-letters it with this failure.
    Retry(Failure),
    /// Can never be handled: the runtime publishes its dead letter with this failure.
    DeadLetter(Failure),
    /// Handled once this record is published: the runtime publishes it (with
    /// [`LoopOptions::forwards`]) and stores the offset only after the broker acknowledged it
    /// (a non-blocking retry through a retry topic, or a dead letter of the handler's own
    /// making).
    Forward(Forward),
    /// Not to be handled before this instant (a retry record whose backoff timestamp lies
    /// ahead). The runtime holds the record, and every later record of its partition, with only
    /// that partition paused; other partitions keep flowing and the consumer keeps being
    /// polled. At the instant it hands them to the handler again, in order. Nothing of them is
    /// stored meanwhile: a shutdown or a revocation leaves them to be redelivered.
    NotBefore(tokio::time::Instant),
}

/// What a [`Verdict::Forward`] publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub record: OutgoingRecord,
    /// What the forward counts as once acknowledged.
    pub kind: ForwardKind,
    /// Why the record was forwarded, for the log.
    pub reason: String,
}

/// How an acknowledged [`Forward`] is counted and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardKind {
    /// A later attempt elsewhere: `retries_total{topic}` of the source topic.
    Retry,
    /// A dead letter: `dlt_mensagens_total{topic}` of the destination.
    DeadLetter,
}

impl Verdict {
    /// `Done` for every record of `batch`.
    pub fn all_done(batch: &[OwnedMessage]) -> Vec<Verdict> {
        vec![Verdict::Done; batch.len()]
    }
}

/// What a handler does with a batch. Implementations make the effects of the records they
/// call [`Verdict::Done`] durable before returning.
pub trait Handler: Send {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Processes `batch` (records of any assigned partitions, in partition order) and returns
    /// one verdict per record, in order. A handler may stop at the first [`Verdict::Retry`]
    /// and return fewer verdicts: the records after it are handed again, after the retried
    /// one, so an account's records are never reordered (verdicts after the first `Retry` are
    /// ignored for the same reason). Likewise the verdicts after a [`Verdict::NotBefore`] of
    /// the same partition are ignored: those records wait behind it, so a handler must not act
    /// on them. `retrying` is true when the batch starts with a record
    /// that failed before (the ledger then settles one record per transaction). `Err` means
    /// nothing of the batch may be considered done (the database or broker is away): the
    /// whole batch is retried after a backoff, without a cap.
    fn handle(
        &mut self,
        batch: &[OwnedMessage],
        retrying: bool,
    ) -> impl Future<Output = Result<Vec<Verdict>, Self::Error>> + Send;

    /// `true` when `error` is one that no retry can fix and that is no record's fault (the
    /// service and its database disagree on the schema, say): the loop stops without storing
    /// the batch's offsets and returns [`Error::Fatal`], and the service shell then stops the
    /// process with a non-zero exit. Every other error is retried.
    fn is_fatal(&self, _error: &Self::Error) -> bool {
        false
    }
}

/// Blocking retries of one record that failed ([`Verdict::Retry`]).
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub backoff: Backoff,
    /// Retries after the first attempt before the record is dead-lettered.
    pub retries: u32,
}

impl Default for RetryPolicy {
    /// The reference article's error handler: 500 ms, doubling, at most 15 s, 5 retries.
    fn default() -> Self {
        Self { backoff: Backoff::default(), retries: 5 }
    }
}

impl RetryPolicy {
    /// After a failure of a record already retried `retried` times: the pause before the next
    /// retry, or `None` when the retries are used up (dead-letter it).
    pub fn after_failure(&self, retried: u32) -> Option<Duration> {
        (retried < self.retries).then(|| self.backoff.delay(retried + 1))
    }

    /// The longest a record can spend in its retries.
    pub fn worst_case(&self) -> Duration {
        (1..=self.retries).map(|attempt| self.backoff.delay(attempt)).sum()
    }
}

/// Exponential backoff of the blocking retries.
#[derive(Debug, Clone)]
pub struct Backoff {
    pub initial: Duration,
    pub multiplier: f64,
    pub max: Duration,
}

impl Backoff {
    /// The pause before retry number `attempt` (1 = the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.powi(attempt.saturating_sub(1).min(64) as i32);
        self.initial.mul_f64(factor).min(self.max)
    }
}

impl Default for Backoff {
    /// The reference article's handler: 500 ms, doubling, at most 15 s.
    fn default() -> Self {
        Self { initial: Duration::from_millis(500), multiplier: 2.0, max: Duration::from_secs(15) }
    }
}

/// Limits of the loop.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Most records handed to the handler at once.
    pub batch_records_max: usize,
    /// How long to keep filling a batch after its first record.
    pub batch_wait_max: Duration,
    /// Pauses between attempts at a batch whose handler returned `Err` (no cap).
    pub backoff: Backoff,
    /// Retries of a record the handler gave [`Verdict::Retry`], and their pauses.
    pub record_retry: RetryPolicy,
    /// Where [`Verdict::DeadLetter`] records (and records out of retries) go; a handler that
    /// returns such verdicts without one stops the loop ([`Error::Fatal`]).
    pub dead_letters: Option<DeadLetterPublisher>,
    /// Publishes the records of [`Verdict::Forward`]; a handler that forwards without one
    /// stops the loop ([`Error::Fatal`]).
    pub forwards: Option<Producer>,
}

impl Default for LoopOptions {
    fn default() -> Self {
        Self {
            batch_records_max: 500,
            batch_wait_max: Duration::from_millis(5),
            backoff: Backoff::default(),
            record_retry: RetryPolicy::default(),
            dead_letters: None,
            forwards: None,
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_retries_follow_the_articles_schedule_then_dead_letter() {
        let policy = RetryPolicy::default();
        let schedule: Vec<Option<u64>> =
            (0..=5).map(|retried| policy.after_failure(retried).map(|d| d.as_millis() as u64)).collect();
        assert_eq!(schedule, [Some(500), Some(1_000), Some(2_000), Some(4_000), Some(8_000), None]);
        assert_eq!(policy.worst_case(), Duration::from_millis(15_500));
        let none = RetryPolicy { retries: 0, ..RetryPolicy::default() };
        assert_eq!(none.after_failure(0), None);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let backoff = Backoff::default();
        assert_eq!(backoff.delay(1), Duration::from_millis(500));
        assert_eq!(backoff.delay(2), Duration::from_millis(1000));
        assert_eq!(backoff.delay(5), Duration::from_millis(8000));
        assert_eq!(backoff.delay(6), Duration::from_secs(15));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(15));
    }
}
