//! Errors of the transfers service, in its own words.

/// What can go wrong with the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("outbox error")]
    Outbox(#[from] outbox::Error),
    #[error("event could not be encoded")]
    Encode(#[source] serde_json::Error),
    /// The Idempotency-Key was used before with another request.
    #[error("the Idempotency-Key was already used with a different request")]
    KeyReused,
    /// Another request with the same Idempotency-Key is being processed.
    #[error("a request with this Idempotency-Key is still being processed")]
    KeyInFlight,
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
    /// The transaction this request shared with others failed for want of the database.
    #[error("the transfers database is unavailable: {0}")]
    Unavailable(String),
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
                outbox::error::classify(database) == outbox::error::FailureKind::Infrastructure
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
    Schema(#[from] outbox::schema::SchemaError),
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    #[error("cannot listen on {address}")]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
}
