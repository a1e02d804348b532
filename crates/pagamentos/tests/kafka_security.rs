//! The secure broker (`scripts/stack secure up`: SASL_SSL, SCRAM-SHA-512, StandardAuthorizer,
//! ACLs per service): the four services as separate processes, each as its own Kafka user, move
//! money end to end; a `TransferenciaAnalisada` forged with the transferencias principal is
//! refused by the broker and moves no money; one forged as a dead letter by notificacoes (which
//! may write its `-dlt` topic) is refused by the operator's replay and moves no money either;
//! clients without credentials, with a wrong password or trusting another CA are refused; only
//! the operator's user creates topics.
//!
//! `#[ignore]`d: they need the secure broker, which `scripts/test` starts before running them
//! (`cargo nextest run --workspace --run-ignored only -E 'group(secured-broker)'`). Without it they fail.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka::rdkafka::client::ClientContext;
use kafka::rdkafka::error::KafkaError;
use kafka::rdkafka::producer::{BaseProducer, DeliveryResult, Producer as _, ProducerContext};
use kafka::rdkafka::types::RDKafkaErrorCode;
use kafka::rdkafka::ClientConfig;
use kafka::{KafkaArgs, KafkaSecurity, SecurityProtocol};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use common::system::System;
use testkit::secure;
use testkit::webhook::Receiver;

/// The services, the user each runs as, and its index in `System::ports`.
const SERVICES: [(&str, &str, usize); 4] = [
    ("transferencias", "transferencias", 0),
    ("ledger", "ledger", 1),
    ("antifraude", "antifraude", 2),
    ("notificacoes", "notificacoes", 3),
];

struct Running {
    children: Vec<Child>,
    logs: Vec<(String, PathBuf)>,
}

impl Running {
    fn tails(&self) -> String {
        let mut text = String::new();
        for (service, path) in &self.logs {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            text.push_str(&format!("--- {service} ({})\n{tail}\n", path.display()));
        }
        text
    }
}

/// Starts each service as its own process and Kafka user on the system's secure topics, logging
/// at debug level into files, and waits until every one is ready.
async fn start_services(system: &System, webhook_url: &str) -> Running {
    let prefix = &system.topics.args.topic_prefix;
    let mut running = Running { children: Vec::new(), logs: Vec::new() };
    for (service, user, _) in SERVICES {
        let log_path = std::env::temp_dir().join(format!("{}.log", testkit::unique(service)));
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut command = common::service(&system.topics, service);
        system.env(&mut command);
        command
            .envs(secure::security(user).to_env())
            // the ACLs grant antifraude the transactional ids behind the test's prefix
            .env("TRANSACTIONAL_ID_PREFIX", format!("{prefix}tx-antifraude-"))
            .env("NOTIFICACOES_WEBHOOK_URL", webhook_url)
            .env("RUST_LOG", "debug")
            .stderr(Stdio::from(log));
        running.children.push(command.spawn().unwrap_or_else(|error| panic!("start {service}: {error}")));
        running.logs.push((service.to_owned(), log_path));
    }
    let deadline = tokio::time::Instant::now() + testkit::PATIENCE;
    for (service, _, index) in SERVICES {
        let url = format!("http://127.0.0.1:{}/readyz", system.ports[index]);
        loop {
            let ready =
                system.http.get(&url).send().await.is_ok_and(|response| response.status().is_success());
            if ready {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{service} not ready at {url}:\n{}",
                running.tails()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    running
}

/// Entries of `account` in the ledger.
async fn entries(system: &System, account: &str) -> Vec<Value> {
    let body: Value = system
        .http
        .get(system.ledger(&format!("/contas/{account}/lancamentos?limit=500")))
        .send()
        .await
        .expect("GET lancamentos")
        .json()
        .await
        .expect("entries");
    body.as_array().cloned().expect("an array of entries")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the secure broker: scripts/stack secure up"]
async fn each_service_as_its_own_user_and_a_forged_analysis_moves_no_money() {
    let system = System::on_kafka(secure::args(secure::SUPER_USER), 1).await;
    secure::grant(&system.topics.args.topic_prefix).await;
    let (receiver, webhook_url) = Receiver::start().await;
    let mut running = start_services(&system, &webhook_url).await;

    // the whole flow, each hop as its own principal
    system.open_account("SEC-A", 10_000).await;
    system.open_account("SEC-B", 0).await;
    let first = system.transfer("SEC-A", "SEC-B", 2_500).await.expect("accepted");
    assert_eq!(system.final_status(&first).await.0, "LIQUIDADA", "{}", running.tails());
    assert_eq!((system.balance("SEC-A").await, system.balance("SEC-B").await), (7_500, 2_500));
    testkit::eventually("notificacoes delivered the settlement", testkit::PATIENCE, || async {
        receiver.calls().iter().any(|call| String::from_utf8_lossy(&call.body).contains(&first)).then_some(())
    })
    .await;

    // a TransferenciaAnalisada forged with the transferencias principal (it may only write
    // solicitada): the broker refuses it
    let forged_id = uuid::Uuid::new_v4().to_string();
    let forged = json!({
        "eventoId": uuid::Uuid::new_v4(), "transferenciaId": forged_id, "contaOrigem": "SEC-A",
        "contaDestino": "SEC-B", "valorEmCentavos": 5_000, "moeda": "BRL", "score": 0,
        "analisadaEm": "2026-12-05T10:00:00Z"
    })
    .to_string();
    let mut forger_args = secure::args("transferencias");
    forger_args.topic_prefix = system.topics.args.topic_prefix.clone();
    let analysed = system.topics.topic(contracts::topics::ANALYSED);
    let forger = kafka::producer::Producer::new(&kafka::config::producer_config(
        &forger_args,
        "forger",
        Duration::ZERO,
    ))
    .expect("producer");
    let sent = forger.send(&kafka::producer::OutgoingRecord::new(analysed.as_str(), "SEC-A", forged)).await;
    match sent {
        Err(kafka::Error::Produce { source: KafkaError::MessageProduction(code), .. }) => {
            assert_eq!(code, RDKafkaErrorCode::TopicAuthorizationFailed, "refused, for want of authorization")
        }
        other => panic!("the forged analysis was not refused by the broker: {other:?}"),
    }

    // a marker: a legitimate transfer from the same account (so the same partition of analisada)
    // settles after the forgery; had the forgery been written, the ledger would have read it first
    let marker = system.transfer("SEC-A", "SEC-B", 100).await.expect("accepted");
    assert_eq!(system.final_status(&marker).await.0, "LIQUIDADA", "{}", running.tails());
    assert_eq!(
        (system.balance("SEC-A").await, system.balance("SEC-B").await),
        (7_400, 2_600),
        "no money moved"
    );
    for account in ["SEC-A", "SEC-B"] {
        let entries = entries(&system, account).await;
        assert!(entries.iter().any(|entry| entry["transferenciaId"] == marker.as_str()), "{entries:?}");
        assert!(entries.iter().all(|entry| entry["transferenciaId"] != forged_id.as_str()), "{entries:?}");
    }
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");

    // no service logged its password (or anyone's), even at debug level
    for child in &mut running.children {
        child.kill().await.expect("stop a service");
    }
    let passwords: Vec<String> = SERVICES.iter().map(|(_, user, _)| secure::password(user)).collect();
    for (service, path) in &running.logs {
        let log = std::fs::read_to_string(path).expect("read a service log");
        assert!(log.contains("listening"), "{service}'s log was captured");
        for password in &passwords {
            let lines: Vec<&str> =
                log.lines().filter(|line| line.contains(password.as_str())).take(3).collect();
            assert!(lines.is_empty(), "a SASL password is in {service}'s log:\n{}", lines.join("\n"));
        }
        let _ = std::fs::remove_file(path);
    }
}

/// `pagamentos dlt ARGS` as Kafka `user` on the secure broker's topics behind `prefix`:
/// (exit code, stdout, stderr).
async fn dlt_command(user: &str, prefix: &str, args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pagamentos"));
    command
        .arg("dlt")
        .args(args)
        .env("KAFKA_BOOTSTRAP_SERVERS", secure::bootstrap_servers())
        .env("PAGAMENTOS_TOPIC_PREFIX", prefix)
        .envs(secure::security(user).to_env())
        // the log an operator gets by default (`info`)
        .env_remove("RUST_LOG");
    common::system::captured(&mut command, "pagamentos dlt").await
}

// Over 100 lines on purpose: one scenario on one running system, read top to bottom; its steps
// build on each other's state, so splitting it would only pass that state around.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the secure broker: scripts/stack secure up"]
async fn a_dead_letter_forged_by_notificacoes_is_not_replayed_into_the_ledgers_input() {
    let system = System::on_kafka(secure::args(secure::SUPER_USER), 1).await;
    let prefix = system.topics.args.topic_prefix.clone();
    secure::grant(&prefix).await;
    let (_receiver, webhook_url) = Receiver::start().await;
    let mut running = start_services(&system, &webhook_url).await;
    system.open_account("DLT-A", 10_000).await;
    system.open_account("DLT-B", 0).await;

    // notificacoes may write transferencias.liquidada-dlt (its own dead letters): there it
    // writes the analysis of a transfer that never was, whose header sends it to the ledger
    let analysed = system.topics.topic(contracts::topics::ANALYSED);
    let settled = system.topics.topic(contracts::topics::SETTLED);
    let dead_letters = system.topics.topic("transferencias.liquidada-dlt");
    let forged_id = uuid::Uuid::new_v4().to_string();
    let forged = json!({
        "eventoId": uuid::Uuid::new_v4(), "transferenciaId": forged_id, "contaOrigem": "DLT-A",
        "contaDestino": "DLT-B", "valorEmCentavos": 5_000, "moeda": "BRL", "score": 0,
        "analisadaEm": "2026-12-07T10:00:00Z"
    })
    .to_string();
    let mut forger_args = secure::args("notificacoes");
    forger_args.topic_prefix = prefix.clone();
    let forger = kafka::producer::Producer::new(&kafka::config::producer_config(
        &forger_args,
        "forger",
        Duration::ZERO,
    ))
    .expect("producer");
    let letter = kafka::producer::OutgoingRecord::new(dead_letters.as_str(), "DLT-A", forged)
        .header("evento-tipo", "TransferenciaAnalisada")
        .header("kafka_dlt-original-topic", analysed.as_str())
        .header("kafka_dlt-exception-message", "webhook answered 400 Bad Request");
    forger.send(&letter).await.expect("notificacoes may write its dead-letter topic");

    // the on-call's routine replay, as the operator (who may write every topic): refused,
    // said with the record and why, on the output and in the log, exit 1
    let (code, stdout, stderr) =
        dlt_command("operador", &prefix, &["replay", "transferencias.liquidada-dlt", "--all"]).await;
    assert_eq!(code, 1, "the replay of a forged letter did not fail:\n{stdout}{stderr}");
    assert!(stdout.contains("0 replayed") && stdout.contains("1 refused"), "{stdout}");
    let why = format!("refused: {analysed} is neither {settled} nor one of its retry topics");
    assert!(stdout.contains(&format!("{dead_letters} partition ")) && stdout.contains(&why), "{stdout}");
    assert!(
        stderr.contains("dead letter refused") && stderr.contains(analysed.as_str()),
        "not logged: {stderr}"
    );
    // left in place: still listed, not replayed
    let (code, stdout, stderr) =
        dlt_command("operador", &prefix, &["list", "transferencias.liquidada-dlt", "--json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let letters: Value = serde_json::from_str(&stdout).expect("JSON list");
    let letters = letters.as_array().expect("an array");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        (letters[0]["originalTopic"].as_str(), &letters[0]["replayed"]),
        (Some(analysed.as_str()), &json!(false))
    );
    // and --to the ledger's input is refused before anything is sent
    let to = ["replay", "transferencias.liquidada-dlt", "--all", "--to", contracts::topics::ANALYSED];
    let (code, stdout, stderr) = dlt_command("operador", &prefix, &to).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("refused") && stderr.contains("nothing read or sent"), "{stderr}");

    // a marker: a legitimate transfer from the same account (so the same partition of
    // analisada) settles after the replays; had the forgery reached analisada, the ledger
    // would have read it first
    let marker = system.transfer("DLT-A", "DLT-B", 100).await.expect("accepted");
    assert_eq!(system.final_status(&marker).await.0, "LIQUIDADA", "{}", running.tails());
    assert_eq!(
        (system.balance("DLT-A").await, system.balance("DLT-B").await),
        (9_900, 100),
        "no money moved but the marker's"
    );
    for account in ["DLT-A", "DLT-B"] {
        let entries = entries(&system, account).await;
        assert!(entries.iter().any(|entry| entry["transferenciaId"] == marker.as_str()), "{entries:?}");
        assert!(entries.iter().all(|entry| entry["transferenciaId"] != forged_id.as_str()), "{entries:?}");
    }
    // analisada read to its end: the marker's analysis is there, nothing replayed is
    let records = testkit::read_to_end(&system.topics.args, &analysed).await;
    let payload = |record: &kafka::rdkafka::message::OwnedMessage| {
        use kafka::rdkafka::Message as _;
        String::from_utf8_lossy(record.payload().unwrap_or_default()).into_owned()
    };
    assert!(
        records.iter().any(|record| payload(record).contains(&marker)),
        "the marker is not in {analysed}"
    );
    for record in &records {
        assert!(!payload(record).contains(&forged_id), "the forged analysis reached {analysed}");
        assert!(
            kafka::consumer::header(record, kafka_admin::dlt::REPLAYED_FROM).is_none(),
            "a replayed record reached {analysed}"
        );
    }
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
    for child in &mut running.children {
        child.kill().await.expect("stop a service");
    }
    for (_, path) in &running.logs {
        let _ = std::fs::remove_file(path);
    }
}

/// Records what librdkafka reports through its error callback.
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<String>>>);

impl ClientContext for Errors {
    fn error(&self, error: KafkaError, reason: &str) {
        self.0.lock().expect("errors").push(format!("{error}: {reason}"));
    }
}

impl ProducerContext for Errors {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// Connects with `args` and asks for metadata for up to 60 s: the topic names seen, or what
/// librdkafka reported instead.
async fn connect(args: KafkaArgs) -> Result<Vec<String>, Vec<String>> {
    tokio::task::spawn_blocking(move || {
        let config: ClientConfig = kafka::config::admin_config(&args, "security-probe");
        let errors = Errors::default();
        let producer: BaseProducer<Errors> = config.create_with_context(errors.clone()).expect("client");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if let Ok(metadata) = producer.client().fetch_metadata(None, Duration::from_secs(2)) {
                return Ok(metadata.topics().iter().map(|topic| topic.name().to_owned()).collect());
            }
            producer.poll(Duration::from_millis(200));
            if !errors.0.lock().expect("errors").is_empty() {
                // one more poll round collects the rest of the burst
                producer.poll(Duration::from_millis(500));
                break;
            }
        }
        let reported = errors.0.lock().expect("errors").clone();
        Err(reported)
    })
    .await
    .expect("probe")
}

/// A CA of its own that signed nothing the broker has.
fn another_ca(dir: &Path) -> PathBuf {
    let key = dir.join("other-ca.key");
    let pem = dir.join("other-ca.pem");
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=not the stack's CA",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&pem)
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req");
    pem
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the secure broker: scripts/stack secure up"]
async fn clients_without_credentials_with_a_wrong_password_or_another_ca_are_refused() {
    let topics = secure::topics(1).await;
    let visible = topics.topic(contracts::topics::REQUESTED);
    let dir = std::env::temp_dir().join(testkit::unique("other-ca"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let other_ca = another_ca(&dir);

    // the control: the operator's user with the stack's CA sees the topics
    let names = connect(secure::args("operador")).await.expect("the operator connects");
    assert!(names.contains(&visible), "{visible} among {names:?}");

    let with = |security: KafkaSecurity| KafkaArgs { security, ..secure::args("operador") };
    let plaintext = with(KafkaSecurity::default());
    let tls_only = with(KafkaSecurity {
        protocol: SecurityProtocol::Ssl,
        ssl_ca_location: Some(secure::ca_location()),
        ..KafkaSecurity::default()
    });
    let wrong_password = with(KafkaSecurity::sasl_ssl("operador", "not-the-password", secure::ca_location()));
    let wrong_ca = with(KafkaSecurity::sasl_ssl("operador", secure::password("operador"), &other_ca));
    let (plaintext, tls_only, wrong_password, wrong_ca) =
        tokio::join!(connect(plaintext), connect(tls_only), connect(wrong_password), connect(wrong_ca));
    let _ = std::fs::remove_dir_all(&dir);

    let refused = |case: &str, result: Result<Vec<String>, Vec<String>>| match result {
        Ok(names) => panic!("{case}: connected and saw {names:?}"),
        Err(errors) => errors.join("\n"),
    };
    refused("plaintext, no credentials", plaintext);
    refused("TLS without SASL credentials", tls_only);
    let errors = refused("a wrong password", wrong_password);
    assert!(
        errors.contains("Authentication failed") || errors.contains("SASL authentication error"),
        "{errors}"
    );
    let errors = refused("another CA", wrong_ca);
    assert!(errors.contains("certificate verify failed"), "{errors}");
}

/// `pagamentos topics` as `user` on the topics behind `prefix`: (exit code, output).
async fn topics_command(user: &str, prefix: &str) -> (i32, String) {
    topics_command_with(user, prefix, &[]).await
}

/// [`topics_command`] with `overrides` of the environment.
async fn topics_command_with(user: &str, prefix: &str, overrides: &[(&str, &str)]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_pagamentos"))
        .args(["topics", "--partitions", "1"])
        .env("KAFKA_BOOTSTRAP_SERVERS", secure::bootstrap_servers())
        .env("PAGAMENTOS_TOPIC_PREFIX", prefix)
        // one secure broker: one replica, said explicitly
        .env("PAGAMENTOS_ALLOW_UNDER_REPLICATED", "true")
        .envs(secure::security(user).to_env())
        .envs(overrides.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run pagamentos topics");
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the secure broker: scripts/stack secure up"]
async fn only_the_operator_creates_topics() {
    let prefix = format!("{}.", testkit::unique("t"));
    secure::grant(&prefix).await;
    let cleanup = KafkaArgs { topic_prefix: prefix.clone(), ..secure::args(secure::SUPER_USER) };
    let names: Vec<String> = contracts::topics::plan(&prefix).into_iter().map(|spec| spec.name).collect();

    let (code, output) = topics_command("ledger", &prefix).await;
    assert_ne!(code, 0, "the ledger's user created topics:\n{output}");
    assert!(output.contains("TopicAuthorizationFailed") || output.contains("authoriz"), "{output}");

    let (code, output) = topics_command("operador", &prefix).await;
    let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
    kafka_admin::topics::delete(&cleanup, &names_ref).await.expect("delete the test's topics");
    assert_eq!(code, 0, "{output}");
    assert_eq!(output.matches("created").count(), names.len(), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the secure broker: scripts/stack secure up"]
async fn a_command_refused_by_the_broker_says_why_not_only_that_it_is_unreachable() {
    let prefix = format!("{}.", testkit::unique("t"));
    let (code, output) =
        topics_command_with("operador", &prefix, &[("KAFKA_SASL_PASSWORD", "not-the-password")]).await;
    assert_eq!(code, 1, "{output}");
    let bootstrap = secure::bootstrap_servers();
    assert!(output.contains(&format!("Kafka at {bootstrap} refused the connection")), "{output}");
    assert!(output.contains("Authentication failed"), "{output}");
    assert!(!output.contains("not-the-password"), "the password leaked: {output}");

    let dir = std::env::temp_dir().join(testkit::unique("other-ca"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let other_ca = another_ca(&dir);
    let (code, output) = topics_command_with(
        "operador",
        &prefix,
        &[("KAFKA_SSL_CA_LOCATION", other_ca.to_str().expect("utf-8 path"))],
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 1, "{output}");
    assert!(output.contains(&format!("Kafka at {bootstrap} refused the connection")), "{output}");
    assert!(output.contains("certificate verify failed"), "{output}");
}
