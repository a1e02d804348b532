-- The relay without its lease (#47, docs/decisions/0039-relay-without-lease.md): the leader
-- reads pending rows with a plain query, leaving out the rows it has sent and not yet seen
-- marked (a set it keeps in memory), and marks the acknowledged ones on a second connection.
-- Nothing writes `reservado_por`/`reservado_ate` any more, and no claim looks for a key's rows
-- that another relay leases: the lease's columns go, and the index of that per-key check.
-- The article's `idx_outbox_pendentes` (pending rows by `criado_em`) goes too: nothing reads
-- pending rows in that order, and its predicate is the claim's, so the planner could take it
-- and sort every pending row instead of walking `idx_outbox_pendentes_sequencia` (it did, with
-- the statistics of a drained table and a backlog written with one `criado_em`: 345 ms for a
-- claim of 1 000 rows behind 200 000). The claim's index is then the only one on pending rows.
DROP INDEX idx_outbox_pendentes_chave;
DROP INDEX idx_outbox_pendentes;
ALTER TABLE outbox_evento DROP COLUMN reservado_por, DROP COLUMN reservado_ate;
