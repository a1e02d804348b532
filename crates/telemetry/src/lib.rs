//! Logs, traces and metrics for every pagamentos service, and the routes that expose them.
//!
//! # Layout
//! - [`logging`]: `tracing` with JSON (or human) logs, and an OpenTelemetry layer so every span
//!   has a W3C trace context that can travel in Kafka headers and outbox rows.
//! - [`log_format`]: JSON log lines with the `trace_id` and `span_id` of their span.
//! - [`metrics`]: the process-wide Prometheus recorder and its histogram buckets (seconds).
//! - [`health`]: `/healthz`, `/readyz` (dependency checks) and `/metrics` as an axum router.
//! - [`context`]: the current span's `traceparent` and spans continued from one.
//! - [`server`]: bind a router and serve it until shutdown.
//!
//! # Architecture invariant
//! Knows nothing of Kafka, databases or the domain: readiness checks are supplied by the
//! services as [`health::ReadinessCheck`]s, and trace context travels as plain strings.

pub mod context;
pub mod health;
pub mod log_format;
pub mod logging;
pub mod metrics;
pub mod server;

/// An error and the chain of its causes, `outer: inner: …`, for logs.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
