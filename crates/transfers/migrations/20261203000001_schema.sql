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

--! outbox:table
