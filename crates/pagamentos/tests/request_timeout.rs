//! The request timeout on real slow paths, after the request reached what writes it: its
//! outcome is unknown, so the answer says so (`500` `/problems/outcome-unknown`), never a
//! plain "retry later" `503`, and the same request sent again with its key takes effect once.
//! - A deposit blocked on its account's row lock (held by the test) past
//!   `PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS`; retried with the same `depositoId` after the lock is
//!   gone, it is applied once.
//! - A transfer whose commit waits on the outbox table (locked by the test for 3 s) past the
//!   timeout: the writer commits it after the answer went out; exactly one transfer exists,
//!   the same Idempotency-Key replays it, and it settles once. Both writers: the group commit
//!   (`fast`, whose writer task goes on without the dropped handler: the key replays the
//!   transfer it committed) and one transaction per request (`reference`, whose transaction
//!   may be committing when it is dropped; here it was still waiting for the lock, so it was
//!   rolled back and the key creates the transfer, once).

use crate::common;

use std::time::{Duration, Instant};

use reqwest::Response;
use serde_json::{json, Value};
use uuid::Uuid;

use common::system::System;

/// `response` is the outcome-unknown problem: a `500` of its own type, no `Retry-After`.
async fn assert_outcome_unknown(response: Response, started: Instant) {
    assert!(started.elapsed() >= Duration::from_secs(1), "answered before the timeout");
    let status = response.status();
    let retry_after = response.headers().get("retry-after").cloned();
    let content_type = response.headers().get("content-type").cloned();
    let text = response.text().await.expect("body");
    assert_ne!(status, 503, "a timeout after the handoff must not invite a blind retry: {text}");
    assert_eq!(status, 500, "{text}");
    assert_eq!(retry_after, None, "{text}");
    assert_eq!(content_type.as_ref().map(|value| value.as_bytes()), Some(&b"application/problem+json"[..]));
    let problem: Value = serde_json::from_str(&text).expect("problem");
    assert_eq!(problem["type"], "/problems/outcome-unknown", "{problem}");
    assert_eq!(problem["status"], 500, "{problem}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposit_blocked_past_the_timeout_is_answered_outcome_unknown_and_applied_once() {
    let system = System::new().await;
    let _all = system.start_with(&[("PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS", "1000")]).await;
    system.open_account("TIMEOUT-A", 500).await;

    let mut lock = system.ledger_db.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM conta WHERE id = 'TIMEOUT-A' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .expect("lock the account");
    let deposit = json!({"depositoId": Uuid::new_v4(), "valorEmCentavos": 700});
    let url = system.ledger("/contas/TIMEOUT-A/depositos");
    let started = Instant::now();
    // the client's own limit is a failure detector only: without the server's timeout the
    // request waits for the lock as long as the test holds it
    let response =
        tokio::time::timeout(Duration::from_secs(60), system.http.post(&url).json(&deposit).send())
            .await
            .expect("answered before the client gave up")
            .expect("POST");
    assert_outcome_unknown(response, started).await;

    lock.rollback().await.expect("release the lock");
    let response = system.http.post(&url).json(&deposit).send().await.expect("POST again");
    assert!([200, 201].contains(&response.status().as_u16()), "{}", response.status());
    assert_eq!(system.balance("TIMEOUT-A").await, 500 + 700, "applied exactly once");
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
}

/// `committed_by_the_writer`: whether the writer commits the transfer after the answer (the
/// group commit) or it was rolled back with its dropped handler (its own transaction).
async fn a_transfer_timed_out_in_the_writer_exists_once(profile: &str, committed_by_the_writer: bool) {
    let system = System::new().await;
    let _all = system
        .start_with(&[("PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS", "1000"), ("PAGAMENTOS_PROFILE", profile)])
        .await;
    let (from, to) = (format!("TO-{profile}-A"), format!("TO-{profile}-B"));
    system.open_account(&from, 1_000).await;
    system.open_account(&to, 0).await;

    // every insert into the outbox waits for this transaction, held 3 s
    let mut lock = system.transfers_db.pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE outbox_evento IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock the outbox");
    let locked = Instant::now();
    let key = testkit::unique("timeout-key");
    let body = json!({"contaOrigem": from, "contaDestino": to, "valorEmCentavos": 300, "moeda": "BRL"});
    let post = || system.http.post(system.api("/transferencias")).header("Idempotency-Key", &key).json(&body);
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(60), post().send())
        .await
        .expect("answered before the client gave up")
        .expect("POST");
    assert_outcome_unknown(response, started).await;
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(locked.elapsed())).await;
    lock.rollback().await.expect("release the outbox");

    // the same key sent again once the lock is gone (409 while the first is being committed):
    // the transfer the writer committed, replayed, or (its transaction rolled back with its
    // handler) created now; from then on, replayed
    let replayed = |response: &Response| {
        response.headers().get("idempotent-replayed").is_some_and(|value| value.as_bytes() == b"true")
    };
    let (first_replayed, first): (bool, Value) =
        testkit::eventually("the same key answers 202", testkit::PATIENCE, || async {
            let response = post().send().await.ok()?;
            if response.status() == 409 {
                return None;
            }
            assert_eq!(response.status(), 202, "{:?}", response.text().await);
            Some((replayed(&response), response.json().await.ok()?))
        })
        .await;
    assert_eq!(first_replayed, committed_by_the_writer, "{first}");
    let again = post().send().await.expect("POST again");
    assert_eq!(again.status(), 202);
    assert!(replayed(&again));
    let again: Value = again.json().await.expect("transfer");
    assert_eq!(again["id"], first["id"]);
    let rows: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM transferencia WHERE conta_origem = $1")
        .bind(&from)
        .fetch_all(&system.transfers_db.pool)
        .await
        .expect("transfers");
    assert_eq!(rows.len(), 1, "exactly one transfer: {rows:?}");
    let id = first["id"].as_str().expect("id");
    assert_eq!(rows[0].to_string(), id);
    assert_eq!(system.final_status(id).await.0, "LIQUIDADA");
    assert_eq!(system.balance(&from).await, 1_000 - 300, "charged exactly once");
    assert_eq!(system.balance(&to).await, 300);
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_timed_out_in_the_group_commit_is_outcome_unknown_and_exists_once() {
    a_transfer_timed_out_in_the_writer_exists_once("fast", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_timed_out_in_its_own_transaction_is_outcome_unknown_and_exists_once() {
    a_transfer_timed_out_in_the_writer_exists_once("reference", false).await;
}
