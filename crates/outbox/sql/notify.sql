CREATE FUNCTION outbox_evento_notificar() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_evento', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_evento_notificar AFTER INSERT ON outbox_evento
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_evento_notificar();
