-- The outbox's acceptance order (CONTRACT.md §4: events of one key are published in acceptance
-- order). `criado_em` cannot give it: every row of one transaction (a group commit of up to 128
-- transfers, a ledger batch) gets the same `now()`, and ties then fall to the random `id`.
-- `sequencia` is drawn at insert time, in insert order, and the relay publishes by it. An added
-- column: the article's columns keep their names and meaning.
ALTER TABLE outbox_evento ADD COLUMN sequencia BIGINT;
-- rows already there (published history and any backlog) keep the order the relay used before
UPDATE outbox_evento SET sequencia = ordem.n
    FROM (SELECT id, row_number() OVER (ORDER BY criado_em, id) AS n FROM outbox_evento) AS ordem
    WHERE outbox_evento.id = ordem.id;
ALTER TABLE outbox_evento ALTER COLUMN sequencia SET NOT NULL;
ALTER TABLE outbox_evento ALTER COLUMN sequencia ADD GENERATED ALWAYS AS IDENTITY;
SELECT setval(pg_get_serial_sequence('outbox_evento', 'sequencia'), COALESCE(max(sequencia), 0) + 1, false)
    FROM outbox_evento;
CREATE INDEX idx_outbox_pendentes_sequencia ON outbox_evento (sequencia) WHERE publicado_em IS NULL;
