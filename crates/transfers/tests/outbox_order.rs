//! Per-key acceptance order through the API's group commit: the rows of one batch are one
//! transaction's, so the relay must keep their order (`sequencia`) on the way to the broker.

use crate::common;

use std::collections::HashMap;

use common::{payload, receive, spawn_app, transfer};
use contracts::topics;
use sqlx::Connection;
use testkit::eventually;

const TRANSFERS: usize = 120;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_of_one_account_in_one_group_commit_leave_in_acceptance_order() {
    let app = spawn_app().await;
    let reader = app.reader(topics::REQUESTED);

    // hold the outbox so the writers block inside their first transactions while the other
    // requests queue behind them: the next batches then hold many transfers each
    let mut holder = sqlx::PgConnection::connect(&app.database.url).await.expect("connection");
    let mut hold = holder.begin().await.expect("begin");
    sqlx::query("LOCK TABLE outbox_evento IN EXCLUSIVE MODE").execute(&mut *hold).await.expect("lock");

    let requests: Vec<_> = (0..TRANSFERS)
        .map(|n| {
            let (http, url) = (app.http.clone(), app.url("/transferencias"));
            let body = transfer("CC-001", "CC-002", n as i64 + 1);
            tokio::spawn(async move {
                http.post(url)
                    .header("Idempotency-Key", testkit::unique("order"))
                    .json(&body)
                    .send()
                    .await
                    .expect("POST /transferencias")
                    .status()
            })
        })
        .collect();
    let pool = app.database.pool.clone();
    eventually("every writer blocked on the held outbox", testkit::PATIENCE, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT pid) FROM pg_locks JOIN pg_stat_activity USING (pid) \
             WHERE NOT granted AND relation = 'outbox_evento'::regclass AND query LIKE 'INSERT INTO outbox_evento%'",
        )
        .fetch_one(&pool)
        .await
        .expect("locks");
        // (the relay's claim may wait on it too: only the inserts count)
        (waiting == transfers::writer::WRITERS as i64).then_some(())
    })
    .await;
    hold.commit().await.expect("release");
    for request in requests {
        assert_eq!(request.await.expect("request task"), 202);
    }

    // acceptance order: the order of `sequencia` within each group commit (one transaction,
    // one `xmin`); batches that overlapped in time have no order between them (docs/reference/contract.md §4
    // orders requests that do not overlap)
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT payload::json->>'transferenciaId', xmin::text FROM outbox_evento ORDER BY sequencia",
    )
    .fetch_all(&app.database.pool)
    .await
    .expect("acceptance order");
    let mut batches: HashMap<&str, Vec<String>> = HashMap::new();
    for (id, batch) in &rows {
        batches.entry(batch.as_str()).or_default().push(id.clone());
    }
    let largest = batches.values().map(Vec::len).max().unwrap_or(0);
    // the test means something only if some batch held several transfers of the account
    assert!(largest >= 10, "no group commit of 10 or more transfers formed (largest {largest})");

    let published: Vec<String> = receive(&reader, TRANSFERS)
        .await
        .iter()
        .map(|record| payload(record)["transferenciaId"].as_str().expect("transferenciaId").to_owned())
        .collect();
    let batch_of: HashMap<&String, &str> = rows.iter().map(|(id, batch)| (id, batch.as_str())).collect();
    for (batch, accepted) in &batches {
        let published_in_batch: Vec<&String> =
            published.iter().filter(|id| batch_of.get(id) == Some(batch)).collect();
        let accepted: Vec<&String> = accepted.iter().collect();
        assert_eq!(
            published_in_batch, accepted,
            "events of CC-001 accepted in one group commit left out of acceptance order"
        );
    }
    app.stop().await;
}
