//! JSON log lines that carry the trace: each line inside a span gets `trace_id` and `span_id`
//! (W3C hex, as in `traceparent`), so a log search and a trace view meet on the same ids.

use std::fmt;

use opentelemetry::trace::TraceContextExt;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Wraps the JSON event format and adds the trace of the innermost span that has one.
#[derive(Debug)]
pub struct JsonWithTrace {
    inner: Format<Json>,
}

impl JsonWithTrace {
    pub fn new(inner: Format<Json>) -> Self {
        Self { inner }
    }
}

impl<S, N> FormatEvent<S, N> for JsonWithTrace
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = String::new();
        self.inner.format_event(ctx, Writer::new(&mut line), event)?;
        // entering a span attaches its OpenTelemetry context to the thread (tracing-opentelemetry's
        // context activation); a span below the OpenTelemetry layer's level leaves its parent's
        let context = opentelemetry::Context::current();
        let span = context.span();
        let span_context = span.span_context();
        let ids = (ctx.lookup_current().is_some() && span_context.is_valid())
            .then(|| (span_context.trace_id().to_string(), span_context.span_id().to_string()));
        match (ids, line.strip_prefix('{')) {
            (Some((trace_id, span_id)), Some(rest)) => {
                write!(writer, "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\",{rest}")
            }
            _ => writer.write_str(&line),
        }
    }
}
