//! `/transferencias` handlers.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use contracts::{Amount, RejectionReason, Timestamp};

use super::error::FORBIDDEN_ACCOUNT;
use super::openapi::TransferRequestBody;
use super::AppState;
use crate::domain::{validate_account_syntax, FieldError, Status, TransferRequest};
use crate::store::{self, Created, EventTarget, IdempotencyKey, ListFilter, NewTransfer, Transfer};
use service::server::Handoff;
use web::{ApiError, Caller, JsonBody, Problem};

/// `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Answered on a replay.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Longest Idempotency-Key.
pub const IDEMPOTENCY_KEY_LENGTH_MAX: usize = 255;
/// `limit` of `GET /transferencias`: default and ceiling.
pub const LIST_LIMIT_DEFAULT: i64 = 50;
pub const LIST_LIMIT_MAX: i64 = 500;

/// A transfer as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Transfer)]
pub struct TransferView {
    pub id: Uuid,
    #[serde(rename = "contaOrigem")]
    pub source_account: contracts::AccountId,
    #[serde(rename = "contaDestino")]
    pub destination_account: contracts::AccountId,
    #[serde(rename = "valorEmCentavos")]
    pub amount_cents: Amount,
    #[serde(rename = "moeda")]
    pub currency: contracts::Currency,
    pub status: Status,
    /// Set when `status` is `REJEITADA`, else null.
    #[serde(rename = "motivoRejeicao")]
    #[schema(value_type = Option<RejectionReason>, required = true)]
    pub rejection_reason: Option<String>,
    #[serde(rename = "criadaEm")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[serde(rename = "atualizadaEm")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl From<Transfer> for TransferView {
    fn from(row: Transfer) -> Self {
        Self {
            id: row.id,
            source_account: row.source_account,
            destination_account: row.destination_account,
            amount_cents: row.amount_cents,
            currency: row.currency,
            status: row.status,
            rejection_reason: row.rejection_reason,
            created_at: row.created_at.into(),
            updated_at: row.updated_at.into(),
        }
    }
}

/// The request's `Idempotency-Key`: `400` when it is malformed, or missing while `required`.
fn idempotency_key(headers: &HeaderMap, required: bool) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        if required {
            return Err(ApiError::Validation(vec![web::FieldError::new(
                "Idempotency-Key",
                format!(
                    "this header is required: 1 to {IDEMPOTENCY_KEY_LENGTH_MAX} visible ASCII characters, \
                     the same on every retry of this request"
                ),
            )]));
        }
        return Ok(None);
    };
    let bytes = value.as_bytes();
    if bytes.is_empty()
        || bytes.len() > IDEMPOTENCY_KEY_LENGTH_MAX
        || !bytes.iter().all(|b| (0x21..=0x7e).contains(b))
    {
        return Err(ApiError::BadRequest(format!(
            "Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_LENGTH_MAX} visible ASCII characters"
        )));
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// How long a client shed by [`shed_load`] is asked to wait.
pub const OVERLOADED_RETRY_AFTER_S: u32 = 5;

/// `503` while the outbox holds `max_pending` or more unpublished rows (Kafka away or too
/// slow): accepting more would only grow a queue nobody drains. Checked after validation, so
/// a broken request still learns what is wrong with it.
fn shed_load(state: &AppState) -> Result<(), ApiError> {
    let pending = state.backlog.rows();
    if pending < state.max_pending {
        return Ok(());
    }
    metrics::counter!("transfers_refused_total", "reason" => "outbox_full").increment(1);
    Err(ApiError::Overloaded {
        detail: format!(
            "{pending} transfers are waiting to be published (bound {}); retry in {OVERLOADED_RETRY_AFTER_S} s",
            state.max_pending
        ),
        retry_after_s: OVERLOADED_RETRY_AFTER_S,
    })
}

/// Request a transfer: `202` with the transfer, `PENDENTE`.
///
/// The transfer and its `TransferenciaSolicitada` event are written in one database
/// transaction; the event reaches Kafka through the outbox.
#[utoipa::path(
    post,
    path = "/transferencias",
    tag = "transferencias",
    params((
        "Idempotency-Key" = String, Header,
        description = "1–255 visible ASCII characters, required (`400` without it, unless the service runs with `TRANSFERENCIAS_IDEMPOTENCY_KEY_REQUIRED=false`). The same key with the same request answers 202 again with `Idempotent-Replayed: true`; with another request 422; while the first is in flight 409. Send it again unchanged on every retry, above all after a `500` `/problems/outcome-unknown`."
    )),
    request_body(content = TransferRequestBody, content_type = "application/json"),
    responses(
        (status = 202, description = "Accepted, status PENDENTE", body = TransferView,
            headers(
                ("Location" = String, description = "`/transferencias/{id}`"),
                ("Idempotent-Replayed" = String, description = "`true` when this answers an earlier request with the same key")
            )),
        (status = 400, description = "Invalid request (a missing Idempotency-Key included); `errors` lists each broken rule", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "A bearer token is required (an API client's revoked token included)", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`/problems/forbidden-account`: an API client's token, and `contaOrigem` is not one of its accounts; nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A request with this Idempotency-Key is in flight", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 16 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Idempotency-Key already used with another request", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "`/problems/outcome-unknown`: the connection to the database broke while the transfer was being committed, or the request timed out (`PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS`) after it was handed to the writer, so it may or may not exist; retry with the same Idempotency-Key (answered with the transfer if it exists) or look it up. Any other 500 is `/problems/internal`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unreachable (`/problems/unavailable`), or more transfers than the configured bound wait in the outbox for Kafka (`/problems/overloaded`); retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json")
    )
)]
#[tracing::instrument(skip_all, fields(transfer_id))]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    handoff: Handoff,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, state.idempotency_key_required)?;
    let request = TransferRequest::parse(&body).map_err(ApiError::Validation)?;
    // an API client debits its own accounts only; refused before anything is written
    if !caller.may_use(request.source_account.as_str()) {
        return Err(ApiError::Denied {
            kind: FORBIDDEN_ACCOUNT,
            detail: format!("this token may not debit the account {}", request.source_account),
        });
    }
    shed_load(&state)?;
    let key = key.map(|key| IdempotencyKey {
        scope: caller.scope.clone(),
        key,
        fingerprint: request.fingerprint(),
        ttl: state.idempotency_ttl,
    });
    let span = tracing::Span::current();
    let trace = telemetry::context::inject(&span);
    let amount_cents = request.amount_cents.get();
    let target = EventTarget {
        topic: state.requested_topic.clone(),
        traceparent: trace.get("traceparent").cloned(),
        tracestate: trace.get("tracestate").cloned(),
    };
    // past the handoff, a timeout is answered outcome-unknown: the writer goes on without us
    let (transfer, replayed) =
        match state.writer.create_marking(NewTransfer { request, key, target }, &handoff).await? {
            Created::New(transfer) => (transfer, false),
            Created::Replayed(transfer) => (transfer, true),
        };
    span.record("transfer_id", tracing::field::display(transfer.id));
    if replayed {
        tracing::info!("idempotent replay");
    } else {
        metrics::counter!("transfers_accepted_total").increment(1);
        tracing::info!(amount_cents, "transfer accepted");
    }
    let location = format!("/transferencias/{}", transfer.id);
    let mut response = (StatusCode::ACCEPTED, Json(TransferView::from(transfer))).into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, location);
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// One transfer.
#[utoipa::path(
    get,
    path = "/transferencias/{id}",
    tag = "transferencias",
    params(("id" = Uuid, Path, description = "The transfer's id")),
    responses(
        (status = 200, description = "The transfer", body = TransferView),
        (status = 400, description = "Malformed id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "A bearer token is required", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown transfer, or (an API client's token) one that touches none of its accounts", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<TransferView>, ApiError> {
    let id = Uuid::parse_str(&id)
        .map_err(|_| ApiError::BadRequest(format!("{id:?} is not a transfer id (a UUID)")))?;
    let transfer = store::find(&state.pool, id)
        .await?
        // another's transfer is answered as an unknown one: an API client learns nothing of it
        .filter(|transfer| {
            caller.may_use(transfer.source_account.as_str())
                || caller.may_use(transfer.destination_account.as_str())
        })
        .ok_or_else(|| ApiError::NotFound(format!("no transfer {id}")))?;
    Ok(Json(transfer.into()))
}

/// Query of `GET /transferencias`; every field is text so a bad value gets our 400.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    #[serde(rename = "conta")]
    account: Option<String>,
    status: Option<String>,
    limit: Option<String>,
}

/// List transfers, newest first. With an API client's token, only those touching its accounts
/// (with `conta`: those of `conta` that do).
#[utoipa::path(
    get,
    path = "/transferencias",
    tag = "transferencias",
    params(
        ("conta" = Option<contracts::AccountId>, Query, description = "Either side of the transfer (an API client's token lists only transfers touching its own accounts)"),
        ("status" = Option<Status>, Query),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 500, description = "At most this many (default 50)")
    ),
    responses(
        (status = 200, description = "Transfers", body = Vec<TransferView>),
        (status = 400, description = "Bad query; `errors` lists each broken rule", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "A bearer token is required", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<TransferView>>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(format!("bad query: {rejection}")))?;
    let mut errors = Vec::new();
    let account = match query.account {
        Some(account) => match validate_account_syntax(&account) {
            Ok(()) => Some(account),
            Err(message) => {
                errors.push(FieldError { field: "conta", message });
                None
            }
        },
        None => None,
    };
    let status = match query.status.as_deref() {
        None => None,
        Some(text) => match Status::parse(text) {
            Ok(status) => Some(status),
            Err(_) => {
                errors.push(FieldError {
                    field: "status",
                    message: "must be PENDENTE, LIQUIDADA or REJEITADA".into(),
                });
                None
            }
        },
    };
    let limit = match query.limit.as_deref() {
        None => LIST_LIMIT_DEFAULT,
        Some(text) => match text.parse::<i64>() {
            Ok(limit) if (1..=LIST_LIMIT_MAX).contains(&limit) => limit,
            _ => {
                errors.push(FieldError {
                    field: "limit",
                    message: format!("must be an integer from 1 to {LIST_LIMIT_MAX}"),
                });
                LIST_LIMIT_DEFAULT
            }
        },
    };
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let rows = match &caller.client {
        // every transfer of `conta` touches it: one of the client's own
        Some(client) if account.as_deref().is_none_or(|account| !client.holds(account)) => {
            store::list_touching(&state.pool, &client.accounts, account.as_deref(), status, limit).await?
        }
        _ => store::list(&state.pool, &ListFilter { account, status, limit }).await?,
    };
    Ok(Json(rows.into_iter().map(TransferView::from).collect()))
}
