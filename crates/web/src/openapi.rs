//! What the OpenAPI documents of both APIs share (`docs/reference/contract.md` §2, `/openapi.json`).
//!
//! Each API derives its document with utoipa from the handlers themselves (`#[utoipa::path]`
//! next to each handler, routes registered through `utoipa_axum`, so a route cannot exist
//! undocumented); this module adds the bearer scheme and serves the finished document.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::OpenApi;
use utoipa::OpenApi as _;

/// Name of the bearer security scheme in the documents.
pub const BEARER: &str = "bearer";

/// Declares the bearer scheme, required by every operation (auth fails closed; a service
/// started with `--insecure-no-auth` accepts requests without it), except the operational
/// routes (`/healthz`, `/readyz`, `/metrics`, `/openapi.json`), which declare no security.
pub fn with_bearer(mut document: OpenApi, description: &str) -> OpenApi {
    let components = document.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some(description)).build(),
        ),
    );
    document.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    document
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(openapi_json))]
struct DocumentRoute;

/// `GET /openapi.json`, outside auth, serving an API's `document` completed with the bearer
/// scheme (described by `bearer`), `/healthz`, `/readyz`, `/metrics` and this route.
pub fn route<S: Clone + Send + Sync + 'static>(document: OpenApi, bearer: &str) -> Router<S> {
    let mut document = with_bearer(document, bearer);
    document.merge(telemetry::health::openapi());
    document.merge(DocumentRoute::openapi());
    let json = document.to_json().unwrap_or_else(|error| {
        // A derived document always serialises; say so loudly if that ever stops being true.
        tracing::error!(%error, "the OpenAPI document does not serialise");
        "{}".into()
    });
    Router::new().route("/openapi.json", get(openapi_json)).with_state(Arc::<str>::from(json))
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    security(()),
    responses((status = 200, description = "This document (OpenAPI 3.1)", content_type = "application/json"))
)]
async fn openapi_json(State(json): State<Arc<str>>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], json.to_string()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_bearer_scheme_is_required_but_not_on_the_operational_routes() {
        let mut document = with_bearer(OpenApi::default(), "when a token is set");
        document.merge(telemetry::health::openapi());
        document.merge(DocumentRoute::openapi());
        let value: Value = serde_json::to_value(&document).expect("json");
        assert_eq!(value["openapi"], "3.1.0");
        assert_eq!(value["components"]["securitySchemes"][BEARER]["scheme"], "bearer");
        assert_eq!(value["security"], serde_json::json!([{"bearer": []}]));
        for path in ["/openapi.json", "/healthz", "/readyz", "/metrics"] {
            assert_eq!(value["paths"][path]["get"]["security"], serde_json::json!([{}]), "{path}");
        }
    }
}
