//! `spawn_ledger()`: the real ledger service on port 0 with a database and topics of its own,
//! and the helpers its tests share.

#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kafka::config::{consumer_config, producer_config, OffsetCommit};
use kafka::consumer::KafkaConsumer;
use kafka::producer::{OutgoingRecord, Producer};
use kafka::rdkafka::message::{Headers, Message, OwnedMessage};
use serde_json::{json, Value};
use sqlx::{Connection, Executor, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use contracts::topics;
pub use testkit::receive;
use testkit::{unique, TestDatabase, TestTopics};

/// One running ledger service.
pub struct Instance {
    pub address: SocketAddr,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Instance {
    /// Stops the service and waits for it to drain.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(Duration::from_secs(30), self.tracker.wait())
            .await
            .expect("ledger drains in 30 s");
    }
}

/// A ledger database and topics of the test's own, and the ledger instances running on them.
pub struct TestLedger {
    pub database: TestDatabase,
    pub topics: TestTopics,
    pub http: reqwest::Client,
    pub instances: Vec<Instance>,
    producer: Producer,
    args: ledger::LedgerArgs,
    auth: web::AuthArgs,
    partitions: i32,
}

/// Options for tests: port 0, small pool, short retries (10 ms doubling, 3 retries).
pub fn test_args(database: &TestDatabase) -> ledger::LedgerArgs {
    ledger::LedgerArgs {
        listen: "127.0.0.1:0".parse().expect("address"),
        database_url: database.url.clone(),
        database_connections: 6,
        database_statement_timeout_ms: 30_000,
        database_lock_timeout_ms: 10_000,
        database_idle_in_transaction_timeout_ms: 180_000,
        database_acquire_timeout_ms: 10_000,
        ledger_batch_records: 500,
        ledger_batch_wait_ms: 0,
        ledger_retry_initial_ms: 10,
        ledger_retry_max_ms: 100,
        ledger_retries: 3,
        outbox_retention_seconds: 86_400,
    }
}

pub async fn spawn_ledger() -> TestLedger {
    spawn_ledger_with(1, |_| {}).await
}

/// A ledger on `partitions`-partition topics, configured by `configure`.
pub async fn spawn_ledger_with(
    partitions: i32,
    configure: impl FnOnce(&mut ledger::LedgerArgs),
) -> TestLedger {
    // the API without tokens, said explicitly: the tests of authentication pass tokens
    spawn_ledger_with_auth(partitions, web::AuthArgs::insecure(), configure).await
}

/// [`spawn_ledger_with`] with the given authentication.
pub async fn spawn_ledger_with_auth(
    partitions: i32,
    auth: web::AuthArgs,
    configure: impl FnOnce(&mut ledger::LedgerArgs),
) -> TestLedger {
    testkit::init_logs();
    let database = TestDatabase::create(&ledger::MIGRATOR).await;
    let topics = TestTopics::plan(partitions).await;
    let mut args = test_args(&database);
    configure(&mut args);
    let producer = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    let mut ledger = TestLedger {
        database,
        topics,
        http: reqwest::Client::new(),
        instances: Vec::new(),
        producer,
        args,
        auth,
        partitions,
    };
    ledger.start_instance().await;
    ledger
}

impl TestLedger {
    /// Starts one more instance in the same group on the same database.
    pub async fn start_instance(&mut self) -> &Instance {
        let settings = ledger::Settings {
            args: self.args.clone(),
            auth: self.auth.clone(),
            kafka: self.topics.args.clone(),
            topics: kafka::TopicArgs { partitions: self.partitions, replicas: 1 },
            profile: kafka::Profile::Fast,
            metrics: telemetry::health::MetricsRoute::ServicePort,
            producer: None,
        };
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let address = ledger::start(
            settings,
            &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
        )
        .await
        .expect("ledger starts");
        self.instances.push(Instance { address, shutdown, tracker });
        self.instances.last().expect("instance")
    }

    pub fn pool(&self) -> &PgPool {
        &self.database.pool
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.instances[0].address)
    }

    /// `POST /contas`; panics unless `201`.
    pub async fn create_account(&self, id: &str, currency: &str, opening_cents: i64) {
        let response = self
            .http
            .post(self.url("/contas"))
            .json(&json!({"id": id, "moeda": currency, "saldoInicialCentavos": opening_cents}))
            .send()
            .await
            .expect("POST /contas");
        assert_eq!(response.status(), 201, "{}", response.text().await.unwrap_or_default());
    }

    /// `POST /contas/{id}/depositos` with a new `depositoId`; panics unless `201`.
    pub async fn deposit(&self, account: &str, cents: i64) {
        let response = self
            .http
            .post(self.url(&format!("/contas/{account}/depositos")))
            .json(&json!({"depositoId": Uuid::new_v4(), "valorEmCentavos": cents}))
            .send()
            .await
            .expect("POST depositos");
        assert_eq!(response.status(), 201, "{}", response.text().await.unwrap_or_default());
    }

    /// The account's balance from the database.
    pub async fn balance(&self, account: &str) -> i64 {
        sqlx::query_scalar("SELECT saldo_centavos FROM conta WHERE id = $1")
            .bind(account)
            .fetch_one(self.pool())
            .await
            .expect("balance")
    }

    /// Every account's balance.
    pub async fn balances(&self) -> HashMap<String, i64> {
        sqlx::query_as::<_, (String, i64)>("SELECT id, saldo_centavos FROM conta")
            .fetch_all(self.pool())
            .await
            .expect("balances")
            .into_iter()
            .collect()
    }

    /// Publishes `payload` to the test's `transferencias.analisada` with key `key`.
    pub async fn publish(&self, key: &str, payload: impl Into<Vec<u8>>) {
        let record = OutgoingRecord::new(self.topics.topic(topics::ANALYSED), key, payload);
        self.producer.send(&record).await.expect("publish");
    }

    /// Publishes a `TransferenciaAnalisada` for `transfer_id` with a fresh `eventoId`.
    pub async fn publish_transfer(
        &self,
        transfer_id: Uuid,
        source: &str,
        destination: &str,
        cents: i64,
        currency: &str,
    ) {
        let event = analysed(transfer_id, source, destination, cents, currency);
        self.publish(source, event.to_string()).await;
    }

    /// The stored outcome of a transfer once decided: (`resultado`, `motivo`).
    pub async fn decided(&self, transfer_id: Uuid) -> (String, Option<String>) {
        testkit::eventually(&format!("transfer {transfer_id} decided"), testkit::PATIENCE, || async {
            ledger::store::outcome(self.pool(), transfer_id)
                .await
                .expect("outcome")
                .map(|outcome| (outcome.result().to_owned(), outcome.reason().map(str::to_owned)))
        })
        .await
    }

    /// Waits until the outbox has published every row.
    pub async fn outbox_drained(&self) {
        testkit::outbox_published(self.pool()).await;
    }

    /// Waits until the ledger has done everything it will do for the records published so far:
    /// its group has committed them all (so their dead letters are written) and its outbox has
    /// published every row (so their outcome events are written). What a topic lacks after
    /// this, the ledger never writes for those records: absence without a quiet time window.
    pub async fn caught_up(&self) {
        let group = self.topics.args.group(topics::groups::LEDGER);
        testkit::consumed(&self.topics.args, &group, &[self.topics.topic(topics::ANALYSED)]).await;
        self.outbox_drained().await;
    }

    /// How many records were ever written to the test's `contract_topic`.
    pub async fn written(&self, contract_topic: &str) -> i64 {
        testkit::records_written(&self.topics.args, &self.topics.topic(contract_topic)).await
    }

    /// A `read_committed` reader of one of the test's topics, from the beginning.
    pub fn reader(&self, contract_topic: &str) -> Arc<KafkaConsumer> {
        self.reader_of(&self.topics.topic(contract_topic))
    }

    pub fn reader_of(&self, topic: &str) -> Arc<KafkaConsumer> {
        kafka::consumer::subscribe(
            &consumer_config(
                &self.topics.args,
                "test-reader",
                &unique("reader"),
                OffsetCommit::StoredAfterHandling,
            ),
            &[topic],
        )
        .expect("reader")
    }

    /// `/metrics` of the first instance.
    /// Closes the test's database to new connections and ends the open ones: to the ledger, the
    /// database is gone.
    pub async fn close_database(&self) {
        let mut admin =
            PgConnection::connect(&testkit::admin_database_url()).await.expect("admin connection");
        let name = &self.database.name;
        admin
            .execute(format!(r#"ALTER DATABASE "{name}" ALLOW_CONNECTIONS false"#).as_str())
            .await
            .expect("close");
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(name)
            .execute(&mut admin)
            .await
            .expect("terminate");
    }

    /// Undoes [`Self::close_database`].
    pub async fn reopen_database(&self) {
        let mut admin =
            PgConnection::connect(&testkit::admin_database_url()).await.expect("admin connection");
        let name = &self.database.name;
        admin
            .execute(format!(r#"ALTER DATABASE "{name}" ALLOW_CONNECTIONS true"#).as_str())
            .await
            .expect("open");
    }

    pub async fn metrics(&self) -> String {
        self.http.get(self.url("/metrics")).send().await.expect("GET /metrics").text().await.expect("metrics")
    }

    /// The ledger's invariants 1–3: the broken checks and their breaks.
    pub async fn broken_invariants(&self) -> Vec<String> {
        broken_invariants(self.pool()).await
    }

    /// Panics, naming the breaks, unless invariants 1–3 hold.
    pub async fn assert_books_balance(&self) {
        let broken = self.broken_invariants().await;
        assert!(broken.is_empty(), "broken invariants: {broken:?}");
    }

    pub async fn stop(mut self) {
        for instance in std::mem::take(&mut self.instances) {
            instance.stop().await;
        }
    }
}

/// A `TransferenciaAnalisada` payload with a fresh `eventoId`.
pub fn analysed(transfer_id: Uuid, source: &str, destination: &str, cents: i64, currency: &str) -> Value {
    json!({
        "eventoId": Uuid::new_v4(), "transferenciaId": transfer_id, "contaOrigem": source,
        "contaDestino": destination, "valorEmCentavos": cents, "moeda": currency, "score": 10,
        "analisadaEm": "2026-12-03T10:00:00Z"
    })
}

pub fn header(record: &OwnedMessage, name: &str) -> Option<String> {
    let headers = record.headers()?;
    let found = headers.iter().find(|header| header.key == name)?;
    found.value.map(|value| String::from_utf8_lossy(value).into_owned())
}

pub fn payload(record: &OwnedMessage) -> Value {
    serde_json::from_slice(record.payload().expect("payload")).expect("JSON payload")
}

/// (`D` entries, `C` entries) of a transfer.
pub async fn entry_counts(pool: &PgPool, transfer_id: Uuid) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE tipo = 'D'), count(*) FILTER (WHERE tipo = 'C') FROM lancamento WHERE transferencia_id = $1",
    )
    .bind(transfer_id)
    .fetch_one(pool)
    .await
    .expect("entries")
}

/// The broken checks of invariants 1–3 in the ledger database `pool`, with their breaks.
pub async fn broken_invariants(pool: &PgPool) -> Vec<String> {
    ledger::verify::ledger_invariants(pool)
        .await
        .expect("verify")
        .into_iter()
        .filter(|result| !result.is_clean())
        .map(|result| format!("{}: {:?}", result.check, result.breaks))
        .collect()
}
