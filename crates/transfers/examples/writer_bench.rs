//! Benchmark of the API's group commit alone (`transfers::writer`), against the local stack's
//! PostgreSQL, no HTTP and no Kafka:
//!
//! ```sh
//! cargo run --release -p transfers --example writer_bench -- [callers] [seconds]
//! ```
//!
//! `callers` (default 256) tasks each create transfers one after another through one
//! `Writer::batched`, every request with its own Idempotency-Key (as `pagamentos loadgen` sends
//! them), over 1 000 accounts, for `seconds` (default 15) after a 3 s warm-up, in a fresh
//! database. Prints one JSON line: transfers per second, the mean batch (transfers per commit in
//! the bench's database, which its own two statistics reads add to), and the machine's CPU
//! per transfer (every process's, from `/proc/stat`, so run it with nothing else busy): this
//! process's writer tasks and PostgreSQL's backends together.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::TestDatabase;
use transfers::domain::TransferRequest;
use transfers::store::{Created, EventTarget, IdempotencyKey, NewTransfer};
use transfers::writer::Writer;
use uuid::Uuid;

const ACCOUNTS: u64 = 1_000;
const WARM_UP: Duration = Duration::from_secs(3);

/// Busy and total clock ticks of the whole machine since boot (`/proc/stat`'s `cpu` line).
fn machine_ticks() -> (u64, u64) {
    use procfs::prelude::*;
    let cpu = procfs::KernelStats::current().expect("/proc/stat").total;
    let idle = cpu.idle + cpu.iowait.unwrap_or(0);
    let busy = cpu.user
        + cpu.nice
        + cpu.system
        + cpu.irq.unwrap_or(0)
        + cpu.softirq.unwrap_or(0)
        + cpu.steal.unwrap_or(0);
    (busy, busy + idle)
}

fn transfer(n: u64) -> NewTransfer {
    let source = n % ACCOUNTS;
    let request = TransferRequest::parse(&json!({
        "contaOrigem": format!("CC-{source:04}"),
        "contaDestino": format!("CC-{:04}", (source + 1) % ACCOUNTS),
        "valorEmCentavos": 1 + n % 10_000,
        "moeda": "BRL",
    }))
    .expect("a valid transfer");
    let key = Some(IdempotencyKey {
        scope: "anonimo".into(),
        key: Uuid::new_v4().to_string(),
        fingerprint: request.fingerprint(),
        ttl: Duration::from_secs(86_400),
    });
    let target =
        EventTarget { topic: Arc::from("bench.transferencias"), traceparent: None, tracestate: None };
    NewTransfer { request, key, target }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let callers: u64 = args.next().map_or(256, |text| text.parse().expect("callers: a number"));
    let seconds: u64 = args.next().map_or(15, |text| text.parse().expect("seconds: a number"));
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    let writer = Writer::batched(database.pool.clone(), outbox::Waker::default());
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (writer, counting, stop, created) =
                (writer.clone(), counting.clone(), stop.clone(), created.clone());
            tokio::spawn(async move {
                let mut n = caller;
                while !stop.load(Ordering::Relaxed) {
                    match writer.create(transfer(n)).await {
                        Ok(Created::New(_)) => {
                            if counting.load(Ordering::Relaxed) {
                                created.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(Created::Replayed(_)) => panic!("a fresh key was replayed"),
                        Err(error) => panic!("refused: {error}"),
                    }
                    n += callers;
                }
            })
        })
        .collect();
    tokio::time::sleep(WARM_UP).await;
    let batches_before = batches(&database).await;
    let (busy_before, total_before) = machine_ticks();
    let started = Instant::now();
    counting.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let (busy_after, total_after) = machine_ticks();
    let batches_after = batches(&database).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a caller panicked");
    }
    // the writer tasks end with the last clone, and give their connections back
    drop(writer);
    database.pool.close().await;
    let created = created.load(Ordering::Relaxed) as f64;
    let busy_seconds = (busy_after - busy_before) as f64 / procfs::ticks_per_second() as f64;
    let cores_busy = (busy_after - busy_before) as f64 / (total_after - total_before).max(1) as f64
        * std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    println!(
        "{}",
        json!({
            "callers": callers,
            "seconds": seconds,
            "transfers_per_s": (created / elapsed * 10.0).round() / 10.0,
            "mean_batch": ((created / (batches_after - batches_before).max(1) as f64) * 10.0).round() / 10.0,
            "machine_cpu_ms_per_transfer": (busy_seconds * 1000.0 / created.max(1.0) * 1000.0).round() / 1000.0,
            "cores_busy": (cores_busy * 100.0).round() / 100.0,
        })
    );
}

/// Committed transactions of the bench's database so far (`pg_stat_database.xact_commit`).
async fn batches(database: &TestDatabase) -> i64 {
    sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(&database.pool)
        .await
        .expect("pg_stat_database")
}
