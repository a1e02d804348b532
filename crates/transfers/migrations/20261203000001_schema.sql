-- The transfers database, as in the reference article (V1__schema.sql of transferencias-service).
CREATE TABLE transferencia (
    id                UUID PRIMARY KEY,
    conta_origem      VARCHAR(32)    NOT NULL,
    conta_destino     VARCHAR(32)    NOT NULL,
    valor_centavos    BIGINT         NOT NULL CHECK (valor_centavos > 0),
    moeda             CHAR(3)        NOT NULL,
    status            VARCHAR(20)    NOT NULL,
    motivo_rejeicao   TEXT,
    criada_em         TIMESTAMPTZ    NOT NULL DEFAULT now(),
    atualizada_em     TIMESTAMPTZ    NOT NULL DEFAULT now()
);

CREATE TABLE outbox_evento (
    id            UUID PRIMARY KEY,
    topico        VARCHAR(255) NOT NULL,
    chave         VARCHAR(64)  NOT NULL,
    tipo          VARCHAR(100) NOT NULL,
    payload       TEXT         NOT NULL,
    criado_em     TIMESTAMPTZ  NOT NULL DEFAULT now(),
    publicado_em  TIMESTAMPTZ
);

CREATE INDEX idx_outbox_pendentes ON outbox_evento (criado_em) WHERE publicado_em IS NULL;
