//! W3C trace context in record headers: the `traceparent` written by the outbox and by each
//! service continues as one trace across every hop.

use rdkafka::message::Message;

use crate::consumer::header;

use contracts::headers::{TRACEPARENT, TRACESTATE};

use crate::producer::OutgoingRecord;

/// Adds the `traceparent`/`tracestate` of `span` to `record` (replacing any it had).
pub fn inject(span: &tracing::Span, record: &mut OutgoingRecord) {
    record.headers.retain(|(name, _)| name != TRACEPARENT && name != TRACESTATE);
    for (name, value) in telemetry::context::inject(span) {
        record.headers.push((name, value.into_bytes()));
    }
}

/// Makes `span` a child of the trace in `message`'s headers, if it has one.
pub fn continue_from(span: &tracing::Span, message: &impl Message) {
    let text = |name| header(message, name).and_then(|value| std::str::from_utf8(value).ok());
    telemetry::context::continue_from(span, text(TRACEPARENT), text(TRACESTATE));
}
