//! The HTTP API (`docs/reference/contract.md` §2, *transferencias*).
//!
//! # Layout
//! - [`transfers`]: `POST /transferencias`, `GET /transferencias/{id}`, `GET /transferencias`.
//! - [`error`]: the service's errors as `web::ApiError` (problem+json); bearer tokens, the
//!   JSON body extractor and request metrics come from the `web` crate.
//! - [`openapi`]: the OpenAPI 3.1 document at `/openapi.json` (outside auth).

pub mod error;
pub mod openapi;
pub mod transfers;

use std::sync::Arc;
use std::time::Duration;

use axum::middleware;
use axum::Router;
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// Writes accepted transfers (group commit in the `fast` profile).
    pub writer: crate::writer::Writer,
    /// Topic of `TransferenciaSolicitada` (with the configured prefix).
    pub requested_topic: Arc<str>,
    pub idempotency_ttl: Duration,
    /// `POST /transferencias` needs an `Idempotency-Key` (`400` without one).
    pub idempotency_key_required: bool,
    pub tokens: web::Tokens,
    /// The outbox backlog as last measured, and the bound past which new transfers get `503`.
    pub backlog: outbox::metrics::Backlog,
    pub max_pending: i64,
}

/// The API's routes, each with its `#[utoipa::path]`.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(<openapi::ApiDoc as utoipa::OpenApi>::openapi())
        .routes(routes!(transfers::create, transfers::list))
        .routes(routes!(transfers::get))
}

/// The API's document as derived from its routes (before the bearer scheme and the operational
/// routes are added).
pub fn document() -> utoipa::openapi::OpenApi {
    routes().split_for_parts().1
}

/// The API routes and `/openapi.json` (health and metrics are merged in by the service,
/// outside auth; the document describes them too).
pub fn router(state: AppState) -> Router {
    let (api, document) = routes()
        .route_layer(middleware::from_fn_with_state(state.tokens.clone(), web::auth::authenticate))
        .split_for_parts();
    api.merge(web::openapi::route(document, openapi::BEARER))
        .fallback(|| async { web::ApiError::NotFound("no such route".into()) })
        .with_state(state)
        .layer(middleware::from_fn(web::observe))
}
