#![allow(dead_code)]
//! `pagamentos all` on a test's own topics, databases and ports.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::{Child, Command};

use testkit::{TestDatabase, TestTopics};

/// A free local port (bound, read, released: the service binds it a moment later).
pub fn free_port() -> u16 {
    use rand::Rng as _;
    // A port the kernel hands out for `bind(0)` (its ephemeral range, 32768-60999 on Linux) can be
    // taken between this check and the service's own bind by any other socket bound to port 0
    // (this test's webhook receiver, another test process): drawn below that range instead, at
    // random, checked free, and never handed out twice in one test process (a port given and
    // not yet bound looks free: with a repeat, two services of one `pagamentos all` would be
    // given the same port, and the second could not listen).
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let port = rng.random_range(20_000..32_000);
        let mut given = GIVEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free port between 20000 and 32000 on 127.0.0.1");
}

pub struct System {
    pub topics: TestTopics,
    /// Replication factor of the topics (1 on the local stack).
    pub replicas: i32,
    pub transfers_db: TestDatabase,
    pub ledger_db: TestDatabase,
    pub ports: [u16; 4],
    /// Sends the admin token (accepted on every route) with every request.
    pub http: reqwest::Client,
    /// Set by [`Self::keep`]: the topics outlive the test.
    kept: AtomicBool,
}

/// A client that authenticates as the admin of the services `super::service` starts.
pub fn admin_client(timeout: Option<Duration>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let bearer = format!("Bearer {}", super::ADMIN_TOKEN);
    headers.insert(reqwest::header::AUTHORIZATION, bearer.parse().expect("header value"));
    let mut builder = reqwest::Client::builder().default_headers(headers);
    if let Some(timeout) = timeout {
        builder = builder.timeout(timeout);
    }
    builder.build().expect("HTTP client")
}

impl System {
    pub async fn new() -> Self {
        Self::on_kafka(testkit::kafka_args(), 1).await
    }

    /// A system on the Kafka cluster `args` names, its topics with `replicas` replicas.
    pub async fn on_kafka(args: kafka::KafkaArgs, replicas: i32) -> Self {
        testkit::init_logs();
        let topics = TestTopics::plan_on(args, 3, replicas).await;
        let transfers_db = TestDatabase::empty().await;
        let ledger_db = TestDatabase::empty().await;
        let ports = [free_port(), free_port(), free_port(), free_port()];
        Self {
            topics,
            replicas,
            transfers_db,
            ledger_db,
            ports,
            http: admin_client(None),
            kept: AtomicBool::new(false),
        }
    }

    /// Keeps the topics when the system is dropped (as a panicking test does anyway), for a
    /// post-mortem of `why` with the broker's own tools.
    pub fn keep(&self, why: &str) {
        if !self.kept.swap(true, Ordering::Relaxed) {
            eprintln!("[system] {why}: the topics {}* will be kept", self.topics.args.topic_prefix);
        }
    }

    pub fn env(&self, command: &mut Command) {
        command
            .env("TRANSFERENCIAS_DATABASE_URL", &self.transfers_db.url)
            .env("LEDGER_DATABASE_URL", &self.ledger_db.url)
            .env("TRANSFERENCIAS_DATABASE_CONNECTIONS", "4")
            .env("LEDGER_DATABASE_CONNECTIONS", "4")
            .env("TRANSFERENCIAS_LISTEN", format!("127.0.0.1:{}", self.ports[0]))
            .env("LEDGER_LISTEN", format!("127.0.0.1:{}", self.ports[1]))
            .env("ANTIFRAUDE_LISTEN", format!("127.0.0.1:{}", self.ports[2]))
            .env("NOTIFICACOES_LISTEN", format!("127.0.0.1:{}", self.ports[3]))
            .env("APP_KAFKA_REPLICAS", self.replicas.to_string())
            .env("PAGAMENTOS_INSTANCE_ID", testkit::unique("all"));
    }

    /// Starts `pagamentos all` and waits until every service is ready.
    pub async fn start(&self) -> Child {
        self.start_with(&[]).await
    }

    /// [`Self::start`] with more environment.
    pub async fn start_with(&self, extra: &[(&str, &str)]) -> Child {
        self.start_configured(|command| {
            command.envs(extra.iter().copied());
        })
        .await
    }

    /// [`Self::start`] with the command adjusted by `configure` first.
    pub async fn start_configured(&self, configure: impl FnOnce(&mut Command)) -> Child {
        let mut command = super::service(&self.topics, "all");
        self.env(&mut command);
        configure(&mut command);
        let child = command.spawn().expect("start pagamentos all");
        for port in self.ports {
            let url = format!("http://127.0.0.1:{port}/readyz");
            testkit::eventually(&format!("{url} ready"), testkit::PATIENCE, || async {
                let response = self.http.get(&url).send().await.ok()?;
                response.status().is_success().then_some(())
            })
            .await;
        }
        child
    }

    pub fn api(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.ports[0])
    }

    pub fn ledger(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.ports[1])
    }

    pub async fn open_account(&self, id: &str, cents: i64) {
        let response = self
            .http
            .post(self.ledger("/contas"))
            .json(&json!({"id": id, "moeda": "BRL", "saldoInicialCentavos": cents}))
            .send()
            .await
            .expect("POST /contas");
        assert_eq!(response.status(), 201, "{}", response.text().await.unwrap_or_default());
    }

    /// POSTs a transfer with an Idempotency-Key of its own; its id when accepted.
    pub async fn transfer(&self, from: &str, to: &str, cents: i64) -> Option<String> {
        let response = self
            .http
            .post(self.api("/transferencias"))
            .header("Idempotency-Key", testkit::unique("key"))
            .json(&json!({"contaOrigem": from, "contaDestino": to, "valorEmCentavos": cents, "moeda": "BRL"}))
            .send()
            .await
            .ok()?;
        if response.status() != 202 {
            return None;
        }
        let body: Value = response.json().await.ok()?;
        body["id"].as_str().map(str::to_owned)
    }

    pub async fn final_status(&self, id: &str) -> (String, Value) {
        testkit::eventually(&format!("transfer {id} final"), testkit::PATIENCE, || async {
            let body: Value = self
                .http
                .get(self.api(&format!("/transferencias/{id}")))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let status = body["status"].as_str()?.to_owned();
            (status != "PENDENTE").then(|| (status, body["motivoRejeicao"].clone()))
        })
        .await
    }

    pub async fn balance(&self, account: &str) -> i64 {
        let body: Value = self
            .http
            .get(self.ledger(&format!("/contas/{account}")))
            .send()
            .await
            .expect("GET /contas")
            .json()
            .await
            .expect("account");
        body["saldoCentavos"].as_i64().expect("saldoCentavos")
    }

    /// Waits until no transfer is PENDENTE any more (every accepted one decided and projected),
    /// the condition `verify` needs to compare the two databases.
    pub async fn all_decided(&self) {
        testkit::eventually("every transfer decided", testkit::PATIENCE, || async {
            let pending: i64 =
                sqlx::query_scalar("SELECT count(*) FROM transferencia WHERE status = 'PENDENTE'")
                    .fetch_one(&self.transfers_db.pool)
                    .await
                    .expect("count pending transfers");
            (pending == 0).then_some(())
        })
        .await;
    }

    /// `pagamentos clients <args>` as both databases' owner (the test's role, which migrated
    /// them): (exit code, stdout, stderr).
    pub async fn clients(&self, args: &[&str]) -> (i32, String, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pagamentos"));
        command
            .arg("clients")
            .args(args)
            .env("TRANSFERENCIAS_MIGRATION_DATABASE_URL", &self.transfers_db.url)
            .env("LEDGER_MIGRATION_DATABASE_URL", &self.ledger_db.url)
            .env("RUST_LOG", "warn");
        captured(&mut command, "pagamentos clients").await
    }

    /// A new API client `name` for `accounts` (comma-separated): its bearer token, the only line
    /// `pagamentos clients create` prints on stdout.
    pub async fn create_client(&self, name: &str, accounts: &str) -> String {
        let (code, stdout, stderr) = self.clients(&["create", name, "--accounts", accounts]).await;
        assert_eq!(code, 0, "clients create {name}: {stdout}{stderr}");
        let token = stdout.trim().to_owned();
        assert!(web::auth::is_client_token(&token), "not a token on stdout: {stdout:?} ({stderr})");
        token
    }

    /// `pagamentos verify` on the system's databases: (exit code, report).
    pub async fn verify(&self) -> (i32, String) {
        let output = Command::new(env!("CARGO_BIN_EXE_pagamentos"))
            .arg("verify")
            .env("TRANSFERENCIAS_DATABASE_URL", &self.transfers_db.url)
            .env("LEDGER_DATABASE_URL", &self.ledger_db.url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await
            .expect("run verify");
        let report =
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.code().unwrap_or(-1), report)
    }
}

/// A failed test (panicking) or one that found lost transfers ([`System::keep`]) leaves its
/// topics on the broker, records, transactions' markers and committed offsets included, and
/// says where they and the services' logs are; a passing one deletes them ([`TestTopics`]'s
/// drop, after this).
impl Drop for System {
    fn drop(&mut self) {
        if !std::thread::panicking() && !self.kept.load(Ordering::Relaxed) {
            return;
        }
        let names = std::mem::take(&mut self.topics.names);
        let prefix = &self.topics.args.topic_prefix;
        let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let mut logs: Vec<String> = std::fs::read_dir(tmp)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix.as_str()))
                    .map(|entry| entry.path().display().to_string())
                    .collect()
            })
            .unwrap_or_default();
        logs.sort();
        eprintln!(
            "[system] kept {} topics {prefix}* on {} (delete them with kafka-topics --delete --topic '{prefix}.*'); \
             service logs: {logs:?} (System::start's), plus any log directory the test printed",
            names.len(),
            self.topics.args.bootstrap_servers
        );
    }
}

/// Runs `command` to its end: (exit code, -1 when killed by a signal; stdout; stderr). Panics,
/// naming `what`, only if it cannot be started.
pub async fn captured(command: &mut Command, what: &str) -> (i32, String, String) {
    let output = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap_or_else(|error| panic!("run {what}: {error}"));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
