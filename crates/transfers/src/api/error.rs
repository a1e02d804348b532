//! The service's errors as answered over HTTP (`web::ApiError`, problem+json).

use web::problem::Kind;
use web::ApiError;

use crate::error::StoreError;

/// 409: the same Idempotency-Key is being processed right now.
pub const KEY_IN_FLIGHT: Kind =
    Kind { uri: "/problems/idempotency-key-in-flight", title: "Request in flight" };
/// 422: the Idempotency-Key was used with another body.
pub const KEY_REUSED: Kind =
    Kind { uri: "/problems/idempotency-key-reused", title: "Idempotency-Key reused" };

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::KeyReused => ApiError::Unprocessable {
                kind: KEY_REUSED,
                detail: "this Idempotency-Key was already used with a different request".into(),
            },
            StoreError::KeyInFlight => ApiError::Conflict {
                kind: KEY_IN_FLIGHT,
                detail: "a request with this Idempotency-Key is still being processed; retry later".into(),
            },
            other => ApiError::internal(other),
        }
    }
}
