//! The service's errors as answered over HTTP (`web::ApiError`, problem+json).

use web::problem::Kind;
use web::ApiError;

use crate::error::{Refusal, StoreError};

/// 409: the same Idempotency-Key is being processed right now.
pub const KEY_IN_FLIGHT: Kind =
    Kind { uri: "/problems/idempotency-key-in-flight", title: "Request in flight" };
/// 500: the connection to the database broke during the commit; the transfer may exist.
pub const OUTCOME_UNKNOWN: Kind = Kind { uri: "/problems/outcome-unknown", title: "Outcome unknown" };
/// 422: the Idempotency-Key was used with another body.
pub const KEY_REUSED: Kind =
    Kind { uri: "/problems/idempotency-key-reused", title: "Idempotency-Key reused" };

/// 403: an API client's token debiting an account that is not one of its own.
pub const FORBIDDEN_ACCOUNT: Kind = Kind { uri: "/problems/forbidden-account", title: "Account not allowed" };

/// How long a client refused for a full writer queue is asked to wait.
pub const WRITER_BUSY_RETRY_AFTER_S: u32 = 1;

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Refused(Refusal::KeyReused) => ApiError::Unprocessable {
                kind: KEY_REUSED,
                detail: "this Idempotency-Key was already used with a different request".into(),
            },
            StoreError::Refused(Refusal::KeyInFlight) => ApiError::Conflict {
                kind: KEY_IN_FLIGHT,
                detail: "a request with this Idempotency-Key is still being processed; retry later".into(),
            },
            StoreError::OutcomeUnknown(_) => ApiError::OutcomeUnknown {
                kind: OUTCOME_UNKNOWN,
                detail: "the connection to the database broke while this transfer was being committed: it may \
                         or may not exist. Retry with the same Idempotency-Key (it answers with the transfer if \
                         it exists, and creates it once if not), or look it up with GET /transferencias?conta=…"
                    .into(),
            },
            StoreError::WriterBusy => {
                metrics::counter!("transfers_refused_total", "reason" => "queue_full").increment(1);
                ApiError::Overloaded {
                    detail: format!(
                        "too many transfers are waiting to be written; retry in {WRITER_BUSY_RETRY_AFTER_S} s"
                    ),
                    retry_after_s: WRITER_BUSY_RETRY_AFTER_S,
                }
            }
            ref unavailable if unavailable.is_unavailable() => {
                tracing::warn!(error = %telemetry::error_chain(&error), "transfers database unreachable");
                ApiError::Unavailable("the transfers database is unreachable; retry later".into())
            }
            other => ApiError::internal(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_database_is_a_503_and_any_other_failure_a_500() {
        let unreachable = ApiError::from(StoreError::Database(sqlx::Error::PoolTimedOut));
        assert!(matches!(unreachable, ApiError::Unavailable(_)), "{unreachable:?}");
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let reset = ApiError::from(StoreError::Outbox(outbox::Error::Database(sqlx::Error::Io(io))));
        assert!(matches!(reset, ApiError::Unavailable(_)), "{reset:?}");
        let lost = sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof"));
        let unknown = ApiError::from(StoreError::OutcomeUnknown(std::sync::Arc::new(lost)));
        assert!(matches!(unknown, ApiError::OutcomeUnknown { kind: OUTCOME_UNKNOWN, .. }), "{unknown:?}");
        let shared = std::sync::Arc::new(StoreError::Database(sqlx::Error::PoolTimedOut));
        let batch = ApiError::from(StoreError::Unavailable(shared));
        assert!(matches!(batch, ApiError::Unavailable(_)), "{batch:?}");
        let bug = ApiError::from(StoreError::KeyWithoutTransfer);
        assert!(matches!(bug, ApiError::Internal(_)), "{bug:?}");
    }
}
