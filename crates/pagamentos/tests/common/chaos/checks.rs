//! The chaos suite's checks after a run: what the API's database, the ledger and the topics
//! hold against what the client was told, the bank reads, the notifications; the figures
//! printed as the run's last line, and a diagnosis of any lost transfer.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use contracts::topics;
use testkit::webhook::Receiver;

use super::bank::DRAIN;
use super::inspect::{diagnose, read_all};
use super::processes::{dump_stacks, Service};
use super::workload::{BankReads, Client, ACCOUNTS, OPENING_CENTS};
use crate::common::system::System;

/// What a run leaves to check.
pub struct Ran<'a> {
    pub seed: u64,
    pub rounds: usize,
    pub faults: usize,
    pub traffic_s: f64,
    /// Transfer ids answered `202`.
    pub accepted: Vec<String>,
    /// POSTs that failed for good.
    pub failed: Vec<String>,
    /// Transfers still `PENDENTE` when the drain ended (0: none).
    pub pending: i64,
    pub client: &'a Client,
    pub bank_reads: &'a BankReads,
    pub webhook: &'a Receiver,
    /// Both deployments' processes, whose stacks are dumped when a transfer is lost.
    pub processes: Vec<&'a Service>,
    pub logs: &'a Path,
}

/// Every check of the run; its figures are printed as the last line.
pub async fn check(system: &System, ran: Ran<'_>) {
    let Ran { seed, rounds, faults, traffic_s, ref accepted, ref failed, pending, client, .. } = ran;
    let api = api_view(system, accepted).await;
    let requested = client.requested.lock().expect("lock").clone();
    let ledger = ledger_view(system, &api.status, &requested).await;
    let reads = ran.bank_reads.reads.load(Ordering::Relaxed);
    let reads_unavailable = ran.bank_reads.unavailable.load(Ordering::Relaxed);
    let read_violations = ran.bank_reads.violations.lock().expect("lock").clone();
    let pipeline = pipeline_view(system, accepted, &api).await;

    let notified: HashSet<String> = ran
        .webhook
        .calls()
        .iter()
        .filter_map(|call| serde_json::from_slice::<Value>(&call.body).ok())
        .filter_map(|event| event["transferenciaId"].as_str().map(str::to_owned))
        .collect();
    let unnotified = accepted.iter().filter(|id| !notified.contains(*id)).count();

    let figures = json!({
        "seed": seed,
        "rounds": rounds,
        "faults": faults,
        "seconds": traffic_s.round(),
        "posts": client.posts.load(Ordering::Relaxed),
        "post_retries": client.retries.load(Ordering::Relaxed),
        "accepted": accepted.len(),
        "settled": api.settled,
        "rejected": api.rejected,
        "lost": api.lost.len(),
        "doubled": ledger.doubled,
        "misapplied": ledger.misapplied.len(),
        "bank_reads": reads,
        "bank_reads_unavailable": reads_unavailable,
        "bank_read_violations": read_violations.len(),
        "requests_republished": pipeline.republished,
        "analysed_twice": pipeline.analysed_twice,
        "phantom": api.phantom,
        "dead_letters": pipeline.dead_letters.len(),
        "unanalysed": pipeline.unanalysed,
        "unnotified": unnotified,
        "unrequested": pipeline.unrequested,
        "settlements_republished": pipeline.settlements_republished,
        "settled_unannounced": pipeline.settled_unannounced,
        "announced_unsettled": pipeline.announced_unsettled,
        "phantom_events": pipeline.phantom_events,
    });
    if !api.lost.is_empty() {
        diagnose(system, &api.lost, &pipeline.analysed, &pipeline.request_records).await;
        for process in &ran.processes {
            dump_stacks(process, ran.logs).await;
        }
    }
    assert!(failed.is_empty(), "POSTs that failed for good: {failed:?}");
    assert_eq!(pending, 0, "transfers still PENDENTE {DRAIN:?} after the traffic stopped: {figures}");
    assert!(api.lost.is_empty(), "accepted but not final: {:?} {figures}", api.lost);
    assert_eq!(api.duplicate_answers, 0, "one transfer answered for two keys: {figures}");
    assert_eq!(api.phantom, 0, "transfers in the database the client never had answered: {figures}");
    assert_eq!(ledger.doubled, 0, "transfers with other than one debit and one credit: {figures}");
    assert!(
        ledger.misapplied.is_empty(),
        "transfers that moved other than what was asked: {:?} {figures}",
        ledger.misapplied
    );
    assert!(read_violations.is_empty(), "bank reads during the faults: {read_violations:?} {figures}");
    assert!(reads > 0, "no bank read succeeded during the faults: {figures}");
    assert_eq!(
        ledger.settled as usize, api.settled,
        "the ledger and the API disagree on what settled: {figures}"
    );
    assert_eq!(ledger.balances, ACCOUNTS as i64 * OPENING_CENTS, "money appeared or vanished: {figures}");
    assert_eq!(ledger.verify_code, 0, "pagamentos verify: {}", ledger.verify_report);
    assert_eq!(
        pipeline.analysed_twice, 0,
        "antifraude produced more outputs than it had requests: {figures}"
    );
    assert_eq!(pipeline.unanalysed, 0, "accepted transfers antifraude never analysed: {figures}");
    assert!(pipeline.dead_letters.is_empty(), "dead letters: {:?}", pipeline.dead_letters);
    assert_eq!(unnotified, 0, "final transfers never notified: {figures}");
    assert_eq!(pipeline.unrequested, 0, "accepted transfers with no request event: {figures}");
    assert_eq!(pipeline.settled_unannounced, 0, "settled transfers with no settlement event: {figures}");
    assert_eq!(pipeline.announced_unsettled, 0, "settlement events of transfers not settled: {figures}");
    assert_eq!(pipeline.phantom_events, 0, "events of transfers nobody accepted: {figures}");
    assert!(api.settled > 0 && api.rejected > 0, "the workload should both settle and reject: {figures}");
    println!("{figures}");
}

/// What the API's database holds against what the client was told.
struct ApiView<'a> {
    /// Each transfer's status.
    status: HashMap<String, String>,
    accepted_set: HashSet<&'a String>,
    /// Accepted, but not final (or not there at all).
    lost: Vec<&'a String>,
    /// Transfers the client was never told of.
    phantom: usize,
    duplicate_answers: usize,
    settled: usize,
    rejected: usize,
}

async fn api_view<'a>(system: &System, accepted: &'a [String]) -> ApiView<'a> {
    let transfers = &system.transfers_db.pool;
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT id::text, status FROM transferencia")
        .fetch_all(transfers)
        .await
        .expect("transfers");
    let status: HashMap<String, String> = rows.into_iter().collect();
    let accepted_set: HashSet<&String> = accepted.iter().collect();
    let lost: Vec<&String> =
        accepted.iter().filter(|id| status.get(*id).is_none_or(|status| status == "PENDENTE")).collect();
    let phantom = status.keys().filter(|id| !accepted_set.contains(id)).count();
    let duplicate_answers = accepted.len() - accepted_set.len();
    let settled = status.values().filter(|status| *status == "LIQUIDADA").count();
    let rejected = status.values().filter(|status| *status == "REJEITADA").count();
    ApiView { status, accepted_set, lost, phantom, duplicate_answers, settled, rejected }
}

/// What the ledger holds, and `pagamentos verify`'s verdict.
struct LedgerView {
    /// Transfers with other than one debit and one credit.
    doubled: i64,
    /// Σ of the customer accounts' balances.
    balances: i64,
    /// Transfers the ledger settled.
    settled: i64,
    verify_code: i32,
    verify_report: String,
    /// Transfers whose entries are not what was asked, and entries of transfers never asked.
    misapplied: Vec<String>,
}

async fn ledger_view(
    system: &System,
    status: &HashMap<String, String>,
    requested: &HashMap<String, (String, String, i64)>,
) -> LedgerView {
    let ledger = &system.ledger_db.pool;
    let doubled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT transferencia_id FROM lancamento l
          WHERE NOT EXISTS (SELECT 1 FROM deposito d WHERE d.id = l.transferencia_id)
          GROUP BY transferencia_id HAVING count(*) <> 2) AS odd",
    )
    .fetch_one(ledger)
    .await
    .expect("entries per transfer");
    let balances: i64 = sqlx::query_scalar("SELECT sum(saldo_centavos)::bigint FROM conta WHERE NOT emissor")
        .fetch_one(ledger)
        .await
        .expect("balances");
    let ledger_settled: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transferencia_processada WHERE resultado = 'LIQUIDADA'")
            .fetch_one(ledger)
            .await
            .expect("settled in the ledger");
    let (verify_code, verify_report) = system.verify().await;

    // entry by entry: every settled transfer moved exactly what was asked, between the accounts
    // asked, once; nothing else moved money
    let entries: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT transferencia_id::text, conta_id, tipo, valor_centavos FROM lancamento l
          WHERE NOT EXISTS (SELECT 1 FROM deposito d WHERE d.id = l.transferencia_id)",
    )
    .fetch_all(ledger)
    .await
    .expect("entries");
    let mut moved: HashMap<String, Vec<(String, String, i64)>> = HashMap::new();
    for (transfer, account, kind, cents) in entries {
        moved.entry(transfer).or_default().push((kind.trim().to_owned(), account, cents));
    }
    let mut misapplied = Vec::new();
    for (id, (from, to, cents)) in requested {
        let mut got = moved.remove(id).unwrap_or_default();
        got.sort();
        let expected = match status.get(id).map(String::as_str) {
            Some("LIQUIDADA") => {
                vec![("C".to_owned(), to.clone(), *cents), ("D".to_owned(), from.clone(), *cents)]
            }
            _ => Vec::new(),
        };
        if got != expected {
            misapplied.push(format!("{id}: asked {from} → {to} {cents}, entries {got:?}"));
        }
    }
    // entries of transfers the client never had accepted
    misapplied.extend(moved.keys().map(|id| format!("{id}: entries of a transfer nobody was told of")));
    LedgerView { doubled, balances, settled: ledger_settled, verify_code, verify_report, misapplied }
}

/// What the pipeline's topics hold against what was accepted and settled.
struct PipelineView {
    /// Every record of the request topic.
    request_records: Vec<Value>,
    /// antifraude's outputs per transfer.
    analysed: HashMap<String, usize>,
    /// Transfers requested more than once (the outbox relay is at least once).
    republished: usize,
    analysed_twice: usize,
    unanalysed: usize,
    unrequested: usize,
    settlements_republished: usize,
    settled_unannounced: usize,
    announced_unsettled: usize,
    phantom_events: usize,
    dead_letters: Vec<Value>,
}

async fn pipeline_view(system: &System, accepted: &[String], api: &ApiView<'_>) -> PipelineView {
    let (status, accepted_set) = (&api.status, &api.accepted_set);
    // antifraude's outputs: exactly one per request record (exactly-once through its Kafka
    // transactions). The outbox relay is at-least-once: a relay that loses its database between
    // publishing and marking publishes the row again, as the same event; the ledger absorbs that
    // by business key. (The ledger's own rejections share the rejection topic, with another
    // reason.)
    let count_by_transfer = |records: &[Value]| {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for record in records {
            if record.get("motivo").is_some_and(|reason| reason != "BLOQUEADA_ANTIFRAUDE") {
                continue;
            }
            *counts.entry(record["transferenciaId"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
        }
        counts
    };
    let request_records = read_all(system, &[system.topics.topic(topics::REQUESTED)]).await;
    let requests = count_by_transfer(&request_records);
    let republished = requests.values().filter(|count| **count > 1).count();
    let outputs =
        read_all(system, &[system.topics.topic(topics::ANALYSED), system.topics.topic(topics::REJECTED)])
            .await;
    let analysed = count_by_transfer(&outputs);
    let over: Vec<&String> = analysed
        .iter()
        .filter(|(id, count)| **count > requests.get(*id).copied().unwrap_or(0))
        .map(|(id, _)| id)
        .collect();
    for id in &over {
        let copies: Vec<&Value> =
            outputs.iter().filter(|output| output["transferenciaId"] == ***id).collect();
        eprintln!("[chaos] more outputs than requests: {copies:?}");
    }
    let analysed_twice = over.len();
    let unanalysed = accepted.iter().filter(|id| !analysed.contains_key(*id)).count();

    // the pipeline's topics, Kafka-workload style: every accepted transfer was requested; no
    // event names a transfer nobody accepted; every settled one has its settlement event and
    // none that is not settled has one
    let unrequested = accepted.iter().filter(|id| !requests.contains_key(*id)).count();
    let settlements = count_by_transfer(&read_all(system, &[system.topics.topic(topics::SETTLED)]).await);
    let settlements_republished = settlements.values().filter(|count| **count > 1).count();
    let settled_unannounced =
        status.iter().filter(|(id, status)| *status == "LIQUIDADA" && !settlements.contains_key(*id)).count();
    let announced_unsettled =
        settlements.keys().filter(|id| status.get(*id).is_none_or(|status| status != "LIQUIDADA")).count();
    let phantom_events = requests
        .keys()
        .chain(analysed.keys())
        .chain(settlements.keys())
        .filter(|id| !accepted_set.contains(id))
        .collect::<HashSet<_>>()
        .len();

    let dlts: Vec<String> =
        system.topics.names.iter().filter(|name| name.ends_with("-dlt")).cloned().collect();
    let dead_letters = read_all(system, &dlts).await;
    PipelineView {
        request_records,
        analysed,
        republished,
        analysed_twice,
        unanalysed,
        unrequested,
        settlements_republished,
        settled_unannounced,
        announced_unsettled,
        phantom_events,
        dead_letters,
    }
}
