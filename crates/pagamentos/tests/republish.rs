//! `pagamentos republish` against the whole system: a transfer whose request event never
//! reached Kafka (written by the API's own store while no relay ran, its outbox row then
//! deleted as the day-old cleanup would) stays PENDENTE and `verify` says so; `republish`
//! sends its request event again and it settles, `verify` clean; sending settled transfers
//! again moves no money. And a transfer whose outcome event the ledger published but
//! transferencias never projected (the event lost, the ledger's outbox row gone): its request
//! sent again would change nothing (the ledger's outcome is pinned), so `republish` sends the
//! ledger's outcome event again, with its own `eventoId`, and the transfer ends as the ledger
//! decided, no money moved.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::{Child, Command};
use uuid::Uuid;

use common::system::System;
use contracts::ids::{derived_event_id, REJECTED_BY_LEDGER_PREFIX, SETTLED_PREFIX};
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
        .env("LEDGER_DATABASE_URL", &system.ledger_db.url)
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

// Over 100 lines on purpose: one scenario on one running system, read top to bottom; its steps
// build on each other's state, so splitting it would only pass that state around.
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

    // settled transfers sent again: the ledger decided them, so their outcome events go again
    // (not their requests); nothing moves. A transfer of the same account accepted after them
    // and settled proves the ledger is still in step
    let ids: Vec<Uuid> = [&settled, &lost_id].iter().map(|id| id.parse().expect("uuid")).collect();
    let mut requests_before = Vec::new();
    for id in &ids {
        requests_before.push(outbox_rows_of(&system, *id).await);
    }
    let unknown = Uuid::new_v4().to_string();
    let (code, out) = republish(&system, &["--id", &settled, "--id", &lost_id, "--id", &unknown]).await;
    assert_eq!(code, 1, "an unknown id is named and fails: {out}");
    assert!(out.contains(&format!("{unknown}: no such transfer")), "{out}");
    for id in &ids {
        let event_id = derived_event_id(SETTLED_PREFIX, *id);
        assert!(
            out.contains(&format!("{id} LIQUIDADA for "))
                && out
                    .contains(&format!("LIQUIDADA in the ledger: its outcome event {event_id} queued again")),
            "{out}"
        );
    }
    assert!(out.ends_with("republish: queued 2, 0 already waiting, 1 not found\n"), "{out}");
    let after = system.transfer("REP-A", "REP-B", 400).await.expect("accepted");
    assert_eq!(system.final_status(&after).await.0, "LIQUIDADA");
    assert_eq!(system.balance("REP-A").await, 1_000_000 - 100 - 200 - 300 - 400);
    assert_eq!(system.balance("REP-B").await, 100 + 200 + 300 + 400);
    for (id, before) in ids.iter().zip(requests_before) {
        assert_eq!(outbox_rows_of(&system, *id).await, before, "no request sent again: {id}");
    }
    for id in &ids {
        wait_published_twice(
            &system,
            &system.topics.args.topic(contracts::topics::SETTLED),
            derived_event_id(SETTLED_PREFIX, *id),
        )
        .await;
    }
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "no transfer settled twice: {report}");
    terminate(&mut all).await;
}

/// Waits until `event_id` was published twice on `topic` (the first time and once again).
async fn wait_published_twice(system: &System, topic: &str, event_id: Uuid) {
    let kafka = system.topics.args.clone();
    let topic = topic.to_owned();
    testkit::eventually(&format!("{event_id} on {topic} twice"), Duration::from_secs(60), || {
        let (kafka, topic) = (kafka.clone(), topic.clone());
        async move {
            let seen = published(&kafka, &topic, event_id).await;
            (seen == 2).then_some(())
        }
    })
    .await;
}

/// How many records of `topic` carry `event_id` as their `eventoId`.
async fn published(kafka: &kafka::KafkaArgs, topic: &str, event_id: Uuid) -> usize {
    use kafka::rdkafka::Message as _;
    testkit::read_to_end(kafka, topic)
        .await
        .iter()
        .filter_map(|record| record.payload().and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok()))
        .filter(|value| value["eventoId"] == event_id.to_string())
        .count()
}

async fn ledger_outbox_rows(system: &System, event_id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_evento WHERE id = $1")
        .bind(event_id)
        .fetch_one(&system.ledger_db.pool)
        .await
        .expect("count the ledger's outbox rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_outcome_event_is_sent_again_from_the_ledger_and_moves_nothing() {
    let system = System::new().await;
    let mut all = system.start().await;
    system.open_account("OUT-A", 1_000_000).await;
    system.open_account("OUT-B", 0).await;
    system.open_account("OUT-C", 0).await;
    let settled = system.transfer("OUT-A", "OUT-B", 100).await.expect("accepted");
    assert_eq!(system.final_status(&settled).await.0, "LIQUIDADA");
    // rejected by the ledger (not by antifraude): OUT-C has nothing
    let rejected = system.transfer("OUT-C", "OUT-B", 100).await.expect("accepted");
    let (final_status, reason) = system.final_status(&rejected).await;
    assert_eq!((final_status.as_str(), &reason), ("REJEITADA", &json!("SALDO_INSUFICIENTE")));
    terminate(&mut all).await;

    // the ledger published both outcomes and transferencias never projected them: they were
    // lost. The settled one's outbox row is gone as the day-old cleanup takes it; the rejected
    // one's is still there, published
    let ids: Vec<Uuid> = [&settled, &rejected].iter().map(|id| id.parse().expect("uuid")).collect();
    sqlx::query(
        "UPDATE transferencia SET status = 'PENDENTE', motivo_rejeicao = NULL, \
         criada_em = now() - interval '10 minutes', atualizada_em = now() - interval '10 minutes' \
         WHERE id = ANY($1)",
    )
    .bind(&ids)
    .execute(&system.transfers_db.pool)
    .await
    .expect("the outcomes never projected");
    let settled_event = derived_event_id(SETTLED_PREFIX, ids[0]);
    let rejected_event = derived_event_id(REJECTED_BY_LEDGER_PREFIX, ids[1]);
    sqlx::query("DELETE FROM outbox_evento WHERE id = $1")
        .bind(settled_event)
        .execute(&system.ledger_db.pool)
        .await
        .expect("the day-old cleanup");
    assert_eq!(ledger_outbox_rows(&system, rejected_event).await, 1);

    let mut all = system.start().await;
    let marker = system.transfer("OUT-A", "OUT-B", 200).await.expect("accepted");
    assert_eq!(system.final_status(&marker).await.0, "LIQUIDADA");
    for id in [&settled, &rejected] {
        assert_eq!(status(&system, id).await, "PENDENTE");
    }
    let (code, report) = system.verify().await;
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains(&format!("{settled}: PENDENTE for 6"))
            && report.contains("LIQUIDADA in the ledger: its outcome event did not reach transferencias")
            && report.contains(&format!("{rejected}: PENDENTE for 6")),
        "{report}"
    );

    // a dry run says what it would send and writes nothing
    let (code, out) = republish(&system, &["--dry-run"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("its outcome event {settled_event} would be sent again")), "{out}");
    assert!(out.contains(&format!("REJEITADA (SALDO_INSUFICIENTE) in the ledger: its outcome event {rejected_event} would be sent again")), "{out}");
    assert!(out.ends_with("republish: would send 2, 0 already waiting, 0 not found (dry run)\n"), "{out}");
    assert_eq!(ledger_outbox_rows(&system, settled_event).await, 0);
    // their request events are still in the transfers outbox, published: counted, not added to
    let requests = (outbox_rows_of(&system, ids[0]).await, outbox_rows_of(&system, ids[1]).await);

    let (code, out) = republish(&system, &["--pending-older-than", "5m"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("its outcome event {settled_event} queued again in the ledger's outbox")),
        "{out}"
    );
    assert!(
        out.contains(&format!("its outcome event {rejected_event} queued again in the ledger's outbox")),
        "{out}"
    );
    assert!(!out.contains(&marker), "{out}");
    assert!(out.ends_with("republish: queued 2, 0 already waiting, 0 not found\n"), "{out}");
    assert_eq!(system.final_status(&settled).await.0, "LIQUIDADA");
    let (final_status, reason) = system.final_status(&rejected).await;
    assert_eq!((final_status.as_str(), &reason), ("REJEITADA", &json!("SALDO_INSUFICIENTE")));
    // the same events, by their eventoId, a second time; no request was sent again
    let settled_topic = system.topics.args.topic(contracts::topics::SETTLED).to_owned();
    let rejected_topic = system.topics.args.topic(contracts::topics::REJECTED).to_owned();
    wait_published_twice(&system, &settled_topic, settled_event).await;
    wait_published_twice(&system, &rejected_topic, rejected_event).await;
    assert_eq!((outbox_rows_of(&system, ids[0]).await, outbox_rows_of(&system, ids[1]).await), requests);
    assert_eq!(system.balance("OUT-A").await, 1_000_000 - 100 - 200);
    assert_eq!(system.balance("OUT-B").await, 100 + 200);
    assert_eq!(system.balance("OUT-C").await, 0);
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
    terminate(&mut all).await;
}

/// A transfer antifraude blocked is final (`REJEITADA`) and the ledger never heard of it. Its
/// request sent again after the threshold was raised would be analysed again, pass, and settle
/// what was decided otherwise: `republish` refuses it (named, exit 1), dry run or not, and
/// sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_blocked_by_antifraude_is_final_and_never_sent_again() {
    let system = System::new().await;
    let mut all = system.start_with(&[("ANTIFRAUDE_BLOQUEIO_CENTAVOS", "1000")]).await;
    system.open_account("FRA-A", 1_000_000).await;
    system.open_account("FRA-B", 0).await;
    let blocked = system.transfer("FRA-A", "FRA-B", 5_000).await.expect("accepted");
    let (final_status, reason) = system.final_status(&blocked).await;
    assert_eq!((final_status.as_str(), &reason), ("REJEITADA", &json!("BLOQUEADA_ANTIFRAUDE")));
    terminate(&mut all).await;

    // the threshold raised: the same request would pass antifraude now
    let mut all = system.start_with(&[("ANTIFRAUDE_BLOQUEIO_CENTAVOS", "1000000")]).await;
    let blocked_id: Uuid = blocked.parse().expect("uuid");
    let requests = outbox_rows_of(&system, blocked_id).await;
    for args in [&["--id", blocked.as_str(), "--dry-run"][..], &["--id", blocked.as_str()][..]] {
        let (code, out) = republish(&system, args).await;
        assert_eq!(code, 1, "refused: {out}");
        assert!(
            out.contains(&format!("{blocked} REJEITADA for "))
                && out.contains("REJEITADA (BLOQUEADA_ANTIFRAUDE)")
                && out.contains("refused"),
            "{out}"
        );
        assert!(out.contains(", 1 refused"), "{out}");
        assert_eq!(outbox_rows_of(&system, blocked_id).await, requests, "nothing sent: {out}");
    }
    // a transfer of the same account accepted afterwards and settled: had the blocked one's
    // request been sent again, it would have been decided before this one (one key, in order)
    let marker = system.transfer("FRA-A", "FRA-B", 200).await.expect("accepted");
    assert_eq!(system.final_status(&marker).await.0, "LIQUIDADA");
    assert_eq!(status(&system, &blocked).await, "REJEITADA");
    assert_eq!(system.balance("FRA-A").await, 1_000_000 - 200);
    assert_eq!(system.balance("FRA-B").await, 200);
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
    terminate(&mut all).await;
}
