//! Logs, traces and metrics for every pagamentos service, and the routes that expose them.
//!
//! # Layout
//! - [`logging`]: `tracing` with JSON (or human) logs, and an OpenTelemetry layer so every span
//!   has a W3C trace context that can travel in Kafka headers and outbox rows.
//! - [`log_format`]: JSON log lines with the `trace_id` and `span_id` of their span.
//! - [`metrics`]: the process-wide Prometheus recorder and its histogram buckets (seconds).
//! - [`health`]: `/healthz`, `/readyz` (dependency checks, detail for the admin token only) and
//!   `/metrics` as axum routers.
//! - [`context`]: the current span's `traceparent` and spans continued from one.
//! - [`transport`]: transport fails closed off the machine: loopback hosts, the
//!   `--insecure-transport` opt-in and its refusal.
//!
//! # Architecture invariant
//! Knows nothing of Kafka, databases or the domain: readiness checks are supplied by the
//! services as [`health::ReadinessCheck`]s, and trace context travels as plain strings.

#![forbid(unsafe_code)]

pub mod context;
pub mod health;
pub mod log_format;
pub mod logging;
pub mod metrics;
pub mod transport;

/// `url` fit for a log or a `Debug` print: its password replaced by `***` and its query and
/// fragment (where tokens travel) dropped. Text that is not a URL is shown as `***` whole.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return "***".into() };
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    let (rest, dropped) = (&rest[..end], end < rest.len());
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_owned(),
    };
    let suffix = if dropped { "?***" } else { "" };
    format!("{scheme}://{authority}{path}{suffix}")
}

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

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn urls_lose_their_passwords_and_queries() {
        assert_eq!(
            redact_url("postgres://ledger:s3cret@db.internal:5432/ledger?sslmode=verify-full"),
            "postgres://ledger:***@db.internal:5432/ledger?***"
        );
        assert_eq!(
            redact_url("https://hooks.example.com/in?token=t0k3n#x"),
            "https://hooks.example.com/in?***"
        );
        assert_eq!(redact_url("http://user@h:1/p"), "http://user@h:1/p");
        assert_eq!(redact_url("postgres://a:b@c/d@e"), "postgres://a:***@c/d@e");
        assert_eq!(redact_url("not a url with s3cret"), "***");
    }
}
