//! Benchmark of the ledger alone, both profiles side by side, against the local stack:
//!
//! ```sh
//! cargo run --release -p ledger --example ledger_bench -- [backlog_fast] [backlog_reference] [accounts]
//! ```
//!
//! For each profile (`fast`: one database transaction per poll batch; `reference`: one per
//! transfer, as the article) and each scenario, on a fresh database and fresh 12-partition
//! topics:
//! - *uniform*: transfers between random accounts among `accounts` (default 10 000);
//! - *hot*: every transfer credits the same account (the hot-row case).
//!
//! Funded accounts are loaded with SQL as real double entries (one deposit from the issuer
//! each), then the backlog of `TransferenciaAnalisada` records (default 50 000 for `fast`,
//! 2 000 for `reference`) is published keyed by source account, then one ledger instance
//! starts. Reports settlements per second from the first decision to the last (joining the
//! group is not counted), and until the outbox has published every outcome event. Checks the
//! ledger's invariants afterwards and fails if one is broken. One JSON line per run.

use std::time::{Duration, Instant};

use kafka::config::producer_config;
use kafka::producer::{OutgoingRecord, Producer};
use kafka::Profile;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use contracts::topics;
use testkit::{TestDatabase, TestTopics};

const FUNDS_CENTS: i64 = 1_000_000_000;

#[derive(Debug, Clone, Copy)]
enum Scenario {
    Uniform,
    Hot,
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let backlog_fast: usize =
        args.next().map_or(50_000, |text| text.parse().expect("backlog_fast: a number"));
    let backlog_reference: usize =
        args.next().map_or(2_000, |text| text.parse().expect("backlog_reference: a number"));
    let accounts: usize = args.next().map_or(10_000, |text| text.parse().expect("accounts: a number"));
    for scenario in [Scenario::Uniform, Scenario::Hot] {
        println!("{}", run(Profile::Fast, scenario, backlog_fast, accounts).await);
        println!("{}", run(Profile::Reference, scenario, backlog_reference, accounts).await);
    }
}

fn account(n: usize) -> String {
    format!("CC-{n:05}")
}

/// `accounts` accounts with [`FUNDS_CENTS`] each, every one a deposit from `EMISSOR-BRL` with
/// its two entries, so the books balance from the start.
async fn fund(pool: &PgPool, accounts: usize) {
    let mut transaction = pool.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO conta (id, saldo_centavos, moeda) \
         SELECT format('CC-%s', lpad(n::text, 5, '0')), $2, 'BRL' FROM generate_series(0, $1 - 1) AS n",
    )
    .bind(accounts as i64)
    .bind(FUNDS_CENTS)
    .execute(&mut *transaction)
    .await
    .expect("accounts");
    sqlx::query(
        "INSERT INTO conta (id, saldo_centavos, moeda, emissor) VALUES ('EMISSOR-BRL', $1, 'BRL', true)",
    )
    .bind(-(accounts as i64) * FUNDS_CENTS)
    .execute(&mut *transaction)
    .await
    .expect("issuer");
    for statement in [
        "INSERT INTO deposito (id, conta_id, valor_centavos) \
         SELECT gen_random_uuid(), id, saldo_centavos FROM conta WHERE NOT emissor",
        "INSERT INTO lancamento (transferencia_id, conta_id, tipo, valor_centavos) \
         SELECT id, 'EMISSOR-BRL', 'D', valor_centavos FROM deposito \
         UNION ALL SELECT id, conta_id, 'C', valor_centavos FROM deposito",
    ] {
        sqlx::query(statement).execute(&mut *transaction).await.expect("deposits");
    }
    transaction.commit().await.expect("commit");
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect("count")
}

async fn run(profile: Profile, scenario: Scenario, backlog: usize, accounts: usize) -> serde_json::Value {
    let database = TestDatabase::create(&ledger::MIGRATOR).await;
    let pool = &database.pool;
    fund(pool, accounts).await;
    let topics = TestTopics::plan(12).await;
    let input = topics.topic(topics::ANALYSED);
    let producer = Producer::new(&producer_config(&topics.args, "bench", Duration::ZERO)).expect("producer");
    let random = |below: usize| (Uuid::new_v4().as_u128() % below as u128) as usize;
    let records: Vec<OutgoingRecord> = (0..backlog)
        .map(|n| {
            let source = 1 + random(accounts - 1);
            let destination = match scenario {
                Scenario::Uniform => (source + 1 + random(accounts - 1)) % accounts,
                Scenario::Hot => 0,
            };
            let event = json!({
                "eventoId": Uuid::new_v4(), "transferenciaId": Uuid::new_v4(),
                "contaOrigem": account(source), "contaDestino": account(destination),
                "valorEmCentavos": 100 + n % 1_000, "moeda": "BRL", "score": 10,
                "analisadaEm": "2026-12-03T10:00:00Z"
            });
            OutgoingRecord::new(&input, account(source), event.to_string())
        })
        .collect();
    futures::future::try_join_all(records.iter().map(|record| producer.send(record))).await.expect("backlog");

    let settings = ledger::Settings {
        args: ledger::LedgerArgs {
            listen: "127.0.0.1:0".parse().expect("address"),
            database_url: database.url.clone(),
            database_connections: 8,
            database_statement_timeout_ms: 30_000,
            database_lock_timeout_ms: 10_000,
            database_idle_in_transaction_timeout_ms: 180_000,
            database_acquire_timeout_ms: 10_000,
            ledger_batch_records: 500,
            ledger_batch_wait_ms: 0,
            ledger_retry_initial_ms: 500,
            ledger_retry_max_ms: 15_000,
            ledger_retries: 5,
            outbox_retention_seconds: 86_400,
        },
        // no HTTP client here: the bench feeds Kafka
        auth: web::AuthArgs::insecure(),
        kafka: topics.args.clone(),
        topics: kafka::TopicArgs { partitions: 12, replicas: 1 },
        profile,
        metrics: telemetry::health::MetricsRoute::ServicePort,
        producer: None,
    };
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    ledger::start(settings, &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()))
        .await
        .expect("start");

    const DECIDED: &str = "SELECT count(*) FROM transferencia_processada";
    while count(pool, DECIDED).await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    let first = count(pool, DECIDED).await;
    while count(pool, DECIDED).await < backlog as i64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let settle_seconds = started.elapsed().as_secs_f64();
    while count(pool, "SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL").await > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let announce_seconds = started.elapsed().as_secs_f64();
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;

    let settled =
        count(pool, "SELECT count(*) FROM transferencia_processada WHERE resultado = 'LIQUIDADA'").await;
    let broken: Vec<String> = ledger::verify::ledger_invariants(pool)
        .await
        .expect("verify")
        .into_iter()
        .filter(|result| !result.is_clean())
        .map(|result| result.check.to_owned())
        .collect();
    assert!(broken.is_empty(), "broken invariants after the run: {broken:?}");
    let counted = (backlog as i64 - first) as f64;
    json!({
        "profile": format!("{profile:?}").to_lowercase(),
        "scenario": format!("{scenario:?}").to_lowercase(),
        "accounts": accounts,
        "backlog": backlog,
        "settled": settled,
        "settlements_per_s": (counted / settle_seconds).round(),
        "announced_per_s": (counted / announce_seconds).round(),
        "invariants": "clean",
    })
}
