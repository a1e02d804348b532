//! `pagamentos migrate` and `pagamentos topics` as an operator runs them, against the local
//! stack, each test with a database or topic prefix of its own.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use testkit::{unique, TestDatabase};

/// Runs the binary with `env` (on the single-broker stack: fewer than 3 replicas allowed unless
/// `env` says otherwise), killing it if it outlives `limit` (then the test fails).
fn pagamentos(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pagamentos"));
    command
        .args(args)
        .env("LOG_FORMAT", "pretty")
        .env("PAGAMENTOS_ALLOW_UNDER_REPLICATED", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("start pagamentos");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if started.elapsed() > limit {
            child.kill().expect("kill");
            panic!("pagamentos {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn migrate_creates_the_ledger_schema_once() {
    let database = TestDatabase::empty().await;
    for run in 0..2 {
        let output = pagamentos(
            &["migrate", "--only", "ledger"],
            &[("LEDGER_DATABASE_URL", &database.url)],
            Duration::from_secs(60),
        );
        assert!(output.status.success(), "run {run}: {}", text(&output.stderr));
        assert!(text(&output.stdout).contains(&format!("/{} to version", database.name)));
    }
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&database.pool)
    .await
    .expect("tables");
    assert_eq!(
        tables,
        [
            "_sqlx_migrations",
            "cliente_api",
            "conta",
            "deposito",
            "lancamento",
            "outbox_evento",
            "transferencia_processada"
        ]
    );

    // the balance check: only issuer accounts may go negative
    let insert = |id: &'static str, balance: i64, issuer: bool| {
        sqlx::query("INSERT INTO conta (id, saldo_centavos, moeda, emissor) VALUES ($1, $2, 'BRL', $3)")
            .bind(id)
            .bind(balance)
            .bind(issuer)
            .execute(&database.pool)
    };
    insert("EMISSOR-BRL", -500, true).await.expect("an issuer may go negative");
    let refused = insert("CC-001", -1, false).await.expect_err("a customer may not");
    assert!(refused.to_string().contains("conta_saldo_centavos_check"), "{refused}");
    // ids sort in byte order whatever the database's collation: the lock order
    for id in ["a-1", "B-1", "_x"] {
        insert(id, 0, false).await.expect("insert");
    }
    let order: Vec<String> =
        sqlx::query_scalar("SELECT id FROM conta ORDER BY id").fetch_all(&database.pool).await.expect("ids");
    assert_eq!(order, ["B-1", "EMISSOR-BRL", "_x", "a-1"]);
}

#[tokio::test]
async fn migrate_creates_the_transfers_schema() {
    let database = TestDatabase::empty().await;
    let output = pagamentos(
        &["migrate", "--only", "transferencias"],
        &[("TRANSFERENCIAS_DATABASE_URL", &database.url)],
        Duration::from_secs(60),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&database.pool)
    .await
    .expect("tables");
    assert_eq!(
        tables,
        ["_sqlx_migrations", "chave_idempotencia", "cliente_api", "outbox_evento", "transferencia"]
    );
}

#[tokio::test]
async fn topics_twice_is_idempotent_and_a_difference_exits_1() {
    let prefix = format!("{}.", unique("cli"));
    let env = [("PAGAMENTOS_TOPIC_PREFIX", prefix.as_str()), ("APP_KAFKA_PARTITIONS", "1")];
    let limit = Duration::from_secs(60);

    let first = pagamentos(&["topics"], &env, limit);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let stdout = text(&first.stdout);
    assert_eq!(stdout.lines().filter(|line| line.starts_with("created")).count(), 14, "{stdout}");
    assert!(stdout.contains(&format!("{prefix}transferencias.analisada-dlt")), "{stdout}");

    let second = pagamentos(&["topics"], &env, limit);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let stdout = text(&second.stdout);
    assert_eq!(stdout.lines().filter(|line| line.starts_with("ok")).count(), 14, "{stdout}");

    let differs = pagamentos(&["topics", "--partitions", "2"], &env, limit);
    assert_eq!(differs.status.code(), Some(1));
    assert!(text(&differs.stdout).contains("DIFFERS"), "{}", text(&differs.stdout));
    assert!(text(&differs.stdout).contains("1 partitions, configured 2"));
    assert!(text(&differs.stderr).contains("differ from the configuration"));

    let args = kafka::KafkaArgs {
        topic_prefix: prefix.clone(),
        ..kafka::KafkaArgs::new(testkit::bootstrap_servers())
    };
    let names: Vec<String> = contracts::topics::plan(&prefix).into_iter().map(|spec| spec.name).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    kafka_admin::topics::delete(&args, &names).await.expect("clean up");
}

#[test]
fn an_unreachable_kafka_fails_in_bounded_time_naming_the_address() {
    let output =
        pagamentos(&["topics"], &[("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")], Duration::from_secs(30));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("Kafka at 127.0.0.1:1 unreachable"), "{stderr}");
}

#[test]
fn an_unreachable_database_fails_in_bounded_time_naming_the_address() {
    let output = pagamentos(
        &["migrate"],
        &[("TRANSFERENCIAS_DATABASE_URL", "postgres://pagamentos:secret@127.0.0.1:1/transferencias")],
        Duration::from_secs(30),
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("PostgreSQL at 127.0.0.1:1/transferencias unreachable"), "{stderr}");
    assert!(stderr.contains("Connection refused"), "{stderr}");
    assert!(!stderr.contains("secret"), "the password leaked: {stderr}");
}

#[test]
fn a_malformed_environment_value_is_refused_naming_the_variable() {
    for (variable, value) in
        [("APP_KAFKA_PARTITIONS", "twelve"), ("APP_KAFKA_REPLICAS", "0"), ("KAFKA_GROUP_PROTOCOL", "fast")]
    {
        let output = pagamentos(&["topics"], &[(variable, value)], Duration::from_secs(10));
        assert_eq!(output.status.code(), Some(2), "{variable}={value}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(value), "{stderr}");
        assert!(stderr.contains(variable), "{variable} not named: {stderr}");
    }
}

#[test]
fn a_bad_metrics_listen_address_is_refused_with_exit_2() {
    // nothing may be reached first: the refusal comes before any connection
    let unreachable = [
        ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1"),
        ("TRANSFERENCIAS_DATABASE_URL", "postgres://nobody:x@127.0.0.1:1/none"),
        ("LEDGER_DATABASE_URL", "postgres://nobody:x@127.0.0.1:1/none"),
        ("PAGAMENTOS_INSECURE_NO_AUTH", "true"),
    ];
    for (subcommand, value) in [("antifraude", "localhost:9100"), ("all", "9100"), ("ledger", "0.0.0.0:")] {
        let mut env = unreachable.to_vec();
        env.push(("PAGAMENTOS_METRICS_LISTEN", value));
        let output = pagamentos(&[subcommand], &env, Duration::from_secs(30));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{subcommand} {value}: {stderr}");
        assert!(stderr.contains("expected IP:PORT") && stderr.contains(value), "{stderr}");
        assert!(stderr.contains("PAGAMENTOS_METRICS_LISTEN"), "the variable is not named: {stderr}");
    }
    // on the command line too
    let output =
        pagamentos(&["notificacoes", "--metrics-listen", "nowhere"], &unreachable, Duration::from_secs(30));
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    // a well-formed address that takes a service's port: refused before anything starts
    for (subcommand, value) in [("all", "0.0.0.0:8083"), ("ledger", "127.0.0.1:8081")] {
        let mut env = unreachable.to_vec();
        env.push(("PAGAMENTOS_METRICS_LISTEN", value));
        let output = pagamentos(&[subcommand], &env, Duration::from_secs(30));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{subcommand} {value}: {stderr}");
        assert!(stderr.contains("give /metrics a port of its own"), "{stderr}");
        assert!(!stderr.contains("unreachable"), "{subcommand}: refused only after a connection: {stderr}");
    }
}

#[test]
fn fewer_than_three_replicas_are_refused_without_the_explicit_opt_in() {
    // nothing may be reached first: the refusal comes before any connection
    let unreachable = [
        ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1"),
        ("TRANSFERENCIAS_DATABASE_URL", "postgres://nobody:x@127.0.0.1:1/none"),
        ("LEDGER_DATABASE_URL", "postgres://nobody:x@127.0.0.1:1/none"),
        ("PAGAMENTOS_INSECURE_NO_AUTH", "true"),
        ("PAGAMENTOS_ALLOW_UNDER_REPLICATED", "false"),
    ];
    for subcommand in ["topics", "all", "transferencias", "ledger", "antifraude", "notificacoes"] {
        for replicas in [None, Some("2")] {
            let mut env = unreachable.to_vec();
            env.extend(replicas.map(|value| ("APP_KAFKA_REPLICAS", value)));
            let output = pagamentos(&[subcommand], &env, Duration::from_secs(30));
            let stderr = text(&output.stderr);
            let said = format!("APP_KAFKA_REPLICAS is {}:", replicas.unwrap_or("1"));
            assert_eq!(output.status.code(), Some(1), "{subcommand} {replicas:?}: {stderr}");
            assert!(stderr.contains(&said) && stderr.contains("--allow-under-replicated"), "{stderr}");
            assert!(
                !stderr.contains("unreachable"),
                "{subcommand}: refused only after a connection: {stderr}"
            );
        }
    }
    // the opt-in, on the command line or in the environment, gets past the check (to Kafka)
    for opt_in in [vec!["topics", "--allow-under-replicated"], vec!["topics"]] {
        let mut env = unreachable.to_vec();
        if opt_in.len() == 1 {
            env.push(("PAGAMENTOS_ALLOW_UNDER_REPLICATED", "true"));
        }
        let output = pagamentos(&opt_in, &env, Duration::from_secs(30));
        let stderr = text(&output.stderr);
        assert!(stderr.contains("Kafka at 127.0.0.1:1 unreachable"), "{opt_in:?}: {stderr}");
        assert!(stderr.contains("fewer than 3 replicas (--allow-under-replicated)"), "logged: {stderr}");
    }
    // three replicas need no opt-in
    let mut env = unreachable.to_vec();
    env.push(("APP_KAFKA_REPLICAS", "3"));
    let output = pagamentos(&["topics"], &env, Duration::from_secs(30));
    assert!(text(&output.stderr).contains("Kafka at 127.0.0.1:1 unreachable"), "{}", text(&output.stderr));
}

/// A subcommand, its environment, and what its refusal must say.
type Refusal = (&'static str, &'static [(&'static str, &'static str)], &'static str);

#[test]
fn services_refuse_to_start_without_auth_or_a_webhook_secret() {
    let cases: [Refusal; 6] = [
        ("all", &[], "authentication is required"),
        ("transferencias", &[("PAGAMENTOS_API_TOKEN", "api")], "missing: PAGAMENTOS_ADMIN_TOKEN"),
        ("ledger", &[("PAGAMENTOS_API_TOKEN", "same"), ("PAGAMENTOS_ADMIN_TOKEN", "same")], "must differ"),
        (
            "transferencias",
            &[("PAGAMENTOS_API_TOKEN", "api"), ("PAGAMENTOS_INSECURE_NO_AUTH", "true")],
            "choose one",
        ),
        (
            "notificacoes",
            &[("NOTIFICACOES_WEBHOOK_URL", "http://127.0.0.1:1/hooks")],
            "NOTIFICACOES_WEBHOOK_SECRET",
        ),
        // no API, but the admin token for /readyz's detail: the same rule as the APIs
        (
            "antifraude",
            &[("PAGAMENTOS_ADMIN_TOKEN", "adm"), ("PAGAMENTOS_INSECURE_NO_AUTH", "true")],
            "choose one",
        ),
    ];
    for (subcommand, env, says) in cases {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pagamentos"));
        command
            .arg(subcommand)
            .env("LOG_FORMAT", "pretty")
            .env("PAGAMENTOS_ALLOW_UNDER_REPLICATED", "true")
            // nothing else may be reached first: the refusal comes before any connection
            .env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
            .env("TRANSFERENCIAS_DATABASE_URL", "postgres://nobody:x@127.0.0.1:1/none")
            .env("LEDGER_DATABASE_URL", "postgres://nobody:x@127.0.0.1:1/none");
        for name in [
            "PAGAMENTOS_API_TOKEN",
            "PAGAMENTOS_ADMIN_TOKEN",
            "PAGAMENTOS_INSECURE_NO_AUTH",
            "NOTIFICACOES_WEBHOOK_SECRET",
            "NOTIFICACOES_WEBHOOK_UNSIGNED",
        ] {
            command.env_remove(name);
        }
        let output = command.envs(env.iter().copied()).output().expect("run pagamentos");
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{subcommand} {env:?}: {stderr}");
        assert!(stderr.contains(says), "{subcommand} {env:?} should say {says:?}: {stderr}");
        assert!(
            !stderr.contains("unreachable"),
            "{subcommand}: refused only after trying a connection: {stderr}"
        );
    }
}
