//! A profile's running system: `pagamentos all` on fresh databases and topics, loads driven
//! through `pagamentos loadgen` and measured, and everything removed afterwards.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};

use loadgen::Report;

use crate::procs::{Part, Parts};
use crate::prom::Scrape;
use crate::{procs, prom};
use crate::{Args, Measured, HOPS};

/// How often the sampler reads loadgen's CPU (loadgen is gone when its CPU is read at the end).
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Memory (PSS) is read every this many samples (every 10 s), and once more at the load's end.
const MEMORY_EVERY_TICKS: u64 = 40;

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Seconds of each warm-up chunk.
const WARM_UP_CHUNK_SECONDS: u64 = 5;
/// Two chunks whose p50s differ by at most this share of the larger are steady.
const WARM_UP_STEADY: f64 = 0.15;

/// How a round's warm-up went: each chunk's p50 at 200/s, until steady or `--warm-up-max`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct WarmUp {
    pub round: usize,
    pub binary: String,
    pub seconds: f64,
    pub p50_ms: Vec<f64>,
    pub steady: bool,
}

/// A profile's running system.
pub(crate) struct System {
    profile: String,
    /// Which binary runs (`current`, `baseline`) and in which round.
    binary: String,
    round: usize,
    child: Child,
    ports: [u16; 4],
    prefix: String,
    databases: [String; 2],
    http: reqwest::Client,
    /// The bearer tokens this run's services were started with (random per run).
    tokens: [String; 2],
}

impl System {
    /// Starts `binary` (the `label`led one) under `profile` for round `round` of run `run`.
    pub(crate) async fn start(
        args: &Args,
        (label, binary): (&str, &Path),
        profile: &str,
        run: &str,
        round: usize,
    ) -> anyhow::Result<Self> {
        let run = format!("{run}r{round}");
        let databases =
            [format!("bench_{run}_{profile}_transferencias"), format!("bench_{run}_{profile}_ledger")];
        let mut admin = PgConnection::connect(&args.database_url).await.context("connect to PostgreSQL")?;
        for name in &databases {
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut admin)
                .await
                .with_context(|| format!("create {name}"))?;
        }
        let base = args.database_url.rsplit_once('/').map_or(args.database_url.as_str(), |(base, _)| base);
        let ports = [free_port()?, free_port()?, free_port()?, free_port()?];
        let prefix = format!("bench-{run}-{profile}.");
        let log_name = format!("{round}-{label}-{profile}.log");
        let log = std::fs::File::create(args.out.join(&log_name))?;
        let tokens =
            [format!("bench-api-{}", uuid::Uuid::new_v4()), format!("bench-admin-{}", uuid::Uuid::new_v4())];
        let child = Command::new(binary)
            .args(["all", "--profile", profile])
            .env("PAGAMENTOS_API_TOKEN", &tokens[0])
            .env("PAGAMENTOS_ADMIN_TOKEN", &tokens[1])
            .env("TRANSFERENCIAS_DATABASE_URL", format!("{base}/{}", databases[0]))
            .env("LEDGER_DATABASE_URL", format!("{base}/{}", databases[1]))
            .env("TRANSFERENCIAS_LISTEN", format!("127.0.0.1:{}", ports[0]))
            .env("LEDGER_LISTEN", format!("127.0.0.1:{}", ports[1]))
            .env("ANTIFRAUDE_LISTEN", format!("127.0.0.1:{}", ports[2]))
            .env("NOTIFICACOES_LISTEN", format!("127.0.0.1:{}", ports[3]))
            .env("KAFKA_BOOTSTRAP_SERVERS", &args.kafka_bootstrap_servers)
            .envs(args.kafka_security.to_env())
            .env("PAGAMENTOS_TOPIC_PREFIX", &prefix)
            // the bench measures, it keeps no data: the topics' replicas as configured, fewer
            // than 3 accepted (the local stack has one broker)
            .env("PAGAMENTOS_ALLOW_UNDER_REPLICATED", "true")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let system = Self {
            profile: profile.to_owned(),
            binary: label.to_owned(),
            round,
            child,
            ports,
            prefix,
            databases,
            http: reqwest::Client::new(),
            tokens,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        for port in ports {
            let url = format!("http://127.0.0.1:{port}/readyz");
            loop {
                if system.http.get(&url).send().await.is_ok_and(|response| response.status().is_success()) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("{url} not ready after 120 s (see {log_name})");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        Ok(system)
    }

    async fn metrics(&self) -> anyhow::Result<Scrape> {
        let text =
            self.http.get(format!("http://127.0.0.1:{}/metrics", self.ports[0])).send().await?.text().await?;
        Ok(Scrape::parse(&text))
    }

    /// SIGTERM, wait for the drain, then drop the databases and topics.
    pub(crate) async fn stop(mut self, args: &Args) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
            if tokio::time::timeout(Duration::from_secs(45), self.child.wait()).await.is_err() {
                self.child.kill().await.ok();
            }
        }
        let mut admin = PgConnection::connect(&args.database_url).await?;
        for name in &self.databases {
            drop_database(&mut admin, name).await?;
        }
        let kafka = kafka::KafkaArgs {
            topic_prefix: self.prefix.clone(),
            security: args.kafka_security.clone(),
            ..kafka::KafkaArgs::new(args.kafka_bootstrap_servers.clone())
        };
        let names: Vec<String> =
            contracts::topics::plan(&self.prefix).into_iter().map(|spec| spec.name).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        kafka_admin::topics::delete(&kafka, &names)
            .await
            .map_err(|error| anyhow!("delete the run's topics: {error}"))?;
        Ok(())
    }

    /// Loads the fresh system at 200/s in chunks of [`WARM_UP_CHUNK_SECONDS`] until two
    /// chunks in a row have a p50 within [`WARM_UP_STEADY`] of each other (at least two chunks,
    /// at most `--warm-up-max` seconds): a freshly started broker, PostgreSQL and service warm
    /// their caches, JIT and pools over tens of seconds, and a fixed three seconds left the
    /// first measured load of a round the slowest.
    pub(crate) async fn warm_up(&self, args: &Args) -> anyhow::Result<WarmUp> {
        let extra = ["--rate", "200", "--duration", &WARM_UP_CHUNK_SECONDS.to_string()].map(String::from);
        let started = Instant::now();
        let mut p50_ms: Vec<f64> = Vec::new();
        let steady = loop {
            let chunk = self.measure(args, "warm-up", Some(200), &extra, false).await?;
            p50_ms.push(chunk.report.latency_ms.p50);
            if let [.., before, last] = p50_ms.as_slice() {
                if (last - before).abs() <= WARM_UP_STEADY * before.max(*last) {
                    break true;
                }
            }
            if started.elapsed().as_secs() + WARM_UP_CHUNK_SECONDS > args.warm_up_max {
                break false;
            }
        };
        Ok(WarmUp {
            round: self.round,
            binary: self.binary.clone(),
            seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            p50_ms,
            steady,
        })
    }

    /// Runs one load through `pagamentos loadgen` and measures around it.
    // Over 100 lines on purpose: the loadgen child, the CPU sampler and the broker and database
    // readings must bracket the same span.
    /// `settle`: first wait `--settle-seconds` (not between the chunks of a warm-up).
    pub(crate) async fn measure(
        &self,
        args: &Args,
        load: &str,
        offered: Option<u32>,
        extra: &[String],
        settle: bool,
    ) -> anyhow::Result<Measured> {
        let pagamentos = self.child.id().ok_or_else(|| anyhow!("pagamentos all exited"))?;
        if settle {
            tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;
        }
        let mut database = PgConnection::connect(&args.database_url).await?;

        eprintln!("bench: round {} {} {} — {load}", self.round, self.binary, self.profile);
        // the current binary's loadgen for every round: the instrument stays the same while
        // the system under test changes
        let mut child = Command::new(&args.loadgen)
            .arg("loadgen")
            .args(["--accounts", &args.accounts.to_string()])
            .args(extra)
            .env("LOADGEN_TRANSFERENCIAS_URL", format!("http://127.0.0.1:{}", self.ports[0]))
            .env("LOADGEN_LEDGER_URL", format!("http://127.0.0.1:{}", self.ports[1]))
            .env("PAGAMENTOS_API_TOKEN", &self.tokens[0])
            .env("PAGAMENTOS_ADMIN_TOKEN", &self.tokens[1])
            .env("KAFKA_BOOTSTRAP_SERVERS", &args.kafka_bootstrap_servers)
            .envs(args.kafka_security.to_env())
            .env("PAGAMENTOS_TOPIC_PREFIX", &self.prefix)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("run pagamentos loadgen")?;
        let parts = Parts { pagamentos, loadgen: child.id() };

        // the measured span starts when loadgen starts sending: opening and funding its
        // accounts (a thousand of each through the API and the ledger) is not the load, and
        // counted in it made the CPU per transfer of the slow loads mostly set-up
        let sending = forward_until_sending(&mut child)?;
        let _ = sending.await;
        let scrape_before = self.metrics().await?;
        let mut cpu_before = Parts { pagamentos, loadgen: None }.cpu_ticks();
        cpu_before.insert(Part::Loadgen, parts.loadgen_ticks());
        let commits_before = commits(&mut database).await?;
        let started = Instant::now();

        // peak memory of each part, and loadgen's CPU as last seen (it is gone at the end).
        // Memory is read every 10 s and at the end only: a PSS reading walks the page tables of
        // every process measured (the JVM's heap, every PostgreSQL backend's view of the shared
        // buffers), and every 250 ms it cost this driver a fifth of a core, every 2 s still 3 %
        // of the machine, taken from the two cores the system under test runs on
        // (docs/benchmarks.md)
        let (stop_sampling, mut stopped) = tokio::sync::watch::channel(false);
        let sampler = tokio::spawn(async move {
            let mut peak: BTreeMap<Part, u64> = BTreeMap::new();
            let mut loadgen_ticks = 0;
            let read_memory = |peak: &mut BTreeMap<Part, u64>| {
                for (part, kib) in parts.memory() {
                    let slot = peak.entry(part).or_default();
                    *slot = (*slot).max(kib);
                }
            };
            for tick in 0u64.. {
                if tick % MEMORY_EVERY_TICKS == 0 {
                    read_memory(&mut peak);
                }
                loadgen_ticks = loadgen_ticks.max(parts.loadgen_ticks());
                tokio::select! {
                    _ = stopped.changed() => break,
                    () = tokio::time::sleep(SAMPLE_EVERY) => {}
                }
            }
            // at the end of the load (loadgen gone; its peak was read while it ran)
            read_memory(&mut peak);
            (peak, loadgen_ticks)
        });
        let output = child.wait_with_output().await.context("run pagamentos loadgen")?;
        let seconds = started.elapsed().as_secs_f64();
        let mut cpu_after = Parts { pagamentos, loadgen: None }.cpu_ticks();
        // let PostgreSQL flush its statistics (at most once a second) before reading them
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let _ = stop_sampling.send(true);
        let (peak, loadgen_ticks) = sampler.await?;
        cpu_after.insert(Part::Loadgen, loadgen_ticks);
        let commits_after = commits(&mut database).await?;
        let scrape_after = self.metrics().await?;

        let stdout = String::from_utf8_lossy(&output.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        let report: Report = serde_json::from_str(last)
            .with_context(|| format!("loadgen's last line {last:?} (exit {:?})", output.status.code()))?;
        let hops = HOPS
            .iter()
            .filter_map(|spec| {
                prom::hop(&scrape_before, &scrape_after, spec.metric, &spec.filter(&self.prefix))
                    .map(|hop| (spec.name, hop))
            })
            .collect();
        let measured = Measured {
            binary: self.binary.clone(),
            round: self.round,
            profile: self.profile.clone(),
            load: load.to_owned(),
            offered_per_s: offered,
            seconds: (seconds * 10.0).round() / 10.0,
            report,
            cpu_percent: procs::cpu_percent(&cpu_before, &cpu_after, seconds),
            memory_mib_max: peak
                .into_iter()
                .map(|(part, kib)| (part, (kib as f64 / 1024.0 * 10.0).round() / 10.0))
                .collect(),
            postgres_commits_per_s: ((commits_after - commits_before) as f64 / seconds * 10.0).round() / 10.0,
            hops,
        };
        println!("{}", serde_json::to_string(&measured)?);
        Ok(measured)
    }
}

/// Passes loadgen's stderr through to ours, line by line; the returned receiver completes at
/// its line `loadgen: sending …` (the accounts are open and funded), or when stderr ends.
fn forward_until_sending(child: &mut Child) -> anyhow::Result<tokio::sync::oneshot::Receiver<()>> {
    use tokio::io::AsyncBufReadExt;
    let stderr = child.stderr.take().ok_or_else(|| anyhow!("loadgen's stderr not piped"))?;
    let (sending, receiver) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut sending = Some(sending);
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            if line.starts_with("loadgen: sending") {
                if let Some(sending) = sending.take() {
                    let _ = sending.send(());
                }
            }
        }
    });
    Ok(receiver)
}

/// `DROP DATABASE … WITH (FORCE)`, tried again for up to 30 s while it fails: the bench's role
/// may not terminate an autovacuum worker (it runs as the superuser) that is busy with the
/// database's freshly loaded tables, and the worker is gone within seconds.
pub(crate) async fn drop_database(admin: &mut PgConnection, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut *admin).await
        {
            Ok(_) => return Ok(()),
            Err(error) if Instant::now() < deadline => {
                eprintln!("bench: drop {name}: {error}; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error).with_context(|| format!("drop database {name}")),
        }
    }
}

/// Transactions committed in the whole cluster so far.
pub(crate) async fn commits(database: &mut PgConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT sum(xact_commit)::bigint FROM pg_stat_database").fetch_one(database).await
}
