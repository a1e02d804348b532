//! The claim statement: marking the previous batch while it leases the next, leasing in place
//! (heap-only updates), and its cost behind a backlog.

use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use outbox::relay::{claim, claim_and_mark};

use crate::helpers::fixture;

/// The statement of a cycle that starts at once: it marks the previous cycle's acknowledged
/// rows and leases the next ones, never taking back a row it marks (its claim does not see its
/// own marks), and marks nothing of a row another relay has taken meanwhile.
#[tokio::test]
async fn a_claim_that_marks_the_previous_batch_never_takes_it_back() {
    let fixture = fixture(1).await;
    let pool = &fixture.database.pool;
    let first = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let taken = fixture.insert("CC-002", r#"{"n":2}"#).await;
    let (owner, other) = (Uuid::new_v4(), Uuid::new_v4());
    let leased: Vec<Uuid> = claim(pool, owner, 2, Duration::from_secs(60))
        .await
        .expect("claim")
        .iter()
        .map(|event| event.id)
        .collect();
    assert_eq!(leased, vec![first, taken]);
    // the second row's lease was taken over by another relay before this one's mark
    sqlx::query("UPDATE outbox_evento SET reservado_por = $2 WHERE id = $1")
        .bind(taken)
        .bind(other)
        .execute(pool)
        .await
        .expect("take over");
    let later = fixture.insert("CC-001", r#"{"n":3}"#).await;
    let (marked, next) = claim_and_mark(pool, owner, 10, Duration::from_secs(60), &[first, taken])
        .await
        .expect("claim and mark");
    assert_eq!(marked, 1, "only the row this relay still held");
    assert_eq!(next.iter().map(|event| event.id).collect::<Vec<_>>(), vec![later], "not the row it marked");
    fixture.published_at(first).await;
    let published: Option<OffsetDateTime> =
        sqlx::query_scalar("SELECT publicado_em FROM outbox_evento WHERE id = $1")
            .bind(taken)
            .fetch_one(pool)
            .await
            .expect("row");
    assert_eq!(published, None, "the other relay's row stays to that relay");
    // nothing acknowledged: a plain claim, nothing marked
    let (marked, next) = claim_and_mark(pool, owner, 10, Duration::from_secs(60), &[]).await.expect("claim");
    assert_eq!((marked, next.len()), (0, 1), "its own lease on the later row");
}

/// The lease is a heap-only (HOT) update: the table keeps room on its pages
/// (`20261206000001_outbox_fillfactor`), so a claim rewrites (nearly) every leased row in place
/// and adds no index entry. With full pages every lease of a new batch becomes a new tuple
/// elsewhere with an entry in each of the table's four indexes, and the claim costs about twice
/// as much (#28).
#[tokio::test]
async fn a_claim_leases_its_rows_in_place_without_touching_the_indexes() {
    let fixture = fixture(1).await;
    let mut tx = fixture.database.pool.begin().await.expect("begin");
    let keys: Vec<String> = (0..500).map(|n| format!("CC-{:03}", n % 100)).collect();
    let payload = format!(r#"{{"descricao":"{}"}}"#, "x".repeat(300));
    fixture.insert_keys(&mut tx, &keys, &payload).await;
    let leased = claim(&mut *tx, Uuid::new_v4(), 500, Duration::from_secs(60)).await.expect("claim");
    assert_eq!(leased.len(), 500);
    // this transaction's own counts: no wait for the statistics collector
    let (updated, in_place): (i64, i64) = sqlx::query_as(
        "SELECT pg_stat_get_xact_tuples_updated('outbox_evento'::regclass), \
                pg_stat_get_xact_tuples_hot_updated('outbox_evento'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("statistics");
    // deterministic for one transaction on a new table: 445 of 500 at fillfactor 50 (a page's
    // last rows may not find room), none at 100
    assert_eq!(updated, 500);
    assert!(in_place * 5 >= updated * 4, "{in_place} of {updated} leases were heap-only updates");
}

/// Heap blocks this transaction has read from `outbox_evento` so far (cache hits included).
async fn heap_blocks_read(tx: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar("SELECT pg_stat_get_xact_blocks_fetched('outbox_evento'::regclass)")
        .fetch_one(tx)
        .await
        .expect("statistics")
}

/// A backlog met with the statistics of a drained queue (taken while nothing was pending, as
/// they are in steady operation): a claim and a mark read each pending row a few times, not
/// once per row they take. Planned from those statistics, the per-key check once read every
/// pending row for every candidate, and the marks scanned every pending row to find their ids:
/// a claim of 1 000 rows behind 20 000 took 7.2 s, so a relay met a backlog after an outage
/// at a crawl (#28). Here the old statement's claim read 183 846 heap blocks, the new one 3 545.
#[tokio::test]
async fn a_claim_behind_a_backlog_reads_each_pending_row_a_few_times_whatever_the_statistics() {
    const PUBLISHED: usize = 6_000;
    const BACKLOG: usize = 3_000;
    const BATCH: i64 = 500;
    let fixture = fixture(1).await;
    let pool = &fixture.database.pool;
    // statistics are this test's to take: no autovacuum ANALYZE in between
    sqlx::query("ALTER TABLE outbox_evento SET (autovacuum_enabled = false)")
        .execute(pool)
        .await
        .expect("alter");
    let payload = format!(r#"{{"descricao":"{}"}}"#, "x".repeat(300));
    let insert = |count: usize| {
        let keys: Vec<String> = (0..count).map(|n| format!("CC-{:03}", n % 300)).collect();
        let (fixture, payload) = (&fixture, &payload);
        async move {
            let mut tx = pool.begin().await.expect("begin");
            fixture.insert_keys(&mut tx, &keys, payload).await;
            tx.commit().await.expect("commit");
        }
    };
    insert(PUBLISHED).await;
    sqlx::query("UPDATE outbox_evento SET publicado_em = now()").execute(pool).await.expect("publish");
    sqlx::query("ANALYZE outbox_evento").execute(pool).await.expect("analyze");
    insert(BACKLOG).await;

    let owner = Uuid::new_v4();
    let mut tx = pool.begin().await.expect("begin");
    let before = heap_blocks_read(&mut tx).await;
    let first = claim(&mut *tx, owner, BATCH, Duration::from_secs(60)).await.expect("claim");
    let claimed = heap_blocks_read(&mut tx).await;
    let ids: Vec<Uuid> = first.iter().map(|event| event.id).collect();
    let (marked, second) =
        claim_and_mark(&mut *tx, owner, BATCH, Duration::from_secs(60), &ids).await.expect("claim and mark");
    let marked_and_claimed = heap_blocks_read(&mut tx).await;
    tx.rollback().await.expect("rollback");

    assert_eq!((first.len(), marked, second.len()), (BATCH as usize, BATCH as u64, BATCH as usize));
    // a few reads per pending row and per row taken; the nested loop read BACKLOG per row taken
    let bound = 3 * (BACKLOG as i64 + BATCH);
    let (claim_reads, mark_and_claim_reads) = (claimed - before, marked_and_claimed - claimed);
    assert!(claim_reads < bound, "the claim read {claim_reads} heap blocks (bound {bound})");
    assert!(
        mark_and_claim_reads < bound,
        "the mark and claim read {mark_and_claim_reads} heap blocks (bound {bound})"
    );
}
