//! `pagamentos republish` against the whole system: a transfer whose request event never
//! reached Kafka (written by the API's own store while no relay ran, its outbox row then
//! deleted as the day-old cleanup would) stays PENDENTE and `verify` says so; `republish`
//! sends its request event again and it settles, `verify` clean; sending settled transfers
//! again moves no money.

mod common;

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::{Child, Command};
use uuid::Uuid;

use common::system::System;
use transfers::domain::TransferRequest;
use transfers::store::{self, Created, EventTarget, NewTransfer};

async fn terminate(child: &mut Child) {
    let pid = child.id().expect("pid").to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().await.expect("kill").success());
    let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .expect("exits within the drain deadline")
        .expect("wait");
    assert!(status.success(), "pagamentos all exited with {status}");
}

/// `pagamentos republish <args>` on the system's transfers database: (exit code, stdout).
async fn republish(system: &System, args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_pagamentos"))
        .arg("republish")
        .args(args)
        .env("TRANSFERENCIAS_DATABASE_URL", &system.transfers_db.url)
        .env("PAGAMENTOS_TOPIC_PREFIX", &system.topics.args.topic_prefix)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run pagamentos republish");
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code().unwrap_or(-1), text)
}

async fn status(system: &System, id: &str) -> String {
    let body: Value = system
        .http
        .get(system.api(&format!("/transferencias/{id}")))
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("body");
    body["status"].as_str().expect("status").to_owned()
}

/// The age `text` gives `id` ("<id>: PENDENTE for <N> s" or "<id> PENDENTE for <N> s"), in
/// seconds; the test aged the transfer by 600 s, and a slow run only adds to that.
fn pending_age_s(text: &str, id: &str) -> u64 {
    let line = text
        .lines()
        .find(|line| line.contains(id) && line.contains("PENDENTE for "))
        .unwrap_or_else(|| panic!("{id} is not named PENDENTE in:\n{text}"));
    let after = line.split_once("PENDENTE for ").expect("the age").1;
    after.split(' ').next().and_then(|age| age.parse().ok()).unwrap_or_else(|| panic!("no age in {line}"))
}

async fn outbox_rows_of(system: &System, id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_evento WHERE payload::jsonb ->> 'transferenciaId' = $1")
        .bind(id.to_string())
        .fetch_one(&system.transfers_db.pool)
        .await
        .expect("count outbox rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_request_event_is_sent_again_and_settles_once() {
    let system = System::new().await;
    let mut all = system.start().await;
    system.open_account("REP-A", 1_000_000).await;
    system.open_account("REP-B", 0).await;
    let settled = system.transfer("REP-A", "REP-B", 100).await.expect("accepted");
    assert_eq!(system.final_status(&settled).await.0, "LIQUIDADA");
    terminate(&mut all).await;

    // accepted while no relay runs, by the API's own store: the transfer and its outbox row in
    // one transaction; the row then goes as the day-old cleanup would take it, unpublished
    let target = EventTarget {
        topic: system.topics.args.topic(contracts::topics::REQUESTED).into(),
        traceparent: None,
        tracestate: None,
    };
    let request = TransferRequest::parse(
        &json!({"contaOrigem": "REP-A", "contaDestino": "REP-B", "valorEmCentavos": 300, "moeda": "BRL"}),
    )
    .expect("valid request");
    let Created::New(lost) =
        store::create(&system.transfers_db.pool, &NewTransfer { request, key: None, target })
            .await
            .expect("create")
    else {
        panic!("a new transfer")
    };
    assert_eq!(outbox_rows_of(&system, lost.id).await, 1, "written with its outbox row");
    sqlx::query("DELETE FROM outbox_evento WHERE publicado_em IS NULL")
        .execute(&system.transfers_db.pool)
        .await
        .expect("lose the event");
    sqlx::query("UPDATE transferencia SET criada_em = now() - interval '10 minutes' WHERE id = $1")
        .bind(lost.id)
        .execute(&system.transfers_db.pool)
        .await
        .expect("age it");

    let mut all = system.start().await;
    // a transfer of the same account accepted after it settles: had the lost one's event been
    // anywhere, it would have been decided before this one (one key, one partition, in order)
    let marker = system.transfer("REP-A", "REP-B", 200).await.expect("accepted");
    assert_eq!(system.final_status(&marker).await.0, "LIQUIDADA");
    let lost_id = lost.id.to_string();
    assert_eq!(status(&system, &lost_id).await, "PENDENTE");
    let (code, report) = system.verify().await;
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("BROKEN invariant 4 pending-too-long")
            && report.contains(&format!("{lost_id}: PENDENTE for "))
            && report.contains("not decided by the ledger"),
        "{report}"
    );
    assert!(pending_age_s(&report, &lost_id) >= 600, "{report}");

    // a dry run writes nothing
    let (code, out) = republish(&system, &["--dry-run"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("{lost_id} PENDENTE for ")) && out.contains("would be sent again"),
        "{out}"
    );
    assert!(pending_age_s(&out, &lost_id) >= 600, "{out}");
    assert!(out.ends_with("republish: would send 1, 0 already waiting, 0 not found (dry run)\n"), "{out}");
    assert_eq!(outbox_rows_of(&system, lost.id).await, 0);

    // the stuck one is sent again (the recent marker is not stuck) and settles
    let (code, out) = republish(&system, &["--pending-older-than", "5m"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("{lost_id} PENDENTE for ")) && out.contains("queued again"), "{out}");
    assert!(pending_age_s(&out, &lost_id) >= 600, "{out}");
    assert!(!out.contains(&marker), "{out}");
    assert!(out.ends_with("republish: queued 1, 0 already waiting, 0 not found\n"), "{out}");
    assert_eq!(system.final_status(&lost_id).await.0, "LIQUIDADA");
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
    assert_eq!(system.balance("REP-A").await, 1_000_000 - 100 - 200 - 300);

    // settled transfers sent again: nothing moves. A transfer of the same account accepted
    // after them and settled proves their events went through the ledger first
    let ids: Vec<Uuid> = [&settled, &lost_id].iter().map(|id| id.parse().expect("uuid")).collect();
    let mut rows_before = Vec::new();
    for id in &ids {
        rows_before.push(outbox_rows_of(&system, *id).await);
    }
    let unknown = Uuid::new_v4().to_string();
    let (code, out) = republish(&system, &["--id", &settled, "--id", &lost_id, "--id", &unknown]).await;
    assert_eq!(code, 1, "an unknown id is named and fails: {out}");
    assert!(out.contains(&format!("{unknown}: no such transfer")), "{out}");
    assert!(out.ends_with("republish: queued 2, 0 already waiting, 1 not found\n"), "{out}");
    let after = system.transfer("REP-A", "REP-B", 400).await.expect("accepted");
    assert_eq!(system.final_status(&after).await.0, "LIQUIDADA");
    assert_eq!(system.balance("REP-A").await, 1_000_000 - 100 - 200 - 300 - 400);
    assert_eq!(system.balance("REP-B").await, 100 + 200 + 300 + 400);
    for (id, before) in ids.iter().zip(rows_before) {
        assert_eq!(outbox_rows_of(&system, *id).await, before + 1, "sent again: {id}");
    }
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "no transfer settled twice: {report}");
    terminate(&mut all).await;
}
