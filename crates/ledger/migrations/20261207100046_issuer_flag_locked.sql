-- The issuer flag locked (issue #46, CONTRACT.md §4, invariant 5). Money enters the books only
-- from a currency's issuer account EMISSOR-<moeda>, the one kind of account that may go
-- negative. Until now the runtime role could UPDATE every column of conta: with its
-- credentials one could flag any account emissor, debit it for a "deposit" and mint money.
--
-- * An account is an issuer exactly when its id is EMISSOR-<its currency>: a check constraint,
--   so no INSERT or UPDATE of anyone's makes another account an issuer, nor the issuer an
--   ordinary account. (COLLATE "C": conta.id's collation, so the comparison is byte order.)
-- * The runtime role may update a conta row's saldo_centavos only, never emissor, moeda or id.
--   What the running ledger does still works: it opens accounts (INSERT, the issuer's on
--   demand with emissor = true), locks them (SELECT … FOR UPDATE needs UPDATE on a column) and
--   moves balances (UPDATE conta SET saldo_centavos = …).

-- Accounts written before the constraint that break it are named, rather than left to a bare
-- constraint violation: the operator looks at them (pagamentos verify names them too).
DO $$
DECLARE
    wrong text;
BEGIN
    SELECT string_agg(format('%s (%s, emissor %s)', id, moeda, emissor), ', ' ORDER BY id)
      INTO wrong
      FROM conta
     WHERE emissor IS DISTINCT FROM (id = ('EMISSOR-' || moeda) COLLATE "C");
    IF wrong IS NOT NULL THEN
        RAISE EXCEPTION 'accounts whose issuer flag disagrees with their id: %', wrong
            USING HINT = 'only EMISSOR-<moeda> may be flagged emissor, and it must be; look at how these were written before fixing them (docs/operations.md, Verifying the books)';
    END IF;
END
$$;

ALTER TABLE conta
    ADD CONSTRAINT conta_emissor_check CHECK (emissor = (id = ('EMISSOR-' || moeda) COLLATE "C"));

-- Table-level UPDATE out (which also takes any column grants with it), the balance's back in.
REVOKE UPDATE ON conta FROM ledger_runtime;
GRANT UPDATE (saldo_centavos) ON conta TO ledger_runtime;
