//! Bearer tokens (`docs/reference/contract.md` §1). Auth fails closed: a service that serves an API needs both
//! `PAGAMENTOS_API_TOKEN` and `PAGAMENTOS_ADMIN_TOKEN` (and they must differ), or refuses to
//! start, unless it was started with `--insecure-no-auth`, which it logs as a warning and
//! reports on `/readyz`. With tokens, every route but health, metrics and the OpenAPI document
//! requires `Authorization: Bearer <token>` (`401` otherwise); the admin token is accepted
//! wherever the API token is, and only it may use the admin routes (accounts, deposits: `403`
//! with the API token) and read `/readyz`'s detail (anyone else reads its status line only). Tokens are compared in constant time and never logged; the caller's
//! identity for Idempotency-Key scoping is a hash of its token.
//!
//! API clients (`docs/reference/contract.md` §2, `pagamentos clients`): besides the two tokens, a service may
//! accept the tokens of clients, each bound to its accounts ([`Client`]). Their SHA-256 is
//! looked up in the service's own database on every request ([`ClientDirectory`], one indexed
//! query; nothing cached), so a revocation holds from the next request on. Only a token of a
//! client token's shape ([`is_client_token`]) is looked up: any other unknown token is a `401`
//! without a query.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

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
    /// The scope of its Idempotency-Keys: a hash of its token (so each client has its own).
    pub scope: String,
    /// It may use the admin routes.
    pub admin: bool,
    /// An API client's token: only its accounts. `None`: every account (the shared API token,
    /// the admin token, or no authentication).
    pub client: Option<Client>,
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

    /// Whether the caller may debit and read `account`: any account, but a client only its own.
    pub fn may_use(&self, account: &str) -> bool {
        self.client.as_ref().is_none_or(|client| client.holds(account))
    }
}

/// An API client (`pagamentos clients`) as its token identifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Its name, unique (for logs and operators).
    pub name: String,
    /// The accounts it may debit and read, and no other.
    pub accounts: Vec<String>,
}

impl Client {
    /// `account` is one of the client's.
    pub fn holds(&self, account: &str) -> bool {
        self.accounts.iter().any(|own| own == account)
    }
}

/// What [`ClientDirectory::find`] answers.
pub type ClientLookup<'a> = Pin<Box<dyn Future<Output = Result<Option<Client>, ApiError>> + Send + 'a>>;

/// Where a service looks up the clients' tokens: a table of its own database, written by
/// `pagamentos clients` (each service reaches only its own database).
pub trait ClientDirectory: Send + Sync {
    /// The client whose token's SHA-256 (hex, [`token_hash`]) is `token_hash`, unless it is
    /// unknown or revoked; `Err` when the directory cannot answer (`503`).
    fn find<'a>(&'a self, token_hash: &'a str) -> ClientLookup<'a>;
}

/// Every client token starts so (a secret scanner can recognise one), then
/// [`CLIENT_TOKEN_HEX_DIGITS`] lowercase hex digits (32 random bytes).
pub const CLIENT_TOKEN_PREFIX: &str = "pgc_";
/// Hex digits of a client token after its prefix.
pub const CLIENT_TOKEN_HEX_DIGITS: usize = 64;

/// `token` has a client token's shape: only such tokens are looked up.
pub fn is_client_token(token: &str) -> bool {
    token.strip_prefix(CLIENT_TOKEN_PREFIX).is_some_and(|digits| {
        digits.len() == CLIENT_TOKEN_HEX_DIGITS
            && digits.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    })
}

/// A token's SHA-256 in lowercase hex: how a client's token is stored, and every caller's
/// Idempotency-Key scope.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The authentication options of a service with an API (`docs/reference/contract.md` §1), flattened once into
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
            (Some(api), Some(admin)) => Ok(Tokens::Required { api, admin, clients: None }),
        }
    }
}

/// The tokens a service accepts.
#[derive(Clone)]
pub enum Tokens {
    /// Both tokens: the only way [`AuthArgs::resolve`] serves an API by default; and the API
    /// clients' tokens when the service gave a directory ([`Tokens::with_clients`]).
    Required { api: String, admin: String, clients: Option<Arc<dyn ClientDirectory>> },
    /// `--insecure-no-auth`: every caller is an anonymous admin.
    Disabled,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Required { clients, .. } => write!(
                f,
                "Tokens::Required {{ api: ***, admin: ***, clients: {} }}",
                if clients.is_some() { "looked up" } else { "none" }
            ),
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

    /// These tokens, and the API clients' tokens looked up in `directory` (with tokens only:
    /// without authentication every caller is an admin already).
    pub fn with_clients(self, directory: Arc<dyn ClientDirectory>) -> Self {
        match self {
            Self::Required { api, admin, .. } => Self::Required { api, admin, clients: Some(directory) },
            Self::Disabled => Self::Disabled,
        }
    }

    /// The caller that `authorization` (the header's value, if any) identifies: `401` for no
    /// token, a wrong one, or a client's token unknown or revoked; `503` when the client
    /// directory cannot answer.
    pub async fn caller(&self, authorization: Option<&str>) -> Result<Caller, ApiError> {
        let (api, admin, clients) = match self {
            Self::Disabled => return Ok(Caller { scope: ANONYMOUS.into(), admin: true, client: None }),
            Self::Required { api, admin, clients } => (api, admin, clients),
        };
        let given =
            authorization.and_then(|value| value.strip_prefix("Bearer ")).ok_or(ApiError::Unauthorized)?;
        // both compared, so the time taken does not tell which token came close
        let is_admin = matches(given, admin);
        let is_api = matches(given, api);
        let scope = token_hash(given);
        if is_admin || is_api {
            return Ok(Caller { scope, admin: is_admin, client: None });
        }
        // a client's token: found by its hash (never compared as text), on every request, so
        // a revoked one is refused from the next request on
        let Some(directory) = clients.as_ref().filter(|_| is_client_token(given)) else {
            return Err(ApiError::Unauthorized);
        };
        match directory.find(&scope).await? {
            Some(client) => Ok(Caller { scope, admin: false, client: Some(client) }),
            None => Err(ApiError::Unauthorized),
        }
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
    let caller = tokens.caller(authorization).await?;
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

    #[tokio::test]
    async fn insecure_mode_is_explicit_and_reported() {
        let tokens = args(None, None, true).resolve("test").expect("insecure");
        let caller = tokens.caller(None).await.expect("open");
        assert!(caller.admin);
        assert_eq!(tokens.warnings(), vec![INSECURE_WARNING.to_owned()]);
        assert!(matches!(tokens.readiness_detail(), telemetry::health::ReadinessDetail::Open));
        let secured = AuthArgs::tokens("api", "adm").resolve("test").expect("tokens");
        assert!(secured.warnings().is_empty());
        assert!(
            matches!(secured.readiness_detail(), telemetry::health::ReadinessDetail::Token(t) if t == "adm")
        );
    }

    #[tokio::test]
    async fn the_admin_token_works_everywhere_the_api_token_only_on_the_api() {
        let both = AuthArgs::tokens("api", "adm").resolve("test").expect("tokens");
        assert!(matches!(both.caller(None).await, Err(ApiError::Unauthorized)));
        assert!(matches!(both.caller(Some("Bearer nope")).await, Err(ApiError::Unauthorized)));
        assert!(matches!(both.caller(Some("Bearer ")).await, Err(ApiError::Unauthorized)));
        assert!(matches!(both.caller(Some("api")).await, Err(ApiError::Unauthorized)));
        let api = both.caller(Some("Bearer api")).await.expect("api token");
        assert!(!api.admin && api.require_admin().is_err());
        assert!(api.client.is_none() && api.may_use("CC-ANY"), "the shared token reaches every account");
        let admin = both.caller(Some("Bearer adm")).await.expect("admin token");
        assert!(admin.admin && admin.require_admin().is_ok());
        assert!(admin.may_use("CC-ANY"));
        assert_ne!(api.scope, admin.scope);
    }

    /// A directory in memory: token hash → client (`None`: revoked), counting its lookups.
    struct Directory {
        clients: std::collections::HashMap<String, Option<Client>>,
        lookups: std::sync::atomic::AtomicUsize,
        down: bool,
    }

    impl ClientDirectory for Directory {
        fn find<'a>(&'a self, token_hash: &'a str) -> ClientLookup<'a> {
            self.lookups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Box::pin(async move {
                if self.down {
                    return Err(ApiError::Unavailable("directory down".into()));
                }
                Ok(self.clients.get(token_hash).cloned().flatten())
            })
        }
    }

    const CLIENT: &str = "pgc_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const REVOKED: &str = "pgc_ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    fn directory(down: bool) -> Arc<Directory> {
        let client = Client { name: "loja".into(), accounts: vec!["CC-A".into(), "CC-B".into()] };
        Arc::new(Directory {
            clients: [(token_hash(CLIENT), Some(client)), (token_hash(REVOKED), None)].into_iter().collect(),
            lookups: Default::default(),
            down,
        })
    }

    #[tokio::test]
    async fn a_clients_token_is_looked_up_by_its_hash_and_binds_the_caller_to_its_accounts() {
        let directory = directory(false);
        let tokens =
            AuthArgs::tokens("api", "adm").resolve("test").expect("tokens").with_clients(directory.clone());
        let caller = tokens.caller(Some(&format!("Bearer {CLIENT}"))).await.expect("a client's token");
        assert_eq!(caller.client.as_ref().map(|client| client.name.as_str()), Some("loja"));
        assert!(!caller.admin && caller.require_admin().is_err(), "a client is no admin");
        assert!(caller.may_use("CC-A") && caller.may_use("CC-B"));
        assert!(!caller.may_use("CC-C") && !caller.may_use("cc-a"), "only its own accounts, exactly");
        assert_eq!(caller.scope, token_hash(CLIENT), "its own Idempotency-Key scope");
        let api = tokens.caller(Some("Bearer api")).await.expect("api token");
        assert_ne!(api.scope, caller.scope);

        // revoked (or unknown): refused; a token of another shape costs no lookup
        let lookups = directory.lookups.load(std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(
            tokens.caller(Some(&format!("Bearer {REVOKED}"))).await,
            Err(ApiError::Unauthorized)
        ));
        for garbage in
            ["nope", "pgc_", &CLIENT.to_uppercase(), &format!("{CLIENT}0"), &CLIENT[..CLIENT.len() - 1]]
        {
            assert!(
                matches!(
                    tokens.caller(Some(&format!("Bearer {garbage}"))).await,
                    Err(ApiError::Unauthorized)
                ),
                "{garbage}"
            );
        }
        assert_eq!(directory.lookups.load(std::sync::atomic::Ordering::Relaxed), lookups + 1);

        // without a directory, a client's token is just an unknown token
        let plain = AuthArgs::tokens("api", "adm").resolve("test").expect("tokens");
        assert!(matches!(plain.caller(Some(&format!("Bearer {CLIENT}"))).await, Err(ApiError::Unauthorized)));
        // a directory that cannot answer: 503, never a pass
        let down = plain.with_clients(self::directory(true));
        assert!(matches!(
            down.caller(Some(&format!("Bearer {CLIENT}"))).await,
            Err(ApiError::Unavailable(_))
        ));
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
