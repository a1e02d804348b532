//! `pagamentos-bench`, the driver behind `scripts/bench` (`docs/reference/contract.md` §1, issues
//! #10 and #47): rounds of the current binary and, with `--baseline`, a baseline binary (A B B
//! A) on one stack, each on fresh databases and topics: the floor program (`floor`), then
//! `pagamentos all --profile fast` warmed up until steady and driven through the current
//! binary's `pagamentos loadgen` under each load (25/s and 200/s open loop, flat out, hot
//! accounts, a sweep; `--loads` picks some); then the reference profile flat out once. It
//! samples CPU and memory of pagamentos, Kafka and PostgreSQL, PostgreSQL's commits/s and each
//! hop's latency over each load's sending and draining, writes `results.json`, `summary.md`
//! (issue #47's targets as ratios within the run) and the latency-vs-load plot, and prints the
//! targets and then `{"fast": …, "reference": …, "ratio": {"throughput", "p99"}}` as its last
//! two lines.

#![forbid(unsafe_code)]

mod floor;
mod plot;
mod procs;
mod prom;
mod rounds;
mod summary;
mod system;
mod targets;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use contracts::topics::groups;
use serde::Serialize;

use loadgen::Report;
use procs::Part;
use prom::Hop;
use summary::{ratio, summary};

/// The standard benchmark: the same loads against the current binary and, with `--baseline`,
/// a baseline binary in rounds A B B A on one stack, plus the floor program and the reference
/// profile; every target a ratio within this run.
#[derive(Debug, Parser)]
#[command(name = "pagamentos-bench")]
struct Args {
    /// Profiles to run: `fast` runs the rounds (every load, each binary), `reference` runs flat
    /// out once with the current binary after them (the contract's comparison line).
    #[arg(long, value_delimiter = ',', default_value = "fast,reference", value_parser = ["reference", "fast"])]
    profiles: Vec<String>,

    /// A pagamentos binary measured beside the current one: rounds baseline, current, current,
    /// baseline (A B B A), each on fresh databases and topics, every figure compared as
    /// current ÷ baseline. Without it, one round of the current binary.
    #[arg(long)]
    baseline: Option<PathBuf>,

    /// The baseline's commit, for the records.
    #[arg(long, env = "PAGAMENTOS_BENCH_BASELINE_COMMIT", default_value = "baseline")]
    baseline_commit: String,

    /// Seconds of each main load (25/s, 200/s, flat out, Zipf, hot accounts).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    duration: u64,

    /// Seconds of each load of the sweep.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    sweep_duration: u64,

    /// Longest warm-up of a round, in seconds: 200/s in 5 s chunks until two chunks in a row
    /// have a p50 within 15 % of each other.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(5..))]
    warm_up_max: u64,

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

    /// Loads of each round, in the order given (the sweep last): `25` and `200` (open loop at
    /// that rate), `flat` (closed loop, uniform), `zipf` (flat out with --skew), `hot-credit`
    /// and `hot-debit` (flat out, every transfer crediting, resp. debiting, one account),
    /// `sweep` (the open-loop rates of the plot).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "25,200,flat,hot-credit,hot-debit,sweep",
        value_parser = ["25", "200", "flat", "zipf", "hot-credit", "hot-debit", "sweep"]
    )]
    loads: Vec<String>,

    /// Offered rates (transfers/s) of the sweep; the plot adds the 25/s and 200/s loads.
    #[arg(long, value_delimiter = ',', default_value = "50,100,400,800,1200")]
    fast_rates: Vec<u32>,

    /// Rates (messages/s) of the floor program, run in each round before the system starts.
    #[arg(long, value_delimiter = ',', default_value = "25,200")]
    floor_rates: Vec<u32>,

    /// Skip the floor program.
    #[arg(long)]
    no_floor: bool,

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

    /// The binary whose `loadgen` drives every round (the current one): set by `run`.
    #[arg(skip)]
    loadgen: PathBuf,

    /// Commit being measured, for the records.
    #[arg(long, env = "PAGAMENTOS_BENCH_COMMIT", default_value = "unknown")]
    commit: String,
}

/// One load of one profile, measured.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    /// `current`, `baseline`, or `floor` (the floor program: its "pagamentos" CPU is this driver's).
    binary: String,
    /// The round (0-based) it ran in.
    round: usize,
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
    /// Consumer groups (without the run's topic prefix) whose samples the hop sums; none: any.
    groups: &'static [&'static str],
}

impl HopSpec {
    /// The samples of this hop in a run whose topics and groups carry `prefix`.
    fn filter(&self, prefix: &str) -> Vec<(&'static str, Vec<String>)> {
        let mut filter: Vec<(&'static str, Vec<String>)> =
            self.labels.iter().map(|(name, value)| (*name, vec![(*value).to_owned()])).collect();
        if !self.groups.is_empty() {
            filter.push(("group", self.groups.iter().map(|group| format!("{prefix}{group}")).collect()));
        }
        filter
    }
}

const fn hop(
    name: &'static str,
    metric: &'static str,
    labels: &'static [(&'static str, &'static str)],
) -> HopSpec {
    HopSpec { name, metric, labels, groups: &[] }
}

/// `kafka_batch_handling_seconds` of some groups: one consumer runtime's batches, from the first
/// record handed to the handler to its verdicts (the handler's database or Kafka transaction
/// included; not the fetch before, nor the offset store after).
const fn batches(name: &'static str, groups: &'static [&'static str]) -> HopSpec {
    HopSpec { name, metric: "kafka_batch_handling_seconds", labels: &[], groups }
}

/// The notification retry stages' groups (`docs/reference/contract.md` §3), checked against
/// `groups::notifications_retry` by a test.
const NOTIFICATION_RETRY_GROUPS: [&str; 3] =
    ["notificacoes-retry-1000", "notificacoes-retry-2000", "notificacoes-retry-4000"];

const HOPS: [HopSpec; 10] = [
    hop(
        "api_post",
        "http_server_request_duration_seconds",
        &[("method", "POST"), ("route", "/transferencias")],
    ),
    hop("relay_transferencias", "outbox_delivery_seconds", &[("database", "transferencias")]),
    hop("antifraude_transaction", "antifraud_transaction_seconds", &[]),
    hop("ledger_settlement", "ledger_settlement_seconds", &[]),
    hop("relay_ledger", "outbox_delivery_seconds", &[("database", "ledger")]),
    batches("batch_antifraude", &[groups::ANTIFRAUD]),
    batches("batch_ledger", &[groups::LEDGER]),
    batches("batch_projecao", &[groups::TRANSFERS_PROJECTION]),
    batches("batch_notificacoes", &[groups::NOTIFICATIONS]),
    batches("batch_notificacoes_retry", &NOTIFICATION_RETRY_GROUPS),
];

/// The loads other than the sweep that `--loads` asks for, in its order: name, open-loop rate
/// (none: closed loop), loadgen's arguments.
fn main_loads(args: &Args) -> Vec<(String, Option<u32>, Vec<String>)> {
    let duration = args.duration.to_string();
    let flat_out = |skew: Option<&str>| {
        let mut extra: Vec<String> = ["--rate", "0", "--concurrency", &args.flat_concurrency.to_string()]
            .into_iter()
            .map(String::from)
            .collect();
        extra.extend(["--duration".to_owned(), duration.clone()]);
        if let Some(skew) = skew {
            extra.extend(["--skew".to_owned(), skew.to_owned()]);
        }
        extra
    };
    args.loads
        .iter()
        .filter_map(|load| match load.as_str() {
            "flat" => Some(("flat out".to_owned(), None, flat_out(None))),
            rate @ ("25" | "200") => Some((
                format!("{rate}/s"),
                rate.parse().ok(),
                vec!["--rate".into(), rate.to_owned(), "--duration".into(), duration.clone()],
            )),
            "zipf" => Some((format!("flat out {}", args.skew), None, flat_out(Some(&args.skew)))),
            hot @ ("hot-credit" | "hot-debit") => {
                Some((format!("flat out {hot}"), None, flat_out(Some(hot))))
            }
            _ => None, // the sweep runs after these
        })
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // interrupted (ctrl-c, SIGTERM), the run is dropped, and with it `pagamentos all` and the
    // running `pagamentos loadgen` (both killed on drop): left running, they would compete with
    // whatever is measured next on the same cores. Their databases and topics stay behind.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = run(args) => result,
        _ = tokio::signal::ctrl_c() => bail!("interrupted: the services and the load generator were stopped"),
        _ = terminate.recv() => bail!("terminated: the services and the load generator were stopped"),
    }
}

async fn run(mut args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let current = match &args.pagamentos {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("pagamentos"),
    };
    for binary in std::iter::once(&current).chain(&args.baseline) {
        if !binary.exists() {
            bail!("{} does not exist (build it: cargo build --release -p pagamentos)", binary.display());
        }
    }
    args.loadgen = current.clone();
    let args = args;
    let run = format!("{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs());
    let mut runs = Vec::new();
    let mut warm_ups = Vec::new();
    let plan = rounds::plan(&current, args.baseline.as_deref());
    let outcome = if args.profiles.iter().any(|profile| profile == "fast") {
        rounds::fast(&args, &plan, &run, &mut runs, &mut warm_ups).await
    } else {
        Ok(())
    };
    let outcome = match outcome {
        Ok(()) if args.profiles.iter().any(|profile| profile == "reference") => {
            rounds::reference(&args, &current, &run, plan.len(), &mut runs).await
        }
        other => other,
    };

    // the contract's line: the current binary's last flat-out round against the reference
    let flat = |binary: &str, profile: &str| {
        runs.iter()
            .rev()
            .find(|run| run.binary == binary && run.profile == profile && run.load == "flat out")
            .map(|run| run.report.clone())
    };
    let (fast, reference) = (flat("current", "fast"), flat("current", "reference"));
    let ratios = match (&fast, &reference) {
        (Some(fast), Some(reference)) => Some(Ratios {
            throughput: ratio(fast.throughput_per_s, reference.throughput_per_s),
            p99: ratio(fast.latency_ms.p99, reference.latency_ms.p99),
        }),
        _ => None,
    };
    let comparison = Comparison { fast, reference, ratio: ratios };
    let comparison_json = serde_json::to_string(&comparison)?;
    let targets = targets::Targets::from_runs(&runs);
    let date = String::from_utf8_lossy(
        &std::process::Command::new("date").arg("-u").arg("+%Y-%m-%d").output()?.stdout,
    )
    .trim()
    .to_owned();
    let plot_name = format!("latency-vs-load-{date}-{}.png", args.commit);
    plot::latency_vs_load(
        &rounds::series(&runs),
        &format!("pagamentos {date} ({} vs {}): latency vs offered load", args.commit, args.baseline_commit),
        &args.out.join("latency-vs-load.svg"),
        &args.out.join(&plot_name),
    )?;
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "runs": runs, "warm_ups": warm_ups, "targets": targets, "comparison": comparison
        }))?,
    )?;
    std::fs::write(
        args.out.join("summary.md"),
        summary(&args, &runs, &warm_ups, &targets, &comparison_json, &date, &format!("bench/{plot_name}")),
    )?;
    eprintln!("bench: results, summary and plot in {}", args.out.display());
    outcome?;
    println!("{}", serde_json::to_string(&targets)?);
    println!("{comparison_json}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_hop_names_the_contract_s_retry_groups() {
        let contract: Vec<String> = contracts::topics::RETRY_DELAYS_MS
            .iter()
            .map(|&delay| groups::notifications_retry(delay))
            .collect();
        assert_eq!(NOTIFICATION_RETRY_GROUPS.to_vec(), contract);
    }

    #[test]
    fn loads_run_in_the_order_asked_and_hot_loads_are_flat_out_with_their_skew() {
        let args =
            Args::parse_from(["pagamentos-bench", "--out", "/tmp/x", "--loads", "hot-debit,flat,sweep"]);
        let loads = main_loads(&args);
        let names: Vec<&str> = loads.iter().map(|(name, _, _)| name.as_str()).collect();
        assert_eq!(names, ["flat out hot-debit", "flat out"]);
        let (_, rate, extra) = &loads[0];
        assert_eq!(*rate, None, "closed loop");
        assert_eq!(extra.join(" "), "--rate 0 --concurrency 256 --duration 20 --skew hot-debit");
        let every = Args::parse_from(["pagamentos-bench", "--out", "/tmp/x"]);
        let names: Vec<String> = main_loads(&every).into_iter().map(|(name, _, _)| name).collect();
        assert_eq!(names, ["25/s", "200/s", "flat out", "flat out hot-credit", "flat out hot-debit"]);
    }

    #[test]
    fn a_group_hop_matches_the_run_s_prefixed_groups() {
        let spec = HOPS.iter().find(|spec| spec.name == "batch_ledger").expect("ledger hop");
        assert_eq!(spec.filter("bench-1-fast."), [("group", vec!["bench-1-fast.ledger".to_owned()])]);
        let api = HOPS.iter().find(|spec| spec.name == "api_post").expect("api hop");
        assert_eq!(api.filter("p.").len(), 2, "no group filter on a hop without groups");
    }
}
