//! The HTTP edge every pagamentos API shares (`docs/reference/contract.md` §2): errors answered as
//! problem+json, the JSON body extractor with its 413/415/400 answers, bearer tokens, the
//! request-duration histogram. The field rules both APIs apply (account ids, currencies) are
//! business rules and live in `contracts::domain`.
//!
//! # Layout
//! - [`problem`]: [`ApiError`] and [`FieldError`], answered as RFC 9457 problem+json.
//! - [`body`]: [`JsonBody`], the size- and content-type-checked JSON extractor.
//! - [`auth`]: [`Tokens`], the `authenticate` middleware, the [`Caller`] it leaves behind (an
//!   API [`Client`] bound to its accounts, looked up in a service's [`ClientDirectory`]).
//! - [`openapi`]: what both OpenAPI documents share: problem responses, the bearer scheme and
//!   the `/openapi.json` route.
//! - `observe`: `http_server_request_duration_seconds{method,route,status}` and the request's
//!   span, continuing an incoming `traceparent`.

#![forbid(unsafe_code)]

pub mod auth;
pub mod body;
pub mod openapi;
pub mod problem;

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub use auth::{AuthArgs, AuthConfigError, Caller, Client, ClientDirectory, Tokens};
pub use body::JsonBody;
pub use problem::{required_text, ApiError, FieldError, Problem};

/// Middleware: `http_server_request_duration_seconds{method, route, status}` for every request,
/// and a span `http.request` that continues the caller's W3C `traceparent` when it sends one,
/// so a transfer's trace can start in the client.
pub async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let span = tracing::info_span!("http.request", http.method = %method, http.route = %route);
    let (traceparent, tracestate) = {
        let header =
            |name: &str| request.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
        (header("traceparent"), header("tracestate"))
    };
    telemetry::context::continue_from(&span, traceparent.as_deref(), tracestate.as_deref());
    let response = next.run(request).instrument(span).await;
    metrics::histogram!(
        "http_server_request_duration_seconds",
        "method" => method,
        "route" => route,
        "status" => response.status().as_u16().to_string(),
    )
    .record(started.elapsed().as_secs_f64());
    response
}
