//! PostgreSQL failing under load, on a streaming pair of our own (`scripts/stack pg-pair`:
//! primary on 5442, synchronous standby on 5443), never the shared cluster on 5432:
//! - the primary crashes and the standby is promoted: `pagamentos all`, given both hosts,
//!   follows to the new primary; every accepted transfer settles once, nothing is
//!   dead-lettered, `verify` is clean;
//! - the primary is frozen (SIGSTOP of the postmaster and every backend) longer than the
//!   statement timeout, then resumed: `/readyz` says so meanwhile, the statements cancelled by
//!   the timeout are retried (even with `LEDGER_RETRIES=0`), never dead-lettered.
//!
//! Both stop and pause a cluster, so they run alone in `scripts/test`:
//! `cargo nextest run --workspace --run-ignored only -E 'test(/^database_faults::/)'`

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::{Connection, Executor, PgConnection};

use common::system::System;

const PRIMARY: &str = "127.0.0.1:5442";
const STANDBY: &str = "127.0.0.1:5443";
const ACCOUNTS: usize = 8;

/// The service's output into a file of its own (printed, so a failure can be read after).
fn logs_to_a_file(command: &mut tokio::process::Command, name: &str) {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(testkit::unique(name) + ".log");
    let file = std::fs::File::create(&path).expect("service log file");
    let copy = file.try_clone().expect("service log file");
    eprintln!("pagamentos all logs in {}", path.display());
    command.stdout(file).stderr(copy);
}

/// A fresh pair: whatever an earlier run left is removed first.
async fn fresh_pair() {
    testkit::stack(&["pg-pair", "down"]).await;
    testkit::stack(&["pg-pair", "up"]).await;
}

/// A new database on the pair's primary (the standby receives it by replication).
async fn pair_database() -> String {
    let name = testkit::unique("falha").replace('-', "_");
    let mut admin = PgConnection::connect(&format!("postgres://pagamentos:pagamentos@{PRIMARY}/postgres"))
        .await
        .expect("connect to the pair's primary (scripts/stack pg-pair up)");
    admin.execute(format!(r#"CREATE DATABASE "{name}""#).as_str()).await.expect("create database");
    name
}

fn url(hosts: &str, database: &str) -> String {
    format!("postgres://pagamentos:pagamentos@{hosts}/{database}?target_session_attrs=read-write")
}

/// `scripts/stack pg-pair pids a`: the primary's postmaster and every process it forked.
fn primary_pids() -> Vec<String> {
    let package = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let script = std::path::PathBuf::from(package).join("../../scripts/stack");
    let output = std::process::Command::new(script).args(["pg-pair", "pids", "a"]).output().expect("pids");
    assert!(output.status.success(), "pg-pair pids: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect()
}

fn signal(pids: &[String], signal: &str) {
    let status = std::process::Command::new("kill").arg(signal).args(pids).status().expect("kill");
    assert!(status.success(), "kill {signal} {pids:?}");
}

/// Transfers posted without pause by two clients, each retried with its own Idempotency-Key
/// until accepted, as a well-behaved client does through `503`, `500 outcome-unknown` and
/// timeouts; the ids of the accepted ones.
struct Load {
    accepted: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(system: &System) -> Self {
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..2)
            .map(|client| {
                let http = common::system::admin_client(Some(Duration::from_secs(5)));
                let api = system.api("/transferencias");
                let (accepted, stop) = (accepted.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = client;
                    while !stop.load(Ordering::Relaxed) {
                        let from = format!("FALHA-{}", n % ACCOUNTS);
                        let to = format!("FALHA-{}", (n + 1) % ACCOUNTS);
                        let body = json!({"contaOrigem": from, "contaDestino": to, "valorEmCentavos": 1 + n % 97, "moeda": "BRL"});
                        let id = post_until_accepted(&http, &api, &body, &testkit::unique("chave")).await;
                        accepted.lock().expect("lock").push(id);
                        n += 2;
                    }
                })
            })
            .collect();
        Self { accepted, stop, clients }
    }

    fn count(&self) -> usize {
        self.accepted.lock().expect("lock").len()
    }

    async fn wait_for(&self, what: &str, count: usize) {
        testkit::eventually(what, Duration::from_secs(180), || async {
            (self.count() >= count).then_some(())
        })
        .await;
    }

    async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            client.await.expect("load client");
        }
        Arc::try_unwrap(self.accepted).expect("clients done").into_inner().expect("lock")
    }
}

async fn post_until_accepted(http: &reqwest::Client, api: &str, body: &Value, key: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "transfer {key} not accepted within 180 s");
        if let Ok(response) = http.post(api).header("Idempotency-Key", key).json(body).send().await {
            let status = response.status().as_u16();
            if status == 202 {
                let body: Value = response.json().await.expect("transfer");
                return body["id"].as_str().expect("id").to_owned();
            }
            // 503 (database away, queue full), 500 outcome unknown, 409 the same key in flight
            assert!(
                matches!(status, 500 | 503 | 409),
                "unexpected {status}: {}",
                response.text().await.unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One line of `/metrics` parsed as a number (0 when absent).
async fn metric(system: &System, port: u16, series: &str) -> f64 {
    let text = system
        .http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Every accepted transfer settled exactly once, no counter of dead letters moved, and
/// `verify` on `urls` is clean.
async fn assert_nothing_lost(system: &System, accepted: &[String], urls: (&str, &str)) {
    for id in accepted {
        let (status, reason) = final_status_or_where_it_stopped(system, id, urls).await;
        assert_eq!(status, "LIQUIDADA", "{id}: {reason}");
    }
    let unique: std::collections::HashSet<&String> = accepted.iter().collect();
    assert_eq!(unique.len(), accepted.len(), "one transfer per Idempotency-Key");
    // every dead letter any service publishes counts here, and the process never restarted
    for topic in [
        contracts::topics::REQUESTED,
        contracts::topics::ANALYSED,
        contracts::topics::SETTLED,
        contracts::topics::REJECTED,
    ] {
        let series = format!("dlt_mensagens_total{{topic=\"{}-dlt\"}}", system.topics.topic(topic));
        assert_eq!(metric(system, system.ports[0], &series).await, 0.0, "{series}");
    }
    let settled = metric(system, system.ports[0], "transferencias_total{resultado=\"LIQUIDADA\"}").await;
    assert!(settled >= accepted.len() as f64, "{settled} settled of {}", accepted.len());
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_pagamentos"))
        .arg("verify")
        .env("TRANSFERENCIAS_DATABASE_URL", urls.0)
        .env("LEDGER_DATABASE_URL", urls.1)
        .output()
        .await
        .expect("verify");
    assert!(
        output.status.success(),
        "verify: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The transfer's final status, or a panic that says where in the pipeline it stopped: its row,
/// its outbox rows and the ledger's decision, read from the databases behind `urls` (the
/// services' logs are in the file printed at the start).
async fn final_status_or_where_it_stopped(system: &System, id: &str, urls: (&str, &str)) -> (String, Value) {
    let read = || async {
        let response = system.http.get(system.api(&format!("/transferencias/{id}"))).send().await.ok()?;
        let body: Value = response.json().await.ok()?;
        let status = body["status"].as_str()?.to_owned();
        (status != "PENDENTE").then(|| (status, body["motivoRejeicao"].clone()))
    };
    let deadline = tokio::time::Instant::now() + testkit::PATIENCE;
    while tokio::time::Instant::now() < deadline {
        if let Some(found) = read().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("transfer {id} not final after {:?}: {}", testkit::PATIENCE, where_it_stopped(id, urls).await);
}

async fn where_it_stopped(id: &str, urls: (&str, &str)) -> String {
    let queries: [(&str, &str); 4] = [
        (urls.0, "SELECT status || ' ' || coalesce(motivo_rejeicao, '') FROM transferencia WHERE id::text = $1"),
        (urls.0, "SELECT tipo || ' created ' || criado_em || ' published ' || coalesce(publicado_em::text, 'no') FROM outbox_evento WHERE chave = $1"),
        (urls.1, "SELECT resultado || ' at ' || processada_em FROM transferencia_processada WHERE transferencia_id::text = $1"),
        (urls.1, "SELECT tipo || ' created ' || criado_em || ' published ' || coalesce(publicado_em::text, 'no') FROM outbox_evento WHERE chave = $1"),
    ];
    let mut found = Vec::new();
    for (url, query) in queries {
        // sqlx takes one host: the same database on whichever server of the pair answers
        let database = url.rsplit('/').next().and_then(|tail| tail.split('?').next()).unwrap_or_default();
        let mut rows = Vec::new();
        for host in [STANDBY, PRIMARY] {
            match PgConnection::connect(&format!("postgres://pagamentos:pagamentos@{host}/{database}")).await
            {
                Ok(mut connection) => {
                    match sqlx::query_scalar::<_, String>(query).bind(id).fetch_all(&mut connection).await {
                        Ok(answer) => rows.extend(answer),
                        Err(error) => rows.push(format!("error on {host}: {error}")),
                    }
                    break;
                }
                Err(error) => rows.push(format!("{host} unreachable: {error}")),
            }
        }
        found.push(format!("{query}: {rows:?}"));
    }
    found.join("; ")
}

async fn open_accounts(system: &System) {
    for account in 0..ACCOUNTS {
        system.open_account(&format!("FALHA-{account}"), 10_000_000).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "crashes and promotes a PostgreSQL pair of its own; runs alone in scripts/test"]
async fn the_services_follow_a_failover_to_the_promoted_standby_and_lose_nothing() {
    fresh_pair().await;
    let (transfers_db, ledger_db) = (pair_database().await, pair_database().await);
    let both = format!("{PRIMARY},{STANDBY}");
    let urls = (url(&both, &transfers_db), url(&both, &ledger_db));
    let system = System::new().await;
    let mut all = system
        .start_configured(|command| {
            command
                .env("TRANSFERENCIAS_DATABASE_URL", &urls.0)
                .env("LEDGER_DATABASE_URL", &urls.1)
                .env("RUST_LOG", "info");
            logs_to_a_file(command, "failover");
        })
        .await;
    open_accounts(&system).await;
    let load = Load::start(&system);
    load.wait_for("transfers before the failover", 40).await;

    testkit::stack(&["pg-pair", "stop-primary"]).await;
    testkit::stack(&["pg-pair", "promote"]).await;
    let before = load.count();

    // the API takes transfers again, and both pools moved to the new primary
    load.wait_for("transfers after the failover", before + 40).await;
    for database in ["transferencias", "ledger"] {
        let series = format!("database_failovers_total{{database=\"{database}\"}}");
        testkit::eventually(&series, Duration::from_secs(60), || async {
            (metric(&system, system.ports[0], &series).await >= 1.0).then_some(())
        })
        .await;
    }
    let accepted = load.finish().await;
    eprintln!("{} transfers, {before} accepted before the failover", accepted.len());
    assert_nothing_lost(&system, &accepted, (&urls.0, &urls.1)).await;

    all.start_kill().expect("stop pagamentos all");
    all.wait().await.expect("pagamentos all ended");
    testkit::stack(&["pg-pair", "down"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "freezes a PostgreSQL of its own with SIGSTOP; runs alone in scripts/test"]
async fn a_frozen_database_is_reported_and_its_timed_out_statements_are_retried_not_dead_lettered() {
    fresh_pair().await;
    let (transfers_db, ledger_db) = (pair_database().await, pair_database().await);
    let urls = (url(PRIMARY, &transfers_db), url(PRIMARY, &ledger_db));
    let statement_timeout = Duration::from_secs(2);
    let system = System::new().await;
    let mut all = system
        .start_configured(|command| {
            let timeout = statement_timeout.as_millis().to_string();
            command
                .env("TRANSFERENCIAS_DATABASE_URL", &urls.0)
                .env("LEDGER_DATABASE_URL", &urls.1)
                .env("TRANSFERENCIAS_DATABASE_STATEMENT_TIMEOUT_MS", &timeout)
                .env("LEDGER_DATABASE_STATEMENT_TIMEOUT_MS", &timeout)
                .env("TRANSFERENCIAS_DATABASE_ACQUIRE_TIMEOUT_MS", "2000")
                .env("LEDGER_DATABASE_ACQUIRE_TIMEOUT_MS", "2000")
                // a statement cancelled by the timeout must not be the record's fault: with no
                // retries at all, a transient classification would dead-letter it at once
                .env("LEDGER_RETRIES", "0");
            logs_to_a_file(command, "freeze");
        })
        .await;
    open_accounts(&system).await;
    let load = Load::start(&system);
    load.wait_for("transfers before the freeze", 40).await;

    let pids = primary_pids();
    signal(&pids, "-STOP");
    let frozen = tokio::time::Instant::now();
    // the services say so: /readyz of the ledger and of the API names PostgreSQL
    for port in [system.ports[0], system.ports[1]] {
        let readyz = format!("http://127.0.0.1:{port}/readyz");
        testkit::eventually("readyz 503 naming postgres", Duration::from_secs(30), || async {
            let response = system.http.get(&readyz).send().await.ok()?;
            let status = response.status().as_u16();
            let body = response.text().await.ok()?;
            (status == 503 && body.contains("postgres")).then_some(())
        })
        .await;
    }
    // the freeze is the scenario: it lasts several statement timeouts
    tokio::time::sleep((statement_timeout * 3).saturating_sub(frozen.elapsed())).await;
    signal(&pids, "-CONT");
    let before = load.count();

    for port in [system.ports[0], system.ports[1]] {
        let readyz = format!("http://127.0.0.1:{port}/readyz");
        testkit::eventually("readyz 200 again", Duration::from_secs(60), || async {
            system.http.get(&readyz).send().await.ok()?.status().is_success().then_some(())
        })
        .await;
    }
    load.wait_for("transfers after the freeze", before + 40).await;
    let accepted = load.finish().await;
    eprintln!("{} transfers, {before} accepted before the thaw", accepted.len());
    assert_nothing_lost(&system, &accepted, (&urls.0, &urls.1)).await;

    all.start_kill().expect("stop pagamentos all");
    all.wait().await.expect("pagamentos all ended");
    testkit::stack(&["pg-pair", "down"]).await;
}
