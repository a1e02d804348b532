//! How any service tells a database failure's kind apart, by SQLSTATE.

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

/// Classifies a database error by SQLSTATE. Only the record's own data can make it
/// permanent: data exceptions (`22`) and integrity violations (`23`). The database being unable
/// to serve now is infrastructure, whatever the record: connection classes (`08`), shutdown
/// (`57P01`–`57P03`), a statement cancelled (`57014`: `statement_timeout`, i.e. a server too
/// slow or frozen to answer in time, or an operator's `pg_cancel_backend`), resources (`53`),
/// system errors (`58`, `XX`), a read-only server (`25006`, a standby during a failover), a
/// session ended by `idle_in_transaction_session_timeout` (`25P03`), a role without a privilege
/// it needs (`42501`, a misconfiguration), and every error without a SQLSTATE (I/O, pool
/// timeouts, protocol, a read-only server refused on connect). Anything else (serialization
/// failures, deadlocks, lock timeouts, and codes nobody foresaw) is transient: retried with
/// backoff, and dead-lettered only after the retries.
pub fn classify(error: &sqlx::Error) -> FailureKind {
    let sqlx::Error::Database(database) = error else { return FailureKind::Infrastructure };
    let Some(code) = database.code() else { return FailureKind::Infrastructure };
    classify_sqlstate(&code)
}

/// [`classify`] of a SQLSTATE.
pub fn classify_sqlstate(code: &str) -> FailureKind {
    let class = code.get(..2).unwrap_or(code);
    match code {
        _ if class == "22" || class == "23" => FailureKind::Permanent,
        "57P01" | "57P02" | "57P03" | "57014" | "25006" | "25P03" | "42501" => FailureKind::Infrastructure,
        _ if matches!(class, "08" | "53" | "58" | "XX") => FailureKind::Infrastructure,
        _ => FailureKind::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_records_own_data_makes_a_failure_permanent() {
        // numeric overflow, invalid text, a check or unique constraint
        for code in ["22003", "22P02", "23514", "23505", "23503"] {
            assert_eq!(classify_sqlstate(code), FailureKind::Permanent, "{code}");
        }
    }

    #[test]
    fn a_database_that_cannot_serve_now_is_infrastructure_never_a_dead_letter() {
        // read-only during a failover, admin shutdown, crash shutdown, cannot connect now,
        // statement timeout (a hung or overloaded server), permission denied,
        // idle-in-transaction timeout, connection failure, too many connections, disk full,
        // I/O error, internal error
        for code in [
            "25006", "57P01", "57P02", "57P03", "57014", "42501", "25P03", "08006", "53300", "53100",
            "58030", "XX000",
        ] {
            assert_eq!(classify_sqlstate(code), FailureKind::Infrastructure, "{code}");
        }
        let io = sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
        assert_eq!(classify(&io), FailureKind::Infrastructure);
        assert_eq!(classify(&sqlx::Error::PoolTimedOut), FailureKind::Infrastructure);
    }

    #[test]
    fn passing_conditions_and_unforeseen_codes_are_retried() {
        // serialization failure, deadlock, lock not available (lock_timeout), a trigger's
        // RAISE, an undefined table (a migration not applied yet)
        for code in ["40001", "40P01", "55P03", "P0001", "42P01"] {
            assert_eq!(classify_sqlstate(code), FailureKind::Transient, "{code}");
        }
    }
}
