//! Errors of the outbox, and how any service tells a database failure's kind apart.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("outbox database error")]
    Database(#[from] sqlx::Error),
    #[error("outbox publish failed")]
    Kafka(#[from] kafka::Error),
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
