//! Bearer tokens (`CONTRACT.md` §1): when `PAGAMENTOS_API_TOKEN` or `PAGAMENTOS_ADMIN_TOKEN`
//! is set, every route but health, metrics and the OpenAPI document requires
//! `Authorization: Bearer <token>` (`401` otherwise); the admin token is accepted wherever the
//! API token is, and the admin routes (accounts, deposits) need it (`403` with the API token).
//! Tokens are compared in constant time and never logged; the caller's identity for
//! Idempotency-Key scoping is a hash of its token.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::problem::ApiError;

/// Who is calling, as `authenticate` left it in the request's extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The scope of its Idempotency-Keys: a hash of its token.
    pub scope: String,
    /// It may use the admin routes.
    pub admin: bool,
}

impl Caller {
    /// `403` unless the caller may use the admin routes.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

/// The tokens a service accepts (none: the API is open).
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

impl Tokens {
    /// The caller that `authorization` (the header's value, if any) identifies.
    pub fn caller(&self, authorization: Option<&str>) -> Result<Caller, ApiError> {
        if self.api.is_none() && self.admin.is_none() {
            return Ok(Caller { scope: ANONYMOUS.into(), admin: true });
        }
        let given =
            authorization.and_then(|value| value.strip_prefix("Bearer ")).ok_or(ApiError::Unauthorized)?;
        let admin = matches(given, &self.admin);
        if !(admin || matches(given, &self.api)) {
            return Err(ApiError::Unauthorized);
        }
        // with only an API token configured, nobody holds a separate admin right
        let admin = admin || self.admin.is_none();
        Ok(Caller { scope: hex::encode(Sha256::digest(given.as_bytes())), admin })
    }
}

/// Middleware (`from_fn_with_state(tokens, authenticate)`): `401` without a valid token,
/// otherwise the [`Caller`] goes into the request's extensions.
pub async fn authenticate(
    State(tokens): State<Tokens>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok());
    let caller = tokens.caller(authorization)?;
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(api: Option<&str>, admin: Option<&str>) -> Tokens {
        Tokens { api: api.map(str::to_owned), admin: admin.map(str::to_owned) }
    }

    #[test]
    fn open_when_no_token_is_configured() {
        let caller = tokens(None, None).caller(None).expect("open");
        assert!(caller.admin);
    }

    #[test]
    fn the_admin_token_works_everywhere_the_api_token_only_on_the_api() {
        let both = tokens(Some("api"), Some("adm"));
        assert!(matches!(both.caller(None), Err(ApiError::Unauthorized)));
        assert!(matches!(both.caller(Some("Bearer nope")), Err(ApiError::Unauthorized)));
        assert!(matches!(both.caller(Some("api")), Err(ApiError::Unauthorized)));
        let api = both.caller(Some("Bearer api")).expect("api token");
        assert!(!api.admin && api.require_admin().is_err());
        let admin = both.caller(Some("Bearer adm")).expect("admin token");
        assert!(admin.admin && admin.require_admin().is_ok());
        assert_ne!(api.scope, admin.scope);
    }

    #[test]
    fn only_an_api_token_guards_everything_alike() {
        let api_only = tokens(Some("api"), None);
        assert!(api_only.caller(Some("Bearer api")).expect("api").admin);
        let admin_only = tokens(None, Some("adm"));
        assert!(matches!(admin_only.caller(Some("Bearer api")), Err(ApiError::Unauthorized)));
        assert!(admin_only.caller(Some("Bearer adm")).expect("admin").admin);
    }
}
