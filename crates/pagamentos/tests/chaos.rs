//! The chaos suite: the bank workload under faults, judged the way Jepsen's bank test judges a
//! database. Transfers flow continuously through the HTTP API over a fixed set of funded
//! accounts, served by two deployments that share the databases and topics: `pagamentos all`
//! (deployment A) and the four services as separate processes (deployment B). One fault after
//! another, with traffic in between:
//!
//! 1. SIGKILL of each of B's services (antifraude, ledger, transferencias, notificacoes), each
//!    started again a moment later, then SIGKILL of A (`pagamentos all`), started again;
//! 2. `scripts/stack restart kafka`, then `scripts/stack restart postgres`;
//! 3. SIGSTOP of A for longer than the group session timeout (its partitions move to B; A wakes
//!    up a zombie, holding batches and transactions of partitions it no longer owns), SIGCONT.
//!
//! The client is a careful one: every POST carries an `Idempotency-Key` and is retried, on
//! either deployment, until it is answered (a killed API, a request in flight elsewhere, a
//! database restart). Afterwards the pipeline drains and the test checks: every accepted
//! transfer is final; the database holds no transfer the client was not told about; no transfer
//! moved money twice; antifraude produced one output per request record (exactly-once through
//! its Kafka transactions); Σ balances of the accounts is what was paid in; `pagamentos verify` is clean;
//! every outcome was notified; the dead-letter topics are empty. Its figures are its last line.
//!
//! A second test runs the same workload on a three-broker cluster of its own (replication 3,
//! `min.insync.replicas` 2) and SIGKILLs each broker in turn under load. A third runs it on such
//! a cluster whose nodes each live in a network namespace of their own ([`Network`]) and cuts
//! one node off the network, twice, each time for longer than the session and transaction
//! timeouts: first the active controller from the other two nodes only (its quorum traffic and
//! replication; clients still reach it), then the broker leading the most partitions from
//! everyone. Each cut is proven real (the others elect a new controller when it was one, and
//! drop the node from leadership and every ISR) and healed; the node must be back in every
//! ISR and both deployments ready again before the schedule goes on.
//!
//! Faults also combine: `pause-all+restart-kafka` restarts the broker while A is frozen, so A
//! wakes up to a broker that has forgotten its sessions and transactions as well as its
//! partitions.
//!
//! While the faults run, a reader reads every customer balance in one snapshot, over and over
//! (Jepsen's bank reads): every read must show Σ conserved and no negative balance. Since the
//! set of accounts is closed, Σ cannot see a transfer applied twice between two of them, so
//! afterwards every settled transfer is also checked entry by entry: one debit of the requested
//! amount on the requested source, one credit on the requested destination.
//!
//! **Seeded**: the order of the faults in each round, the traffic between them, how long a fault
//! lasts, which part a combined fault restarts, and the transfers offered are all drawn from one
//! seed, printed at the start, in the figures and on failure. `PAGAMENTOS_CHAOS_SEED=<n>` replays
//! the same schedule (the systems' own timing is not replayable: the seed fixes what is done and
//! when, not how the processes interleave).
//!
//! They restart the shared broker and database or start a cluster, so they are `#[ignore]`d and
//! run alone by `scripts/test`. `PAGAMENTOS_CHAOS_ROUNDS=N` runs the fault schedule N times (a soak run);
//! `PAGAMENTOS_CHAOS_FAULTS=pause-all,restart-kafka` runs only the faults named, in that order
//! (see [`Fault`]).

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka::rdkafka::message::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use common::system::{free_port, System};
use contracts::topics;
use testkit::webhook::Receiver;

const ACCOUNTS: usize = 12;
const OPENING_CENTS: i64 = 1_000_000;
/// Transfers offered per second while faults are injected.
const RATE_PER_S: u64 = 40;
/// Traffic between two faults: drawn from this range.
const BETWEEN_FAULTS_MS: std::ops::Range<u64> = 2_000..6_000;
/// Longer than the group session timeout (the stack's `group.consumer.session.timeout.ms` and
/// the classic `session.timeout.ms` the services set: 10 s) and antifraude's
/// `transaction.timeout.ms` (10 s), so the paused instance is fenced on both counts.
const PAUSE: Duration = Duration::from_secs(20);
/// A pause lasts [`PAUSE`] plus up to this much, drawn.
const PAUSE_EXTRA_MS: u64 = 5_000;
/// How long a killed Kafka node of a cluster stays down.
const BROKER_DOWN: Duration = Duration::from_secs(8);
/// How long a Kafka node stays cut off: longer than the group session timeout and
/// antifraude's transaction timeout (10 s each), the brokers' registration with the controller
/// (`broker.session.timeout.ms`, 9 s) and the time a follower may lag before its leader drops
/// it from the ISR (`replica.lag.time.max.ms`, 30 s).
const PARTITION: Duration = Duration::from_secs(32);
/// A partition lasts [`PARTITION`] plus up to this much, drawn.
const PARTITION_EXTRA_MS: u64 = 4_000;
/// From the heal, how long the cluster has to take the node back into every ISR, and the
/// deployments to be ready again.
const PARTITION_RECOVERY: Duration = Duration::from_secs(120);
/// How long one POST is retried before the client gives up on it.
const POST_PATIENCE: Duration = Duration::from_secs(240);
/// From the end of the traffic, how long the pipeline has to make every transfer final.
const DRAIN: Duration = Duration::from_secs(240);
/// antifraude's default limit: transfers of this amount or more are blocked.
const BLOCKED_CENTS: i64 = antifraud::scoring::DEFAULT_BLOCK_THRESHOLD_CENTS;

/// One process of a deployment.
struct Service {
    name: &'static str,
    subcommand: &'static str,
    /// Its own environment on top of the system's.
    env: Vec<(&'static str, String)>,
    /// Its HTTP ports, all answering `/readyz` once it is up.
    ports: Vec<u16>,
    child: Option<Child>,
}

impl Service {
    async fn start(&mut self, system: &System, logs: &Path) {
        let mut command = common::service(&system.topics, self.subcommand);
        system.env(&mut command);
        command.envs(self.env.iter().map(|(key, value)| (*key, value.as_str())));
        // warnings and errors of every run of the process, for a failure's post-mortem
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{}.log", self.subcommand)))
            .expect("log file");
        command.stderr(Stdio::from(log)).env("RUST_LOG", "warn,kafka=info");
        self.child = Some(command.spawn().unwrap_or_else(|error| panic!("start {}: {error}", self.name)));
        self.ready(Duration::from_secs(90)).await;
    }

    /// Waits until every one of its ports answers `/readyz` with success.
    async fn ready(&self, within: Duration) {
        // a probe that hangs (a service waiting on a cut-off broker) counts as not ready
        let probe = common::system::admin_client(Some(Duration::from_secs(5)));
        for port in &self.ports {
            let url = format!("http://127.0.0.1:{port}/readyz");
            testkit::eventually(&format!("{} ready ({url})", self.name), within, || async {
                let response = probe.get(&url).send().await.ok()?;
                response.status().is_success().then_some(())
            })
            .await;
        }
    }

    fn pid(&self) -> String {
        let child = self.child.as_ref().unwrap_or_else(|| panic!("{} is not running", self.name));
        child.id().unwrap_or_else(|| panic!("{} has exited", self.name)).to_string()
    }

    async fn kill(&mut self) {
        let mut child = self.child.take().unwrap_or_else(|| panic!("{} is not running", self.name));
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("reap");
    }

    async fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.pid()]).status().await.expect("kill");
        assert!(status.success(), "kill {signal} {}", self.name);
    }
}

/// Deployment A (`pagamentos all` on the system's ports) and B (one process per service).
fn deployments(webhook: &str) -> (Service, Vec<Service>) {
    let webhook = ("NOTIFICACOES_WEBHOOK_URL", webhook.to_owned());
    let a = Service {
        name: "A: pagamentos all",
        subcommand: "all",
        env: vec![("PAGAMENTOS_INSTANCE_ID", testkit::unique("chaos-a")), webhook.clone()],
        ports: Vec::new(), // the system's, filled in by the caller
        child: None,
    };
    let instance = testkit::unique("chaos-b");
    let b = [
        ("B: transferencias", "transferencias", "TRANSFERENCIAS_LISTEN"),
        ("B: ledger", "ledger", "LEDGER_LISTEN"),
        ("B: antifraude", "antifraude", "ANTIFRAUDE_LISTEN"),
        ("B: notificacoes", "notificacoes", "NOTIFICACOES_LISTEN"),
    ]
    .into_iter()
    .map(|(name, subcommand, listen)| {
        let port = free_port();
        Service {
            name,
            subcommand,
            env: vec![
                (listen, format!("127.0.0.1:{port}")),
                ("PAGAMENTOS_INSTANCE_ID", instance.clone()),
                webhook.clone(),
            ],
            ports: vec![port],
            child: None,
        }
    })
    .collect();
    (a, b)
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL of B's service (0 transferencias, 1 ledger, 2 antifraude, 3 notificacoes) or of
    /// A (4), started again a second later.
    Kill(usize),
    /// `scripts/stack restart <part>`.
    Restart(&'static str),
    /// SIGSTOP of A for [`PAUSE`] or a little more, then SIGCONT.
    Pause,
    /// SIGSTOP of A, `scripts/stack restart <part>` while it is frozen, SIGCONT after the pause.
    PauseDuringRestart(&'static str),
    /// SIGKILL of Kafka node n (1–3) of a [`Cluster`], started again after [`BROKER_DOWN`].
    KillBroker(usize),
    /// A network partition of one Kafka node of a [`Cluster`] in network namespaces, for
    /// [`PARTITION`] or a little more, then healed.
    Partition(Isolated, Cut),
}

/// Which node a [`Fault::Partition`] cuts off, chosen when the fault starts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Isolated {
    /// The active controller (the KRaft quorum's leader).
    Controller,
    /// Of the other nodes, the one that leads the most partitions: a broker, not the controller.
    Broker,
}

/// Whom a [`Fault::Partition`] cuts the node from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    /// From the other nodes only: its controller quorum traffic and its replication are cut,
    /// clients still reach it (and it answers them from what it last knew).
    Brokers,
    /// From the other nodes and from every client: a node off the network.
    Everyone,
}

impl Fault {
    const ALL: [(&'static str, Fault); 10] = [
        ("kill-antifraude", Fault::Kill(2)),
        ("kill-ledger", Fault::Kill(1)),
        ("kill-transferencias", Fault::Kill(0)),
        ("kill-notificacoes", Fault::Kill(3)),
        ("kill-all", Fault::Kill(4)),
        ("restart-kafka", Fault::Restart("kafka")),
        ("restart-postgres", Fault::Restart("postgres")),
        ("pause-all", Fault::Pause),
        ("pause-all+restart-kafka", Fault::PauseDuringRestart("kafka")),
        ("pause-all+restart-postgres", Fault::PauseDuringRestart("postgres")),
    ];

    /// The default schedule: every single fault, and one combined fault whose restarted part
    /// the seed draws (both would add a minute to every run).
    fn default_schedule(rng: &mut StdRng) -> Vec<Fault> {
        let combined = if rng.random_bool(0.5) { "kafka" } else { "postgres" };
        Self::ALL
            .iter()
            .map(|(_, fault)| *fault)
            .filter(|fault| match fault {
                Fault::PauseDuringRestart(part) => *part == combined,
                _ => true,
            })
            .collect()
    }

    /// The faults named in `PAGAMENTOS_CHAOS_FAULTS` (comma-separated, in the order given), to
    /// reproduce one; `None` when unset.
    fn named() -> Option<Vec<Fault>> {
        let names = std::env::var("PAGAMENTOS_CHAOS_FAULTS").ok()?;
        names
            .split(',')
            .map(|name| {
                Self::ALL
                    .iter()
                    .find(|(known, _)| *known == name.trim())
                    .map(|(_, fault)| *fault)
                    .unwrap_or_else(|| {
                        let known: Vec<&str> = Self::ALL.iter().map(|(known, _)| *known).collect();
                        panic!("PAGAMENTOS_CHAOS_FAULTS: unknown fault {name:?}; known: {}", known.join(", "))
                    })
            })
            .collect::<Vec<_>>()
            .into()
    }

    fn describe(&self) -> String {
        match self {
            Fault::Kill(4) => "SIGKILL A: pagamentos all".into(),
            Fault::Kill(service) => {
                format!("SIGKILL B: {}", ["transferencias", "ledger", "antifraude", "notificacoes"][*service])
            }
            Fault::Restart(part) => format!("scripts/stack restart {part}"),
            Fault::Pause => "SIGSTOP A (pagamentos all)".into(),
            Fault::PauseDuringRestart(part) => {
                format!("SIGSTOP A, scripts/stack restart {part} while it is frozen")
            }
            Fault::KillBroker(node) => format!("SIGKILL of Kafka node {node}"),
            Fault::Partition(isolated, cut) => format!(
                "network partition: {} cut from {}",
                match isolated {
                    Isolated::Controller => "the active controller",
                    Isolated::Broker => "the node (not the controller) leading the most partitions",
                },
                match cut {
                    Cut::Brokers => "the other nodes (clients still reach it)",
                    Cut::Everyone => "the other nodes and every client",
                }
            ),
        }
    }
}

/// One step of a drawn schedule: traffic for `traffic_before`, then `fault`, which lasts `hold`
/// (how long a killed process or broker stays down, or a frozen one frozen).
#[derive(Debug, Clone, Copy)]
struct Step {
    traffic_before: Duration,
    fault: Fault,
    hold: Duration,
}

/// The run's seed: `PAGAMENTOS_CHAOS_SEED`, or drawn.
fn seed() -> u64 {
    match std::env::var("PAGAMENTOS_CHAOS_SEED") {
        Ok(text) => text.trim().parse().expect("PAGAMENTOS_CHAOS_SEED: a number (u64)"),
        Err(_) => rand::rng().random(),
    }
}

/// The schedule of `rounds` rounds drawn from `seed`: `faults` (or, when `None`, the default
/// faults in an order drawn per round), the traffic between them and how long each lasts.
fn draw_schedule(seed: u64, faults: Option<&[Fault]>, rounds: usize) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    for _ in 0..rounds {
        let round = match faults {
            Some(faults) => faults.to_vec(),
            None => {
                let mut round = Fault::default_schedule(&mut rng);
                rand::seq::SliceRandom::shuffle(round.as_mut_slice(), &mut rng);
                round
            }
        };
        for fault in round {
            let traffic_before = Duration::from_millis(rng.random_range(BETWEEN_FAULTS_MS));
            let hold = match fault {
                Fault::Kill(_) => Duration::from_millis(rng.random_range(200..2_000)),
                Fault::KillBroker(_) => BROKER_DOWN + Duration::from_millis(rng.random_range(0..2_000)),
                Fault::Partition(..) => {
                    PARTITION + Duration::from_millis(rng.random_range(0..PARTITION_EXTRA_MS))
                }
                Fault::Pause | Fault::PauseDuringRestart(_) => {
                    PAUSE + Duration::from_millis(rng.random_range(0..PAUSE_EXTRA_MS))
                }
                Fault::Restart(_) => Duration::ZERO,
            };
            steps.push(Step { traffic_before, fault, hold });
        }
    }
    steps
}

/// Prints the seed again when the test fails, next to the panic, with how to replay it.
struct SeedOnFailure(u64);

impl Drop for SeedOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("[chaos] FAILED with seed {0}: replay with PAGAMENTOS_CHAOS_SEED={0}", self.0);
        }
    }
}

/// Jepsen's bank reads, while the faults run: every customer balance read in one snapshot.
#[derive(Default)]
struct BankReads {
    reads: AtomicU64,
    /// Reads that could not be made (the database restarting): not violations.
    unavailable: AtomicU64,
    violations: Mutex<Vec<String>>,
}

impl BankReads {
    /// Reads until `stop`, a read every 200 ms.
    async fn run(self: Arc<Self>, pool: sqlx::PgPool, stop: CancellationToken) {
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
struct Client {
    /// Transfer ids answered `202`.
    accepted: Mutex<Vec<String>>,
    /// What was asked of each accepted transfer: (source, destination, cents).
    requested: Mutex<HashMap<String, (String, String, i64)>>,
    /// Answers that were neither `202` nor worth retrying, and POSTs given up on.
    failed: Mutex<Vec<String>>,
    posts: AtomicU64,
    retries: AtomicU64,
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
async fn drive(
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

fn account(n: usize) -> String {
    format!("CHAOS-{n:02}")
}

/// Every record on `topics` (read_committed), read to the end of every partition (librdkafka's
/// partition EOF, which under read_committed is the last stable offset), once both outboxes
/// have published everything: its payload, plus where it was (`_at`: topic/partition/offset).
/// No quiet time window decides that the reading is over.
async fn read_all(system: &System, topics: &[String]) -> Vec<Value> {
    const UNPUBLISHED: &str = "SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL";
    testkit::eventually("both outboxes published", Duration::from_secs(120), || async {
        let mut left = 0i64;
        for pool in [&system.transfers_db.pool, &system.ledger_db.pool] {
            left += sqlx::query_scalar::<_, i64>(UNPUBLISHED).fetch_one(pool).await.ok()?;
        }
        (left == 0).then_some(())
    })
    .await;
    let mut records = Vec::new();
    for topic in topics {
        for record in testkit::read_to_end(&system.topics.args, topic).await {
            let payload = record.payload().unwrap_or_default();
            let mut value: Value = serde_json::from_slice(payload)
                .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(payload)}));
            value["_at"] = json!(format!("{}/{}/{}", record.topic(), record.partition(), record.offset()));
            records.push(value);
        }
    }
    records
}

/// Where the lost transfers stopped: published by the relay? analysed? decided by the ledger?
/// its outcome published?
async fn diagnose(system: &System, lost: &[&String], analysed: &HashMap<String, usize>) {
    let ids: Vec<uuid::Uuid> = lost.iter().map(|id| id.parse().expect("uuid")).collect();
    async fn count(pool: &sqlx::PgPool, sql: &str, ids: &[uuid::Uuid]) -> i64 {
        sqlx::query_scalar(sql).bind(ids).fetch_one(pool).await.expect(sql)
    }
    const UNPUBLISHED: &str = "SELECT count(*) FROM outbox_evento \
        WHERE publicado_em IS NULL AND (payload::jsonb->>'transferenciaId')::uuid = ANY($1)";
    let unpublished = count(&system.transfers_db.pool, UNPUBLISHED, &ids).await;
    let decided = count(
        &system.ledger_db.pool,
        "SELECT count(*) FROM transferencia_processada WHERE transferencia_id = ANY($1)",
        &ids,
    )
    .await;
    let outcome_unpublished = count(&system.ledger_db.pool, UNPUBLISHED, &ids).await;
    let was_analysed = lost.iter().filter(|id| analysed.contains_key(**id)).count();
    eprintln!(
        "[chaos] {} lost: request unpublished {unpublished}, analysed {was_analysed}, decided by the ledger {decided}, \
         outcome unpublished {outcome_unpublished}; first: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}

/// The threads' stacks of `process` into the log directory (when gdb is installed): where a
/// stuck loop waits.
async fn dump_stacks(process: &Service, logs: &Path) {
    let file = logs.join(format!("{}.stacks", process.subcommand));
    let output = Command::new("gdb")
        .args(["-batch", "-ex", "thread apply all bt", "-p", &process.pid()])
        .stdin(Stdio::null())
        .output()
        .await;
    if let Ok(output) = output {
        if std::fs::write(&file, &output.stdout).is_ok() {
            eprintln!("[chaos] stacks of {} in {}", process.name, file.display());
        }
    }
}

/// `PAGAMENTOS_CHAOS_ROUNDS`, default 1.
fn rounds() -> usize {
    std::env::var("PAGAMENTOS_CHAOS_ROUNDS").ok().map_or(1, |text| {
        text.parse().ok().filter(|rounds| *rounds > 0).expect("PAGAMENTOS_CHAOS_ROUNDS: a positive number")
    })
}

/// The same seed draws the same schedule; another seed another one; every round holds each
/// single fault once and one combined fault.
#[test]
fn a_seed_replays_its_schedule() {
    let describe = |steps: &[Step]| -> Vec<String> {
        steps
            .iter()
            .map(|step| format!("{:?} {:?} {:?}", step.traffic_before, step.fault, step.hold))
            .collect()
    };
    let first = draw_schedule(42, None, 3);
    assert_eq!(describe(&first), describe(&draw_schedule(42, None, 3)));
    assert_ne!(describe(&first), describe(&draw_schedule(43, None, 3)));
    for round in first.chunks(first.len() / 3) {
        let combined = round.iter().filter(|step| matches!(step.fault, Fault::PauseDuringRestart(_))).count();
        assert_eq!(combined, 1, "{:?}", describe(round));
        for (_, fault) in
            Fault::ALL.iter().filter(|(_, fault)| !matches!(fault, Fault::PauseDuringRestart(_)))
        {
            assert_eq!(
                round.iter().filter(|step| step.fault == *fault).count(),
                1,
                "{fault:?} in {:?}",
                describe(round)
            );
        }
    }
    // named faults keep their order
    let named = [Fault::Pause, Fault::Kill(1)];
    let steps = draw_schedule(7, Some(&named), 2);
    let order: Vec<Fault> = steps.iter().map(|step| step.fault).collect();
    assert_eq!(order, [Fault::Pause, Fault::Kill(1), Fault::Pause, Fault::Kill(1)]);
}

#[tokio::test]
#[ignore = "restarts the shared broker and database: scripts/test runs it alone"]
async fn money_is_neither_lost_nor_doubled_through_crashes_restarts_and_pauses() {
    let system = System::new().await;
    bank_under_faults(&system, Fault::named().as_deref(), rounds(), None).await;
}

#[tokio::test]
#[ignore = "starts a three-broker Kafka cluster of its own: scripts/test runs it alone"]
async fn with_three_brokers_killing_any_one_under_load_loses_nothing() {
    let cluster = Cluster::up().await;
    let mut args = testkit::kafka_args();
    args.bootstrap_servers = cluster.bootstrap.clone();
    // declared after the cluster, so dropped before it: its topics are deleted while it runs
    let system = System::on_kafka(args, 3).await;
    let schedule = [Fault::KillBroker(2), Fault::KillBroker(1), Fault::KillBroker(3)];
    bank_under_faults(&system, Some(&schedule), rounds(), Some(&cluster)).await;
}

#[tokio::test]
#[ignore = "starts a three-broker Kafka cluster of its own in network namespaces: scripts/test runs it alone"]
async fn with_three_brokers_partitioning_one_from_the_others_loses_nothing() {
    let cluster = Cluster::up_in_namespaces().await;
    let mut args = testkit::kafka_args();
    args.bootstrap_servers = cluster.bootstrap.clone();
    // declared after the cluster, so dropped before it: its topics are deleted while it runs
    let system = System::on_kafka(args, 3).await;
    let schedule = [
        Fault::Partition(Isolated::Controller, Cut::Brokers),
        Fault::Partition(Isolated::Broker, Cut::Everyone),
    ];
    bank_under_faults(&system, Some(&schedule), rounds(), Some(&cluster)).await;
}

/// A Kafka cluster of three broker+controller nodes of the test's own (`scripts/stack up kafka
/// --brokers 3` with its own state directory and ports), beside the shared stack; stopped and
/// wiped when dropped (and before it starts, should an earlier run have left one behind). With
/// a [`Network`], each node runs in a network namespace of its own, on an address of its own.
struct Cluster {
    state: PathBuf,
    base_port: u16,
    bootstrap: String,
    /// Dropped after the cluster is stopped (the fields after `Drop::drop`).
    network: Option<Network>,
}

impl Cluster {
    const BASE_PORT: u16 = 19_092;
    const NETNS_BASE_PORT: u16 = 29_092;

    async fn up() -> Self {
        let cluster = Self {
            bootstrap: (0..3)
                .map(|n| format!("127.0.0.1:{}", Self::BASE_PORT + 2 * n))
                .collect::<Vec<_>>()
                .join(","),
            state: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos-cluster3"),
            base_port: Self::BASE_PORT,
            network: None,
        };
        cluster.stop_and_wipe();
        cluster.stack(&["up", "kafka", "--brokers", "3"]).await;
        cluster
    }

    /// The cluster with each node in a network namespace of its own ([`Network`]).
    async fn up_in_namespaces() -> Self {
        let mut cluster = Self {
            bootstrap: (1..=3)
                .map(|n| format!("{}:{}", Network::address(n), Self::NETNS_BASE_PORT as usize + 2 * (n - 1)))
                .collect::<Vec<_>>()
                .join(","),
            state: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos-cluster3-netns"),
            base_port: Self::NETNS_BASE_PORT,
            network: None,
        };
        // an earlier run's nodes first (they hold its namespaces), then its namespaces
        cluster.stop_and_wipe();
        cluster.network = Some(Network::create());
        cluster.stack(&["up", "kafka", "--brokers", "3"]).await;
        cluster
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command =
            std::process::Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/stack"));
        command
            .args(args)
            .env("PAGAMENTOS_STACK_DIR", &self.state)
            .env("KAFKA_BROKER_PORT", self.base_port.to_string());
        if self.network.is_some() {
            let addresses: Vec<String> = (1..=3).map(Network::address).collect();
            let namespaces: Vec<String> = (1..=3).map(Network::node_namespace).collect();
            command
                .env("KAFKA_NODE_ADDRESSES", addresses.join(","))
                .env("KAFKA_NODE_NETNS", namespaces.join(","));
        }
        command
    }

    /// `scripts/stack <args>` on this cluster.
    async fn stack(&self, args: &[&str]) {
        let mut command = self.command(args);
        let status = tokio::task::spawn_blocking(move || command.status())
            .await
            .expect("join")
            .expect("run scripts/stack");
        assert!(status.success(), "scripts/stack {args:?} on the cluster failed");
    }

    fn stop_and_wipe(&self) {
        if let Some(network) = &self.network {
            network.heal_all(); // a node cut off would wait for its controller before stopping
        }
        if self.state.exists() {
            let _ = self.command(&["down", "kafka"]).status();
            let _ = std::fs::remove_dir_all(&self.state);
        }
    }

    /// SIGKILL of node `n` (1–3): no controlled shutdown, as when a machine dies.
    async fn kill(&self, n: usize) {
        let pid_file = self.state.join(format!("kafka-cluster/node-{n}/broker.pid"));
        let pid = std::fs::read_to_string(&pid_file).expect("broker.pid");
        let status = Command::new("kill").args(["-KILL", pid.trim()]).status().await.expect("kill");
        assert!(status.success(), "kill -KILL node {n}");
    }

    /// Each node's view of the controller quorum, from its `quorum-state` file: (node, leader,
    /// epoch); leader -1 while a node knows of none.
    fn quorum(&self) -> Vec<(usize, i64, i64)> {
        (1..=3)
            .filter_map(|n| {
                let file =
                    self.state.join(format!("kafka-cluster/node-{n}/data/__cluster_metadata-0/quorum-state"));
                let state: Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
                Some((n, state["leaderId"].as_i64()?, state["leaderEpoch"].as_i64()?))
            })
            .collect()
    }

    /// The quorum's leader as the node of the highest epoch that knows one has it.
    fn quorum_leader(&self) -> Option<(usize, i64)> {
        self.quorum()
            .into_iter()
            .filter(|(_, leader, _)| *leader > 0)
            .max_by_key(|(_, _, epoch)| *epoch)
            .map(|(_, leader, epoch)| (leader as usize, epoch))
    }

    /// The node `isolated` names, cut off from whom `cut` says for `hold`, then healed, all
    /// under the traffic that keeps flowing. Proves the cut real (the other nodes fence the
    /// node: it leads nothing and is in no ISR, and when it was the controller another one is
    /// elected) and waits until the heal is complete (the node back in every ISR); prints what
    /// the cluster did meanwhile, with wall-clock times to match the service logs.
    async fn partition(&self, system: &System, isolated: Isolated, cut: Cut, hold: Duration) {
        let network = self.network.as_ref().expect("a partition needs the cluster in network namespaces");
        let watch = Watch::new(&self.bootstrap);
        let before = watch.view(None, Duration::from_secs(60)).await;
        let (leader, epoch) = self.quorum_leader().expect("a controller quorum with a leader");
        let node = match isolated {
            Isolated::Controller => leader,
            Isolated::Broker => (1..=3)
                .filter(|node| *node != leader)
                .max_by_key(|node| before.leads(*node as i32))
                .expect("three nodes"),
        };
        let id = node as i32;
        eprintln!(
            "[partition {}] cutting node {node} off (quorum leader {leader}, epoch {epoch}); before: {}",
            wall_clock(),
            before.summary(id)
        );
        let settled_before = settled(system).await;
        let cut_at = Instant::now();
        let partition = network.cut(node, cut);
        let (mut printed_majority, mut printed_isolated, mut printed_quorum) =
            (String::new(), String::new(), String::new());
        let (mut fenced, mut new_leader, mut settled_at_fence) = (None, None, None);
        let mut progress_at = Duration::ZERO;
        // how long settlements stopped: the longest stretch of the cut in which the settled
        // count did not grow (sampled every 500 ms), and when they first grew after the cut
        let mut stall = Stall::new(settled_before);
        while cut_at.elapsed() < hold {
            let t = cut_at.elapsed().as_secs_f64();
            stall.sample(settled(system).await, cut_at.elapsed());
            if cut_at.elapsed() >= progress_at {
                eprintln!("[partition +{t:>5.1}s] {}", pipeline(system).await);
                progress_at += Duration::from_secs(5);
            }
            if let Some((now, epoch)) = self.quorum_leader() {
                let quorum =
                    format!("quorum leader {now} (epoch {epoch}); (node, leader, epoch) {:?}", self.quorum());
                if quorum != printed_quorum {
                    eprintln!("[partition +{t:>5.1}s] {quorum}");
                    printed_quorum = quorum;
                }
                if now != leader && new_leader.is_none() {
                    new_leader = Some((now, cut_at.elapsed()));
                }
            }
            if let Some(view) = watch.sample().await {
                let summary = view.summary(id);
                // the cut-off node answers (when clients still reach it) from what it last knew
                let printed =
                    if view.answered_by == id { &mut printed_isolated } else { &mut printed_majority };
                if summary != *printed {
                    eprintln!("[partition +{t:>5.1}s] node {}'s answer: {summary}", view.answered_by);
                    *printed = summary;
                }
                if fenced.is_none() && view.answered_by != id && view.leads(id) == 0 && view.in_isr(id) == 0 {
                    fenced = Some(cut_at.elapsed());
                    settled_at_fence = settled(system).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(500).min(hold.saturating_sub(cut_at.elapsed()))).await;
        }
        let fenced = fenced.unwrap_or_else(|| {
            panic!("node {node} cut off for {hold:?}, yet the other nodes never dropped it from leadership and every ISR")
        });
        if node == leader {
            let (now, after) = new_leader.unwrap_or_else(|| {
                panic!("the controller (node {node}) cut off for {hold:?}, yet no other node was elected")
            });
            eprintln!(
                "[partition] node {now} became the controller {:.1}s into the cut",
                after.as_secs_f64()
            );
        }
        let settled_at_heal = settled(system).await;
        stall.sample(settled_at_heal, cut_at.elapsed());
        drop(partition);
        let healed = Instant::now();
        let count = |count: Option<i64>| count.map_or("?".to_owned(), |count| count.to_string());
        eprintln!(
            "[partition {}] healed after {:.1}s; node {node} had left every ISR and leadership {:.1}s into the cut; \
             transfers settled: {} before the cut, {} when it was fenced, {} at the heal",
            wall_clock(),
            cut_at.elapsed().as_secs_f64(),
            fenced.as_secs_f64(),
            count(settled_before),
            count(settled_at_fence),
            count(settled_at_heal),
        );
        eprintln!("[partition] {}", stall.summary(cut_at.elapsed()));
        let after = watch.view(Some(id), PARTITION_RECOVERY).await;
        eprintln!(
            "[partition {}] node {node} back in every ISR {:.1}s after the heal: {}",
            wall_clock(),
            healed.elapsed().as_secs_f64(),
            after.summary(id)
        );
    }
}

/// When settlements stopped and resumed during a cut, from samples of the settled count.
struct Stall {
    last: Option<i64>,
    /// When the count last grew (from the cut; zero until it grows).
    grew_at: Duration,
    /// The first growth after the cut.
    first: Option<Duration>,
    /// The longest stretch without growth: (from, to).
    longest: (Duration, Duration),
}

impl Stall {
    fn new(settled_before: Option<i64>) -> Self {
        Self {
            last: settled_before,
            grew_at: Duration::ZERO,
            first: None,
            longest: (Duration::ZERO, Duration::ZERO),
        }
    }

    fn sample(&mut self, settled: Option<i64>, at: Duration) {
        let Some(now) = settled else { return };
        if self.last.is_some_and(|last| now > last) {
            self.first.get_or_insert(at);
            if at - self.grew_at > self.longest.1 - self.longest.0 {
                self.longest = (self.grew_at, at);
            }
            self.grew_at = at;
        }
        self.last = Some(now);
    }

    /// At the heal (`end` into the cut): a stretch still open then counts up to the heal.
    fn summary(&self, end: Duration) -> String {
        let (from, to) = if end - self.grew_at > self.longest.1 - self.longest.0 {
            (self.grew_at, end)
        } else {
            self.longest
        };
        format!(
            "settlements: longest stop {:.1}s (+{:.1}s to +{:.1}s{}), first settlement after the cut at {}",
            (to - from).as_secs_f64(),
            from.as_secs_f64(),
            to.as_secs_f64(),
            if to == end { ", the heal" } else { "" },
            self.first.map_or("none before the heal".to_owned(), |at| format!("+{:.1}s", at.as_secs_f64())),
        )
    }
}

/// Transfers settled so far, as the API's database has them (`None` while it cannot say).
async fn settled(system: &System) -> Option<i64> {
    sqlx::query_scalar("SELECT count(*) FROM transferencia WHERE status = 'LIQUIDADA'")
        .fetch_one(&system.transfers_db.pool)
        .await
        .ok()
}

/// Where the traffic is, hop by hop: events waiting in each outbox, transfers the ledger
/// decided, transfers settled.
async fn pipeline(system: &System) -> String {
    async fn count(pool: &sqlx::PgPool, sql: &str) -> String {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .map_or("?".to_owned(), |count| count.to_string())
    }
    const UNPUBLISHED: &str = "SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL";
    let (transfers, ledger) = (&system.transfers_db.pool, &system.ledger_db.pool);
    format!(
        "requests unpublished {}, decided by the ledger {}, outcomes unpublished {}, settled {}",
        count(transfers, UNPUBLISHED).await,
        count(ledger, "SELECT count(*) FROM transferencia_processada").await,
        count(ledger, UNPUBLISHED).await,
        count(transfers, "SELECT count(*) FROM transferencia WHERE status = 'LIQUIDADA'").await,
    )
}

/// The time of day (UTC, as the services log it).
fn wall_clock() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let (seconds, millis) = (now.as_secs() % 86_400, now.subsec_millis());
    format!("{:02}:{:02}:{:02}.{millis:03}Z", seconds / 3600, seconds / 60 % 60, seconds % 60)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_and_wipe();
    }
}

/// `ip <args>`, which must succeed.
fn ip(args: &[&str]) {
    let output = std::process::Command::new("ip").args(args).output().expect("run ip");
    assert!(output.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
}

/// The network of a [`Cluster`] whose nodes run in network namespaces of their own: node n at
/// `10.202.n.2`, on a veth pair to a router namespace (the hub, `10.202.n.1` on its side), which
/// the host (the services, the test, the databases) reaches over one more veth pair
/// (`10.202.0.2` on the host, `10.202.0.1` in the hub; the host routes `10.202.0.0/16` there).
/// A partition is a set of `ip rule … blackhole` in the hub: the hub drops what the cut
/// forbids, silently (no reset, no ICMP error, no error on the sender, as a failed link in
/// the middle of the network), and nothing changes on the nodes themselves. Fixed names and
/// addresses: a run removes what an earlier one left behind. Dropping it removes everything
/// (the host's end of its veth pair and its route go with the hub).
struct Network {
    cuts: Mutex<Vec<Vec<String>>>,
}

impl Network {
    const HUB: &str = "pgm-k3-hub";
    const HOST_LINK: &str = "pgm-k3";

    fn node_namespace(n: usize) -> String {
        format!("pgm-k3-{n}")
    }

    fn address(n: usize) -> String {
        format!("10.202.{n}.2")
    }

    fn namespaces() -> Vec<String> {
        std::iter::once(Self::HUB.to_owned()).chain((1..=3).map(Self::node_namespace)).collect()
    }

    fn remove() {
        for namespace in Self::namespaces() {
            let _ = std::process::Command::new("ip").args(["netns", "del", &namespace]).output();
        }
        // the host's end goes with the hub, but not at once: deleting it deletes both ends now
        let _ = std::process::Command::new("ip").args(["link", "del", Self::HOST_LINK]).output();
    }

    fn create() -> Self {
        Self::remove();
        let hub = Self::HUB;
        ip(&["netns", "add", hub]);
        ip(&["netns", "exec", hub, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]);
        ip(&["-n", hub, "link", "set", "lo", "up"]);
        for n in 1..=3 {
            let namespace = Self::node_namespace(n);
            let hub_side = format!("n{n}");
            ip(&["netns", "add", &namespace]);
            ip(&[
                "link", "add", "eth0", "netns", &namespace, "type", "veth", "peer", "name", &hub_side,
                "netns", hub,
            ]);
            ip(&["-n", hub, "addr", "add", &format!("10.202.{n}.1/24"), "dev", &hub_side]);
            ip(&["-n", hub, "link", "set", &hub_side, "up"]);
            ip(&["-n", &namespace, "addr", "add", &format!("{}/24", Self::address(n)), "dev", "eth0"]);
            ip(&["-n", &namespace, "link", "set", "eth0", "up"]);
            ip(&["-n", &namespace, "link", "set", "lo", "up"]);
            ip(&["-n", &namespace, "route", "add", "default", "via", &format!("10.202.{n}.1")]);
        }
        ip(&["link", "add", Self::HOST_LINK, "type", "veth", "peer", "name", "host", "netns", hub]);
        ip(&["-n", hub, "addr", "add", "10.202.0.1/24", "dev", "host"]);
        ip(&["-n", hub, "link", "set", "host", "up"]);
        ip(&["addr", "add", "10.202.0.2/24", "dev", Self::HOST_LINK]);
        ip(&["link", "set", Self::HOST_LINK, "up"]);
        ip(&["route", "add", "10.202.0.0/16", "via", "10.202.0.1", "dev", Self::HOST_LINK]);
        Self { cuts: Mutex::new(Vec::new()) }
    }

    /// The hub's rules (`ip rule` selectors) that cut node `n` off as `cut` says.
    fn rules(n: usize, cut: Cut) -> Vec<Vec<String>> {
        let node = Self::address(n);
        match cut {
            Cut::Brokers => (1..=3)
                .filter(|other| *other != n)
                .flat_map(|other| {
                    let other = Self::address(other);
                    [
                        vec!["from".to_owned(), node.clone(), "to".to_owned(), other.clone()],
                        vec!["from".to_owned(), other, "to".to_owned(), node.clone()],
                    ]
                })
                .collect(),
            Cut::Everyone => {
                vec![vec!["from".to_owned(), node.clone()], vec!["to".to_owned(), node]]
            }
        }
    }

    fn rule(action: &str, selector: &[String]) {
        let mut args = vec!["-n", Self::HUB, "rule", action];
        args.extend(selector.iter().map(String::as_str));
        args.push("blackhole");
        ip(&args);
    }

    /// Cuts node `n` off until the returned guard is dropped.
    fn cut(&self, n: usize, cut: Cut) -> Partition<'_> {
        let rules = Self::rules(n, cut);
        for rule in &rules {
            Self::rule("add", rule);
        }
        self.cuts.lock().expect("lock").extend(rules.iter().cloned());
        Partition { network: self, rules }
    }

    fn heal(&self, rules: &[Vec<String>]) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for rule in rules {
            if let Some(at) = cuts.iter().position(|cut| cut == rule) {
                cuts.remove(at);
                let mut args = vec!["-n", Self::HUB, "rule", "del"];
                args.extend(rule.iter().map(String::as_str));
                args.push("blackhole");
                let _ = std::process::Command::new("ip").args(&args).output();
            }
        }
    }

    fn heal_all(&self) {
        let rules = self.cuts.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        self.heal(&rules);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        Self::remove();
    }
}

/// A cut in force; dropping it heals it (on a test's failure too).
struct Partition<'a> {
    network: &'a Network,
    rules: Vec<Vec<String>>,
}

impl Drop for Partition<'_> {
    fn drop(&mut self) {
        self.network.heal(&self.rules);
    }
}

/// Watches a cluster's metadata: who leads which partition, who is in its ISR, and which node
/// answered (a node cut off from the others still answers clients, from what it last knew).
struct Watch {
    config: kafka::rdkafka::ClientConfig,
}

/// One metadata answer: every topic's partitions (the internal ones included).
struct View {
    answered_by: i32,
    brokers: Vec<i32>,
    /// (leader, replicas, ISR) of every partition.
    partitions: Vec<(i32, Vec<i32>, Vec<i32>)>,
}

impl View {
    fn leads(&self, node: i32) -> usize {
        self.partitions.iter().filter(|(leader, _, _)| *leader == node).count()
    }

    fn in_isr(&self, node: i32) -> usize {
        self.partitions.iter().filter(|(_, _, isr)| isr.contains(&node)).count()
    }

    fn under_replicated(&self) -> usize {
        self.partitions.iter().filter(|(_, replicas, isr)| isr.len() < replicas.len()).count()
    }

    fn summary(&self, node: i32) -> String {
        let total = self.partitions.len();
        let mut leaders: Vec<String> =
            self.brokers.iter().map(|b| format!("{b}:{}", self.leads(*b))).collect();
        leaders.sort();
        format!(
            "brokers {:?}; leaders per node {}; node {node} in the ISR of {}/{total}; under-replicated {}/{total}; leaderless {}",
            self.brokers,
            leaders.join(" "),
            self.in_isr(node),
            self.under_replicated(),
            self.leads(-1)
        )
    }
}

impl Watch {
    fn new(bootstrap: &str) -> Self {
        let args = kafka::KafkaArgs::new(bootstrap);
        let mut config = kafka::config::base_consumer_settings(&args, "chaos-watch");
        config.set("group.id", testkit::unique("watch"));
        Self { config }
    }

    /// One metadata answer, from a node drawn at random; `None` when none came in 2 s. A fresh
    /// client each time: a client that lives on asks the node it used last (librdkafka prefers
    /// the least idle connection), so a watch that once asked the cut-off node kept asking it
    /// and, when that node still answered clients, saw its stale view for the whole cut.
    async fn sample(&self) -> Option<View> {
        use kafka::rdkafka::consumer::Consumer;
        let config = self.config.clone();
        tokio::task::spawn_blocking(move || {
            let client: kafka::rdkafka::consumer::BaseConsumer<kafka::context::Context> =
                kafka::context::create(&config).expect("metadata client");
            let metadata = client.fetch_metadata(None, Duration::from_secs(2)).ok()?;
            let mut brokers: Vec<i32> = metadata.brokers().iter().map(|broker| broker.id()).collect();
            brokers.sort();
            let partitions = metadata
                .topics()
                .iter()
                .flat_map(|topic| topic.partitions())
                .map(|partition| {
                    (partition.leader(), partition.replicas().to_vec(), partition.isr().to_vec())
                })
                .collect();
            Some(View { answered_by: metadata.orig_broker_id(), brokers, partitions })
        })
        .await
        .expect("metadata task")
    }

    /// The first answer, not from `not_from`, in which all three nodes are registered and
    /// every partition has a leader and all its replicas in sync.
    async fn view(&self, not_from: Option<i32>, within: Duration) -> View {
        let what = "three nodes, every partition led and fully in sync";
        let started = Instant::now();
        loop {
            if let Some(view) = self.sample().await {
                if Some(view.answered_by) != not_from
                    && view.brokers.len() == 3
                    && view.under_replicated() == 0
                    && view.leads(-1) == 0
                    && !view.partitions.is_empty()
                {
                    return view;
                }
            }
            assert!(started.elapsed() < within, "timed out after {within:?} waiting for {what}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The bank workload on `system` through `faults` (the default schedule when `None`), `rounds`
/// times, then every check; its figures are printed as the last line.
async fn bank_under_faults(
    system: &System,
    faults: Option<&[Fault]>,
    rounds: usize,
    cluster: Option<&Cluster>,
) {
    let seed = seed();
    let _report_seed = SeedOnFailure(seed);
    let schedule = draw_schedule(seed, faults, rounds);
    let per_round = schedule.len() / rounds;
    eprintln!("[chaos] seed {seed} (PAGAMENTOS_CHAOS_SEED={seed} replays this schedule)");
    for (n, step) in schedule.iter().enumerate() {
        eprintln!(
            "[chaos] plan {:>2}: after {:?} of traffic, {} (held {:?})",
            n + 1,
            step.traffic_before,
            step.fault.describe(),
            step.hold
        );
    }
    let (webhook, webhook_url) = Receiver::start().await;
    let logs = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(testkit::unique("chaos"));
    std::fs::create_dir_all(&logs).expect("log directory");
    eprintln!("[chaos] service logs in {}", logs.display());
    let (mut a, mut b) = deployments(&webhook_url);
    a.ports = system.ports.to_vec();
    a.start(system, &logs).await;
    for service in &mut b {
        service.start(system, &logs).await;
    }
    for n in 0..ACCOUNTS {
        system.open_account(&account(n), OPENING_CENTS).await;
    }

    let client = Arc::new(Client::default());
    let http = common::system::admin_client(Some(Duration::from_secs(3)));
    let apis = [system.api("/transferencias"), format!("http://127.0.0.1:{}/transferencias", b[0].ports[0])];
    let (stop, posts) = (CancellationToken::new(), TaskTracker::new());
    let driver = tokio::spawn(drive(client.clone(), http, apis, stop.clone(), posts.clone(), seed));
    let bank_reads = Arc::new(BankReads::default());
    let reader = tokio::spawn(bank_reads.clone().run(system.ledger_db.pool.clone(), stop.clone()));

    let started = Instant::now();
    let mut faults = 0usize;
    for step in &schedule {
        if faults.is_multiple_of(per_round) {
            eprintln!("[chaos] round {} of {rounds}", faults / per_round + 1);
        }
        // the traffic between faults is the schedule's, not a wait for something
        tokio::time::sleep(step.traffic_before).await;
        faults += 1;
        eprintln!(
            "[chaos {:>6.1}s] fault {faults}: {}",
            started.elapsed().as_secs_f64(),
            step.fault.describe()
        );
        match step.fault {
            Fault::KillBroker(node) => {
                let cluster = cluster.expect("a broker is killed only in a cluster of the test's own");
                cluster.kill(node).await;
                tokio::time::sleep(step.hold).await;
                cluster.stack(&["up", "kafka"]).await;
            }
            Fault::Partition(isolated, cut) => {
                let cluster = cluster.expect("a node is cut off only in a cluster of the test's own");
                cluster.partition(system, isolated, cut, step.hold).await;
                // the deployments, through the partition and its heal, serve again
                let healed = Instant::now();
                for process in b.iter().chain([&a]) {
                    process.ready(PARTITION_RECOVERY).await;
                }
                eprintln!(
                    "[chaos] both deployments ready {:.1}s after the heal",
                    healed.elapsed().as_secs_f64()
                );
            }
            Fault::Kill(service) => {
                let process = if service == 4 { &mut a } else { &mut b[service] };
                process.kill().await;
                tokio::time::sleep(step.hold).await;
                process.start(system, &logs).await;
            }
            Fault::Restart(part) => testkit::stack(&["restart", part]).await,
            Fault::Pause => {
                a.signal("-STOP").await;
                tokio::time::sleep(step.hold).await;
                a.signal("-CONT").await;
            }
            Fault::PauseDuringRestart(part) => {
                let frozen = Instant::now();
                a.signal("-STOP").await;
                testkit::stack(&["restart", part]).await;
                tokio::time::sleep(step.hold.saturating_sub(frozen.elapsed())).await;
                a.signal("-CONT").await;
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(BETWEEN_FAULTS_MS.start)).await;
    stop.cancel();
    driver.await.expect("driver");
    reader.await.expect("bank reader");
    posts.close();
    posts.wait().await;
    let traffic_s = started.elapsed().as_secs_f64();
    let accepted: Vec<String> = client.accepted.lock().expect("lock").clone();
    let failed: Vec<String> = client.failed.lock().expect("lock").clone();
    eprintln!("[chaos {traffic_s:>6.1}s] traffic stopped: {} accepted; draining", accepted.len());

    // drain: every accepted transfer final in the API's database
    let transfers = &system.transfers_db.pool;
    let deadline = Instant::now() + DRAIN;
    let mut pending: i64 = -1;
    while Instant::now() < deadline {
        match sqlx::query_scalar("SELECT count(*) FROM transferencia WHERE status = 'PENDENTE'")
            .fetch_one(transfers)
            .await
        {
            Ok(0) => {
                pending = 0;
                break;
            }
            Ok(count) => pending = count,
            Err(error) => eprintln!("[chaos] counting pending transfers: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let rows: Vec<(String, String)> = sqlx::query_as("SELECT id::text, status FROM transferencia")
        .fetch_all(transfers)
        .await
        .expect("transfers");
    let status: HashMap<String, String> = rows.into_iter().collect();
    let accepted_set: HashSet<&String> = accepted.iter().collect();
    let lost: Vec<&String> =
        accepted.iter().filter(|id| status.get(*id).is_none_or(|status| status == "PENDENTE")).collect();
    let phantom = status.keys().filter(|id| !accepted_set.contains(id)).count();
    let duplicate_answers = accepted.len() - accepted_set.len();
    let settled = status.values().filter(|status| *status == "LIQUIDADA").count();
    let rejected = status.values().filter(|status| *status == "REJEITADA").count();

    let ledger = &system.ledger_db.pool;
    let doubled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT transferencia_id FROM lancamento l
          WHERE NOT EXISTS (SELECT 1 FROM deposito d WHERE d.id = l.transferencia_id)
          GROUP BY transferencia_id HAVING count(*) <> 2) AS odd",
    )
    .fetch_one(ledger)
    .await
    .expect("entries per transfer");
    let balances: i64 = sqlx::query_scalar("SELECT sum(saldo_centavos)::bigint FROM conta WHERE NOT emissor")
        .fetch_one(ledger)
        .await
        .expect("balances");
    let ledger_settled: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transferencia_processada WHERE resultado = 'LIQUIDADA'")
            .fetch_one(ledger)
            .await
            .expect("settled in the ledger");
    let (verify_code, verify_report) = system.verify().await;

    // entry by entry: every settled transfer moved exactly what was asked, between the accounts
    // asked, once; nothing else moved money
    let entries: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT transferencia_id::text, conta_id, tipo, valor_centavos FROM lancamento l
          WHERE NOT EXISTS (SELECT 1 FROM deposito d WHERE d.id = l.transferencia_id)",
    )
    .fetch_all(ledger)
    .await
    .expect("entries");
    let mut moved: HashMap<String, Vec<(String, String, i64)>> = HashMap::new();
    for (transfer, account, kind, cents) in entries {
        moved.entry(transfer).or_default().push((kind.trim().to_owned(), account, cents));
    }
    let requested = client.requested.lock().expect("lock").clone();
    let mut misapplied = Vec::new();
    for (id, (from, to, cents)) in &requested {
        let mut got = moved.remove(id).unwrap_or_default();
        got.sort();
        let expected = match status.get(id).map(String::as_str) {
            Some("LIQUIDADA") => {
                vec![("C".to_owned(), to.clone(), *cents), ("D".to_owned(), from.clone(), *cents)]
            }
            _ => Vec::new(),
        };
        if got != expected {
            misapplied.push(format!("{id}: asked {from} → {to} {cents}, entries {got:?}"));
        }
    }
    // entries of transfers the client never had accepted
    misapplied.extend(moved.keys().map(|id| format!("{id}: entries of a transfer nobody was told of")));
    let reads = bank_reads.reads.load(Ordering::Relaxed);
    let reads_unavailable = bank_reads.unavailable.load(Ordering::Relaxed);
    let read_violations = bank_reads.violations.lock().expect("lock").clone();

    // antifraude's outputs: exactly one per request record (exactly-once through its Kafka
    // transactions). The outbox relay is at-least-once: a relay that loses its database between
    // publishing and marking publishes the row again, as the same event; the ledger absorbs that
    // by business key. (The ledger's own rejections share the rejection topic, with another
    // reason.)
    let count_by_transfer = |records: &[Value]| {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for record in records {
            if record.get("motivo").is_some_and(|reason| reason != "BLOQUEADA_ANTIFRAUDE") {
                continue;
            }
            *counts.entry(record["transferenciaId"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
        }
        counts
    };
    let requests = count_by_transfer(&read_all(system, &[system.topics.topic(topics::REQUESTED)]).await);
    let republished = requests.values().filter(|count| **count > 1).count();
    let outputs =
        read_all(system, &[system.topics.topic(topics::ANALYSED), system.topics.topic(topics::REJECTED)])
            .await;
    let analysed = count_by_transfer(&outputs);
    let over: Vec<&String> = analysed
        .iter()
        .filter(|(id, count)| **count > requests.get(*id).copied().unwrap_or(0))
        .map(|(id, _)| id)
        .collect();
    for id in &over {
        let copies: Vec<&Value> =
            outputs.iter().filter(|output| output["transferenciaId"] == ***id).collect();
        eprintln!("[chaos] more outputs than requests: {copies:?}");
    }
    let analysed_twice = over.len();
    let unanalysed = accepted.iter().filter(|id| !analysed.contains_key(*id)).count();

    // the pipeline's topics, Kafka-workload style: every accepted transfer was requested; no
    // event names a transfer nobody accepted; every settled one has its settlement event and
    // none that is not settled has one
    let unrequested = accepted.iter().filter(|id| !requests.contains_key(*id)).count();
    let settlements = count_by_transfer(&read_all(system, &[system.topics.topic(topics::SETTLED)]).await);
    let settlements_republished = settlements.values().filter(|count| **count > 1).count();
    let settled_unannounced =
        status.iter().filter(|(id, status)| *status == "LIQUIDADA" && !settlements.contains_key(*id)).count();
    let announced_unsettled =
        settlements.keys().filter(|id| status.get(*id).is_none_or(|status| status != "LIQUIDADA")).count();
    let phantom_events = requests
        .keys()
        .chain(analysed.keys())
        .chain(settlements.keys())
        .filter(|id| !accepted_set.contains(id))
        .collect::<HashSet<_>>()
        .len();

    let dlts: Vec<String> =
        system.topics.names.iter().filter(|name| name.ends_with("-dlt")).cloned().collect();
    let dead_letters = read_all(system, &dlts).await;

    let notified: HashSet<String> = webhook
        .calls()
        .iter()
        .filter_map(|call| serde_json::from_slice::<Value>(&call.body).ok())
        .filter_map(|event| event["transferenciaId"].as_str().map(str::to_owned))
        .collect();
    let unnotified = accepted.iter().filter(|id| !notified.contains(*id)).count();

    let figures = json!({
        "seed": seed,
        "rounds": rounds,
        "faults": faults,
        "seconds": traffic_s.round(),
        "posts": client.posts.load(Ordering::Relaxed),
        "post_retries": client.retries.load(Ordering::Relaxed),
        "accepted": accepted.len(),
        "settled": settled,
        "rejected": rejected,
        "lost": lost.len(),
        "doubled": doubled,
        "misapplied": misapplied.len(),
        "bank_reads": reads,
        "bank_reads_unavailable": reads_unavailable,
        "bank_read_violations": read_violations.len(),
        "requests_republished": republished,
        "analysed_twice": analysed_twice,
        "phantom": phantom,
        "dead_letters": dead_letters.len(),
        "unanalysed": unanalysed,
        "unnotified": unnotified,
        "unrequested": unrequested,
        "settlements_republished": settlements_republished,
        "settled_unannounced": settled_unannounced,
        "announced_unsettled": announced_unsettled,
        "phantom_events": phantom_events,
    });
    if !lost.is_empty() {
        diagnose(system, &lost, &analysed).await;
        for process in b.iter().chain([&a]) {
            dump_stacks(process, &logs).await;
        }
    }
    assert!(failed.is_empty(), "POSTs that failed for good: {failed:?}");
    assert_eq!(pending, 0, "transfers still PENDENTE {DRAIN:?} after the traffic stopped: {figures}");
    assert!(lost.is_empty(), "accepted but not final: {lost:?} {figures}");
    assert_eq!(duplicate_answers, 0, "one transfer answered for two keys: {figures}");
    assert_eq!(phantom, 0, "transfers in the database the client never had answered: {figures}");
    assert_eq!(doubled, 0, "transfers with other than one debit and one credit: {figures}");
    assert!(
        misapplied.is_empty(),
        "transfers that moved other than what was asked: {misapplied:?} {figures}"
    );
    assert!(read_violations.is_empty(), "bank reads during the faults: {read_violations:?} {figures}");
    assert!(reads > 0, "no bank read succeeded during the faults: {figures}");
    assert_eq!(
        ledger_settled as usize, settled,
        "the ledger and the API disagree on what settled: {figures}"
    );
    assert_eq!(balances, ACCOUNTS as i64 * OPENING_CENTS, "money appeared or vanished: {figures}");
    assert_eq!(verify_code, 0, "pagamentos verify: {verify_report}");
    assert_eq!(analysed_twice, 0, "antifraude produced more outputs than it had requests: {figures}");
    assert_eq!(unanalysed, 0, "accepted transfers antifraude never analysed: {figures}");
    assert!(dead_letters.is_empty(), "dead letters: {dead_letters:?}");
    assert_eq!(unnotified, 0, "final transfers never notified: {figures}");
    assert_eq!(unrequested, 0, "accepted transfers with no request event: {figures}");
    assert_eq!(settled_unannounced, 0, "settled transfers with no settlement event: {figures}");
    assert_eq!(announced_unsettled, 0, "settlement events of transfers not settled: {figures}");
    assert_eq!(phantom_events, 0, "events of transfers nobody accepted: {figures}");
    assert!(settled > 0 && rejected > 0, "the workload should both settle and reject: {figures}");
    println!("{figures}");
}
