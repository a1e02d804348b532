-- The ledger database, as in the reference article (V1__schema.sql of ledger-service), with the
-- contract's deliberate changes (CONTRACT.md §4):
--  * conta.emissor: the issuer account EMISSOR-<MOEDA> of each currency is the only account
--    that may go negative, so money enters through real double entries and Σ balances = 0;
--  * conta.id COLLATE "C": ORDER BY id, the lock order, is byte order on every machine;
--  * deposito: deposits (and opening balances) keyed by their business id;
--  * transferencia_processada.motivo: a rejection's reason is pinned with its outcome.
CREATE TABLE conta (
    id              VARCHAR(32) COLLATE "C" PRIMARY KEY,
    saldo_centavos  BIGINT   NOT NULL,
    moeda           CHAR(3)  NOT NULL,
    emissor         BOOLEAN  NOT NULL DEFAULT false,
    CONSTRAINT conta_saldo_centavos_check CHECK (saldo_centavos >= 0 OR emissor)
);

CREATE TABLE lancamento (
    id                BIGSERIAL PRIMARY KEY,
    transferencia_id  UUID         NOT NULL,
    conta_id          VARCHAR(32) COLLATE "C" NOT NULL REFERENCES conta (id),
    tipo              CHAR(1)      NOT NULL CHECK (tipo IN ('D', 'C')),
    valor_centavos    BIGINT       NOT NULL CHECK (valor_centavos > 0),
    criado_em         TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE INDEX idx_lancamento_transferencia ON lancamento (transferencia_id);
CREATE INDEX idx_lancamento_conta ON lancamento (conta_id, id);

CREATE TABLE transferencia_processada (
    transferencia_id  UUID PRIMARY KEY,
    resultado         VARCHAR(20)  NOT NULL,
    motivo            VARCHAR(40),
    processada_em     TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE TABLE deposito (
    id              UUID PRIMARY KEY,
    conta_id        VARCHAR(32) COLLATE "C" NOT NULL REFERENCES conta (id),
    valor_centavos  BIGINT       NOT NULL CHECK (valor_centavos > 0),
    criado_em       TIMESTAMPTZ  NOT NULL DEFAULT now()
);

--! outbox:table
