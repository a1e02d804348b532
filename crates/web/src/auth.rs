//! Bearer tokens (`CONTRACT.md` §1). Auth fails closed: a service that serves an API needs both
//! `PAGAMENTOS_API_TOKEN` and `PAGAMENTOS_ADMIN_TOKEN` (and they must differ), or refuses to
//! start, unless it was started with `--insecure-no-auth`, which it logs as a warning and
//! reports on `/readyz`. With tokens, every route but health, metrics and the OpenAPI document
//! requires `Authorization: Bearer <token>` (`401` otherwise); the admin token is accepted
//! wherever the API token is, and only it may use the admin routes (accounts, deposits: `403`
//! with the API token) and read `/readyz`'s detail (anyone else reads its status line only). Tokens are compared in constant time and never logged; the caller's
//! identity for Idempotency-Key scoping is a hash of its token.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use telemetry::health::HealthAuthArgs;

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

/// The authentication options of a service with an API (`CONTRACT.md` §1), flattened once into
/// each command that serves one: the API token, and the admin token and no-auth switch every
/// service shares (`telemetry::health::HealthAuthArgs`, defined there once).
#[derive(Clone, Default, clap::Args)]
pub struct AuthArgs {
    /// Bearer token of the API's clients (required unless `--insecure-no-auth`).
    #[arg(long, env = "PAGAMENTOS_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,

    /// `--admin-token` and `--insecure-no-auth`.
    #[command(flatten)]
    pub admin: HealthAuthArgs,
}

impl std::fmt::Debug for AuthArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthArgs")
            .field("api_token", &self.api_token.as_ref().map(|_| "***"))
            .field("admin", &self.admin)
            .finish()
    }
}

/// Why a service refuses to start with the authentication it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthConfigError {
    #[error(
        "authentication is required: set PAGAMENTOS_API_TOKEN and PAGAMENTOS_ADMIN_TOKEN \
         (or start with --insecure-no-auth to serve without it); missing: {0}"
    )]
    Missing(&'static str),
    #[error("PAGAMENTOS_API_TOKEN and PAGAMENTOS_ADMIN_TOKEN must differ")]
    SameToken,
    #[error("--insecure-no-auth was given together with tokens; choose one")]
    InsecureWithTokens,
}

/// What `/readyz` says of a service started with `--insecure-no-auth`.
pub const INSECURE_WARNING: &str = "authentication disabled (--insecure-no-auth): every caller is an admin";

impl AuthArgs {
    /// No authentication, said explicitly (tests, local experiments).
    pub fn insecure() -> Self {
        Self { api_token: None, admin: HealthAuthArgs { admin_token: None, insecure_no_auth: true } }
    }

    /// The same admin token and mode for a service without an API (antifraude and notificacoes
    /// in `pagamentos all`): who may read its `/readyz` detail.
    pub fn health(&self) -> HealthAuthArgs {
        self.admin.clone()
    }

    /// Both tokens.
    pub fn tokens(api: impl Into<String>, admin: impl Into<String>) -> Self {
        Self {
            api_token: Some(api.into()),
            admin: HealthAuthArgs { admin_token: Some(admin.into()), insecure_no_auth: false },
        }
    }

    /// The tokens a service accepts, or why it must not start. `--insecure-no-auth` is logged as
    /// a warning here, naming `service`.
    pub fn resolve(&self, service: &str) -> Result<Tokens, AuthConfigError> {
        let api = self.api_token.clone().filter(|token| !token.is_empty());
        let admin = self.admin.admin_token.clone().filter(|token| !token.is_empty());
        if self.admin.insecure_no_auth {
            if api.is_some() || admin.is_some() {
                return Err(AuthConfigError::InsecureWithTokens);
            }
            tracing::warn!(service, "{INSECURE_WARNING}");
            return Ok(Tokens::Disabled);
        }
        match (api, admin) {
            (None, None) => Err(AuthConfigError::Missing("PAGAMENTOS_API_TOKEN, PAGAMENTOS_ADMIN_TOKEN")),
            (None, Some(_)) => Err(AuthConfigError::Missing("PAGAMENTOS_API_TOKEN")),
            (Some(_), None) => Err(AuthConfigError::Missing("PAGAMENTOS_ADMIN_TOKEN")),
            (Some(api), Some(admin)) if api == admin => Err(AuthConfigError::SameToken),
            (Some(api), Some(admin)) => Ok(Tokens::Required { api, admin }),
        }
    }
}

/// The tokens a service accepts.
#[derive(Clone)]
pub enum Tokens {
    /// Both tokens: the only way [`AuthArgs::resolve`] serves an API by default.
    Required { api: String, admin: String },
    /// `--insecure-no-auth`: every caller is an anonymous admin.
    Disabled,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Required { .. } => f.write_str("Tokens::Required { api: ***, admin: *** }"),
            Self::Disabled => f.write_str("Tokens::Disabled"),
        }
    }
}

fn matches(given: &str, expected: &str) -> bool {
    bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

/// Anonymous callers share one scope when authentication is disabled.
const ANONYMOUS: &str = "anonimo";

impl Tokens {
    /// What `/readyz` should report about authentication, if anything.
    pub fn warnings(&self) -> Vec<String> {
        match self {
            Self::Required { .. } => Vec::new(),
            Self::Disabled => vec![INSECURE_WARNING.to_owned()],
        }
    }

    /// Who may read `/readyz`'s detail: the admin token, or everyone without authentication.
    pub fn readiness_detail(&self) -> telemetry::health::ReadinessDetail {
        match self {
            Self::Required { admin, .. } => telemetry::health::ReadinessDetail::Token(admin.clone()),
            Self::Disabled => telemetry::health::ReadinessDetail::Open,
        }
    }

    /// The caller that `authorization` (the header's value, if any) identifies.
    pub fn caller(&self, authorization: Option<&str>) -> Result<Caller, ApiError> {
        let (api, admin) = match self {
            Self::Disabled => return Ok(Caller { scope: ANONYMOUS.into(), admin: true }),
            Self::Required { api, admin } => (api, admin),
        };
        let given =
            authorization.and_then(|value| value.strip_prefix("Bearer ")).ok_or(ApiError::Unauthorized)?;
        // both compared, so the time taken does not tell which token came close
        let is_admin = matches(given, admin);
        let is_api = matches(given, api);
        if !(is_admin || is_api) {
            return Err(ApiError::Unauthorized);
        }
        Ok(Caller { scope: hex::encode(Sha256::digest(given.as_bytes())), admin: is_admin })
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

    fn args(api: Option<&str>, admin: Option<&str>, insecure: bool) -> AuthArgs {
        AuthArgs {
            api_token: api.map(str::to_owned),
            admin: HealthAuthArgs { admin_token: admin.map(str::to_owned), insecure_no_auth: insecure },
        }
    }

    #[test]
    fn without_both_tokens_a_service_refuses_to_start() {
        for (api, admin, missing) in [
            (None, None, "PAGAMENTOS_API_TOKEN, PAGAMENTOS_ADMIN_TOKEN"),
            (Some("api"), None, "PAGAMENTOS_ADMIN_TOKEN"),
            (None, Some("adm"), "PAGAMENTOS_API_TOKEN"),
            (Some(""), Some("adm"), "PAGAMENTOS_API_TOKEN"),
        ] {
            assert_eq!(
                args(api, admin, false).resolve("test").err(),
                Some(AuthConfigError::Missing(missing))
            );
        }
        assert_eq!(
            args(Some("same"), Some("same"), false).resolve("test").err(),
            Some(AuthConfigError::SameToken)
        );
        assert_eq!(
            args(Some("api"), None, true).resolve("test").err(),
            Some(AuthConfigError::InsecureWithTokens)
        );
    }

    #[test]
    fn the_api_services_and_the_others_read_the_same_admin_settings() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Api {
            #[command(flatten)]
            auth: AuthArgs,
        }
        #[derive(Debug, Parser)]
        struct Health {
            #[command(flatten)]
            auth: HealthAuthArgs,
        }
        let argv = ["svc", "--admin-token", "adm", "--insecure-no-auth=false"];
        let api = Api::try_parse_from(argv).expect("api service");
        let health = Health::try_parse_from(argv).expect("service without an API");
        assert_eq!(api.auth.health().admin_token.as_deref(), Some("adm"));
        assert_eq!(health.auth.admin_token.as_deref(), Some("adm"));
        assert!(
            Health::try_parse_from(["svc", "--api-token", "api"]).is_err(),
            "no API token without an API"
        );
    }

    #[test]
    fn insecure_mode_is_explicit_and_reported() {
        let tokens = args(None, None, true).resolve("test").expect("insecure");
        let caller = tokens.caller(None).expect("open");
        assert!(caller.admin);
        assert_eq!(tokens.warnings(), vec![INSECURE_WARNING.to_owned()]);
        assert!(matches!(tokens.readiness_detail(), telemetry::health::ReadinessDetail::Open));
        let secured = AuthArgs::tokens("api", "adm").resolve("test").expect("tokens");
        assert!(secured.warnings().is_empty());
        assert!(
            matches!(secured.readiness_detail(), telemetry::health::ReadinessDetail::Token(t) if t == "adm")
        );
    }

    #[test]
    fn the_admin_token_works_everywhere_the_api_token_only_on_the_api() {
        let both = AuthArgs::tokens("api", "adm").resolve("test").expect("tokens");
        assert!(matches!(both.caller(None), Err(ApiError::Unauthorized)));
        assert!(matches!(both.caller(Some("Bearer nope")), Err(ApiError::Unauthorized)));
        assert!(matches!(both.caller(Some("Bearer ")), Err(ApiError::Unauthorized)));
        assert!(matches!(both.caller(Some("api")), Err(ApiError::Unauthorized)));
        let api = both.caller(Some("Bearer api")).expect("api token");
        assert!(!api.admin && api.require_admin().is_err());
        let admin = both.caller(Some("Bearer adm")).expect("admin token");
        assert!(admin.admin && admin.require_admin().is_ok());
        assert_ne!(api.scope, admin.scope);
    }

    #[test]
    fn tokens_never_show_in_debug_output() {
        let args = AuthArgs::tokens("api-secret-1", "admin-secret-2");
        let tokens = args.resolve("test").expect("tokens");
        for text in [format!("{args:?}"), format!("{tokens:?}")] {
            assert!(!text.contains("secret"), "{text}");
        }
    }
}
