//! Transport fails closed off the machine (`docs/reference/contract.md` §1, issue #46 item 6): every command
//! that connects to Kafka or PostgreSQL refuses to start, naming the setting, when a host that
//! is not a loopback address would be reached in plaintext (Kafka) or unverified (PostgreSQL
//! below `sslmode=verify-full`), unless started with `--insecure-transport`, which it then logs
//! and reports on `/readyz`; and a service connected as its schema's owner says so there and in
//! its log.
//!
//! No test lets a byte leave the machine, not even should the check regress: every host they
//! name is `0.0.0.0`, not a loopback address by the rule (it needs the opt-in like any host
//! off the machine), yet a connection to it is delivered on the loopback interface by Linux.
//! So a refusal is checked to come before anything connects (at once, and without a
//! connection error), and with the opt-in the services reach the local stack through settings
//! the check treats as off the machine. Which hosts count as loopback (`10.255.255.1`, host
//! names, `::1`, …) is unit-tested next to the rule (`telemetry::transport`, `kafka::config`,
//! `database`).

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions as _;
use tokio::process::Command;

use common::system::System;
use testkit::TestDatabase;

/// Off the machine by the rule, on the loopback interface in fact (see the module's docs).
const OFF_MACHINE: &str = "0.0.0.0";

/// `pagamentos <args>` with the environment of a plain local run, and no opt-in inherited.
fn pagamentos(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pagamentos"));
    command
        .args(args)
        .env("LOG_FORMAT", "pretty")
        .env("PAGAMENTOS_ALLOW_UNDER_REPLICATED", "true")
        .env_remove("PAGAMENTOS_INSECURE_TRANSPORT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs `command`, which must refuse to start at once: its stderr.
async fn refused(what: &str, mut command: Command) -> String {
    let started = Instant::now();
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after 30 s, not refused"))
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{what}: {stderr}");
    assert!(stderr.contains("refusing to connect off the machine unprotected"), "{what}: {stderr}");
    assert!(stderr.contains("--insecure-transport (PAGAMENTOS_INSECURE_TRANSPORT=true)"), "{what}: {stderr}");
    // before anything connected: no connection was tried, so none failed or timed out
    assert!(started.elapsed() < Duration::from_secs(10), "{what}: took {:?}", started.elapsed());
    for attempt in ["unreachable", "timed out", "Connection refused", "did not start"] {
        assert!(!stderr.contains(attempt), "{what}: a connection was tried ({attempt}): {stderr}");
    }
    stderr
}

#[tokio::test]
async fn every_command_that_connects_refuses_plaintext_kafka_off_the_machine_naming_the_setting() {
    let kafka = format!("{OFF_MACHINE}:9092");
    let commands: [&[&str]; 8] = [
        &["transferencias"],
        &["ledger"],
        &["antifraude"],
        &["notificacoes"],
        &["all"],
        &["topics"],
        &["dlt", "list", "transferencias.liquidada-dlt"],
        &["dlt", "replay", "transferencias.liquidada-dlt", "--all"],
    ];
    for args in commands {
        let mut command = pagamentos(args);
        command.env("KAFKA_BOOTSTRAP_SERVERS", format!("localhost:9092,{kafka}"));
        let stderr = refused(&args.join(" "), command).await;
        let named = format!(
            "KAFKA_BOOTSTRAP_SERVERS names {kafka}, not a loopback address, and KAFKA_SECURITY_PROTOCOL is \
             plaintext (ssl or sasl_ssl needed)"
        );
        assert!(stderr.contains(&named), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("names localhost"),
            "{args:?}: only what is off the machine is named: {stderr}"
        );
    }
    // SASL without TLS is plaintext too
    let mut command = pagamentos(&["antifraude"]);
    command
        .env("KAFKA_BOOTSTRAP_SERVERS", &kafka)
        .env("KAFKA_SECURITY_PROTOCOL", "sasl_plaintext")
        .env("KAFKA_SASL_USERNAME", "antifraude")
        .env("KAFKA_SASL_PASSWORD", "pw-kafka");
    let stderr = refused("antifraude over sasl_plaintext", command).await;
    assert!(stderr.contains("KAFKA_SECURITY_PROTOCOL is sasl_plaintext"), "{stderr}");
    assert!(!stderr.contains("pw-kafka"), "{stderr}");
}

#[tokio::test]
async fn every_command_that_connects_refuses_postgres_below_verify_full_off_the_machine_naming_the_setting() {
    let url =
        |role: &str, mode: &str| format!("postgres://{role}:pw-db@{OFF_MACHINE}:5432/ledger?sslmode={mode}");
    let cases: [(&[&str], &str, String); 8] = [
        (&["ledger"], "LEDGER_DATABASE_URL", url("ledger_app", "require")),
        (&["transferencias"], "TRANSFERENCIAS_DATABASE_URL", url("transferencias_app", "verify-ca")),
        (&["all"], "LEDGER_DATABASE_URL", url("ledger_app", "prefer")),
        (&["verify"], "LEDGER_DATABASE_URL", url("ledger_app", "disable")),
        (&["republish"], "TRANSFERENCIAS_DATABASE_URL", url("transferencias_app", "allow")),
        (&["migrate", "--only", "ledger"], "LEDGER_MIGRATION_DATABASE_URL", url("ledger", "require")),
        (
            &["migrate", "--only", "transferencias"],
            "TRANSFERENCIAS_DATABASE_URL",
            url("transferencias", "prefer"),
        ),
        (&["clients", "list"], "TRANSFERENCIAS_MIGRATION_DATABASE_URL", url("transferencias", "require")),
    ];
    for (args, setting, url) in cases {
        let mut command = pagamentos(args);
        command.env(setting, &url).env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092");
        let stderr = refused(&args.join(" "), command).await;
        let mode = url.rsplit('=').next().unwrap_or_default();
        let named = format!(
            "{setting} names {OFF_MACHINE}:5432, not a loopback address, and its sslmode is {mode} (verify-full \
             needed, with sslrootcert)"
        );
        assert!(stderr.contains(&named), "{args:?}: {stderr}");
        assert!(!stderr.contains("KAFKA_BOOTSTRAP_SERVERS"), "{args:?}: Kafka is local: {stderr}");
        assert!(!stderr.contains("pw-db"), "{args:?}: a password in the refusal: {stderr}");
    }
}

/// `url` with its host replaced by `0.0.0.0` (see the module's docs).
fn through_unspecified(url: &str) -> String {
    let options: PgConnectOptions = url.parse().expect("database URL");
    options.host(OFF_MACHINE).to_url_lossy().to_string()
}

/// `ledger_app`, the stack's runtime role of the ledger, on the test's database `name`.
fn ledger_runtime_url(name: &str) -> String {
    let server: PgConnectOptions = testkit::admin_database_url().parse().expect("admin URL");
    let runtime: PgConnectOptions = ledger::DEFAULT_DATABASE_URL.parse().expect("default URL");
    runtime.host(server.get_host()).port(server.get_port()).database(name).to_url_lossy().to_string()
}

async fn readyz(system: &System, port: u16) -> String {
    let url = format!("http://127.0.0.1:{port}/readyz");
    let response = system.http.get(&url).send().await.unwrap_or_else(|error| panic!("GET {url}: {error}"));
    assert_eq!(response.status(), 200, "{url}");
    response.text().await.expect("body")
}

/// With `--insecure-transport` the same settings start the service: the opt-in is logged and
/// on every service's `/readyz` (admin detail), naming what it lets through. In the same run:
/// transferencias, connected as its schema's owner, says so; the ledger, as its runtime role
/// `ledger_app`, does not.
#[tokio::test]
async fn with_insecure_transport_the_services_start_and_say_so_and_an_owner_says_it_owns_the_schema() {
    let system = System::new().await;
    // the deploy step for the ledger, whose service then runs as the runtime role
    ledger::MIGRATOR.run(&system.ledger_db.pool).await.expect("migrate as the owner");
    let port = testkit::bootstrap_servers().rsplit(':').next().expect("a port").to_owned();
    let kafka = format!("{OFF_MACHINE}:{port}");
    let transfers_url = through_unspecified(&system.transfers_db.url);
    let ledger_url = ledger_runtime_url(&system.ledger_db.name);
    let configure = |command: &mut Command| {
        command
            .env("KAFKA_BOOTSTRAP_SERVERS", &kafka)
            .env("TRANSFERENCIAS_DATABASE_URL", &transfers_url)
            .env("LEDGER_DATABASE_URL", &ledger_url)
            .env_remove("PAGAMENTOS_INSECURE_TRANSPORT");
    };

    // without the opt-in: refused, naming both, before anything connects
    let mut command = common::service(&system.topics, "all");
    system.env(&mut command);
    configure(&mut command);
    command.env("LOG_FORMAT", "pretty").stderr(Stdio::piped());
    let stderr = refused("pagamentos all through 0.0.0.0", command).await;
    assert!(stderr.contains(&format!("KAFKA_BOOTSTRAP_SERVERS names {kafka}")), "{stderr}");
    assert!(stderr.contains("TRANSFERENCIAS_DATABASE_URL names 0.0.0.0:"), "{stderr}");
    assert!(!stderr.contains("LEDGER_DATABASE_URL"), "the ledger's database is on loopback: {stderr}");

    // with it: started, and said
    let _all = system
        .start_configured(|command| {
            configure(command);
            command.arg("--insecure-transport");
        })
        .await;
    let mut exposures = kafka::KafkaArgs::new(&kafka).transport_exposures();
    exposures.extend(
        database::transport_exposures("TRANSFERENCIAS_DATABASE_URL", &transfers_url).expect("transfers URL"),
    );
    assert_eq!(exposures.len(), 2, "{exposures:?}");
    let transport = format!("warning: {}\n", telemetry::transport::warning(&exposures));
    let owner_role = system.transfers_db.pool.connect_options().get_username().to_owned();
    let owner = database::schema::Prepared::Migrated { role: owner_role }
        .owner_warning("transferencias")
        .expect("the owner's warning");
    let [transferencias, ledger, antifraude, notificacoes] = system.ports;
    assert_eq!(readyz(&system, transferencias).await, format!("ready\nwarning: {owner}\n{transport}"));
    for port in [ledger, antifraude, notificacoes] {
        assert_eq!(readyz(&system, port).await, format!("ready\n{transport}"), "port {port}");
    }
    // anyone else reads the status alone
    let anonymous = reqwest::Client::new();
    let body = anonymous
        .get(format!("http://127.0.0.1:{transferencias}/readyz"))
        .send()
        .await
        .expect("GET /readyz")
        .text()
        .await
        .expect("body");
    assert_eq!(body, "ready\n");

    // and the log says both, at warning level
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{}all.log", system.topics.args.topic_prefix));
    let log = std::fs::read_to_string(&log).unwrap_or_else(|error| panic!("{}: {error}", log.display()));
    let warnings: Vec<&str> = log.lines().filter(|line| line.contains("\"WARN\"")).collect();
    assert!(
        warnings.iter().any(|line| line.contains("insecure transport allowed (--insecure-transport)")),
        "{log}"
    );
    assert!(warnings.iter().any(|line| line.contains("which owns its schema")), "{log}");
    assert!(!log.contains("ledger database as ledger_app"), "the runtime role owns nothing: {log}");
}

/// A tool given the opt-in runs through the same check, and says so: `verify` reads a ledger
/// database through `0.0.0.0` (its owner's URL, a scan needs no more), clean, exit 0.
#[tokio::test]
async fn a_tool_with_insecure_transport_runs_and_warns() {
    let database = TestDatabase::create(&ledger::MIGRATOR).await;
    let url = through_unspecified(&database.url);
    let mut command = pagamentos(&["verify", "--scope", "ledger"]);
    command.env("LEDGER_DATABASE_URL", &url);
    let stderr = refused("verify through 0.0.0.0", command).await;
    assert!(stderr.contains("LEDGER_DATABASE_URL names 0.0.0.0:"), "{stderr}");

    let output = pagamentos(&["verify", "--scope", "ledger"])
        .env("LEDGER_DATABASE_URL", &url)
        .env("PAGAMENTOS_INSECURE_TRANSPORT", "true")
        .output()
        .await
        .expect("run verify");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}\n{}", String::from_utf8_lossy(&output.stdout));
    assert!(
        stderr.contains(
            "insecure transport allowed (--insecure-transport): LEDGER_DATABASE_URL names 0.0.0.0:"
        ),
        "{stderr}"
    );
}
