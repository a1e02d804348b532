//! The chaos suite's bank workload: funded accounts, a careful client offering transfers on
//! both deployments until each is answered, and Jepsen's bank reads while the faults run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub const ACCOUNTS: usize = 12;
pub const OPENING_CENTS: i64 = 1_000_000;
/// Transfers offered per second while faults are injected.
const RATE_PER_S: u64 = 40;
/// How long one POST is retried before the client gives up on it.
const POST_PATIENCE: Duration = Duration::from_secs(240);
/// antifraude's default limit: transfers of this amount or more are blocked.
const BLOCKED_CENTS: i64 = antifraud::scoring::DEFAULT_BLOCK_THRESHOLD_CENTS.get();

/// Jepsen's bank reads, while the faults run: every customer balance read in one snapshot.
#[derive(Default)]
pub struct BankReads {
    pub reads: AtomicU64,
    /// Reads that could not be made (the database restarting): not violations.
    pub unavailable: AtomicU64,
    pub violations: Mutex<Vec<String>>,
}

impl BankReads {
    /// Reads until `stop`, a read every 200 ms.
    pub async fn run(self: Arc<Self>, pool: sqlx::PgPool, stop: CancellationToken) {
        let expected = ACCOUNTS as i64 * OPENING_CENTS;
        while !stop.is_cancelled() {
            // one statement: one snapshot of every balance
            let read: Result<Vec<(String, i64)>, _> =
                sqlx::query_as("SELECT id, saldo_centavos FROM conta WHERE NOT emissor ORDER BY id")
                    .fetch_all(&pool)
                    .await;
            match read {
                Ok(balances) => {
                    self.reads.fetch_add(1, Ordering::Relaxed);
                    let sum: i64 = balances.iter().map(|(_, cents)| cents).sum();
                    let negative: Vec<&(String, i64)> =
                        balances.iter().filter(|(_, cents)| *cents < 0).collect();
                    if balances.len() != ACCOUNTS || sum != expected || !negative.is_empty() {
                        self.violations.lock().expect("lock").push(format!(
                            "{} accounts, Σ {sum} (expected {expected}), negative {negative:?}",
                            balances.len()
                        ));
                    }
                }
                Err(_) => {
                    self.unavailable.fetch_add(1, Ordering::Relaxed);
                }
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}

/// What the client saw.
#[derive(Default)]
pub struct Client {
    /// Transfer ids answered `202`.
    pub accepted: Mutex<Vec<String>>,
    /// What was asked of each accepted transfer: (source, destination, cents).
    pub requested: Mutex<HashMap<String, (String, String, i64)>>,
    /// Answers that were neither `202` nor worth retrying, and POSTs given up on.
    pub failed: Mutex<Vec<String>>,
    pub posts: AtomicU64,
    pub retries: AtomicU64,
}

impl Client {
    /// POSTs one transfer with its own `Idempotency-Key` until it is answered, alternating
    /// between the two deployments' APIs.
    async fn transfer(&self, http: &reqwest::Client, apis: &[String; 2], body: Value) {
        self.posts.fetch_add(1, Ordering::Relaxed);
        let key = uuid::Uuid::new_v4().to_string();
        let started = Instant::now();
        for attempt in 0usize.. {
            if attempt > 0 {
                self.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            if started.elapsed() > POST_PATIENCE {
                self.failed.lock().expect("lock").push(format!("key {key}: no answer in {POST_PATIENCE:?}"));
                return;
            }
            let url = &apis[attempt % 2];
            let sent = http.post(url).header("Idempotency-Key", &key).json(&body).send().await;
            let Ok(response) = sent else { continue }; // refused, reset or timed out: retry
            let status = response.status().as_u16();
            match status {
                202 => {
                    let answer: Value = match response.json().await {
                        Ok(answer) => answer,
                        Err(_) => continue, // cut off mid-body: ask again
                    };
                    let id = answer["id"].as_str().expect("the transfer's id").to_owned();
                    let asked = (
                        body["contaOrigem"].as_str().expect("source").to_owned(),
                        body["contaDestino"].as_str().expect("destination").to_owned(),
                        body["valorEmCentavos"].as_i64().expect("cents"),
                    );
                    self.requested.lock().expect("lock").insert(id.clone(), asked);
                    self.accepted.lock().expect("lock").push(id);
                    return;
                }
                // in flight elsewhere (the other deployment, or a frozen one), the database
                // unreachable, a process going down
                409 | 500 | 502 | 503 => continue,
                _ => {
                    let text = response.text().await.unwrap_or_default();
                    self.failed.lock().expect("lock").push(format!("key {key}: {status} {text}"));
                    return;
                }
            }
        }
    }
}

/// Offers transfers at [`RATE_PER_S`] until `stop`, drawn from `seed`; each POST runs on
/// `tracker`.
pub async fn drive(
    client: Arc<Client>,
    http: reqwest::Client,
    apis: [String; 2],
    stop: CancellationToken,
    tracker: TaskTracker,
    seed: u64,
) {
    let apis = Arc::new(apis);
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_S));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.is_cancelled() {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let from = rng.random_range(0..ACCOUNTS);
        let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
        // a few are blocked by antifraude, a few find too little money; most settle
        let cents = if rng.random_bool(0.04) {
            rng.random_range(BLOCKED_CENTS..BLOCKED_CENTS * 2)
        } else {
            rng.random_range(1..=OPENING_CENTS / 10)
        };
        let body = json!({
            "contaOrigem": account(from), "contaDestino": account(to), "valorEmCentavos": cents, "moeda": "BRL"
        });
        let (client, http, apis) = (client.clone(), http.clone(), apis.clone());
        tracker.spawn(async move { client.transfer(&http, &apis, body).await });
    }
}

pub fn account(n: usize) -> String {
    format!("CHAOS-{n:02}")
}
