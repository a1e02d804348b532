//! The request timeout on a real slow path: a deposit blocked on its account's row lock (held
//! by the test) is abandoned and answered `503` `/problems/timeout` once
//! `PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS` has passed; retried with the same `depositoId` after
//! the lock is gone, it is applied once.

mod common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

use common::system::System;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_blocked_past_the_timeout_is_answered_503_and_abandoned() {
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
    assert_eq!(response.status(), 503);
    assert!(started.elapsed() >= Duration::from_secs(1), "answered before the timeout");
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    assert_eq!(response.headers()["retry-after"], "1");
    let problem: Value = response.json().await.expect("problem");
    assert_eq!(problem["type"], "/problems/timeout", "{problem}");
    assert_eq!(problem["status"], 503, "{problem}");

    lock.rollback().await.expect("release the lock");
    let response = system.http.post(&url).json(&deposit).send().await.expect("POST again");
    assert!([200, 201].contains(&response.status().as_u16()), "{}", response.status());
    assert_eq!(system.balance("TIMEOUT-A").await, 500 + 700, "applied exactly once");
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
}
