//! TLS to PostgreSQL (issue #25): the stack's server offers TLS with a certificate for
//! `localhost` and `127.0.0.1` signed by the stack's CA (`scripts/stack.d/postgres.sh`,
//! `pg_tls`), and every command honours `sslmode=verify-full&sslrootcert=…` in its database URL:
//! with the stack's CA it connects over TLS, with any other CA it refuses to talk to the server.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _};

use testkit::{unique, TestDatabase, TestTopics};

/// The stack's CA certificate, where `scripts/stack` writes it:
/// `${PAGAMENTOS_CACHE_DIR:-~/.cache/pagamentos}/postgres-tls/ca.crt`.
fn stack_ca() -> PathBuf {
    let cache = match std::env::var_os("PAGAMENTOS_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/pagamentos"),
    };
    let ca = cache.join("postgres-tls/ca.crt");
    assert!(
        ca.is_file(),
        "the stack's PostgreSQL CA is not at {}: run `scripts/stack up` (it generates the CA there \
         and serves TLS with a certificate it signed)",
        ca.display()
    );
    ca
}

/// `url` with `sslmode=verify-full` and `sslrootcert=ca` added to its query.
fn verify_full(url: &str, ca: &Path) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}sslmode=verify-full&sslrootcert={}", ca.display())
}

/// A CA of the test's own, which signed nothing the server presents.
struct ForeignCa {
    dir: PathBuf,
}

impl ForeignCa {
    fn generate() -> Self {
        let dir = std::env::temp_dir().join(unique("foreign-ca"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let status = Command::new("openssl")
            .args(["req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
            .args(["-nodes", "-days", "30", "-subj", "/CN=not the stack's CA"])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            .arg("-keyout")
            .arg(dir.join("ca.key"))
            .arg("-out")
            .arg(dir.join("ca.crt"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run openssl (scripts/stack installs it)");
        assert!(status.success(), "openssl could not make a CA");
        Self { dir }
    }

    fn certificate(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
}

impl Drop for ForeignCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn verify_full_with_the_stacks_ca_connects_over_tls_by_name_and_by_address() {
    let ca = stack_ca();
    for host in ["localhost", "127.0.0.1"] {
        let options: PgConnectOptions =
            verify_full(&testkit::admin_database_url(), &ca).parse().expect("URL with sslmode");
        let options = options.host(host);
        let mut connection = options
            .connect()
            .await
            .unwrap_or_else(|error| panic!("verify-full to {host} with the stack's CA: {error}"));
        let (ssl, version): (bool, Option<String>) =
            sqlx::query_as("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&mut connection)
                .await
                .expect("pg_stat_ssl");
        assert!(ssl, "connection to {host} is not encrypted");
        assert!(version.as_deref().is_some_and(|v| v == "TLSv1.3" || v == "TLSv1.2"), "{version:?}");
        connection.close().await.expect("close");
    }
}

#[tokio::test]
async fn verify_full_with_another_ca_is_refused() {
    let foreign = ForeignCa::generate();
    let options: PgConnectOptions = verify_full(&testkit::admin_database_url(), &foreign.certificate())
        .parse()
        .expect("URL with sslmode");
    match options.connect().await {
        Ok(_) => panic!("the server's certificate was accepted on the word of a CA that did not sign it"),
        // rustls's verdict, as sqlx reports a failed handshake (an I/O error of the socket)
        Err(error @ (sqlx::Error::Io(_) | sqlx::Error::Tls(_))) => {
            let message = error.to_string();
            assert!(
                message.contains("invalid peer certificate: UnknownIssuer"),
                "not a refusal of the server's certificate: {message}"
            );
        }
        Err(error) => panic!("not a TLS refusal: {error}"),
    }
}

#[tokio::test]
async fn migrate_refuses_a_server_its_ca_did_not_sign_and_names_the_cause() {
    let database = TestDatabase::empty().await;
    let foreign = ForeignCa::generate();
    let output = Command::new(env!("CARGO_BIN_EXE_pagamentos"))
        .args(["migrate", "--only", "ledger"])
        .env("LEDGER_DATABASE_URL", verify_full(&database.url, &foreign.certificate()))
        .env("LOG_FORMAT", "pretty")
        .output()
        .expect("run pagamentos migrate");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "migrated through an unverified server: {stderr}");
    assert!(
        stderr.contains("unreachable") && stderr.contains("invalid peer certificate: UnknownIssuer"),
        "unclear error: {stderr}"
    );
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&database.pool)
        .await
        .expect("tables");
    assert_eq!(tables, 0, "migrate wrote through a connection it should have refused");
}

#[tokio::test]
async fn the_ledger_runs_on_a_verify_full_url() {
    let ca = stack_ca();
    let database = TestDatabase::empty().await;
    let topics = TestTopics::plan(3).await;
    // the service's own sessions are told apart from the test's by their application name
    let application = unique("ledger-tls").replace('-', "_");
    let url = format!("{}&application_name={application}", verify_full(&database.url, &ca));
    let mut ledger = common::service(&topics, "ledger")
        .env("LEDGER_LISTEN", "127.0.0.1:0")
        .env("LEDGER_DATABASE_URL", &url)
        .env("LEDGER_DATABASE_CONNECTIONS", "4")
        .spawn()
        .expect("start pagamentos ledger");

    // it migrated on start and keeps its pool open, every session encrypted
    let sessions = testkit::eventually("the ledger's sessions", testkit::PATIENCE, || {
        if let Ok(Some(status)) = ledger.try_wait() {
            panic!("pagamentos ledger exited with {status} on a verify-full URL");
        }
        async {
            let migrated: bool = sqlx::query_scalar("SELECT to_regclass('public.lancamento') IS NOT NULL")
                .fetch_one(&database.pool)
                .await
                .ok()?;
            let sessions: Vec<bool> = sqlx::query_scalar(
                "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = $1 AND a.application_name = $2",
            )
            .bind(&database.name)
            .bind(&application)
            .fetch_all(&database.pool)
            .await
            .ok()?;
            (migrated && !sessions.is_empty()).then_some(sessions)
        }
    })
    .await;
    assert!(sessions.iter().all(|ssl| *ssl), "a ledger session without TLS: {sessions:?}");
}
