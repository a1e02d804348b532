-- What the features add to the article's schema (CONTRACT.md §4).

-- W3C trace context of the request that wrote the event: the relay sends it as headers.
--! outbox:trace_columns

-- Any writer (ours or a Java service on the same table) wakes the relay at once.
--! outbox:notify

-- Idempotency-Key (IETF draft): one row per (caller, key), written in the transaction that
-- creates the transfer; the request body's hash tells a replay from a misuse.
CREATE TABLE chave_idempotencia (
    escopo            VARCHAR(64)  NOT NULL,
    chave             VARCHAR(255) NOT NULL,
    hash_requisicao   CHAR(64)     NOT NULL,
    -- deferred: the key is claimed first, so a replay or a misuse costs no transfer insert
    transferencia_id  UUID         NOT NULL REFERENCES transferencia (id) DEFERRABLE INITIALLY DEFERRED,
    criada_em         TIMESTAMPTZ  NOT NULL DEFAULT now(),
    expira_em         TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (escopo, chave)
);
CREATE INDEX idx_chave_idempotencia_expira ON chave_idempotencia (expira_em);

-- GET /transferencias?conta=&status= (newest first)
CREATE INDEX idx_transferencia_origem ON transferencia (conta_origem, criada_em DESC, id DESC);
CREATE INDEX idx_transferencia_destino ON transferencia (conta_destino, criada_em DESC, id DESC);
CREATE INDEX idx_transferencia_status ON transferencia (status, criada_em DESC, id DESC);
CREATE INDEX idx_transferencia_criada ON transferencia (criada_em DESC, id DESC);
