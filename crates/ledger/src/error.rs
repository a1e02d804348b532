//! The ledger's errors.

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Auth(#[from] web::AuthConfigError),
    #[error(transparent)]
    Connect(#[from] database::Error),
    #[error("ledger database migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("the ledger database is not ready (`pagamentos migrate` with LEDGER_MIGRATION_DATABASE_URL migrates it)")]
    Schema(#[from] database::schema::SchemaError),
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    #[error(transparent)]
    Shell(#[from] service::Error),
}

/// A database operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection to the database could be had: never the record's fault.
    #[error("the ledger database is unreachable")]
    Unavailable(#[source] sqlx::Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Outbox(#[from] outbox::Error),
    #[error("an outcome event could not be encoded")]
    Encode(#[from] serde_json::Error),
    /// Another instance decided a transfer of this batch at the same moment; the retry sees
    /// its decision.
    #[error("transfer {0} was decided concurrently by another instance")]
    DecidedConcurrently(uuid::Uuid),
    #[error(transparent)]
    Overflow(#[from] crate::settlement::Overflow),
    /// `transferencia_processada` holds a (`resultado`, `motivo`) this binary does not know.
    #[error("the ledger database holds an unknown outcome")]
    InvalidOutcome(#[from] contracts::domain::InvalidOutcome),
    /// `conta.moeda` holds what is not an active currency code.
    #[error("the ledger database holds an unknown currency")]
    InvalidCurrency(#[from] contracts::domain::InvalidCurrency),
}

pub use database::failure::{classify, FailureKind};

/// SQLSTATEs that say the database is not the schema this binary migrated: an undefined
/// table (`42P01`), column (`42703`), function (`42883`) or schema (`3F000`). The service
/// migrates at start, so after that they mean someone dropped or renamed an object or
/// restored another schema: no retry fixes that and it is no record's fault.
const SCHEMA_MISSING: [&str; 4] = ["42P01", "42703", "42883", "3F000"];

impl StoreError {
    /// The database lacks an object of the schema this binary migrated (see `SCHEMA_MISSING`):
    /// the settler stops (the process exits non-zero) instead of retrying or dead-lettering.
    pub fn is_schema_missing(&self) -> bool {
        let database = match self {
            Self::Database(error) | Self::Outbox(outbox::Error::Database(error)) => error,
            _ => return false,
        };
        let sqlx::Error::Database(database) = database else { return false };
        database.code().is_some_and(|code| SCHEMA_MISSING.contains(&code.as_ref()))
    }

    pub fn kind(&self) -> FailureKind {
        match self {
            Self::Unavailable(_) => FailureKind::Infrastructure,
            Self::Database(error) => classify(error),
            Self::Outbox(outbox::Error::Database(error)) => classify(error),
            Self::Outbox(outbox::Error::Kafka(_)) => FailureKind::Infrastructure,
            Self::DecidedConcurrently(_) => FailureKind::Transient,
            Self::Encode(_) | Self::Overflow(_) | Self::InvalidOutcome(_) | Self::InvalidCurrency(_) => {
                FailureKind::Permanent
            }
        }
    }
}
