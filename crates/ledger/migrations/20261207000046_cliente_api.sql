-- API clients (CONTRACT.md §2, issue #46): each with a bearer token of its own, stored only as
-- its SHA-256, and the accounts it may debit and read. Written by `pagamentos clients`, as
-- this database's owner, in both services' databases (each service reaches only its own); the
-- running service looks a client's token up by its hash on every request (the unique index).
CREATE TABLE cliente_api (
    nome         VARCHAR(64)    PRIMARY KEY CHECK (nome ~ '^[A-Za-z0-9._-]{1,64}$'),
    hash_token   VARCHAR(64)    NOT NULL UNIQUE CHECK (hash_token ~ '^[0-9a-f]{64}$'),
    contas       VARCHAR(32)[]  NOT NULL CHECK (cardinality(contas) > 0),
    criado_em    TIMESTAMPTZ    NOT NULL DEFAULT now(),
    revogado_em  TIMESTAMPTZ
);

-- The runtime role reads clients and never writes them: only the owner creates or revokes one.
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON cliente_api FROM ledger_runtime;
GRANT SELECT ON cliente_api TO ledger_runtime;
