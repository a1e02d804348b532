//! The JSON body extractor: size, content type and syntax are checked here so each failure is
//! answered in problem+json with its own status (413, 415, 400), never axum's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde_json::Value;

use crate::problem::ApiError;

/// Largest accepted body.
pub const BODY_BYTES_MAX: usize = 16 * 1024;

/// A JSON document from the request body.
#[derive(Debug)]
pub struct JsonBody(pub Value);

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok());
        if !content_type.is_some_and(is_json) {
            return Err(ApiError::UnsupportedMediaType);
        }
        if let Some(length) = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<usize>().ok())
        {
            if length > BODY_BYTES_MAX {
                return Err(ApiError::PayloadTooLarge(BODY_BYTES_MAX));
            }
        }
        let limited =
            request.map(|body| axum::body::Body::new(http_body_util::Limited::new(body, BODY_BYTES_MAX)));
        let bytes = Bytes::from_request(limited, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(BODY_BYTES_MAX)
            } else {
                ApiError::BadRequest(format!("unreadable body: {rejection}"))
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|error| ApiError::BadRequest(format!("malformed JSON: {error}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("application/json; charset=utf-8"));
        assert!(is_json("Application/JSON"));
        assert!(is_json("application/merge-patch+json"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json(""));
    }
}
