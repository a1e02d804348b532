//! `/healthz`, `/readyz` and `/metrics`, mounted by every service (`CONTRACT.md` §2).
//!
//! `/healthz` answers while the process is alive; `/readyz` runs every readiness check (its
//! database, its Kafka) concurrently with a timeout and answers `503` naming each one that
//! failed; `/metrics` renders the Prometheus text format. A service running in a mode an
//! operator chose against the defaults (e.g. `--insecure-no-auth`) says so on `/readyz`, one
//! `warning:` line each, whatever the checks say.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::supervisor::Supervisor;

/// How long one readiness check may take before it counts as failed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A dependency a service needs to do its work.
pub trait ReadinessCheck: Send + Sync + 'static {
    /// Short name shown in `/readyz` (`postgres`, `kafka`).
    fn name(&self) -> &'static str;
    /// `Ok` when the dependency answers; `Err` says why not.
    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
}

#[derive(Clone)]
struct HealthState {
    checks: Arc<Vec<Arc<dyn ReadinessCheck>>>,
    metrics: PrometheusHandle,
    warnings: Arc<Vec<String>>,
    supervisor: Option<Supervisor>,
}

/// The three routes, to merge into a service's router.
pub fn router(checks: Vec<Arc<dyn ReadinessCheck>>, metrics: PrometheusHandle) -> Router {
    router_with_warnings(checks, metrics, Vec::new())
}

/// [`router`] for a service that `/readyz` must also describe with `warnings` (one line each).
pub fn router_with_warnings(
    checks: Vec<Arc<dyn ReadinessCheck>>,
    metrics: PrometheusHandle,
    warnings: Vec<String>,
) -> Router {
    routes(HealthState { checks: Arc::new(checks), metrics, warnings: Arc::new(warnings), supervisor: None })
}

/// [`router_with_warnings`] for a service run by `supervisor`: `/readyz` also answers `503`
/// with a `task <name> stopped: <why>` line per task that stopped on its own, and a
/// `shutting down` line once the shutdown began.
pub fn router_supervised(
    checks: Vec<Arc<dyn ReadinessCheck>>,
    metrics: PrometheusHandle,
    warnings: Vec<String>,
    supervisor: &Supervisor,
) -> Router {
    routes(HealthState {
        checks: Arc::new(checks),
        metrics,
        warnings: Arc::new(warnings),
        supervisor: Some(supervisor.clone()),
    })
}

fn routes(state: HealthState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .with_state(state)
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(healthz, readyz, render_metrics))]
struct Routes;

/// The OpenAPI description of the three routes, for the APIs that publish a document.
pub fn openapi() -> utoipa::openapi::OpenApi {
    <Routes as utoipa::OpenApi>::openapi()
}

/// The process is alive.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    security(()),
    responses((status = 200, description = "`ok`", content_type = "text/plain"))
)]
async fn healthz() -> &'static str {
    "ok"
}

/// Every dependency (database, Kafka) answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "`ready`, then a `warning:` line per unsafe mode the service runs in (e.g. `--insecure-no-auth`)", content_type = "text/plain"),
        (status = 503, description = "`not ready`, then a `task <name> stopped: <why>` line per task that stopped (the process is shutting down and exits non-zero) or `shutting down`, one line per failing dependency, then the `warning:` lines", content_type = "text/plain")
    )
)]
async fn readyz(State(state): State<HealthState>) -> Response {
    let results = futures::future::join_all(state.checks.iter().map(|check| async move {
        let outcome = match tokio::time::timeout(CHECK_TIMEOUT, check.check()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
        };
        (check.name(), outcome)
    }))
    .await;
    let mut failures: Vec<String> = Vec::new();
    if let Some(supervisor) = &state.supervisor {
        failures.extend(supervisor.stopped());
        if failures.is_empty() && supervisor.is_shutting_down() {
            failures.push("shutting down".to_owned());
        }
    }
    failures.extend(
        results.into_iter().filter_map(|(name, outcome)| outcome.err().map(|why| format!("{name}: {why}"))),
    );
    let warnings: String = state.warnings.iter().map(|warning| format!("warning: {warning}\n")).collect();
    if failures.is_empty() {
        (StatusCode::OK, format!("ready\n{warnings}")).into_response()
    } else {
        tracing::warn!(failures = ?failures, "not ready");
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready\n{}\n{warnings}", failures.join("\n")))
            .into_response()
    }
}

/// Every metric in the Prometheus text format (`CONTRACT.md` §5).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    security(()),
    responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain"))
)]
async fn render_metrics(State(state): State<HealthState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    struct Fixed(&'static str, Result<(), String>);

    impl ReadinessCheck for Fixed {
        fn name(&self) -> &'static str {
            self.0
        }
        fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
            let outcome = self.1.clone();
            Box::pin(async move { outcome })
        }
    }

    struct Hangs;

    impl ReadinessCheck for Hangs {
        fn name(&self) -> &'static str {
            "hangs"
        }
        fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
            Box::pin(std::future::pending())
        }
    }

    async fn get(app: Router, path: &str) -> (StatusCode, String) {
        let response =
            app.oneshot(Request::get(path).body(Body::empty()).expect("request")).await.expect("response");
        let status = response.status();
        let body = response.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8(body.to_vec()).expect("utf-8"))
    }

    #[tokio::test]
    async fn ready_only_when_every_check_passes() {
        let handle = crate::metrics::install();
        let ok: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("postgres", Ok(())))];
        assert_eq!(get(router(ok, handle.clone()), "/readyz").await.0, StatusCode::OK);

        let failing: Vec<Arc<dyn ReadinessCheck>> = vec![
            Arc::new(Fixed("postgres", Ok(()))),
            Arc::new(Fixed("kafka", Err("connection refused".into()))),
        ];
        let (status, body) = get(router(failing.clone(), handle.clone()), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("kafka: connection refused"), "{body}");
        assert!(!body.contains("postgres"), "{body}");
        // liveness does not depend on readiness
        assert_eq!(get(router(failing, handle), "/healthz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn warnings_show_whether_ready_or_not() {
        let handle = crate::metrics::install();
        let warning = vec!["authentication disabled".to_owned()];
        let ok: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("postgres", Ok(())))];
        let (status, body) = get(router_with_warnings(ok, handle.clone(), warning.clone()), "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\nwarning: authentication disabled\n"));
        let failing: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("kafka", Err("down".into())))];
        let (status, body) = get(router_with_warnings(failing, handle.clone(), warning), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.ends_with("kafka: down\nwarning: authentication disabled\n"), "{body}");
        let (_, body) = get(router(Vec::new(), handle), "/readyz").await;
        assert_eq!(body, "ready\n");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_check_times_out_as_not_ready() {
        let handle = crate::metrics::install();
        let checks: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Hangs)];
        let (status, body) = get(router(checks, handle), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("hangs: no answer"), "{body}");
    }

    #[tokio::test]
    async fn a_stopped_task_is_named_on_readyz() {
        #[derive(Debug, thiserror::Error)]
        #[error("broker gone")]
        struct Gone;
        let handle = crate::metrics::install();
        let supervisor = Supervisor::new();
        let ok: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("postgres", Ok(())))];
        let app = router_supervised(ok, handle, Vec::new(), &supervisor);
        assert_eq!(get(app.clone(), "/readyz").await, (StatusCode::OK, "ready\n".to_owned()));
        supervisor.spawn_fallible("ledger/settler", async { Err::<(), _>(Gone) });
        supervisor.shutdown_token().cancelled().await;
        let (status, body) = get(app, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready\ntask ledger/settler stopped: broker gone\n");
    }

    #[tokio::test]
    async fn metrics_render_prometheus_text() {
        let handle = crate::metrics::install();
        metrics::counter!("telemetry_test_total", "topic" => "t").increment(3);
        metrics::histogram!("telemetry_test_seconds").record(0.02);
        let (status, body) = get(router(Vec::new(), handle), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("telemetry_test_total{topic=\"t\"} 3"), "{body}");
        assert!(body.contains("telemetry_test_seconds_bucket{le=\"0.025\"} 1"), "{body}");
    }
}
