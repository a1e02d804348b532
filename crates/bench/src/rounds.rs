//! The rounds of a run: with a baseline, baseline, current, current, baseline (A B B A) on one
//! stack, so that a host that speeds up or slows down over the run moves both binaries alike;
//! each round on fresh databases and topics, warmed up, with the floor program first. Then the
//! reference profile, and the plot's series.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sqlx::{Connection, PgConnection};

use crate::floor::Floor;
use crate::plot::Series;
use crate::procs::{self, Parts};
use crate::system::{commits, System, WarmUp};
use crate::{main_loads, Args, Measured};

/// The binaries of each round: (label, path).
pub(crate) fn plan(current: &Path, baseline: Option<&Path>) -> Vec<(&'static str, PathBuf)> {
    match baseline {
        Some(baseline) => vec![
            ("baseline", baseline.to_owned()),
            ("current", current.to_owned()),
            ("current", current.to_owned()),
            ("baseline", baseline.to_owned()),
        ],
        None => vec![("current", current.to_owned())],
    }
}

/// The `fast` rounds: per round the floor program, then the binary's system, warmed up, under
/// every load. Stops at the first failure (what was measured is kept in `runs`).
pub(crate) async fn fast(
    args: &Args,
    plan: &[(&'static str, PathBuf)],
    run: &str,
    runs: &mut Vec<Measured>,
    warm_ups: &mut Vec<WarmUp>,
) -> anyhow::Result<()> {
    for (round, (label, binary)) in plan.iter().enumerate() {
        if !args.no_floor && !args.floor_rates.is_empty() {
            floor(args, run, round, runs).await?;
        }
        let system = System::start(args, (label, binary), "fast", run, round).await?;
        let outcome = async {
            warm_ups.push(system.warm_up(args).await?);
            for (load, offered, extra) in main_loads(args) {
                runs.push(system.measure(args, &load, offered, &extra, true).await?);
            }
            if args.loads.iter().any(|load| load == "sweep") {
                for &rate in &args.fast_rates {
                    let extra = ["--rate", &rate.to_string(), "--duration", &args.sweep_duration.to_string()]
                        .map(String::from);
                    let load = format!("sweep {rate}/s");
                    runs.push(system.measure(args, &load, Some(rate), &extra, true).await?);
                }
            }
            anyhow::Ok(())
        }
        .await;
        system.stop(args).await?;
        outcome?;
    }
    Ok(())
}

/// The floor program at each `--floor-rates` rate, on its own database and topics.
async fn floor(args: &Args, run: &str, round: usize, runs: &mut Vec<Measured>) -> anyhow::Result<()> {
    let floor = Floor::start(args, &format!("{run}r{round}")).await?;
    let outcome = async {
        floor.ready().await?;
        // its own warm-up: the clients' connections, the transaction's partitions
        floor.load(100, 5).await?;
        let me = Parts { pagamentos: std::process::id(), loadgen: None };
        let mut database = PgConnection::connect(&args.database_url).await?;
        for &rate in &args.floor_rates {
            tokio::time::sleep(std::time::Duration::from_secs(args.settle_seconds)).await;
            eprintln!("bench: round {round} floor — {rate}/s");
            let (cpu_before, commits_before, started) =
                (me.cpu_ticks(), commits(&mut database).await?, Instant::now());
            let (report, steps) = floor.load(rate, args.duration).await?;
            let seconds = started.elapsed().as_secs_f64();
            let (cpu_after, commits_after) = (me.cpu_ticks(), commits(&mut database).await?);
            let measured = Measured {
                binary: "floor".into(),
                round,
                profile: "floor".into(),
                load: format!("{rate}/s"),
                offered_per_s: Some(rate),
                seconds: (seconds * 10.0).round() / 10.0,
                report,
                cpu_percent: procs::cpu_percent(&cpu_before, &cpu_after, seconds),
                memory_mib_max: BTreeMap::new(),
                postgres_commits_per_s: ((commits_after - commits_before) as f64 / seconds * 10.0).round()
                    / 10.0,
                hops: steps,
            };
            println!("{}", serde_json::to_string(&measured)?);
            runs.push(measured);
        }
        anyhow::Ok(())
    }
    .await;
    floor.stop(args).await?;
    outcome
}

/// The reference profile: flat out once, with the current binary, as round `round`.
pub(crate) async fn reference(
    args: &Args,
    current: &Path,
    run: &str,
    round: usize,
    runs: &mut Vec<Measured>,
) -> anyhow::Result<()> {
    let system = System::start(args, ("current", current), "reference", run, round).await?;
    let outcome = async {
        let warm_up = ["--rate", "50", "--duration", "5"].map(String::from);
        system.measure(args, "warm-up", Some(50), &warm_up, false).await?;
        let flat = main_loads(args).into_iter().find(|(load, _, _)| load == "flat out");
        if let Some((load, offered, extra)) = flat {
            runs.push(system.measure(args, &load, offered, &extra, true).await?);
        }
        anyhow::Ok(())
    }
    .await;
    system.stop(args).await?;
    outcome
}

/// The plot's lines: per binary (and the floor), the mean p50 and p99 of its rounds at each
/// open-loop rate.
pub(crate) fn series(runs: &[Measured]) -> Vec<Series> {
    ["baseline", "current", "floor"]
        .into_iter()
        .filter_map(|binary| {
            let mut by_rate: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
            for run in runs.iter().filter(|run| run.binary == binary && run.profile != "reference") {
                if let Some(rate) = run.offered_per_s {
                    by_rate
                        .entry(rate)
                        .or_default()
                        .push((run.report.latency_ms.p50, run.report.latency_ms.p99));
                }
            }
            let points: Vec<(f64, f64, f64)> = by_rate
                .into_iter()
                .map(|(rate, values)| {
                    let n = values.len() as f64;
                    let p50 = values.iter().map(|v| v.0).sum::<f64>() / n;
                    let p99 = values.iter().map(|v| v.1).sum::<f64>() / n;
                    (f64::from(rate), p50, p99)
                })
                .collect();
            (!points.is_empty()).then(|| Series { profile: binary.to_owned(), points })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_baseline_runs_first_and_last_around_two_current_rounds() {
        let plan = plan(Path::new("/new"), Some(Path::new("/old")));
        let labels: Vec<&str> = plan.iter().map(|(label, _)| *label).collect();
        assert_eq!(labels, ["baseline", "current", "current", "baseline"]);
        assert_eq!(plan[0].1, Path::new("/old"));
        assert_eq!(plan[1].1, Path::new("/new"));
        let alone = super::plan(Path::new("/new"), None);
        assert_eq!(alone, vec![("current", PathBuf::from("/new"))]);
    }
}
