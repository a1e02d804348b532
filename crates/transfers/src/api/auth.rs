//! Bearer tokens (`CONTRACT.md` §1): when `PAGAMENTOS_API_TOKEN` is set, every route but health
//! and metrics requires `Authorization: Bearer <token>`; the admin token is accepted wherever
//! the API token is. Tokens are compared in constant time and never logged; the caller's
//! identity for Idempotency-Key scoping is a hash of its token.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;

/// Who is calling: the scope of its Idempotency-Keys.
#[derive(Debug, Clone)]
pub struct Caller {
    pub scope: String,
}

/// The tokens this service accepts (none: the API is open).
#[derive(Clone, Default)]
pub struct Tokens {
    pub api: Option<String>,
    pub admin: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("api", &self.api.as_ref().map(|_| "***"))
            .field("admin", &self.admin.as_ref().map(|_| "***"))
            .finish()
    }
}

fn matches(given: &str, expected: &Option<String>) -> bool {
    expected.as_ref().is_some_and(|expected| bool::from(given.as_bytes().ct_eq(expected.as_bytes())))
}

/// Anonymous callers share one scope when no token is configured.
const ANONYMOUS: &str = "anonimo";

pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let tokens = &state.tokens;
    let caller = if tokens.api.is_none() && tokens.admin.is_none() {
        Caller { scope: ANONYMOUS.into() }
    } else {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .ok_or(ApiError::Unauthorized)?;
        if !(matches(given, &tokens.api) || matches(given, &tokens.admin)) {
            return Err(ApiError::Unauthorized);
        }
        Caller { scope: hex::encode(Sha256::digest(given.as_bytes())) }
    };
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}
