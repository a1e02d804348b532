//! Benchmark of the outbox relay alone, both profiles side by side, against the local stack:
//!
//! ```sh
//! cargo run --release -p outbox --example relay_bench -- [backlog_rows] [steady_seconds]
//! ```
//!
//! 1. *Backlog*: `backlog_rows` (default 20 000) pending rows, 1 000 keys, are drained by one
//!    relay; reports rows per second from start to the last mark.
//! 2. *Steady*: one row per transaction at 200 rows/s on an open-loop schedule for
//!    `steady_seconds` (default 15); reports the time from the row's commit (`criado_em`, the
//!    one-statement transaction's time) to its mark (`publicado_em`, set after the broker's ack),
//!    so an upper bound of commit-to-ack: p50, p99, max in ms.
//!
//! Each profile gets a fresh database and a fresh 12-partition topic. Prints one JSON line per
//! profile.

use std::time::{Duration, Instant};

use kafka::config::producer_config;
use kafka::producer::Producer;
use kafka::Profile;
use outbox::relay::{Relay, RelayOptions};
use testkit::{TestDatabase, TestTopics};
use tokio_util::sync::CancellationToken;

const RATE_PER_SECOND: u64 = 200;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let backlog_rows: i64 = args.next().map_or(20_000, |text| text.parse().expect("backlog_rows: a number"));
    let steady_seconds: u64 = args.next().map_or(15, |text| text.parse().expect("steady_seconds: a number"));
    for profile in [Profile::Fast, Profile::Reference] {
        let result = run(profile, backlog_rows, steady_seconds).await;
        println!("{result}");
    }
}

async fn pending(database: &TestDatabase) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL")
        .fetch_one(&database.pool)
        .await
        .expect("count")
}

async fn run(profile: Profile, backlog_rows: i64, steady_seconds: u64) -> serde_json::Value {
    let database = TestDatabase::create(&outbox::migrations::STANDALONE).await;
    let topics = TestTopics::create(&["bench"], 12).await;
    let topic = topics.topic("bench");
    let producer =
        Producer::new(&producer_config(&topics.args, "bench", profile.linger())).expect("producer");
    let options = RelayOptions::of(profile, "bench");

    // 1. backlog
    sqlx::query(
        "INSERT INTO outbox_evento (id, topico, chave, tipo, payload) \
         SELECT gen_random_uuid(), $1, 'CC-' || (n % 1000), 'TransferenciaSolicitada', \
                json_build_object('eventoId', gen_random_uuid(), 'transferenciaId', gen_random_uuid(), \
                  'contaOrigem', 'CC-' || (n % 1000), 'contaDestino', 'CC-' || ((n + 1) % 1000), \
                  'valorEmCentavos', n, 'moeda', 'BRL', 'criadaEm', now())::text \
         FROM generate_series(1, $2) AS n",
    )
    .bind(&topic)
    .bind(backlog_rows)
    .execute(&database.pool)
    .await
    .expect("backlog");
    let shutdown = CancellationToken::new();
    let relay =
        tokio::spawn(Relay::new(database.pool.clone(), producer.clone(), options).run(shutdown.clone()));
    let started = Instant::now();
    while pending(&database).await > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain_seconds = started.elapsed().as_secs_f64();

    // 2. steady 200/s, open loop: each insert is due at start + i/rate
    let total = RATE_PER_SECOND * steady_seconds;
    let steady_start = tokio::time::Instant::now();
    for i in 0..total {
        tokio::time::sleep_until(steady_start + Duration::from_micros(i * 1_000_000 / RATE_PER_SECOND)).await;
        sqlx::query(
            "INSERT INTO outbox_evento (id, topico, chave, tipo, payload) \
             VALUES (gen_random_uuid(), $1, $2, 'TransferenciaSolicitada', $3)",
        )
        .bind(&topic)
        .bind(format!("steady-{}", i % 1000))
        .bind(format!(r#"{{"n":{i}}}"#))
        .execute(&database.pool)
        .await
        .expect("insert");
    }
    while pending(&database).await > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (p50, p99, max): (f64, f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms) \
         FROM (SELECT (EXTRACT(EPOCH FROM publicado_em - criado_em) * 1000)::float8 AS ms \
               FROM outbox_evento WHERE chave LIKE 'steady-%') AS latency",
    )
    .fetch_one(&database.pool)
    .await
    .expect("percentiles");
    shutdown.cancel();
    relay.await.expect("relay stops");
    serde_json::json!({
        "profile": format!("{profile:?}").to_lowercase(),
        "backlog_rows": backlog_rows,
        "drain_rows_per_s": (backlog_rows as f64 / drain_seconds).round(),
        "steady_rate_per_s": RATE_PER_SECOND,
        "steady_rows": total,
        "commit_to_mark_ms": {"p50": (p50 * 10.0).round() / 10.0, "p99": (p99 * 10.0).round() / 10.0, "max": (max * 10.0).round() / 10.0},
    })
}
