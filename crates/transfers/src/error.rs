//! Errors of the transfers service, in its own words.

/// Why one request was refused for its Idempotency-Key: the answer to that request (`422`,
/// `409`), nothing written for it; never a failure of the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The Idempotency-Key was used before with another request.
    #[error("the Idempotency-Key was already used with a different request")]
    KeyReused,
    /// Another request with the same Idempotency-Key is being processed.
    #[error("a request with this Idempotency-Key is still being processed")]
    KeyInFlight,
}

/// Why a request was not written: refused for its key ([`StoreError::Refused`]), or a failure
/// of the service and what it stands on (every other variant).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The request's own answer, not a failure.
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("outbox error")]
    Outbox(#[from] outbox::Error),
    #[error("event could not be encoded")]
    Encode(#[source] serde_json::Error),
    /// The database holds a status this binary does not know: an error, never read as
    /// `PENDENTE`.
    #[error("the transfers database holds a status this binary does not know")]
    UnknownStatus(#[from] contracts::domain::UnknownName),
    #[error("the Idempotency-Key points to a transfer that does not exist")]
    KeyWithoutTransfer,
    /// The writer tasks are gone (the service is stopping).
    #[error("the transfer writer stopped")]
    WriterStopped,
    /// The writers' queue is full: the database takes transfers slower than they arrive.
    #[error("too many transfers are waiting to be written")]
    WriterBusy,
    /// The transaction this request shared with others failed for want of the database: the
    /// failure itself, shared by every request of the batch.
    #[error("the transfers database is unavailable")]
    Unavailable(#[source] std::sync::Arc<StoreError>),
    /// The connection broke while `COMMIT` was on its way: the transaction may or may not be
    /// committed. Never retried here (a request without a key would be written twice); the
    /// client looks the transfer up or retries with the same Idempotency-Key.
    #[error("the connection broke during COMMIT: the outcome is unknown")]
    OutcomeUnknown(#[source] std::sync::Arc<sqlx::Error>),
}

impl StoreError {
    /// The database is unreachable or going away (or the writer stopped): not the request's
    /// fault, worth retrying later.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Database(database) | Self::Outbox(outbox::Error::Database(database)) => {
                database::failure::classify(database) == database::failure::FailureKind::Infrastructure
            }
            Self::WriterStopped | Self::Unavailable(_) => true,
            _ => false,
        }
    }
}

/// What can stop the service from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Auth(#[from] web::AuthConfigError),
    #[error(transparent)]
    Connect(#[from] database::Error),
    #[error("migrating the transferencias database failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("the transferencias database is not ready (`pagamentos migrate` with TRANSFERENCIAS_MIGRATION_DATABASE_URL migrates it)")]
    Schema(#[from] database::schema::SchemaError),
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    #[error(transparent)]
    Shell(#[from] service::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_failure_keeps_its_cause_and_says_it_once() {
        let shared = std::sync::Arc::new(StoreError::Database(sqlx::Error::PoolTimedOut));
        let error = StoreError::Unavailable(shared);
        assert!(error.is_unavailable());
        let chain = telemetry::error_chain(&error);
        assert!(chain.contains("pool timed out"), "{chain}");
        assert_eq!(chain.matches("unavailable").count(), 1, "{chain}");
        let source = std::error::Error::source(&error).expect("the shared failure is the source");
        assert!(source.to_string().contains("database error"), "{source}");
    }

    #[test]
    fn refusals_are_not_failures_of_the_service() {
        for refusal in [Refusal::KeyReused, Refusal::KeyInFlight] {
            let error = StoreError::from(refusal);
            assert!(!error.is_unavailable());
            assert_eq!(error.to_string(), refusal.to_string(), "said once, in its own words");
        }
    }
}
