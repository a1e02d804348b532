ALTER TABLE outbox_evento ADD COLUMN traceparent TEXT, ADD COLUMN tracestate TEXT;
