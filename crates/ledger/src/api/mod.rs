//! The accounts API (`docs/reference/contract.md` §2, *ledger*): `POST /contas`, `POST /contas/{id}/depositos`,
//! `GET /contas/{id}`, `GET /contas/{id}/lancamentos`, and the OpenAPI document.
//!
//! Money enters the books only here: an opening balance or a deposit is a double entry from the
//! currency's issuer account. When `PAGAMENTOS_ADMIN_TOKEN` is set, creating accounts and
//! deposits needs it (`403` with the API token); reads accept either token, and an API client's
//! token (`pagamentos clients`) reads its own accounts only (any other is `404`, as unknown).

pub mod openapi;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use contracts::{AccountId, Amount, Cents, Currency, EntryKind, Timestamp};
use service::server::Handoff;
use web::problem::Kind;
use web::{ApiError, Caller, FieldError, JsonBody, Problem};

use self::openapi::{AccountRequestBody, DepositRequestBody};

use crate::error::{FailureKind, StoreError};
use crate::store::{self, AccountRow, CreateAccountError, Deposit, DepositError, DepositMade, Entry};

/// `limit` of `GET /contas/{id}/lancamentos`: default and ceiling.
pub const ENTRIES_LIMIT_DEFAULT: i64 = 50;
pub const ENTRIES_LIMIT_MAX: i64 = 500;

const ACCOUNT_EXISTS: Kind = Kind { uri: "/problems/account-exists", title: "Account exists" };
const DEPOSIT_ID_REUSED: Kind = Kind { uri: "/problems/deposit-id-reused", title: "depositoId reused" };
const AMOUNT_OUT_OF_RANGE: Kind = Kind { uri: "/problems/amount-out-of-range", title: "Amount out of range" };

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub tokens: web::Tokens,
}

/// The API routes and `/openapi.json` (health and metrics are merged in by the service,
/// outside auth; the document describes them too).
pub fn router(state: AppState) -> Router {
    let (api, document) = routes()
        .route_layer(middleware::from_fn_with_state(state.tokens.clone(), web::auth::authenticate))
        .split_for_parts();
    api.merge(web::openapi::route(document, openapi::BEARER))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .with_state(state)
        .layer(middleware::from_fn(web::observe))
}

/// The API's routes, each with its `#[utoipa::path]`.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(<openapi::ApiDoc as utoipa::OpenApi>::openapi())
        .routes(routes!(create_account))
        .routes(routes!(get_account))
        .routes(routes!(deposit))
        .routes(routes!(list_entries))
}

/// The API's document as derived from its routes (before the bearer scheme and the operational
/// routes are added).
pub fn document() -> utoipa::openapi::OpenApi {
    routes().split_for_parts().1
}

/// A database failure: `503` (with `Retry-After`) when the database is unreachable, else `500`.
fn internal(error: impl Into<StoreError>) -> ApiError {
    let error = error.into();
    if error.kind() == FailureKind::Infrastructure {
        tracing::warn!(error = %telemetry::error_chain(&error), "ledger database unreachable");
        return ApiError::Unavailable("the ledger database is unreachable; retry later".into());
    }
    ApiError::internal(error)
}

/// An account as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Account)]
pub struct AccountView {
    pub id: AccountId,
    #[serde(rename = "moeda")]
    pub currency: Currency,
    /// Negative only for an issuer account.
    #[serde(rename = "saldoCentavos")]
    pub balance_cents: Cents,
}

impl From<AccountRow> for AccountView {
    fn from(row: AccountRow) -> Self {
        Self { id: row.id, currency: row.currency, balance_cents: row.balance_cents }
    }
}

/// A deposit as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Deposit)]
pub struct DepositView {
    #[serde(rename = "depositoId")]
    pub deposit_id: Uuid,
    #[serde(rename = "contaId")]
    pub account_id: AccountId,
    #[serde(rename = "valorEmCentavos")]
    pub amount_cents: Amount,
    #[schema(value_type = String, format = DateTime)]
    #[serde(rename = "criadoEm")]
    pub created_at: Timestamp,
}

impl From<Deposit> for DepositView {
    fn from(deposit: Deposit) -> Self {
        Self {
            deposit_id: deposit.id,
            account_id: deposit.account,
            amount_cents: deposit.amount_cents,
            created_at: deposit.created_at,
        }
    }
}

/// An entry as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Entry)]
pub struct EntryView {
    pub id: i64,
    /// The transfer's id, or the `depositoId`.
    #[serde(rename = "transferenciaId")]
    pub transfer_id: Uuid,
    #[serde(rename = "tipo")]
    pub kind: EntryKind,
    #[serde(rename = "valorCentavos")]
    pub amount_cents: Amount,
    #[schema(value_type = String, format = DateTime)]
    #[serde(rename = "criadoEm")]
    pub created_at: Timestamp,
}

impl From<Entry> for EntryView {
    fn from(entry: Entry) -> Self {
        Self {
            id: entry.id,
            transfer_id: entry.transfer_id,
            kind: entry.kind,
            amount_cents: entry.amount_cents,
            created_at: entry.created_at,
        }
    }
}

/// An integer number of cents in `field`: `Ok(None)` when absent.
fn cents(
    object: &serde_json::Map<String, Value>,
    field: &'static str,
    errors: &mut Vec<FieldError>,
) -> Option<i64> {
    match object.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::Number(number)) => match number.as_i64() {
            Some(value) => Some(value),
            None if number.is_u64() => {
                errors.push(FieldError::new(field, "must be at most 9223372036854775807"));
                None
            }
            None => {
                errors.push(FieldError::new(field, "must be an integer number of cents"));
                None
            }
        },
        Some(_) => {
            errors.push(FieldError::new(field, "must be an integer number of cents"));
            None
        }
    }
}

fn object(body: &Value) -> Result<&serde_json::Map<String, Value>, ApiError> {
    body.as_object()
        .ok_or_else(|| ApiError::Validation(vec![FieldError::new("body", "must be a JSON object")]))
}

/// An account id from the path: syntax checked, issuer accounts readable.
fn path_account(id: String) -> Result<AccountId, ApiError> {
    AccountId::parse(id).map_err(|invalid| ApiError::Validation(vec![FieldError::new("id", invalid.message)]))
}

/// An account from the path that `caller` may read: an API client's token reads only its own
/// accounts, and another's is answered as an unknown account (it learns nothing of it).
fn readable_account(caller: &Caller, id: String) -> Result<AccountId, ApiError> {
    let id = path_account(id)?;
    if caller.may_use(id.as_str()) {
        Ok(id)
    } else {
        Err(ApiError::NotFound(format!("no account {id}")))
    }
}

/// Create an account, optionally with an opening balance.
///
/// Needs the admin token when `PAGAMENTOS_ADMIN_TOKEN` is set.
#[utoipa::path(
    post,
    path = "/contas",
    tag = "contas",
    request_body(content = AccountRequestBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = AccountView,
            headers(("Location" = String, description = "`/contas/{id}`"))),
        (status = 400, description = "Invalid request (EMISSOR-… ids are reserved); `errors` lists each broken rule", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "A bearer token is required", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token is required", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The account exists", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 16 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The opening balance would take the currency's issuer account past the largest amount (`/problems/amount-out-of-range`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unreachable; retry after `Retry-After`", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn create_account(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let object = object(&body)?;
    let mut errors = Vec::new();
    let id = web::required_text(object, "id", &mut errors, |id| {
        AccountId::customer(id).map_err(|invalid| invalid.message)
    });
    let currency = web::required_text(object, "moeda", &mut errors, |code| {
        Currency::parse(code).map_err(|invalid| invalid.to_string())
    });
    let opening = cents(object, "saldoInicialCentavos", &mut errors).unwrap_or(0);
    if opening < 0 {
        errors.push(FieldError::new("saldoInicialCentavos", "must not be negative"));
    }
    let (Some(id), Some(currency)) = (id, currency) else { return Err(ApiError::Validation(errors)) };
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    match store::create_account(&state.pool, &id, &currency, Cents::new(opening)).await {
        Ok(account) => {
            let location = format!("/contas/{}", account.id);
            Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(AccountView::from(account)))
                .into_response())
        }
        Err(CreateAccountError::Exists(id)) => {
            Err(ApiError::Conflict { kind: ACCOUNT_EXISTS, detail: format!("account {id} already exists") })
        }
        Err(CreateAccountError::Deposit(error)) => Err(deposit_error(error)),
        Err(CreateAccountError::Store(error)) => Err(internal(error)),
    }
}

fn deposit_error(error: DepositError) -> ApiError {
    match error {
        DepositError::NoAccount(id) => ApiError::NotFound(format!("no account {id}")),
        DepositError::IdReused { id, original } => ApiError::Unprocessable {
            kind: DEPOSIT_ID_REUSED,
            detail: format!(
                "depositoId {id} was already used for {} cents into {}",
                original.amount_cents, original.account
            ),
        },
        DepositError::Overflow(account) => ApiError::Unprocessable {
            kind: AMOUNT_OUT_OF_RANGE,
            detail: format!("the balance of {account} would exceed the largest amount"),
        },
        DepositError::Store(error) => internal(error),
    }
}

/// Deposit into an account, idempotent on `depositoId`: `201`, or `200` with the original when
/// this deposit was made before (no money moves again).
///
/// Needs the admin token when `PAGAMENTOS_ADMIN_TOKEN` is set.
#[utoipa::path(
    post,
    path = "/contas/{id}/depositos",
    tag = "contas",
    params(("id" = AccountId, Path, description = "The account")),
    request_body(content = DepositRequestBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Deposited", body = DepositView),
        (status = 200, description = "This deposit was made before: the original, no money moved", body = DepositView),
        (status = 400, description = "Invalid request; `errors` lists each broken rule", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "A bearer token is required", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token is required", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown account (or an issuer account)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 16 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "depositoId already used with another account or amount, or the balance would overflow", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "`/problems/outcome-unknown`: the request timed out (`PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS`) while the deposit was being written, so it may or may not have been made; retry with the same depositoId (answered with the original if it was made) or look at the account's entries. Any other 500 is `/problems/internal`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unreachable; retry after `Retry-After`", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn deposit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    handoff: Handoff,
    Path(account): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let account = path_account(account)?;
    let object = object(&body)?;
    let mut errors = Vec::new();
    let deposit_id = match object.get("depositoId") {
        None | Some(Value::Null) => {
            errors.push(FieldError::new("depositoId", "is required"));
            None
        }
        Some(Value::String(text)) => match Uuid::parse_str(text) {
            Ok(id) => Some(id),
            Err(_) => {
                errors.push(FieldError::new("depositoId", "must be a UUID"));
                None
            }
        },
        Some(_) => {
            errors.push(FieldError::new("depositoId", "must be a UUID string"));
            None
        }
    };
    let amount = match cents(object, "valorEmCentavos", &mut errors) {
        None => {
            if !errors.iter().any(|error| error.field == "valorEmCentavos") {
                errors.push(FieldError::new("valorEmCentavos", "is required"));
            }
            None
        }
        Some(amount) => match Amount::new(amount) {
            Ok(amount) => Some(amount),
            Err(_) => {
                errors.push(FieldError::new("valorEmCentavos", "must be greater than 0"));
                None
            }
        },
    };
    let (Some(deposit_id), Some(amount)) = (deposit_id, amount) else {
        return Err(ApiError::Validation(errors));
    };
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    // from here a timeout leaves the outcome unknown (dropped while its COMMIT is on the way,
    // the deposit may be committed): answered outcome-unknown, never "retry later"
    handoff.mark();
    match store::deposit(&state.pool, deposit_id, &account, amount).await.map_err(deposit_error)? {
        DepositMade::New(deposit) => {
            Ok((StatusCode::CREATED, Json(DepositView::from(deposit))).into_response())
        }
        DepositMade::Replayed(deposit) => {
            Ok((StatusCode::OK, Json(DepositView::from(deposit))).into_response())
        }
    }
}

/// One account (issuer accounts included).
#[utoipa::path(
    get,
    path = "/contas/{id}",
    tag = "contas",
    params(("id" = AccountId, Path, description = "The account")),
    responses(
        (status = 200, description = "The account", body = AccountView),
        (status = 400, description = "Malformed id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "A bearer token is required", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown account, or (an API client's token) not one of its accounts", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn get_account(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<AccountView>, ApiError> {
    let id = readable_account(&caller, id)?;
    let account = store::find_account(&state.pool, &id)
        .await
        .map_err(internal)?
        .ok_or_else(|| ApiError::NotFound(format!("no account {id}")))?;
    Ok(Json(account.into()))
}

/// Query of `GET /contas/{id}/lancamentos`; text so a bad value gets our 400.
#[derive(Debug, Deserialize)]
pub struct EntriesQuery {
    limit: Option<String>,
}

/// An account's entries, newest first.
#[utoipa::path(
    get,
    path = "/contas/{id}/lancamentos",
    tag = "contas",
    params(
        ("id" = AccountId, Path, description = "The account"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 500, description = "At most this many (default 50)")
    ),
    responses(
        (status = 200, description = "Entries", body = Vec<EntryView>),
        (status = 400, description = "Malformed id or limit", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "A bearer token is required", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown account, or (an API client's token) not one of its accounts", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn list_entries(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Result<Query<EntriesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<EntryView>>, ApiError> {
    let id = readable_account(&caller, id)?;
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(format!("bad query: {rejection}")))?;
    let limit = match query.limit.as_deref() {
        None => ENTRIES_LIMIT_DEFAULT,
        Some(text) => match text.parse::<i64>() {
            Ok(limit) if (1..=ENTRIES_LIMIT_MAX).contains(&limit) => limit,
            _ => {
                return Err(ApiError::Validation(vec![FieldError::new(
                    "limit",
                    format!("must be an integer from 1 to {ENTRIES_LIMIT_MAX}"),
                )]))
            }
        },
    };
    if store::find_account(&state.pool, &id).await.map_err(internal)?.is_none() {
        return Err(ApiError::NotFound(format!("no account {id}")));
    }
    let entries = store::entries(&state.pool, &id, limit).await.map_err(internal)?;
    Ok(Json(entries.into_iter().map(EntryView::from).collect()))
}
