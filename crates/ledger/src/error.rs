//! The ledger's errors.

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("PostgreSQL at {address} unreachable")]
    Connect {
        address: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("ledger database migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    #[error("cannot listen on {address}")]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
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
}

/// How a failed database operation should be handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The record met a passing condition (serialization failure, deadlock, lock timeout,
    /// a concurrent decision): retry it with backoff, then dead-letter it.
    Transient,
    /// PostgreSQL itself is unreachable or going away: not the record's fault; pause and retry
    /// until it returns, never dead-letter.
    Infrastructure,
    /// The record can never be applied (e.g. a balance overflow): dead-letter it at once.
    Permanent,
}

impl StoreError {
    pub fn kind(&self) -> FailureKind {
        match self {
            Self::Unavailable(_) => FailureKind::Infrastructure,
            Self::Database(error) => classify(error),
            Self::Outbox(outbox::Error::Database(error)) => classify(error),
            Self::Outbox(outbox::Error::Kafka(_)) => FailureKind::Infrastructure,
            Self::DecidedConcurrently(_) => FailureKind::Transient,
            Self::Encode(_) | Self::Overflow(_) => FailureKind::Permanent,
        }
    }
}

/// Classifies a database error by SQLSTATE: `40001` serialization failure, `40P01` deadlock,
/// `55P03` lock not available and `57014` statement timeout are transient; connection classes
/// (`08`), shutdown (`57P01`–`57P03`), resources (`53`), system errors (`58`, `XX`) and every
/// error without a SQLSTATE (I/O, pool timeouts, protocol) mean the database is unavailable;
/// any other SQLSTATE is the record's fault.
pub fn classify(error: &sqlx::Error) -> FailureKind {
    let sqlx::Error::Database(database) = error else { return FailureKind::Infrastructure };
    let Some(code) = database.code() else { return FailureKind::Infrastructure };
    match code.as_ref() {
        "40001" | "40P01" | "55P03" | "57014" => FailureKind::Transient,
        "57P01" | "57P02" | "57P03" => FailureKind::Infrastructure,
        code if ["08", "53", "58", "XX"].iter().any(|class| code.starts_with(class)) => {
            FailureKind::Infrastructure
        }
        _ => FailureKind::Permanent,
    }
}
