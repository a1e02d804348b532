//! The HTTP API (`CONTRACT.md` §2, *transferencias*).
//!
//! # Layout
//! - [`transfers`]: `POST /transferencias`, `GET /transferencias/{id}`, `GET /transferencias`.
//! - [`auth`]: bearer tokens and the caller's Idempotency-Key scope.
//! - [`error`]: `ApiError`, answered as problem+json.
//! - [`body`]: the JSON body extractor (size and content-type checks in our error format).
//! - [`openapi`]: the OpenAPI 3.1 document at `/openapi.json` (outside auth).

pub mod auth;
pub mod body;
pub mod error;
pub mod openapi;
pub mod transfers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
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
    pub tokens: auth::Tokens,
}

/// The API routes (health and metrics are merged in by the service, outside auth).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/transferencias", post(transfers::create).get(transfers::list))
        .route("/transferencias/{id}", get(transfers::get))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::authenticate))
        .route("/openapi.json", get(|| async { axum::Json(openapi::document()) }))
        .fallback(|| async { error::ApiError::NotFound("no such route".into()) })
        .with_state(state)
        .layer(middleware::from_fn(observe))
}

/// `http_server_request_duration_seconds{method, route, status}` for every request.
async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let response = next.run(request).await;
    metrics::histogram!(
        "http_server_request_duration_seconds",
        "method" => method,
        "route" => route,
        "status" => response.status().as_u16().to_string(),
    )
    .record(started.elapsed().as_secs_f64());
    response
}
