//! `pagamentos-bench`, the driver behind `scripts/bench` (`CONTRACT.md` §1, issue #10): for each
//! profile it starts `pagamentos all --profile P` on fresh databases and topics, drives the same
//! loads through `pagamentos loadgen` (closed-loop flat out, 200/s open loop, Zipf-skewed flat
//! out, then an open-loop sweep of rates for the plot), samples CPU and RSS of pagamentos,
//! Kafka and PostgreSQL and PostgreSQL's commits/s, reads each hop's latency from the
//! services' histograms, writes `results.json`, `summary.md` and the latency-vs-load plot,
//! and prints `{"fast": …, "reference": …, "ratio": {"throughput", "p99"}}` as its last line.

mod plot;
mod procs;
mod prom;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use serde::Serialize;
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};

use loadgen::Report;
use procs::{Part, Parts};
use prom::{Hop, Scrape};

/// The standard benchmark: the same loads against `--profile reference` and `--profile fast`.
#[derive(Debug, Parser)]
#[command(name = "pagamentos-bench")]
struct Args {
    /// Profiles to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "reference,fast", value_parser = ["reference", "fast"])]
    profiles: Vec<String>,

    /// Seconds of each main load (flat out, 200/s, Zipf).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    duration: u64,

    /// Seconds of each load of the sweep.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    sweep_duration: u64,

    /// Accounts of each load.
    #[arg(long, default_value_t = 1000)]
    accounts: u32,

    /// Seconds of quiet before each load, so that what the previous load left running
    /// (autovacuum, checkpoints, the broker's garbage collection) is not measured by the next.
    #[arg(long, default_value_t = 5)]
    settle_seconds: u64,

    /// Transfers in flight in the flat-out loads.
    #[arg(long, default_value_t = 256)]
    flat_concurrency: u32,

    /// Skew of the Zipf load.
    #[arg(long, default_value = "zipf:1.1")]
    skew: String,

    /// Offered rates (transfers/s) of the fast profile's sweep.
    #[arg(long, value_delimiter = ',', default_value = "100,200,400,800,1200,1600")]
    fast_rates: Vec<u32>,

    /// Offered rates of the reference profile's sweep (its capacity is far lower).
    #[arg(long, value_delimiter = ',', default_value = "25,50,75,100")]
    reference_rates: Vec<u32>,

    /// A PostgreSQL database to connect to for creating (and dropping) the runs' databases.
    #[arg(
        long,
        env = "PAGAMENTOS_BENCH_DATABASE_URL",
        default_value = "postgres://pagamentos:pagamentos@localhost:5432/postgres"
    )]
    database_url: String,

    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS", default_value = "localhost:9092")]
    kafka_bootstrap_servers: String,

    /// TLS and SASL, passed on to `pagamentos all` and `loadgen`.
    #[command(flatten)]
    kafka_security: kafka::config::KafkaSecurity,

    /// Where results.json, summary.md and the plot go.
    #[arg(long)]
    out: PathBuf,

    /// The pagamentos binary (default: next to this one).
    #[arg(long)]
    pagamentos: Option<PathBuf>,

    /// Commit being measured, for the records.
    #[arg(long, env = "PAGAMENTOS_BENCH_COMMIT", default_value = "unknown")]
    commit: String,
}

/// One load of one profile, measured.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    profile: String,
    load: String,
    /// Open-loop rate, or null for closed loop (flat out).
    offered_per_s: Option<u32>,
    seconds: f64,
    report: Report,
    /// Percent of one core, over the load (sending and draining).
    cpu_percent: BTreeMap<Part, f64>,
    /// Highest memory (PSS) seen, MiB.
    memory_mib_max: BTreeMap<Part, f64>,
    postgres_commits_per_s: f64,
    hops: BTreeMap<&'static str, Hop>,
}

/// The contract's last line: `{"fast": <loadgen object>, "reference": <loadgen object>,
/// "ratio": {"throughput", "p99"}}`, from the flat-out loads.
#[derive(Debug, Clone, Serialize)]
struct Comparison {
    fast: Option<Report>,
    reference: Option<Report>,
    ratio: Option<Ratios>,
}

/// fast ÷ reference.
#[derive(Debug, Clone, Copy, Serialize)]
struct Ratios {
    throughput: f64,
    p99: f64,
}

/// A hop read from the histograms: its name here, the metric, the labels to match.
struct HopSpec {
    name: &'static str,
    metric: &'static str,
    labels: &'static [(&'static str, &'static str)],
}

const HOPS: [HopSpec; 6] = [
    HopSpec {
        name: "api_post",
        metric: "http_server_request_duration_seconds",
        labels: &[("method", "POST"), ("route", "/transferencias")],
    },
    HopSpec {
        name: "relay_transferencias",
        metric: "outbox_delivery_seconds",
        labels: &[("database", "transferencias")],
    },
    HopSpec { name: "antifraude_transaction", metric: "antifraud_transaction_seconds", labels: &[] },
    HopSpec { name: "ledger_settlement", metric: "ledger_settlement_seconds", labels: &[] },
    HopSpec { name: "relay_ledger", metric: "outbox_delivery_seconds", labels: &[("database", "ledger")] },
    HopSpec { name: "consumer_batch", metric: "kafka_batch_handling_seconds", labels: &[] },
];

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A profile's running system.
struct System {
    profile: String,
    child: Child,
    ports: [u16; 4],
    prefix: String,
    databases: [String; 2],
    http: reqwest::Client,
    /// The bearer tokens this run's services were started with (random per run).
    tokens: [String; 2],
}

impl System {
    async fn start(args: &Args, binary: &Path, profile: &str, run: &str) -> anyhow::Result<Self> {
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
        let log = std::fs::File::create(args.out.join(format!("{profile}.log")))?;
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
                    bail!("{url} not ready after 120 s (see {}.log)", profile);
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
    async fn stop(mut self, args: &Args) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
            if tokio::time::timeout(Duration::from_secs(45), self.child.wait()).await.is_err() {
                self.child.kill().await.ok();
            }
        }
        let mut admin = PgConnection::connect(&args.database_url).await?;
        for name in &self.databases {
            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut admin).await?;
        }
        let kafka = kafka::KafkaArgs {
            topic_prefix: self.prefix.clone(),
            security: args.kafka_security.clone(),
            ..kafka::KafkaArgs::new(args.kafka_bootstrap_servers.clone())
        };
        let names: Vec<String> =
            contracts::topics::plan(&self.prefix).into_iter().map(|spec| spec.name).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        kafka::topics::delete(&kafka, &names)
            .await
            .map_err(|error| anyhow!("delete the run's topics: {error}"))?;
        Ok(())
    }

    /// Runs one load through `pagamentos loadgen` and measures around it.
    async fn measure(
        &self,
        args: &Args,
        binary: &Path,
        load: &str,
        offered: Option<u32>,
        extra: &[String],
    ) -> anyhow::Result<Measured> {
        let pagamentos = self.child.id().ok_or_else(|| anyhow!("pagamentos all exited"))?;
        tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;
        let mut database = PgConnection::connect(&args.database_url).await?;
        let scrape_before = self.metrics().await?;
        let cpu_before = Parts { pagamentos, loadgen: None }.cpu_ticks();
        let commits_before = commits(&mut database).await?;
        let started = Instant::now();

        eprintln!("bench: {} — {load}", self.profile);
        let child = Command::new(binary)
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
            .stderr(Stdio::inherit())
            .spawn()
            .context("run pagamentos loadgen")?;
        let parts = Parts { pagamentos, loadgen: child.id() };

        // peak memory of each part, and loadgen's CPU as last seen (it is gone at the end)
        let (stop_sampling, mut stopped) = tokio::sync::watch::channel(false);
        let sampler = tokio::spawn(async move {
            let mut peak: BTreeMap<Part, u64> = BTreeMap::new();
            let mut loadgen_ticks = 0;
            loop {
                for (part, kib) in parts.memory() {
                    let slot = peak.entry(part).or_default();
                    *slot = (*slot).max(kib);
                }
                if let Some(&ticks) = parts.cpu_ticks().get(&Part::Loadgen) {
                    loadgen_ticks = loadgen_ticks.max(ticks);
                }
                tokio::select! {
                    _ = stopped.changed() => return (peak, loadgen_ticks),
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
        });
        let output = child.wait_with_output().await.context("run pagamentos loadgen")?;
        let seconds = started.elapsed().as_secs_f64();
        // let PostgreSQL flush its statistics (at most once a second) before reading them
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let _ = stop_sampling.send(true);
        let (peak, loadgen_ticks) = sampler.await?;
        let mut cpu_after = Parts { pagamentos, loadgen: None }.cpu_ticks();
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
                prom::hop(&scrape_before, &scrape_after, spec.metric, spec.labels).map(|hop| (spec.name, hop))
            })
            .collect();
        let measured = Measured {
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

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|line| {
                line.strip_prefix("model name")
                    .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|line| {
                line.strip_prefix("MemTotal:")?.split_whitespace().next()?.parse::<u64>().ok()
            })
        })
        .map_or(0.0, |kib| kib as f64 / 1024.0 / 1024.0);
    format!("{cores} cores ({cpu}), {memory:.0} GiB; PostgreSQL, Kafka, pagamentos all and loadgen on the same machine")
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator == 0.0 {
        return 0.0;
    }
    (numerator / denominator * 1000.0).round() / 1000.0
}

fn summary(args: &Args, runs: &[Measured], comparison: &str, date: &str, plot: &str) -> String {
    let mut text = format!(
        "## {date} — scripts/bench, commit `{}`\n\nMachine: {}. Loads: flat out = closed loop with {} transfers in flight end to end; 200/s = open loop; Zipf = flat out with `--skew {}`; sweep = open loop, {} s each. {} accounts per load. CPU in % of one core over the load (sending + draining).\n\n",
        args.commit, machine(), args.flat_concurrency, args.skew, args.sweep_duration, args.accounts
    );
    text.push_str("| profile | load | sent | final | lost | throughput/s | p50 ms | p95 ms | p99 ms | max ms | CPU % pagamentos / kafka / postgres / loadgen | memory MiB (PSS) pagamentos / kafka / postgres | PG commits/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        let r = &run.report;
        let cpu = |part| run.cpu_percent.get(&part).copied().unwrap_or(0.0);
        let mem = |part| run.memory_mib_max.get(&part).copied().unwrap_or(0.0);
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} / {} | {} / {} / {} | {} |\n",
            run.profile,
            run.load,
            r.sent,
            r.settled + r.rejected,
            r.lost,
            r.throughput_per_s,
            r.latency_ms.p50,
            r.latency_ms.p95,
            r.latency_ms.p99,
            r.latency_ms.max,
            cpu(Part::Pagamentos),
            cpu(Part::Kafka),
            cpu(Part::Postgres),
            cpu(Part::Loadgen),
            mem(Part::Pagamentos),
            mem(Part::Kafka),
            mem(Part::Postgres),
            run.postgres_commits_per_s
        ));
    }
    text.push_str("\nPer hop (from the services' histograms; mean / p50 / p99 in ms, percentiles interpolated in coarse buckets):\n\n| profile | load | ");
    text.push_str(&HOPS.iter().map(|spec| spec.name).collect::<Vec<_>>().join(" | "));
    text.push_str(" |\n|---|---|");
    text.push_str(&"---|".repeat(HOPS.len()));
    text.push('\n');
    for run in runs.iter().filter(|run| run.offered_per_s.is_none() || run.load.starts_with("200")) {
        text.push_str(&format!("| {} | {} |", run.profile, run.load));
        for spec in &HOPS {
            match run.hops.get(spec.name) {
                Some(hop) => text.push_str(&format!(" {} / {} / {} |", hop.mean_ms, hop.p50_ms, hop.p99_ms)),
                None => text.push_str(" – |"),
            }
        }
        text.push('\n');
    }
    text.push_str(&format!(
        "\nComparison (flat out): `{comparison}`\n\n![latency vs offered load]({plot})\n"
    ));
    text
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let binary = match &args.pagamentos {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("pagamentos"),
    };
    if !binary.exists() {
        bail!("{} does not exist (build it: cargo build --release -p pagamentos)", binary.display());
    }
    let run = format!("{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs());
    let mut runs = Vec::new();
    let mut sweeps = Vec::new();
    for profile in &args.profiles {
        let system = System::start(&args, &binary, profile, &run).await?;
        let duration = args.duration.to_string();
        let flat = args.flat_concurrency.to_string();
        let loads: Vec<(String, Option<u32>, Vec<String>)> = vec![
            (
                "flat out".into(),
                None,
                vec![
                    "--rate".into(),
                    "0".into(),
                    "--concurrency".into(),
                    flat.clone(),
                    "--duration".into(),
                    duration.clone(),
                ],
            ),
            (
                "200/s".into(),
                Some(200),
                vec!["--rate".into(), "200".into(), "--duration".into(), duration.clone()],
            ),
            (
                format!("flat out {}", args.skew),
                None,
                vec![
                    "--rate".into(),
                    "0".into(),
                    "--concurrency".into(),
                    flat,
                    "--duration".into(),
                    duration,
                    "--skew".into(),
                    args.skew.clone(),
                ],
            ),
        ];
        // a first, unrecorded load: producers' transactions initialised, partition leaders
        // known, connection pools filled, so the first measured load does not pay for them
        let warm_up = ["--rate", "100", "--duration", "3"].map(String::from);
        let mut outcome = system.measure(&args, &binary, "warm-up", Some(100), &warm_up).await.map(drop);
        for (load, offered, extra) in loads.iter().filter(|_| outcome.is_ok()) {
            match system.measure(&args, &binary, load, *offered, extra).await {
                Ok(measured) => runs.push(measured),
                Err(error) => {
                    outcome = Err(error);
                    break;
                }
            }
        }
        let rates = if profile == "fast" { &args.fast_rates } else { &args.reference_rates };
        let mut points = Vec::new();
        for &rate in rates.iter().filter(|_| outcome.is_ok()) {
            let extra =
                vec!["--rate".into(), rate.to_string(), "--duration".into(), args.sweep_duration.to_string()];
            match system.measure(&args, &binary, &format!("sweep {rate}/s"), Some(rate), &extra).await {
                Ok(measured) => {
                    points.push((
                        f64::from(rate),
                        measured.report.latency_ms.p50,
                        measured.report.latency_ms.p99,
                    ));
                    runs.push(measured);
                }
                Err(error) => {
                    outcome = Err(error);
                    break;
                }
            }
        }
        sweeps.push(plot::Series { profile: profile.clone(), points });
        system.stop(&args).await?;
        outcome?;
    }

    let flat = |profile: &str| {
        runs.iter().find(|run| run.profile == profile && run.load == "flat out").map(|run| run.report.clone())
    };
    let (fast, reference) = (flat("fast"), flat("reference"));
    let ratios = match (&fast, &reference) {
        (Some(fast), Some(reference)) => Some(Ratios {
            throughput: ratio(fast.throughput_per_s, reference.throughput_per_s),
            p99: ratio(fast.latency_ms.p99, reference.latency_ms.p99),
        }),
        _ => None,
    };
    let comparison = Comparison { fast, reference, ratio: ratios };
    let comparison_json = serde_json::to_string(&comparison)?;
    let date = String::from_utf8_lossy(
        &std::process::Command::new("date").arg("-u").arg("+%Y-%m-%d").output()?.stdout,
    )
    .trim()
    .to_owned();
    let plot_name = format!("latency-vs-load-{date}-{}.png", args.commit);
    plot::latency_vs_load(
        &sweeps,
        &format!("pagamentos {date} ({}): latency vs offered load", args.commit),
        &args.out.join("latency-vs-load.svg"),
        &args.out.join(&plot_name),
    )?;
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&serde_json::json!({"runs": runs, "comparison": comparison}))?,
    )?;
    std::fs::write(
        args.out.join("summary.md"),
        summary(&args, &runs, &comparison_json, &date, &format!("bench/{plot_name}")),
    )?;
    eprintln!("bench: results, summary and plot in {}", args.out.display());
    println!("{comparison_json}");
    Ok(())
}

/// Transactions committed in the whole cluster so far.
async fn commits(database: &mut PgConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT sum(xact_commit)::bigint FROM pg_stat_database").fetch_one(database).await
}
