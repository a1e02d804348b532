//! The supervised service shell (issue #24): a critical task that stops on its own stops the
//! process with a non-zero exit, naming the task, instead of leaving a process that serves
//! `/readyz` 200 while it does nothing. An ordinary SIGTERM still exits 0.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use kafka::config::producer_config;
use kafka::producer::{OutgoingRecord, Producer};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use uuid::Uuid;

use contracts::topics;
use testkit::{TestDatabase, TestTopics};

fn ledger(topics: &TestTopics, database: &TestDatabase, port: u16) -> Command {
    let mut command = common::service(topics, "ledger");
    command
        .env("LEDGER_LISTEN", format!("127.0.0.1:{port}"))
        .env("LEDGER_DATABASE_URL", &database.url)
        .env("LEDGER_DATABASE_CONNECTIONS", "4")
        .env("LOG_FORMAT", "pretty")
        .stderr(Stdio::piped());
    command
}

async fn wait_ready(port: u16) {
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/readyz");
    testkit::eventually("the ledger ready", Duration::from_secs(60), || async {
        let response = http.get(&url).send().await.ok()?;
        response.status().is_success().then_some(())
    })
    .await;
}

/// What `/readyz` answered `503` with while the process went down.
#[derive(Debug, Default)]
struct NotReady {
    /// Bodies read with the admin token (the detail).
    admin: Vec<String>,
    /// Bodies read without a token and with the API token.
    others: Vec<String>,
}

/// Waits for `child` to exit while polling `/readyz` in turn with the admin token, without a
/// token and with the API token; returns the exit status, every `503` body seen on the way,
/// and the process's stderr.
async fn exit_watching_readiness(
    mut child: Child,
    port: u16,
) -> (std::process::ExitStatus, NotReady, String) {
    let mut stderr = child.stderr.take().expect("stderr piped");
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let admin = common::system::admin_client(Some(Duration::from_secs(2)));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().expect("client");
    let url = format!("http://127.0.0.1:{port}/readyz");
    let mut not_ready = NotReady::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut poll = 0_u64;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        poll += 1;
        assert!(tokio::time::Instant::now() < deadline, "the process is still running 90 s later");
        let (request, bodies) = match poll % 3 {
            1 => (admin.get(&url), &mut not_ready.admin),
            2 => (http.get(&url), &mut not_ready.others),
            _ => (http.get(&url).bearer_auth(common::API_TOKEN), &mut not_ready.others),
        };
        if let Ok(response) = request.send().await {
            if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
                bodies.push(response.text().await.unwrap_or_default());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    (status, not_ready, log.await.expect("stderr reader"))
}

/// Someone renames a table of the running ledger's database (a restore of another schema, an
/// operator's mistake): the settler's next batch meets `42P01 undefined_table`. No retry fixes
/// that and it is no record's fault, so the settler stops without committing the batch, the
/// supervisor names it (log, `/readyz` while the others drain) and the process exits non-zero
/// for its orchestrator to restart; nothing is dead-lettered.
#[tokio::test]
async fn a_settler_that_stops_takes_the_process_down_with_a_non_zero_exit() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let database = TestDatabase::empty().await;
    let port = common::system::free_port();
    let child = ledger(&topics, &database, port).spawn().expect("start pagamentos ledger");
    wait_ready(port).await;

    sqlx::query("ALTER TABLE transferencia_processada RENAME TO transferencia_processada_renomeada")
        .execute(&database.pool)
        .await
        .expect("rename the table under the running ledger");
    let producer =
        Producer::new(&producer_config(&topics.args, "test-feed", Duration::ZERO)).expect("producer");
    let event = json!({
        "eventoId": Uuid::new_v4(), "transferenciaId": Uuid::new_v4(), "contaOrigem": "CC-A",
        "contaDestino": "CC-B", "valorEmCentavos": 100, "moeda": "BRL",
        "score": 10, "analisadaEm": "2026-12-03T10:00:00Z"
    });
    producer
        .send(&OutgoingRecord::new(topics.topic(topics::ANALYSED), "CC-A", event.to_string()))
        .await
        .expect("publish an analysed transfer");

    let (status, not_ready, log) = exit_watching_readiness(child, port).await;
    assert!(!status.success(), "exit status {status:?}; log:\n{log}");
    assert!(log.contains("task ledger/settler stopped"), "no stopped task named in the log:\n{log}");
    assert!(log.contains("transferencia_processada"), "the cause is not in the log:\n{log}");
    // /readyz may be gone before a poll lands; each 503 seen by the admin must name the task,
    // and no other caller may read anything but the status line
    eprintln!("/readyz answered 503 before the exit: {not_ready:?}");
    for body in &not_ready.admin {
        assert!(
            body.contains("task ledger/settler stopped") || body.contains("shutting down"),
            "a 503 that names no stopped task: {body}"
        );
    }
    for body in &not_ready.others {
        assert_eq!(body, "not ready\n", "the detail shown without the admin token");
    }
    // the process is gone: whatever it dead-lettered is in the topic by now
    let dead_letter_topic = topics::dead_letter_topic(&topics.topic(topics::ANALYSED));
    let retained = kafka_admin::dlt::DeadLetterTopic::open(&topics.args, &dead_letter_topic)
        .and_then(|topic| topic.retained())
        .expect("read the dead-letter topic");
    assert_eq!(retained, 0, "dead-lettered instead of stopping");
}

/// SIGTERM is the ordinary way out: every task drains and the exit status is 0.
#[tokio::test]
async fn sigterm_still_exits_zero() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let database = TestDatabase::empty().await;
    let port = common::system::free_port();
    let child = ledger(&topics, &database, port).spawn().expect("start pagamentos ledger");
    wait_ready(port).await;
    let pid = child.id().expect("pid").to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().await.expect("kill");
    assert!(killed.success());
    let (status, _, log) = exit_watching_readiness(child, port).await;
    assert!(status.success(), "exit status {status:?}; log:\n{log}");
    assert!(!log.contains("stopped:"), "{log}");
}
