-- Room on every page for the lease (reserva): a claim rewrites each row it leases
-- (`reservado_por`, `reservado_ate`), and a full page makes that a new tuple on another page
-- with an entry in each of the table's four indexes. With half of each new page left free the
-- lease becomes a heap-only (HOT) update on the row's own page and touches no index: about half
-- the claim's cost for a batch of 1 000 rows (docs/benchmarks.md, issue #28). Only pages
-- written from now on keep the room; rows already there are published and deleted as before.
ALTER TABLE outbox_evento SET (fillfactor = 50);
