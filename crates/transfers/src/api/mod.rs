//! The HTTP API (`CONTRACT.md` §2, *transferencias*).
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
use axum::routing::{get, post};
use axum::Router;
use sqlx::PgPool;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// Topic of `TransferenciaSolicitada` (with the configured prefix).
    pub requested_topic: Arc<str>,
    pub idempotency_ttl: Duration,
    pub tokens: web::Tokens,
}

/// The API routes (health and metrics are merged in by the service, outside auth).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/transferencias", post(transfers::create).get(transfers::list))
        .route("/transferencias/{id}", get(transfers::get))
        .route_layer(middleware::from_fn_with_state(state.tokens.clone(), web::auth::authenticate))
        .route("/openapi.json", get(|| async { axum::Json(openapi::document()) }))
        .fallback(|| async { web::ApiError::NotFound("no such route".into()) })
        .with_state(state)
        .layer(middleware::from_fn(web::observe))
}
