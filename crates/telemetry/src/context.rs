//! W3C trace context as plain strings, so Kafka headers and outbox rows can carry it without
//! this crate knowing either.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `traceparent` (and `tracestate`, when present) of `span`.
pub fn inject(span: &tracing::Span) -> HashMap<String, String> {
    let context = span.context();
    let mut carrier = MapCarrier::default();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut carrier)
    });
    carrier.0
}

/// The `traceparent` of `span`, if it belongs to a trace.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    inject(span).remove("traceparent")
}

/// Makes `span` a child of the remote context in `traceparent` (and `tracestate`), e.g. from
/// Kafka headers or an outbox row. A missing or malformed `traceparent` leaves the span as the
/// root of a new trace.
pub fn continue_from(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    let Some(traceparent) = traceparent else { return };
    let mut carrier = MapCarrier::default();
    carrier.0.insert("traceparent".into(), traceparent.into());
    if let Some(tracestate) = tracestate {
        carrier.0.insert("tracestate".into(), tracestate.into());
    }
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier));
    // set_parent only fails once the span has been entered or its context read: callers do
    // this right after creating the span
    drop(span.set_parent(parent));
}

#[derive(Default)]
struct MapCarrier(HashMap<String, String>);

impl Extractor for MapCarrier {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

impl Injector for MapCarrier {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continued_span_keeps_the_remote_trace_id() {
        crate::logging::init("telemetry-test", crate::logging::LogFormat::Pretty);
        let remote = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let span = tracing::info_span!("handle");
        continue_from(&span, Some(remote), None);
        let own = traceparent(&span).expect("span has a trace context");
        assert!(own.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{own}");
        assert!(!own.contains("00f067aa0ba902b7"), "the child has a span id of its own: {own}");
    }

    #[test]
    fn a_malformed_traceparent_starts_a_new_trace() {
        crate::logging::init("telemetry-test", crate::logging::LogFormat::Pretty);
        let span = tracing::info_span!("handle");
        continue_from(&span, Some("garbage"), None);
        let own = traceparent(&span).expect("span has a trace context");
        assert_eq!(own.len(), 55, "{own}");
    }
}
