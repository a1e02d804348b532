//! One error type for the HTTP edge, answered as problem+json (RFC 9457). A 5xx hides its
//! cause from the client and logs it; a 4xx says exactly what was wrong.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One broken rule, for problem+json's `errors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// The request field (or `body`) the rule is about.
    pub field: &'static str,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self { field, message: message.into() }
    }
}

/// The required string `field` of a JSON body, read by `parse` (a domain type's rule): `None`,
/// with the broken rule added to `errors`, when it is missing, not a string, or refused.
pub fn required_text<T>(
    object: &serde_json::Map<String, serde_json::Value>,
    field: &'static str,
    errors: &mut Vec<FieldError>,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Option<T> {
    let message = match object.get(field) {
        None | Some(serde_json::Value::Null) => "is required".to_owned(),
        Some(serde_json::Value::String(text)) => match parse(text) {
            Ok(value) => return Some(value),
            Err(message) => message,
        },
        Some(_) => "must be a string".to_owned(),
    };
    errors.push(FieldError::new(field, message));
    None
}

/// A specific problem: its `type` URI (relative) and `title`, e.g. `/problems/account-exists`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub uri: &'static str,
    pub title: &'static str,
}

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
    /// 403: a valid token without the right: only the admin token may do this.
    #[error("this operation needs the admin token")]
    Forbidden,
    /// 403 with a problem type of its own: a valid token without the right to this resource
    /// (an API client and another's account).
    #[error("{detail}")]
    Denied { kind: Kind, detail: String },
    /// 404
    #[error("{0}")]
    NotFound(String),
    /// 409: the request conflicts with the current state (an id taken, a key in flight).
    #[error("{detail}")]
    Conflict { kind: Kind, detail: String },
    /// 413: body over the limit.
    #[error("the body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// 415: not JSON.
    #[error("the body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// 422: well-formed, but contradicts what this id already means (a reused key or id).
    #[error("{detail}")]
    Unprocessable { kind: Kind, detail: String },
    /// 503: a dependency is down; retry later.
    #[error("{0}")]
    Unavailable(String),
    /// 503: shedding load (a queue past its bound); retry after `retry_after_s` seconds.
    #[error("{detail}")]
    Overloaded { detail: String, retry_after_s: u32 },
    /// 500 with a problem type of its own: the operation may or may not have happened (the
    /// connection broke during its commit); the client retries with the same idempotency key or
    /// looks the result up. Deliberately not a 503, which clients retry blindly.
    #[error("{detail}")]
    OutcomeUnknown { kind: Kind, detail: String },
    /// 500: our fault; the cause is logged, never shown.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ApiError {
    pub fn internal(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Internal(Box::new(error))
    }
}

/// The problem+json body (RFC 9457) every error is answered with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A relative URI naming the kind of problem, e.g. `/problems/validation`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: &'static str,
    /// The HTTP status, repeated.
    pub status: u16,
    /// What was wrong with this request, for a person.
    pub detail: String,
    /// Each broken rule, for `400` validation problems only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<FieldError>>,
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::Validation(_) => (StatusCode::BAD_REQUEST, "/problems/validation", "Invalid request"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "/problems/bad-request", "Bad request"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "/problems/unauthorized", "Unauthorized"),
            Self::Forbidden => (StatusCode::FORBIDDEN, "/problems/forbidden", "Forbidden"),
            Self::Denied { kind, .. } => (StatusCode::FORBIDDEN, kind.uri, kind.title),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "/problems/not-found", "Not found"),
            Self::Conflict { kind, .. } => (StatusCode::CONFLICT, kind.uri, kind.title),
            Self::PayloadTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "/problems/payload-too-large", "Body too large")
            }
            Self::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "/problems/unsupported-media-type",
                "Unsupported media type",
            ),
            Self::Unprocessable { kind, .. } => (StatusCode::UNPROCESSABLE_ENTITY, kind.uri, kind.title),
            Self::Unavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "/problems/unavailable", "Service unavailable")
            }
            Self::Overloaded { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "/problems/overloaded", "Overloaded")
            }
            Self::OutcomeUnknown { kind, .. } => (StatusCode::INTERNAL_SERVER_ERROR, kind.uri, kind.title),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "/problems/internal", "Internal error"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind, title) = self.parts();
        if let Self::Internal(cause) = &self {
            tracing::error!(error = %telemetry::error_chain(cause.as_ref()), "request failed");
        }
        let errors = match &self {
            Self::Validation(errors) => Some(errors.clone()),
            _ => None,
        };
        let problem = Problem { kind, title, status: status.as_u16(), detail: self.to_string(), errors };
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        match self {
            Self::Unauthorized => {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::Unavailable(_) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Overloaded { retry_after_s, .. } => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            }
            _ => {}
        }
        response
    }
}
