-- The service runs as a login role that is a member of the group role transferencias_runtime
-- (NOLOGIN), not as the owner that runs these migrations (issue #25): the owner keeps the
-- schema (DDL, DROP, TRUNCATE need it); transferencias_runtime gets what the running service
-- needs. Transfers are accepted and their status projected, never removed.
--
-- The role is created here when the owner may (CREATEROLE); otherwise an operator creates it
-- first (scripts/stack does, with its login role transferencias_app).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'transferencias_runtime') THEN
        BEGIN
            CREATE ROLE transferencias_runtime NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role transferencias_runtime does not exist and % may not create it', current_user
                USING HINT = 'CREATE ROLE transferencias_runtime NOLOGIN as a role with CREATEROLE, then run pagamentos migrate again (docs/operations.md, Database roles)';
        END;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO transferencias_runtime;

-- Every table and sequence, now and later (tables added by later migrations of this owner
-- included): read and write rows. TRUNCATE, DDL and DROP stay the owner's.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO transferencias_runtime;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO transferencias_runtime;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO transferencias_runtime;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO transferencias_runtime;

-- Transfers: accepted (INSERT) and their status projected (UPDATE), never removed.
REVOKE DELETE, TRUNCATE ON transferencia FROM transferencias_runtime;
-- The migration history: read at start to check the schema, written by the owner only.
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON _sqlx_migrations FROM transferencias_runtime;
