-- The relay's lease (reserva): a claim marks rows as held by one relay instance until a time,
-- in a short transaction of its own, instead of keeping them row-locked in a transaction open
-- for the whole publish (up to the producer's delivery timeout while Kafka is away). A relay
-- that dies leaves its rows leased; when the lease ends, another relay (or the restarted one)
-- takes them. On a published row they tell which instance published it. Added columns: the
-- article's columns keep their names and meaning.
ALTER TABLE outbox_evento ADD COLUMN reservado_por UUID, ADD COLUMN reservado_ate TIMESTAMPTZ;
-- a claim skips the rows of a key while an earlier row of that key is leased (per-key order)
CREATE INDEX idx_outbox_pendentes_chave ON outbox_evento (topico, chave, sequencia) WHERE publicado_em IS NULL;
