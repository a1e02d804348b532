//! `/healthz`, `/readyz` and `/metrics`, mounted by every service (`docs/reference/contract.md` §2).
//!
//! `/healthz` answers while the process is alive; `/readyz` runs every readiness check (its
//! database, its Kafka) concurrently with a timeout and answers `200` or `503`; `/metrics`
//! renders the Prometheus text format, on the service's port unless the process serves it on
//! a listener of its own ([`MetricsRoute`]).
//!
//! The status code of `/readyz` is for everyone: orchestrators and load balancers probe it
//! without credentials. Its detail is not: the check that failed and the error it met (a
//! database's name and address, a broker's error text), the task that stopped and why, and a
//! `warning:` line per mode an operator chose against the defaults (e.g. `--insecure-no-auth`,
//! ready or not) tell an attacker what the service talks to and where it is weak, so they are
//! shown only to the callers [`ReadinessDetail`] names (the admin token). Anyone else reads
//! `ready` or `not ready` alone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use subtle::ConstantTimeEq;

/// How long one readiness check may take before it counts as failed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A dependency a service needs to do its work.
pub trait ReadinessCheck: Send + Sync + 'static {
    /// Short name shown in `/readyz` (`postgres`, `kafka`).
    fn name(&self) -> &'static str;
    /// `Ok` when the dependency answers; `Err` says why not.
    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
}

/// Who may read the detail of `/readyz` (failing checks and why, stopped tasks, `warning:`
/// lines). Everyone else gets the same status code with `ready` or `not ready` alone.
#[derive(Clone, Default)]
pub enum ReadinessDetail {
    /// Nobody: a service given no admin token.
    #[default]
    Hidden,
    /// A caller whose `Authorization` is `Bearer <this token>`: the admin token.
    Token(String),
    /// Every caller: a service started with `--insecure-no-auth`.
    Open,
}

impl std::fmt::Debug for ReadinessDetail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hidden => f.write_str("ReadinessDetail::Hidden"),
            Self::Token(_) => f.write_str("ReadinessDetail::Token(***)"),
            Self::Open => f.write_str("ReadinessDetail::Open"),
        }
    }
}

impl ReadinessDetail {
    /// Whether the caller that sent `headers` may read the detail.
    pub fn shown_to(&self, headers: &HeaderMap) -> bool {
        match self {
            Self::Hidden => false,
            Self::Open => true,
            Self::Token(token) => headers
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.strip_prefix("Bearer "))
                .is_some_and(|given| bool::from(given.as_bytes().ct_eq(token.as_bytes()))),
        }
    }
}

/// The admin token and the no-authentication switch, defined once for every service: alone on
/// a service without an API of its own (antifraude, notificacoes), where they decide who may
/// read `/readyz`'s detail; flattened into `web::AuthArgs` beside the API token on a service
/// with one. One environment serves every process. Without either, `/readyz` answers its status
/// line only.
#[derive(Clone, Default, clap::Args)]
pub struct HealthAuthArgs {
    /// The admin bearer token. A caller that sends it reads `/readyz`'s detail (failing checks
    /// and why, stopped tasks, warnings); on a service without an API, unset means `/readyz`
    /// answers `ready` or `not ready` only. On a service with an API it is also the only token
    /// of the admin routes (opening accounts, deposits), accepted wherever the API token is,
    /// must differ from it, and is required unless `--insecure-no-auth`.
    #[arg(long, env = "PAGAMENTOS_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Serve without authentication: every caller reads `/readyz`'s detail, and an API treats
    /// every caller as an admin. For local experiments only; logged as a warning at start and
    /// reported on `/readyz`. Refused together with a token.
    #[arg(
        long,
        env = "PAGAMENTOS_INSECURE_NO_AUTH",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub insecure_no_auth: bool,
}

impl std::fmt::Debug for HealthAuthArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthAuthArgs")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("insecure_no_auth", &self.insecure_no_auth)
            .finish()
    }
}

/// Why a service without an API refuses to start with the settings it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthAuthError {
    #[error("--insecure-no-auth was given together with PAGAMENTOS_ADMIN_TOKEN; choose one")]
    InsecureWithToken,
}

/// What `/readyz` says of a service without an API started with `--insecure-no-auth`.
pub const INSECURE_DETAIL_WARNING: &str =
    "authentication disabled (--insecure-no-auth): /readyz shows its detail to every caller";

impl HealthAuthArgs {
    /// Who may read the detail, or why the service must not start. `--insecure-no-auth` is
    /// logged here as a warning naming `service`, and a missing token as a notice.
    pub fn resolve(&self, service: &str) -> Result<ReadinessDetail, HealthAuthError> {
        let token = self.admin_token.clone().filter(|token| !token.is_empty());
        match (token, self.insecure_no_auth) {
            (Some(_), true) => Err(HealthAuthError::InsecureWithToken),
            (None, true) => {
                tracing::warn!(service, "{INSECURE_DETAIL_WARNING}");
                Ok(ReadinessDetail::Open)
            }
            (Some(token), false) => Ok(ReadinessDetail::Token(token)),
            (None, false) => {
                tracing::info!(
                    service,
                    "PAGAMENTOS_ADMIN_TOKEN not set: /readyz answers its status line only, to every caller"
                );
                Ok(ReadinessDetail::Hidden)
            }
        }
    }

    /// What `/readyz` should report about these settings, if anything.
    pub fn warnings(&self) -> Vec<String> {
        if self.insecure_no_auth {
            vec![INSECURE_DETAIL_WARNING.to_owned()]
        } else {
            Vec::new()
        }
    }
}

/// Where a service serves `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MetricsRoute {
    /// On the service's port, beside `/healthz` and `/readyz` (`docs/reference/contract.md` §2).
    #[default]
    ServicePort,
    /// Not on the service's port (`404` there): the process serves it on a listener of its own
    /// ([`metrics_router`], `--metrics-listen`), e.g. one reachable only from the monitoring
    /// network.
    OwnListener,
}

/// What `/readyz` checks and whom it tells why.
#[derive(Clone)]
pub struct Readiness {
    checks: Arc<Vec<Arc<dyn ReadinessCheck>>>,
    detail: ReadinessDetail,
    warnings: Arc<Vec<String>>,
    supervisor: Option<Arc<dyn Supervision>>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let checks: Vec<&str> = self.checks.iter().map(|check| check.name()).collect();
        f.debug_struct("Readiness")
            .field("checks", &checks)
            .field("detail", &self.detail)
            .field("warnings", &self.warnings)
            .field("supervised", &self.supervisor.is_some())
            .finish()
    }
}

impl Readiness {
    /// Ready when every one of `checks` passes; the detail shown to whom `detail` names.
    pub fn new(checks: Vec<Arc<dyn ReadinessCheck>>, detail: ReadinessDetail) -> Self {
        Self { checks: Arc::new(checks), detail, warnings: Arc::default(), supervisor: None }
    }

    /// Also describes the service with `warnings`, one `warning:` line each, ready or not.
    pub fn with_warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings = Arc::new(warnings);
        self
    }

    /// For a service run by `supervisor`: also `503` with a `task <name> stopped: <why>` line
    /// per task that stopped on its own, and a `shutting down` line once the shutdown began;
    /// the process's warnings after the service's own.
    pub fn supervised_by<S: Supervision + Clone + 'static>(mut self, supervisor: &S) -> Self {
        self.supervisor = Some(Arc::new(supervisor.clone()));
        self
    }
}

/// What `/readyz` reads of the process's task supervisor (`service::supervisor::Supervisor`).
pub trait Supervision: Send + Sync {
    /// A `task <name> stopped: <why>` line per critical task that stopped on its own.
    fn stopped(&self) -> Vec<String>;
    /// Whether the shutdown began.
    fn is_shutting_down(&self) -> bool;
    /// The process's warnings (insecure settings allowed at start).
    fn warnings(&self) -> Vec<String>;
}

/// `/healthz` and `/readyz`, and `/metrics` when `metrics` says it is served on the service's
/// port, to merge into a service's router. Installs the Prometheus recorder either way
/// ([`crate::metrics::install`]), so what the service registers next is exported.
pub fn router(readiness: Readiness, metrics: MetricsRoute) -> Router {
    let handle = crate::metrics::install();
    let routes =
        Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(readiness);
    match metrics {
        MetricsRoute::ServicePort => routes.merge(metrics_router(handle)),
        MetricsRoute::OwnListener => routes,
    }
}

/// `/metrics` alone: merged into a service's router by [`router`], or served on a listener of
/// its own.
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new().route("/metrics", get(render_metrics)).with_state(handle)
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

/// Every dependency (database, Kafka) answers. The status code is for every caller; the detail
/// (what failed and why, `warning:` lines) only for a caller that sends the admin bearer token
/// (for every caller when the service runs with `--insecure-no-auth`).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "`ready`; with the admin token, then a `warning:` line per unsafe mode the service runs in (e.g. `--insecure-no-auth`)", content_type = "text/plain"),
        (status = 503, description = "`not ready`; with the admin token, then a `task <name> stopped: <why>` line per task that stopped (the process is shutting down and exits non-zero) or `shutting down`, one line per failing dependency, then the `warning:` lines", content_type = "text/plain")
    )
)]
async fn readyz(State(readiness): State<Readiness>, headers: HeaderMap) -> Response {
    let results = futures::future::join_all(readiness.checks.iter().map(|check| async move {
        let outcome = match tokio::time::timeout(CHECK_TIMEOUT, check.check()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
        };
        (check.name(), outcome)
    }))
    .await;
    let mut failures: Vec<String> = Vec::new();
    if let Some(supervisor) = &readiness.supervisor {
        failures.extend(supervisor.stopped());
        if failures.is_empty() && supervisor.is_shutting_down() {
            failures.push("shutting down".to_owned());
        }
    }
    failures.extend(
        results.into_iter().filter_map(|(name, outcome)| outcome.err().map(|why| format!("{name}: {why}"))),
    );
    if !failures.is_empty() {
        // the log keeps the detail whoever asked
        tracing::warn!(failures = ?failures, "not ready");
    }
    let (status, body) = match (failures.is_empty(), readiness.detail.shown_to(&headers)) {
        (true, false) => (StatusCode::OK, "ready\n".to_owned()),
        (false, false) => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned()),
        (ready, true) => {
            let process =
                readiness.supervisor.as_ref().map(|supervisor| supervisor.warnings()).unwrap_or_default();
            let warnings: String = readiness
                .warnings
                .iter()
                .chain(&process)
                .map(|warning| format!("warning: {warning}\n"))
                .collect();
            if ready {
                (StatusCode::OK, format!("ready\n{warnings}"))
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, format!("not ready\n{}\n{warnings}", failures.join("\n")))
            }
        }
    };
    // the body depends on who asks: no cache may hand one caller's answer to another
    (status, [(header::VARY, "authorization"), (header::CACHE_CONTROL, "no-store")], body).into_response()
}

/// Every metric in the Prometheus text format (`docs/reference/contract.md` §5).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    security(()),
    responses((status = 200, description = "Prometheus text format 0.0.4 (on this port unless the process serves it on its own listener, `PAGAMENTOS_METRICS_LISTEN`)", content_type = "text/plain"))
)]
async fn render_metrics(State(handle): State<PrometheusHandle>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], handle.render()).into_response()
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

    const ADMIN: &str = "admin-secret";

    /// The routes with the detail open to every caller, `/metrics` on the service's port.
    fn open(checks: Vec<Arc<dyn ReadinessCheck>>) -> Readiness {
        Readiness::new(checks, ReadinessDetail::Open)
    }

    async fn get_as(app: Router, path: &str, bearer: Option<&str>) -> (StatusCode, String) {
        let mut request = Request::get(path);
        if let Some(token) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = app.oneshot(request.body(Body::empty()).expect("request")).await.expect("response");
        let status = response.status();
        let body = response.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8(body.to_vec()).expect("utf-8"))
    }

    async fn get(app: Router, path: &str) -> (StatusCode, String) {
        get_as(app, path, None).await
    }

    #[tokio::test]
    async fn ready_only_when_every_check_passes() {
        let ok: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("postgres", Ok(())))];
        assert_eq!(get(router(open(ok), MetricsRoute::ServicePort), "/readyz").await.0, StatusCode::OK);

        let failing: Vec<Arc<dyn ReadinessCheck>> = vec![
            Arc::new(Fixed("postgres", Ok(()))),
            Arc::new(Fixed("kafka", Err("connection refused".into()))),
        ];
        let app = router(open(failing), MetricsRoute::ServicePort);
        let (status, body) = get(app.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("kafka: connection refused"), "{body}");
        assert!(!body.contains("postgres"), "{body}");
        // liveness does not depend on readiness
        assert_eq!(get(app, "/healthz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn warnings_show_whether_ready_or_not() {
        let warning = vec!["authentication disabled".to_owned()];
        let ok: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("postgres", Ok(())))];
        let app = router(open(ok).with_warnings(warning.clone()), MetricsRoute::ServicePort);
        let (status, body) = get(app, "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\nwarning: authentication disabled\n"));
        let failing: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("kafka", Err("down".into())))];
        let app = router(open(failing).with_warnings(warning), MetricsRoute::ServicePort);
        let (status, body) = get(app, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.ends_with("kafka: down\nwarning: authentication disabled\n"), "{body}");
        let (_, body) = get(router(open(Vec::new()), MetricsRoute::ServicePort), "/readyz").await;
        assert_eq!(body, "ready\n");
    }

    #[tokio::test]
    async fn the_detail_is_for_the_admin_token_only_and_the_status_for_everyone() {
        let failing: Vec<Arc<dyn ReadinessCheck>> = vec![
            Arc::new(Fixed("postgres", Err("db.internal:5432 refused".into()))),
            Arc::new(Fixed("kafka", Ok(()))),
        ];
        let warning = vec!["webhooks are sent unsigned".to_owned()];
        let readiness = Readiness::new(failing, ReadinessDetail::Token(ADMIN.into())).with_warnings(warning);
        let app = router(readiness, MetricsRoute::ServicePort);
        for caller in [None, Some("api-secret"), Some("admin-secre"), Some("admin-secret2"), Some("")] {
            let answer = get_as(app.clone(), "/readyz", caller).await;
            assert_eq!(answer, (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned()), "{caller:?}");
        }
        let (status, body) = get_as(app, "/readyz", Some(ADMIN)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "not ready\npostgres: db.internal:5432 refused\nwarning: webhooks are sent unsigned\n"
        );

        // ready: the warnings are detail too
        let ok: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("kafka", Ok(())))];
        let readiness = Readiness::new(ok, ReadinessDetail::Token(ADMIN.into()))
            .with_warnings(vec!["webhooks are sent unsigned".to_owned()]);
        let app = router(readiness, MetricsRoute::ServicePort);
        assert_eq!(get(app.clone(), "/readyz").await, (StatusCode::OK, "ready\n".to_owned()));
        assert_eq!(
            get_as(app, "/readyz", Some(ADMIN)).await,
            (StatusCode::OK, "ready\nwarning: webhooks are sent unsigned\n".to_owned())
        );

        // no admin token: nobody reads the detail, whatever they send
        let failing: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("kafka", Err("down".into())))];
        let app = router(Readiness::new(failing, ReadinessDetail::Hidden), MetricsRoute::ServicePort);
        for caller in [None, Some(ADMIN)] {
            let answer = get_as(app.clone(), "/readyz", caller).await;
            assert_eq!(answer, (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned()), "{caller:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_check_times_out_as_not_ready() {
        let checks: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Hangs)];
        let (status, body) = get(router(open(checks), MetricsRoute::ServicePort), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("hangs: no answer"), "{body}");
    }

    /// A task supervisor as `/readyz` reads it.
    #[derive(Clone, Default)]
    struct Tasks(Arc<std::sync::Mutex<TaskState>>);

    #[derive(Default)]
    struct TaskState {
        stopped: Vec<String>,
        shutting_down: bool,
        warnings: Vec<String>,
    }

    impl Supervision for Tasks {
        fn stopped(&self) -> Vec<String> {
            self.0.lock().expect("tasks").stopped.clone()
        }
        fn is_shutting_down(&self) -> bool {
            self.0.lock().expect("tasks").shutting_down
        }
        fn warnings(&self) -> Vec<String> {
            self.0.lock().expect("tasks").warnings.clone()
        }
    }

    #[tokio::test]
    async fn a_stopped_task_is_named_on_readyz_to_the_admin_only() {
        let supervisor = Tasks::default();
        let ok: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("postgres", Ok(())))];
        let readiness = Readiness::new(ok, ReadinessDetail::Token(ADMIN.into())).supervised_by(&supervisor);
        let app = router(readiness, MetricsRoute::ServicePort);
        assert_eq!(get_as(app.clone(), "/readyz", Some(ADMIN)).await, (StatusCode::OK, "ready\n".to_owned()));
        *supervisor.0.lock().expect("tasks") = TaskState {
            stopped: vec!["task ledger/settler stopped: broker gone".to_owned()],
            shutting_down: true,
            warnings: Vec::new(),
        };
        let (status, body) = get_as(app.clone(), "/readyz", Some(ADMIN)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready\ntask ledger/settler stopped: broker gone\n");
        for caller in [None, Some("api-secret")] {
            let answer = get_as(app.clone(), "/readyz", caller).await;
            assert_eq!(answer, (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned()), "{caller:?}");
        }
    }

    #[tokio::test]
    async fn the_process_warnings_follow_the_services_own_for_the_admin_only() {
        let supervisor = Tasks::default();
        supervisor.0.lock().expect("tasks").warnings = vec!["insecure transport allowed".to_owned()];
        let ok: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(Fixed("postgres", Ok(())))];
        let readiness = Readiness::new(ok, ReadinessDetail::Token(ADMIN.into()))
            .with_warnings(vec!["connected as the schema's owner".to_owned()])
            .supervised_by(&supervisor);
        let app = router(readiness, MetricsRoute::ServicePort);
        assert_eq!(
            get_as(app.clone(), "/readyz", Some(ADMIN)).await,
            (
                StatusCode::OK,
                "ready\nwarning: connected as the schema's owner\nwarning: insecure transport allowed\n"
                    .to_owned()
            )
        );
        assert_eq!(get_as(app, "/readyz", None).await, (StatusCode::OK, "ready\n".to_owned()));
    }

    #[tokio::test]
    async fn metrics_render_prometheus_text() {
        // the router installs the recorder: what is recorded before it goes nowhere (in a process
        // of its own, as cargo nextest runs each test, nothing installed one earlier)
        let app = router(open(Vec::new()), MetricsRoute::ServicePort);
        metrics::counter!("telemetry_test_total", "topic" => "t").increment(3);
        metrics::histogram!("telemetry_test_seconds").record(0.02);
        let (status, body) = get(app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("telemetry_test_total{topic=\"t\"} 3"), "{body}");
        assert!(body.contains("telemetry_test_seconds_bucket{le=\"0.025\"} 1"), "{body}");
    }

    #[tokio::test]
    async fn metrics_on_their_own_listener_leave_the_service_port() {
        crate::metrics::install();
        metrics::counter!("telemetry_apart_total").increment(1);
        let service = router(open(Vec::new()), MetricsRoute::OwnListener);
        assert_eq!(get(service.clone(), "/metrics").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(service, "/readyz").await.0, StatusCode::OK);
        let apart = metrics_router(crate::metrics::install());
        let (status, body) = get(apart.clone(), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("telemetry_apart_total 1"), "{body}");
        assert_eq!(get(apart, "/readyz").await.0, StatusCode::NOT_FOUND);
    }

    #[test]
    fn health_only_services_take_the_admin_token_or_run_open_when_told() {
        let args = |token: Option<&str>, insecure: bool| HealthAuthArgs {
            admin_token: token.map(str::to_owned),
            insecure_no_auth: insecure,
        };
        assert!(matches!(args(None, false).resolve("test"), Ok(ReadinessDetail::Hidden)));
        assert!(matches!(args(Some(""), false).resolve("test"), Ok(ReadinessDetail::Hidden)));
        assert!(
            matches!(args(Some("adm"), false).resolve("test"), Ok(ReadinessDetail::Token(t)) if t == "adm")
        );
        assert!(matches!(args(None, true).resolve("test"), Ok(ReadinessDetail::Open)));
        assert_eq!(args(Some("adm"), true).resolve("test").err(), Some(HealthAuthError::InsecureWithToken));
        assert_eq!(args(None, true).warnings(), vec![INSECURE_DETAIL_WARNING.to_owned()]);
        assert!(args(Some("adm"), false).warnings().is_empty());
        let printed =
            format!("{:?} {:?}", args(Some("s3cret"), false), ReadinessDetail::Token("s3cret".into()));
        assert!(!printed.contains("s3cret"), "{printed}");
    }
}
