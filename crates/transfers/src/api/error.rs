//! One error type for the HTTP edge, answered as problem+json (RFC 9457). A 5xx hides its
//! cause from the client and logs it; a 4xx says exactly what was wrong.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::domain::FieldError;
use crate::error::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request broke one or more rules; `errors` lists each.
    #[error("the request is invalid")]
    Validation(Vec<FieldError>),
    /// 400: unreadable body, malformed id or query.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no or wrong bearer token.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// 404
    #[error("{0}")]
    NotFound(String),
    /// 409: the same Idempotency-Key is being processed right now.
    #[error("a request with this Idempotency-Key is still being processed; retry later")]
    KeyInFlight,
    /// 413: body over the limit.
    #[error("the body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// 415: not JSON.
    #[error("the body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// 422: the Idempotency-Key was used with another body.
    #[error("this Idempotency-Key was already used with a different request")]
    KeyReused,
    /// 500: our fault; the cause is logged, never shown.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::KeyReused => Self::KeyReused,
            StoreError::KeyInFlight => Self::KeyInFlight,
            other => Self::Internal(Box::new(other)),
        }
    }
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<&'a [FieldError]>,
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::Validation(_) => (StatusCode::BAD_REQUEST, "/problems/validation", "Invalid request"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "/problems/bad-request", "Bad request"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "/problems/unauthorized", "Unauthorized"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "/problems/not-found", "Not found"),
            Self::KeyInFlight => {
                (StatusCode::CONFLICT, "/problems/idempotency-key-in-flight", "Request in flight")
            }
            Self::PayloadTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "/problems/payload-too-large", "Body too large")
            }
            Self::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "/problems/unsupported-media-type",
                "Unsupported media type",
            ),
            Self::KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "/problems/idempotency-key-reused",
                "Idempotency-Key reused",
            ),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "/problems/internal", "Internal error"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind, title) = self.parts();
        if let Self::Internal(cause) = &self {
            tracing::error!(error = %kafka::consumer::error_chain(cause.as_ref()), "request failed");
        }
        let errors = match &self {
            Self::Validation(errors) => Some(errors.as_slice()),
            _ => None,
        };
        let problem = Problem { kind, title, status: status.as_u16(), detail: self.to_string(), errors };
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if matches!(self, Self::Unauthorized) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
