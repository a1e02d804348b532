//! The claim and the mark: what they take and write, and their cost behind a backlog.

use time::OffsetDateTime;
use uuid::Uuid;

use outbox::relay::{claim, mark};

use crate::helpers::fixture;

/// The claim is a plain read: pending rows in acceptance order, the excluded ones left out, no
/// row locked, nothing written (its transaction never gets an id).
#[tokio::test]
async fn a_claim_reads_pending_rows_in_order_leaving_out_the_excluded_ones_and_writes_nothing() {
    let fixture = fixture(1).await;
    let pool = &fixture.database.pool;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(fixture.insert(&format!("CC-00{}", n % 2), &format!(r#"{{"n":{n}}}"#)).await);
    }
    assert_eq!(mark(pool, &ids[1..2]).await.expect("mark"), 1);
    let mut tx = pool.begin().await.expect("begin");
    let claimed: Vec<Uuid> =
        claim(&mut *tx, 2, &ids[..1]).await.expect("claim").iter().map(|event| event.id).collect();
    assert_eq!(claimed, [ids[2], ids[3]], "in acceptance order, without the excluded and the marked");
    let wrote: bool = sqlx::query_scalar("SELECT pg_current_xact_id_if_assigned() IS NOT NULL")
        .fetch_one(&mut *tx)
        .await
        .expect("xact id");
    assert!(!wrote, "the claim wrote or locked rows");
    tx.rollback().await.expect("rollback");
    let everything: Vec<Uuid> =
        claim(pool, 10, &[]).await.expect("claim").iter().map(|event| event.id).collect();
    assert_eq!(everything, [ids[0], ids[2], ids[3], ids[4]]);
}

/// The mark writes the moment of the first mark and only on pending rows: marking again (two
/// relays published the row) changes nothing and counts nothing.
#[tokio::test]
async fn a_mark_marks_pending_rows_once() {
    let fixture = fixture(1).await;
    let pool = &fixture.database.pool;
    let (first, second) =
        (fixture.insert("CC-001", r#"{"n":1}"#).await, fixture.insert("CC-001", r#"{"n":2}"#).await);
    assert_eq!(mark(pool, &[first]).await.expect("mark"), 1);
    let marked_at: OffsetDateTime = fixture.published_at(first).await;
    assert_eq!(mark(pool, &[first, second]).await.expect("mark"), 1, "only the pending row");
    assert_eq!(fixture.published_at(first).await, marked_at, "the first mark stands");
    assert_eq!(mark(pool, &[]).await.expect("mark"), 0);
    assert_eq!(fixture.pending().await, 0);
}

/// What this transaction has read so far: heap blocks of `outbox_evento` (cache hits included),
/// and scans of the pending rows' index in `sequencia` order and of the primary key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
struct Reads {
    heap_blocks: i64,
    pending_scans: i64,
    primary_key_scans: i64,
}

impl std::ops::Sub for Reads {
    type Output = Self;

    fn sub(self, earlier: Self) -> Self {
        Self {
            heap_blocks: self.heap_blocks - earlier.heap_blocks,
            pending_scans: self.pending_scans - earlier.pending_scans,
            primary_key_scans: self.primary_key_scans - earlier.primary_key_scans,
        }
    }
}

async fn reads(tx: &mut sqlx::PgConnection) -> Reads {
    sqlx::query_as(
        "SELECT pg_stat_get_xact_blocks_fetched('outbox_evento'::regclass) AS heap_blocks, \
                pg_stat_get_xact_numscans('idx_outbox_pendentes_sequencia'::regclass) AS pending_scans, \
                pg_stat_get_xact_numscans('outbox_evento_pkey'::regclass) AS primary_key_scans",
    )
    .fetch_one(tx)
    .await
    .expect("statistics")
}

/// A backlog met with the statistics of a drained queue (taken while nothing was pending, as
/// they are in steady operation) and with those of the backlog itself: a claim walks the partial
/// index on pending rows in `sequencia` order and reads the rows it leaves out and the rows it
/// takes, never the published history nor the rest of the backlog; a mark finds its rows by
/// primary key, not by a walk over the pending rows. Planned from such statistics, an earlier
/// claim's per-key check read every pending row for every row it took (7.2 s for 1 000 rows
/// behind 20 000, #28); with the article's index on pending rows by `criado_em` still there, a
/// claim read the backlog through it and sorted it (345 ms behind 200 000, #47); a scan of the
/// table would read every page of the history, which alone holds more pages than the claims'
/// bound here.
#[tokio::test]
async fn a_claim_behind_a_backlog_reads_each_pending_row_a_few_times_whatever_the_statistics() {
    const PUBLISHED: usize = 30_000;
    // enough for the claim's index to need a level more than the `criado_em` one did
    const BACKLOG: usize = 200_000;
    const BATCH: i64 = 500;
    let fixture = fixture(1).await;
    let pool = &fixture.database.pool;
    // statistics are this test's to take: no autovacuum ANALYZE in between
    sqlx::query("ALTER TABLE outbox_evento SET (autovacuum_enabled = false)")
        .execute(pool)
        .await
        .expect("alter");
    // rows written by one statement share their `criado_em` (as any writer's rows of one
    // transaction do with `DEFAULT now()`): an index on it is then small, which once made the
    // planner prefer it, and a sort of every pending row, to the claim's index
    let insert = |count: usize, description: usize| async move {
        sqlx::query(
            "INSERT INTO outbox_evento (id, topico, chave, tipo, payload) \
             SELECT gen_random_uuid(), 'events', 'CC-' || (n % 300), 'TransferenciaSolicitada', \
                    json_build_object('descricao', repeat('x', $2))::text \
             FROM generate_series(1, $1) AS n",
        )
        .bind(count as i64)
        .bind(description as i32)
        .execute(pool)
        .await
        .expect("insert");
    };
    insert(PUBLISHED, 300).await;
    sqlx::query("UPDATE outbox_evento SET publicado_em = now()").execute(pool).await.expect("publish");
    // the history as vacuum leaves it: no index entry left of the rows' pending versions (the
    // first scan after a mark steps over those once, and marks them dead in the index)
    sqlx::query("VACUUM outbox_evento").execute(pool).await.expect("vacuum");
    sqlx::query("ANALYZE outbox_evento").execute(pool).await.expect("analyze");
    insert(BACKLOG, 10).await;
    let pages: i64 =
        sqlx::query_scalar("SELECT pg_relation_size('outbox_evento') / current_setting('block_size')::int")
            .fetch_one(pool)
            .await
            .expect("pages");
    // at most one heap block per row a claim reads (the rows it leaves out and those it takes)
    let claim_bound = 2 * BATCH;
    assert!(pages > claim_bound, "the table ({pages} pages) is too small to tell a scan of it");
    // the mark reads a row's page, writes its new version, and finds room for it
    let mark_bound = 6 * BATCH;

    for statistics in ["drained", "backlog"] {
        if statistics == "backlog" {
            sqlx::query("ANALYZE outbox_evento").execute(pool).await.expect("analyze");
        }
        let mut tx = pool.begin().await.expect("begin");
        let start = reads(&mut tx).await;
        let first = claim(&mut *tx, BATCH, &[]).await.expect("claim");
        let claimed = reads(&mut tx).await;
        let excluded: Vec<Uuid> = first.iter().map(|event| event.id).collect();
        let second = claim(&mut *tx, BATCH, &excluded).await.expect("claim");
        let claimed_again = reads(&mut tx).await;
        let marked = mark(&mut *tx, &excluded).await.expect("mark");
        let end = reads(&mut tx).await;
        tx.rollback().await.expect("rollback");

        assert_eq!((first.len(), second.len(), marked), (BATCH as usize, BATCH as usize, BATCH as u64));
        assert!(second.iter().all(|event| !excluded.contains(&event.id)), "an excluded row taken");
        let (claim, claim_excluding, mark) = (claimed - start, claimed_again - claimed, end - claimed_again);
        eprintln!(
            "{statistics} statistics, a table of {pages} pages: the claim {claim:?}, the claim leaving out a batch {claim_excluding:?}, the mark {mark:?}"
        );
        for (what, reads) in [("the claim", claim), ("the claim leaving out a batch", claim_excluding)] {
            assert_eq!(
                (reads.pending_scans, reads.primary_key_scans),
                (1, 0),
                "with the {statistics} statistics {what} did not walk the pending rows' index alone"
            );
            assert!(reads.heap_blocks < claim_bound, "{what} read {} heap blocks", reads.heap_blocks);
        }
        assert_eq!(
            mark.pending_scans, 0,
            "with the {statistics} statistics the mark walked the pending rows"
        );
        assert!(mark.primary_key_scans > 0, "the mark found its rows without the primary key");
        assert!(mark.heap_blocks < mark_bound, "the mark read {} heap blocks", mark.heap_blocks);
    }
}
