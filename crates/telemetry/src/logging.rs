//! Process-wide logging and tracing set-up.

use std::sync::OnceLock;

use opentelemetry::propagation::TextMapCompositePropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for machines (the default).
    Json,
    /// Human-readable lines, for a terminal.
    Pretty,
}

/// Used when `RUST_LOG` is unset: PostgreSQL's notices ("relation already exists, skipping")
/// are not news.
pub const DEFAULT_FILTER: &str = "info,sqlx::postgres::notice=warn";

static TRACER_PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

fn tracer_provider() -> &'static SdkTracerProvider {
    TRACER_PROVIDER.get_or_init(|| {
        opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ]));
        // spans are always recorded, so trace context propagates; they leave the process only
        // when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set
        let mut builder = SdkTracerProvider::builder()
            .with_resource(opentelemetry_sdk::Resource::builder().with_service_name("pagamentos").build());
        if let Some(exporter) = otlp_exporter() {
            builder = builder.with_batch_exporter(exporter);
        }
        let provider = builder.build();
        opentelemetry::global::set_tracer_provider(provider.clone());
        provider
    })
}

/// The OTLP/HTTP span exporter, when `OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; `OTEL_EXPORTER_OTLP_PROTOCOL` picks
/// `http/protobuf` (default) or `http/json`. The exporter reads the standard variables itself
/// (endpoint, headers, timeout); batching follows `OTEL_BSP_*`.
fn otlp_exporter() -> Option<opentelemetry_otlp::SpanExporter> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let configured = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|name| std::env::var(name).is_ok_and(|value| !value.trim().is_empty()));
    if !configured {
        return None;
    }
    let protocol = match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
        Ok("http/json") => Protocol::HttpJson,
        Ok("grpc") => {
            eprintln!(
                "warning: OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not built in; exporting over http/protobuf"
            );
            Protocol::HttpBinary
        }
        _ => Protocol::HttpBinary,
    };
    match opentelemetry_otlp::SpanExporter::builder().with_http().with_protocol(protocol).build() {
        Ok(exporter) => Some(exporter),
        Err(error) => {
            // logging is not set up yet: stderr is all there is
            eprintln!("warning: OTLP span exporter not created, spans are not exported: {error}");
            None
        }
    }
}

/// The layer that gives every span an OpenTelemetry context (trace and span ids), for
/// subscribers built elsewhere (tests).
pub fn otel_layer<S>(service_name: &'static str) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(tracer_provider().tracer(service_name))
}

/// Installs the global subscriber: `RUST_LOG` filtering (default [`DEFAULT_FILTER`]), log
/// lines in `format` (JSON lines inside a span carry its `trace_id` and `span_id`), and an OpenTelemetry layer so spans carry W3C trace ids. Safe to call
/// more than once: later calls keep the first set-up.
pub fn init(service_name: &'static str, format: LogFormat) {
    // spans reach OpenTelemetry at info and above whatever RUST_LOG says, so quieting the
    // logs never breaks a trace; RUST_LOG filters only the log lines
    let otel = otel_layer(service_name).with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let registry = tracing_subscriber::registry().with(otel);
    let result = match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .event_format(crate::log_format::JsonWithTrace::new(
                        tracing_subscriber::fmt::format()
                            .json()
                            .flatten_event(true)
                            .with_current_span(true)
                            .with_span_list(false),
                    ))
                    .with_writer(std::io::stderr)
                    .with_filter(filter()),
            )
            .try_init(),
        LogFormat::Pretty => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter()))
            .try_init(),
    };
    // a subscriber installed earlier (another test in this process) is fine
    drop(result);
}

/// Flushes spans still buffered; call once at shutdown.
pub fn shutdown() {
    if let Some(provider) = TRACER_PROVIDER.get() {
        drop(provider.force_flush());
        drop(provider.shutdown());
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer as _;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_in_a_span_carry_its_trace_and_span_ids() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry()
            .with(otel_layer("test").with_filter(tracing_subscriber::filter::LevelFilter::INFO))
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .event_format(crate::log_format::JsonWithTrace::new(
                        tracing_subscriber::fmt::format().json().flatten_event(true),
                    ))
                    .with_writer(move || writer.clone()),
            );
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("hop");
            crate::context::continue_from(
                &span,
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                None,
            );
            span.in_scope(|| tracing::info!(answer = 42, "inside"));
            // a debug span below the OpenTelemetry layer's level: its parent's ids are used
            span.in_scope(|| tracing::debug_span!("detail").in_scope(|| tracing::info!("deeper")));
            tracing::info!("outside");
        });
        let text = String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8");
        let lines: Vec<serde_json::Value> =
            text.lines().map(|line| serde_json::from_str(line).expect("each line is JSON")).collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(lines[0]["span_id"].as_str().map(str::len), Some(16));
        assert_ne!(lines[0]["span_id"], "00f067aa0ba902b7", "the span's own id, not its parent's");
        assert_eq!(lines[0]["answer"], 42);
        assert_eq!(lines[1]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(lines[1]["span_id"], lines[0]["span_id"]);
        assert!(lines[2].get("trace_id").is_none(), "{text}");
    }
}
