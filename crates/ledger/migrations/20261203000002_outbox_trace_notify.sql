-- The outbox additions shared with the transfers database (CONTRACT.md §4).

-- W3C trace context of the handling that wrote the event: the relay sends it as headers.
ALTER TABLE outbox_evento ADD COLUMN traceparent TEXT, ADD COLUMN tracestate TEXT;

-- Any writer wakes the relay at once.
CREATE FUNCTION outbox_evento_notificar() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_evento', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_evento_notificar AFTER INSERT ON outbox_evento
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_evento_notificar();
