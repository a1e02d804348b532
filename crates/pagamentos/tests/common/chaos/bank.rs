//! The chaos suite's run: both deployments started and the accounts opened, the traffic and
//! the bank reads running while the schedule's faults are injected one after another, then the
//! traffic stopped and the pipeline drained before the checks (`checks.rs`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use testkit::webhook::Receiver;

use super::checks::{check, Ran};
use super::cluster::Cluster;
use super::processes::{deployments, Service};
use super::schedule::{
    draw_schedule, seed, Fault, SeedOnFailure, Step, BETWEEN_FAULTS_MS, PARTITION_RECOVERY,
};
use super::workload::{account, drive, BankReads, Client, ACCOUNTS, OPENING_CENTS};
use crate::common;
use crate::common::system::System;

/// From the end of the traffic, how long the pipeline has to make every transfer final.
pub const DRAIN: Duration = Duration::from_secs(240);

/// The bank workload on `system` through `faults` (the default schedule when `None`), `rounds`
/// times, then every check; its figures are printed as the last line.
pub async fn bank_under_faults(
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
    let mut run = Run::start(system, seed).await;

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
        run.inject(system, step, cluster).await;
    }
    tokio::time::sleep(Duration::from_millis(BETWEEN_FAULTS_MS.start)).await;
    run.stop_traffic().await;
    let traffic_s = started.elapsed().as_secs_f64();
    let accepted: Vec<String> = run.client.accepted.lock().expect("lock").clone();
    let failed: Vec<String> = run.client.failed.lock().expect("lock").clone();
    eprintln!("[chaos {traffic_s:>6.1}s] traffic stopped: {} accepted; draining", accepted.len());

    let pending = drain(system).await;
    let ran = Ran {
        seed,
        rounds,
        faults,
        traffic_s,
        accepted,
        failed,
        pending,
        client: &run.client,
        bank_reads: &run.bank_reads,
        webhook: &run.webhook,
        processes: run.b.iter().chain([&run.a]).collect(),
        logs: &run.logs,
    };
    check(system, ran).await;
}

/// One run's deployments (A: `pagamentos all`; B: the four services), its traffic and its bank
/// reads.
struct Run {
    webhook: Receiver,
    logs: PathBuf,
    a: Service,
    b: Vec<Service>,
    client: Arc<Client>,
    stop: CancellationToken,
    posts: TaskTracker,
    driver: JoinHandle<()>,
    bank_reads: Arc<BankReads>,
    reader: JoinHandle<()>,
}

impl Run {
    /// Starts both deployments on `system`, opens the accounts, and starts the traffic drawn
    /// from `seed` and the bank reads.
    async fn start(system: &System, seed: u64) -> Self {
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
        let apis =
            [system.api("/transferencias"), format!("http://127.0.0.1:{}/transferencias", b[0].ports[0])];
        let (stop, posts) = (CancellationToken::new(), TaskTracker::new());
        let driver = tokio::spawn(drive(client.clone(), http, apis, stop.clone(), posts.clone(), seed));
        let bank_reads = Arc::new(BankReads::default());
        let reader = tokio::spawn(bank_reads.clone().run(system.ledger_db.pool.clone(), stop.clone()));
        Self { webhook, logs, a, b, client, stop, posts, driver, bank_reads, reader }
    }

    /// Injects `step`'s fault, and waits out how long it holds.
    async fn inject(&mut self, system: &System, step: &Step, cluster: Option<&Cluster>) {
        match step.fault {
            Fault::KillBroker(node) => {
                let cluster = cluster.expect("a broker is killed only in a cluster of the test's own");
                cluster.kill(node).await;
                tokio::time::sleep(step.hold).await;
                cluster.stack(&["up", "kafka"]).await;
            }
            Fault::Partition(isolated, cut) => {
                let cluster = cluster.expect("a node is cut off only in a cluster of the test's own");
                cluster.partition(system, isolated, cut, step.hold, PARTITION_RECOVERY).await;
                // the deployments, through the partition and its heal, serve again
                let healed = Instant::now();
                for process in self.b.iter().chain([&self.a]) {
                    process.ready(PARTITION_RECOVERY).await;
                }
                eprintln!(
                    "[chaos] both deployments ready {:.1}s after the heal",
                    healed.elapsed().as_secs_f64()
                );
            }
            Fault::Kill(service) => {
                let process = if service == 4 { &mut self.a } else { &mut self.b[service] };
                process.kill().await;
                tokio::time::sleep(step.hold).await;
                process.start(system, &self.logs).await;
            }
            Fault::Restart(part) => testkit::stack(&["restart", part]).await,
            Fault::Pause => {
                self.a.signal("-STOP").await;
                tokio::time::sleep(step.hold).await;
                self.a.signal("-CONT").await;
            }
            Fault::PauseDuringRestart(part) => {
                let frozen = Instant::now();
                self.a.signal("-STOP").await;
                testkit::stack(&["restart", part]).await;
                tokio::time::sleep(step.hold.saturating_sub(frozen.elapsed())).await;
                self.a.signal("-CONT").await;
            }
        }
    }

    /// Stops offering transfers and reading balances, and waits for every POST in flight.
    async fn stop_traffic(&mut self) {
        self.stop.cancel();
        (&mut self.driver).await.expect("driver");
        (&mut self.reader).await.expect("bank reader");
        self.posts.close();
        self.posts.wait().await;
    }
}

/// Waits up to [`DRAIN`] for every accepted transfer to be final in the API's database; returns
/// how many were still pending (0: none).
async fn drain(system: &System) -> i64 {
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
    pending
}
