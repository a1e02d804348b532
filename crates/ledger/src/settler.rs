//! The settlement consumer (group `ledger`, topic `transferencias.analisada`).
//!
//! A batch is settled in one database transaction ([`store::settle`]); its offsets are stored
//! only after the commit (the consumer loop does that when the handler returns `Ok`), so a crash
//! between the two redelivers records whose business keys are already claimed: nothing moves
//! twice. Failures are told apart ([`FailureKind`]):
//! - a record that is not a valid `TransferenciaAnalisada` goes to `<topic>-dlt` at once;
//! - a transient failure of the batch (serialization failure, deadlock, lock timeout, a
//!   concurrent decision) makes the handler settle the batch again one record per transaction,
//!   in order, up to the first record that fails: its verdict is `Retry`, and the consumer
//!   runtime retries it in place with blocking exponential backoff (500 ms × 2 up to 15 s, 5
//!   retries, as the article; polling Kafka and watching shutdown meanwhile), then
//!   dead-letters it, and the next record goes on. Records are handled in order, so retries
//!   never reorder an account's transfers;
//! - a permanent failure of one record (e.g. a balance overflow) dead-letters it at once;
//! - the database lacking an object of its schema (a dropped or renamed table, an old backup
//!   restored: `StoreError::is_schema_missing`) is fatal: the loop stops without committing
//!   the batch, the process exits non-zero, nothing is dead-lettered;
//! - PostgreSQL unreachable is nobody's fault: the handler returns the error, the consumer
//!   loop waits and retries the whole batch (already settled records are no-ops), readiness
//!   reports the database down, and nothing is dead-lettered;
//! - but an "infrastructure" failure (a statement cancelled, an internal error, an error with
//!   no SQLSTATE) that one record meets [`INFRASTRUCTURE_FAILURES_MAX`] times in a row, each
//!   time while the database answers another statement, is that record's: it is
//!   dead-lettered with its cause ([`FailsAlone`]) instead of blocking its partition for ever.
//!
//! Dead letters (`DeadLetter` verdicts) are published by the runtime, after the database work
//! they follow has committed.

use std::time::{Duration, Instant};

use kafka::consumer::{Handler, Verdict};
use kafka::dead_letter::Failure;
use kafka::rdkafka::message::{Message, OwnedMessage};
use sqlx::PgPool;

use contracts::{AccountId, TransferAnalysed};

use crate::error::{FailureKind, StoreError};
use crate::settlement::{Outcome, Transfer};
use crate::store::{self, OutcomeTopics, Request};

/// `kafka_dlt-exception-fqcn` of a record that is not a valid `TransferenciaAnalisada`: the
/// type path of [`MalformedEvent`] (each of these names is held equal to its type's
/// `std::any::type_name` by a unit test, so it always names a type that exists).
pub const MALFORMED_EVENT: &str = "ledger::settler::MalformedEvent";
/// `kafka_dlt-exception-fqcn` of a record whose retries ran out: [`RetriesExhausted`].
pub const RETRIES_EXHAUSTED: &str = "ledger::settler::RetriesExhausted";
/// `kafka_dlt-exception-fqcn` of a record that can never be applied: [`Unprocessable`].
pub const UNPROCESSABLE: &str = "ledger::settler::Unprocessable";

/// `kafka_dlt-exception-fqcn` of a record that kept failing alone: [`FailsAlone`].
pub const FAILS_ALONE: &str = "ledger::settler::FailsAlone";

/// Attempts in a row at one record that fail as if the database were away while it answers
/// other statements, before the record is taken as the cause and dead-lettered. With the
/// runtime's back-off (500 ms doubling up to 15 s) that is about a minute and a half.
pub const INFRASTRUCTURE_FAILURES_MAX: u32 = 10;

/// A record that failed as if the database were away, [`INFRASTRUCTURE_FAILURES_MAX`] times in
/// a row, each time while the database answered another statement: its dead letter's exception.
#[derive(Debug, thiserror::Error)]
#[error("failed {attempts} times in a row while the database answered other statements")]
pub struct FailsAlone {
    pub attempts: u32,
    #[source]
    pub source: StoreError,
}

/// A record that failed transiently until its retries ran out: its dead letter's exception.
#[derive(Debug, thiserror::Error)]
#[error("retries exhausted")]
pub struct RetriesExhausted(#[source] pub StoreError);

/// A record the database refuses for good (a data error, SQLSTATE class 22 or 23): its dead
/// letter's exception.
#[derive(Debug, thiserror::Error)]
#[error("the record can never be applied")]
pub struct Unprocessable(#[source] pub StoreError);

/// A record that is not a valid `TransferenciaAnalisada`.
#[derive(Debug, thiserror::Error)]
pub enum MalformedEvent {
    #[error("not a valid TransferenciaAnalisada")]
    Json(#[source] serde_json::Error),
    #[error("not a valid TransferenciaAnalisada: contaOrigem and contaDestino are both {:?}", .0.as_str())]
    SameAccount(AccountId),
}

/// Blocking retries of a record that failed transiently: the consumer runtime's.
pub use kafka::consumer::RetryPolicy;

/// The ledger's batch handler.
#[derive(Debug)]
pub struct Settler {
    pool: PgPool,
    topics: OutcomeTopics,
    relay: outbox::Waker,
    /// The record whose settlement last failed as if the database were away while it answered
    /// a probe, and how many times in a row.
    suspect: Option<(uuid::Uuid, u32)>,
}

impl Settler {
    /// A settler writing outcome events for `topics`, waking `relay` after each commit that
    /// wrote some.
    pub fn new(pool: PgPool, topics: OutcomeTopics, relay: outbox::Waker) -> Self {
        Self { pool, topics, relay, suspect: None }
    }

    /// Whether the database answers a statement now (within 5 s).
    async fn database_answers(&self) -> bool {
        let probe = sqlx::query("SELECT 1").execute(&self.pool);
        matches!(tokio::time::timeout(Duration::from_secs(5), probe).await, Ok(Ok(_)))
    }

    /// Settles `requests` (each with its index in the batch) one record per transaction, in
    /// order, once each; sets their verdicts and stops at the first transient failure (the
    /// runtime retries that record after its backoff, then hands the rest again). Errs when
    /// the database is unreachable or lacks its schema.
    async fn settle_one_by_one(
        &mut self,
        requests: &[(usize, Request)],
        verdicts: &mut [Option<Verdict>],
    ) -> Result<(), StoreError> {
        for (index, request) in requests {
            let id = request.transfer.transfer_id;
            match self.settle(std::slice::from_ref(request)).await {
                Ok(()) => {
                    if self.suspect.is_some_and(|(suspect, _)| suspect == id) {
                        self.suspect = None;
                    }
                    verdicts[*index] = Some(Verdict::Done)
                }
                Err(error) if error.is_schema_missing() => return Err(error),
                Err(error) => match error.kind() {
                    FailureKind::Infrastructure => {
                        if !self.database_answers().await {
                            return Err(error); // away: nobody's fault
                        }
                        let attempts = match self.suspect {
                            Some((suspect, attempts)) if suspect == id => attempts + 1,
                            _ => 1,
                        };
                        if attempts < INFRASTRUCTURE_FAILURES_MAX {
                            self.suspect = Some((id, attempts));
                            tracing::warn!(transfer_id = %id, attempts, error = %telemetry::error_chain(&error), "the record failed as if the database were away, while it answers other statements");
                            return Err(error);
                        }
                        self.suspect = None;
                        tracing::error!(transfer_id = %id, attempts, error = %telemetry::error_chain(&error), "the record keeps failing while the database answers: dead-lettered");
                        let cause = cause_fqcn(&error);
                        verdicts[*index] = Some(Verdict::DeadLetter(Failure::new(
                            FAILS_ALONE,
                            cause,
                            &FailsAlone { attempts, source: error },
                        )));
                    }
                    FailureKind::Permanent => {
                        let cause = cause_fqcn(&error);
                        verdicts[*index] = Some(Verdict::DeadLetter(Failure::new(
                            UNPROCESSABLE,
                            cause,
                            &Unprocessable(error),
                        )));
                    }
                    FailureKind::Transient => {
                        tracing::info!(transfer_id = %request.transfer.transfer_id, error = %telemetry::error_chain(&error), "transient failure of the record");
                        let cause = cause_fqcn(&error);
                        verdicts[*index] = Some(Verdict::Retry(Failure::new(
                            RETRIES_EXHAUSTED,
                            cause,
                            &RetriesExhausted(error),
                        )));
                        return Ok(());
                    }
                },
            }
        }
        Ok(())
    }

    /// One settlement transaction, with its metrics.
    async fn settle(&self, requests: &[Request]) -> Result<(), StoreError> {
        let started = Instant::now();
        let settlement = store::settle(&self.pool, requests, &self.topics).await?;
        if !settlement.decided.is_empty() {
            // their outcome events are committed: the relay publishes them at once
            self.relay.wake();
        }
        metrics::histogram!("ledger_settlement_seconds").record(started.elapsed().as_secs_f64());
        for (transfer_id, outcome) in &settlement.decided {
            let reason = outcome.reason().unwrap_or("");
            metrics::counter!("ledger_outcomes_total", "outcome" => outcome.result(), "reason" => reason)
                .increment(1);
            match outcome {
                Outcome::Settled => tracing::debug!(%transfer_id, "settled"),
                Outcome::Rejected(reason) => {
                    tracing::info!(%transfer_id, reason = reason.as_str(), "rejected")
                }
            }
        }
        for transfer_id in &settlement.already_decided {
            metrics::counter!("ledger_already_decided_total").increment(1);
            tracing::debug!(%transfer_id, "already decided; outcome pinned, nothing done");
        }
        Ok(())
    }
}

/// The type path of an error's underlying cause, for `kafka_dlt-exception-cause-fqcn`.
fn cause_fqcn(error: &StoreError) -> &'static str {
    use std::any::type_name;
    match error {
        StoreError::Unavailable(_) | StoreError::Database(_) => type_name::<sqlx::Error>(),
        StoreError::Outbox(_) => type_name::<outbox::Error>(),
        StoreError::Encode(_) => type_name::<serde_json::Error>(),
        StoreError::DecidedConcurrently(_) => type_name::<StoreError>(),
        StoreError::Overflow(_) => type_name::<crate::settlement::Overflow>(),
        StoreError::InvalidOutcome(_) => type_name::<contracts::domain::InvalidOutcome>(),
        StoreError::InvalidCurrency(_) => type_name::<contracts::domain::InvalidCurrency>(),
    }
}

impl MalformedEvent {
    /// `kafka_dlt-exception-cause-fqcn`: the underlying error's type, or this type where
    /// there is none.
    pub fn cause_fqcn(&self) -> &'static str {
        match self {
            Self::Json(_) => std::any::type_name::<serde_json::Error>(),
            Self::SameAccount(_) => std::any::type_name::<Self>(),
        }
    }
}

/// The transfer in `record`, or why it is not one.
pub fn decode(record: &OwnedMessage) -> Result<Request, MalformedEvent> {
    let event: TransferAnalysed =
        serde_json::from_slice(record.payload().unwrap_or_default()).map_err(MalformedEvent::Json)?;
    let amount_cents = event.amount_cents;
    if event.source_account == event.destination_account {
        return Err(MalformedEvent::SameAccount(event.source_account));
    }
    let span = tracing::info_span!("settle", transfer_id = %event.transfer_id);
    kafka::trace::continue_from(&span, record);
    let mut trace = telemetry::context::inject(&span);
    Ok(Request {
        transfer: Transfer {
            transfer_id: event.transfer_id,
            source: event.source_account,
            destination: event.destination_account,
            amount_cents,
            currency: event.currency,
        },
        traceparent: trace.remove("traceparent"),
        tracestate: trace.remove("tracestate"),
    })
}

/// Why a batch must be retried as a whole (or, for a missing schema object, why the settler
/// stops).
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error("ledger database error")]
    Database(#[from] StoreError),
}

impl Handler for Settler {
    type Error = SettleError;

    /// A first attempt settles the whole batch in one transaction; if that fails transiently
    /// (or this is a retry) the records are settled one per transaction, in order, up to the
    /// first that fails transiently: the runtime retries it after its backoff
    /// ([`RetryPolicy`]) and dead-letters it when the retries run out. Malformed records and
    /// permanent failures are dead letters at once.
    async fn handle(&mut self, batch: &[OwnedMessage], retrying: bool) -> Result<Vec<Verdict>, SettleError> {
        let mut verdicts: Vec<Option<Verdict>> = vec![None; batch.len()];
        let mut requests = Vec::with_capacity(batch.len());
        for (index, record) in batch.iter().enumerate() {
            match decode(record) {
                Ok(request) => requests.push((index, request)),
                Err(error) => {
                    verdicts[index] =
                        Some(Verdict::DeadLetter(Failure::new(MALFORMED_EVENT, error.cause_fqcn(), &error)))
                }
            }
        }
        if !requests.is_empty() {
            let settled_together = if retrying {
                false
            } else {
                let all: Vec<Request> = requests.iter().map(|(_, request)| request.clone()).collect();
                match self.settle(&all).await {
                    Ok(()) => true,
                    Err(error) if error.is_schema_missing() => return Err(error.into()),
                    // the database away: nobody's fault. Answering, it may be one record's:
                    // settled one by one, that record is found
                    Err(error)
                        if error.kind() == FailureKind::Infrastructure && !self.database_answers().await =>
                    {
                        return Err(error.into())
                    }
                    Err(error) => {
                        tracing::info!(records = all.len(), error = %telemetry::error_chain(&error), "batch failed; settling its records one by one");
                        false
                    }
                }
            };
            if settled_together {
                for (index, _) in &requests {
                    verdicts[*index] = Some(Verdict::Done);
                }
            } else {
                self.settle_one_by_one(&requests, &mut verdicts).await?;
            }
        }
        // up to the first record left without a verdict (after a retry): the runtime hands the
        // rest again once the retried record is through
        Ok(verdicts.into_iter().map_while(|verdict| verdict).collect())
    }

    /// The ledger database lacks a table, column or function it migrated: stop, loudly.
    fn is_fatal(&self, error: &SettleError) -> bool {
        matches!(error, SettleError::Database(error) if error.is_schema_missing())
    }
}

/// How long the runtime's blocking retries of one record may take at most, for logs and docs.
pub fn worst_case_retry_time(policy: &RetryPolicy) -> Duration {
    policy.worst_case()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::any::type_name;

    #[test]
    fn each_dead_letter_exception_names_a_type_that_exists() {
        assert_eq!(MALFORMED_EVENT, type_name::<MalformedEvent>());
        assert_eq!(RETRIES_EXHAUSTED, type_name::<RetriesExhausted>());
        assert_eq!(UNPROCESSABLE, type_name::<Unprocessable>());
        assert_eq!(FAILS_ALONE, type_name::<FailsAlone>());
        let same = MalformedEvent::SameAccount(AccountId::parse("CC-1").expect("an id"));
        assert_eq!(same.cause_fqcn(), MALFORMED_EVENT, "no underlying cause: itself");
        let json = serde_json::from_str::<TransferAnalysed>("{").expect_err("not JSON");
        assert_eq!(MalformedEvent::Json(json).cause_fqcn(), type_name::<serde_json::Error>());
    }

    #[test]
    fn a_dead_letter_says_its_cause_once() {
        let json = serde_json::from_str::<TransferAnalysed>("{").expect_err("not JSON");
        let detail = json.to_string();
        let failure = Failure::new(MALFORMED_EVENT, "x", &MalformedEvent::Json(json));
        assert_eq!(failure.message.matches(&detail).count(), 1, "{}", failure.message);
        assert_eq!(failure.stacktrace.matches(&detail).count(), 1, "{}", failure.stacktrace);
    }
}
