-- Append-only books (issue #25). The service runs as a login role that is a member of the
-- group role ledger_runtime (NOLOGIN), not as the owner that runs these migrations: the owner
-- keeps the schema (DDL, DROP, TRUNCATE need it); ledger_runtime gets what the running
-- service needs and no more. Entries, settlement decisions and deposits are written once and
-- never changed or removed; accounts are opened and their balances moved, never removed.
--
-- The role is created here when the owner may (CREATEROLE); otherwise an operator creates it
-- first (scripts/stack does, with its login role ledger_app).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ledger_runtime') THEN
        BEGIN
            CREATE ROLE ledger_runtime NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role ledger_runtime does not exist and % may not create it', current_user
                USING HINT = 'CREATE ROLE ledger_runtime NOLOGIN as a role with CREATEROLE, then run pagamentos migrate again (docs/operations.md, Database roles)';
        END;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO ledger_runtime;

-- Every table and sequence, now and later (tables added by later migrations of this owner
-- included): read and write rows. TRUNCATE, DDL and DROP stay the owner's.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ledger_runtime;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO ledger_runtime;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO ledger_runtime;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO ledger_runtime;

-- Except the books: entries, decisions and deposits are inserted and read, never rewritten.
REVOKE UPDATE, DELETE, TRUNCATE ON lancamento, transferencia_processada, deposito FROM ledger_runtime;
-- Accounts: opened (INSERT) and their balances moved (UPDATE), never removed.
REVOKE DELETE, TRUNCATE ON conta FROM ledger_runtime;
-- The migration history: read at start to check the schema, written by the owner only.
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON _sqlx_migrations FROM ledger_runtime;
