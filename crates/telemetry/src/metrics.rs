//! The process-wide Prometheus recorder.
//!
//! Metric names follow `docs/reference/contract.md` §5; durations are histograms in seconds, with buckets
//! from 1 ms to 30 s, enough for both an HTTP request and a blocked retry.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Upper bounds of the duration histograms, in seconds.
pub const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global recorder once and returns the handle `/metrics` renders. Later calls
/// (several services in one process, tests) share it.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .expect("bucket list is not empty");
            match builder.install_recorder() {
                Ok(handle) => handle,
                // another recorder is already global (only in tests that install their own):
                // keep a private one so /metrics still renders
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}
