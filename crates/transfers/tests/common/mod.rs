//! `spawn_app()`: the real transfers service on port 0 with a database and topics of its own.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kafka::config::{consumer_config, OffsetCommit};
use kafka::consumer::KafkaConsumer;
use kafka::rdkafka::message::{Headers, Message, OwnedMessage};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[allow(unused_imports)] // not every test binary reads records
pub use testkit::receive;
use testkit::{unique, TestDatabase, TestTopics};

pub struct TestApp {
    pub address: SocketAddr,
    pub http: reqwest::Client,
    pub database: TestDatabase,
    pub topics: TestTopics,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut transfers::TransfersArgs)) -> TestApp {
    // the API without tokens, said explicitly: the tests of authentication use
    // `spawn_app_with_auth`
    spawn_app_with_auth(web::AuthArgs::insecure(), configure).await
}

pub async fn spawn_app_with_auth(
    auth: web::AuthArgs,
    configure: impl FnOnce(&mut transfers::TransfersArgs),
) -> TestApp {
    testkit::init_logs();
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    let topics = TestTopics::plan(1).await;
    let mut args = transfers::TransfersArgs {
        listen: "127.0.0.1:0".parse().expect("address"),
        database_url: database.url.clone(),
        database_connections: 8,
        database_statement_timeout_ms: 30_000,
        database_lock_timeout_ms: 10_000,
        database_idle_in_transaction_timeout_ms: 180_000,
        database_acquire_timeout_ms: 10_000,
        idempotency_key_ttl_seconds: 86_400,
        outbox_retention_seconds: 86_400,
        outbox_max_pending: 100_000,
        idempotency_key_required: true,
    };
    configure(&mut args);
    let settings = transfers::Settings {
        args,
        auth,
        kafka: topics.args.clone(),
        topics: kafka::TopicArgs { partitions: 1, replicas: 1 },
        profile: kafka::Profile::Fast,
        metrics: telemetry::health::MetricsRoute::ServicePort,
        producer: None,
    };
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let address = transfers::start(
        settings,
        &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
    )
    .await
    .expect("service starts");
    TestApp { address, http: reqwest::Client::new(), database, topics, shutdown, tracker }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// POSTs `body` with `Idempotency-Key: key`, or a key of its own when `None` (the key is
    /// required by default).
    pub async fn post_transfer(&self, body: &Value, key: Option<&str>) -> reqwest::Response {
        let key = key.map_or_else(|| unique("key"), str::to_owned);
        self.post_transfer_with(body, Some(&key)).await
    }

    /// POSTs `body` with exactly the `Idempotency-Key` given: none when `None`.
    pub async fn post_transfer_with(&self, body: &Value, key: Option<&str>) -> reqwest::Response {
        let mut request = self.http.post(self.url("/transferencias")).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.expect("POST /transferencias")
    }

    pub async fn get_transfer(&self, id: &str) -> reqwest::Response {
        self.http.get(self.url(&format!("/transferencias/{id}"))).send().await.expect("GET")
    }

    pub async fn outbox_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_evento")
            .fetch_one(&self.database.pool)
            .await
            .expect("count")
    }

    /// A consumer of one of the test's topics, from the beginning.
    pub fn reader(&self, contract_topic: &str) -> Arc<KafkaConsumer> {
        let topic = self.topics.topic(contract_topic);
        kafka::consumer::subscribe(
            &consumer_config(
                &self.topics.args,
                "test-reader",
                &unique("reader"),
                OffsetCommit::StoredAfterHandling,
            ),
            &[&topic],
        )
        .expect("reader")
    }

    /// Waits for the service to stop after the test cancelled it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(Duration::from_secs(30), self.tracker.wait())
            .await
            .expect("service drains in 30 s");
    }
}

pub fn transfer(source: &str, destination: &str, cents: i64) -> Value {
    json!({"contaOrigem": source, "contaDestino": destination, "valorEmCentavos": cents, "moeda": "BRL"})
}

pub fn header(record: &OwnedMessage, name: &str) -> Option<String> {
    let headers = record.headers()?;
    let found = headers.iter().find(|header| header.key == name)?;
    found.value.map(|value| String::from_utf8_lossy(value).into_owned())
}

pub fn payload(record: &OwnedMessage) -> Value {
    serde_json::from_slice(record.payload().expect("payload")).expect("JSON payload")
}
