//! Issue #47's targets, every one a ratio of two figures of the same run: per binary, each
//! load's figure is the mean over that binary's rounds (A B B A: the two means sit at the same
//! point of the run on average).

use serde::Serialize;

use crate::summary::{cpu_ms_per_transfer, ratio};
use crate::Measured;

/// One target: `figure` compared with `limit`; `met` is `None` when the run lacks a figure.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Target {
    pub name: &'static str,
    pub figure: Option<f64>,
    /// `<=`, `>=` or `=`.
    pub relation: &'static str,
    pub limit: f64,
    pub met: Option<bool>,
}

/// current ÷ baseline for one load of the `fast` rounds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Versus {
    pub load: String,
    pub throughput: f64,
    pub p50: f64,
    pub p99: f64,
    pub cpu_ms_per_transfer: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Targets {
    pub targets: Vec<Target>,
    /// Every load both binaries ran, current ÷ baseline.
    pub versus_baseline: Vec<Versus>,
    /// Transfers (or floor messages) that never reached a final status, over every load.
    pub lost: u64,
}

/// The mean of `figure` over the runs of `binary` under `profile` with load `load`.
fn mean(
    runs: &[Measured],
    binary: &str,
    profile: &str,
    load: &str,
    figure: impl Fn(&Measured) -> f64,
) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .filter(|run| run.binary == binary && run.profile == profile && run.load == load)
        .map(figure)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

fn throughput(run: &Measured) -> f64 {
    run.report.throughput_per_s
}
fn p50(run: &Measured) -> f64 {
    run.report.latency_ms.p50
}
fn p99(run: &Measured) -> f64 {
    run.report.latency_ms.p99
}

fn divided(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    Some(ratio(numerator?, denominator?)).filter(|_| denominator != Some(0.0))
}

fn target(name: &'static str, figure: Option<f64>, relation: &'static str, limit: f64) -> Target {
    let met = figure.map(|figure| match relation {
        "<=" => figure <= limit,
        ">=" => figure >= limit,
        _ => figure == limit,
    });
    Target { name, figure, relation, limit, met }
}

impl Targets {
    pub(crate) fn from_runs(runs: &[Measured]) -> Self {
        let current = |load: &str, figure: fn(&Measured) -> f64| mean(runs, "current", "fast", load, figure);
        let floor = |load: &str| mean(runs, "floor", "floor", load, p50);
        let reference = mean(runs, "current", "reference", "flat out", throughput);
        let baseline =
            |load: &str, figure: fn(&Measured) -> f64| mean(runs, "baseline", "fast", load, figure);
        let lost: u64 = runs.iter().map(|run| run.report.lost + run.report.conflicting).sum();
        let targets = vec![
            target("200/s p50 ÷ 25/s p50", divided(current("200/s", p50), current("25/s", p50)), "<=", 1.5),
            target("200/s p99 ÷ 200/s p50", divided(current("200/s", p99), current("200/s", p50)), "<=", 3.0),
            target("25/s p50 ÷ floor 25/s p50", divided(current("25/s", p50), floor("25/s")), "<=", 1.5),
            target(
                "CPU per transfer, 200/s ÷ flat out",
                divided(current("200/s", cpu_ms_per_transfer), current("flat out", cpu_ms_per_transfer)),
                "<=",
                2.0,
            ),
            target(
                "flat out ÷ reference flat out",
                divided(current("flat out", throughput), reference),
                ">=",
                20.0,
            ),
            target(
                "hot-credit ÷ uniform flat out",
                divided(current("flat out hot-credit", throughput), current("flat out", throughput)),
                ">=",
                0.8,
            ),
            target(
                "hot-debit ÷ uniform flat out",
                divided(current("flat out hot-debit", throughput), current("flat out", throughput)),
                ">=",
                0.8,
            ),
            target(
                "flat out throughput ÷ baseline",
                divided(current("flat out", throughput), baseline("flat out", throughput)),
                ">=",
                1.0,
            ),
            target("200/s p50 ÷ baseline", divided(current("200/s", p50), baseline("200/s", p50)), "<=", 1.0),
            target("lost transfers, every load", Some(lost as f64), "=", 0.0),
        ];
        let mut loads: Vec<&str> = Vec::new();
        for run in runs.iter().filter(|run| run.binary == "current" && run.profile == "fast") {
            if !loads.contains(&run.load.as_str()) {
                loads.push(&run.load);
            }
        }
        let versus_baseline = loads
            .into_iter()
            .filter_map(|load| {
                let of =
                    |figure: fn(&Measured) -> f64| divided(current(load, figure), baseline(load, figure));
                Some(Versus {
                    load: load.to_owned(),
                    throughput: of(throughput)?,
                    p50: of(p50)?,
                    p99: of(p99)?,
                    cpu_ms_per_transfer: of(cpu_ms_per_transfer).unwrap_or(0.0),
                })
            })
            .collect();
        Self { targets, versus_baseline, lost }
    }

    /// The targets and the comparison with the baseline as Markdown tables.
    pub(crate) fn markdown(&self, baseline_commit: &str) -> String {
        let mut text = String::from("Targets (issue #47; each figure a ratio of two means of this run):\n\n| target | figure | limit | met |\n|---|---|---|---|\n");
        for target in &self.targets {
            let figure = target.figure.map_or_else(|| "–".to_owned(), |figure| figure.to_string());
            let met = match target.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "not measured",
            };
            let relation = match target.relation {
                "<=" => "≤",
                ">=" => "≥",
                other => other,
            };
            text.push_str(&format!("| {} | {figure} | {relation} {} | {met} |\n", target.name, target.limit));
        }
        if !self.versus_baseline.is_empty() {
            text.push_str(&format!(
                "\nCurrent ÷ baseline (`{baseline_commit}`), mean of each binary's two rounds:\n\n| load | throughput | p50 | p99 | CPU ms per transfer |\n|---|---|---|---|---|\n"
            ));
            for versus in &self.versus_baseline {
                text.push_str(&format!(
                    "| {} | {} | {} | {} | {} |\n",
                    versus.load, versus.throughput, versus.p50, versus.p99, versus.cpu_ms_per_transfer
                ));
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use loadgen::{LatencySummary, Report};

    use super::*;

    fn run(binary: &str, profile: &str, load: &str, throughput: f64, p50: f64, p99: f64) -> Measured {
        Measured {
            binary: binary.into(),
            round: 0,
            profile: profile.into(),
            load: load.into(),
            offered_per_s: None,
            seconds: 10.0,
            report: Report {
                sent: 100,
                accepted: 100,
                settled: 100,
                rejected: 0,
                lost: 0,
                throughput_per_s: throughput,
                latency_ms: LatencySummary { p50, p95: p99, p99, max: p99 },
                conflicting: 0,
            },
            cpu_percent: BTreeMap::new(),
            memory_mib_max: BTreeMap::new(),
            postgres_commits_per_s: 0.0,
            hops: BTreeMap::new(),
        }
    }

    fn figure(targets: &Targets, name: &str) -> (Option<f64>, Option<bool>) {
        let target = targets.targets.iter().find(|target| target.name == name).expect(name);
        (target.figure, target.met)
    }

    #[test]
    fn figures_are_means_over_a_binary_s_rounds_and_limits_are_checked() {
        let runs = vec![
            run("baseline", "fast", "200/s", 200.0, 40.0, 100.0),
            run("current", "fast", "200/s", 200.0, 20.0, 50.0),
            run("current", "fast", "200/s", 200.0, 40.0, 70.0),
            run("baseline", "fast", "200/s", 200.0, 60.0, 100.0),
            run("current", "fast", "25/s", 25.0, 10.0, 20.0),
            run("floor", "floor", "25/s", 25.0, 5.0, 9.0),
        ];
        let targets = Targets::from_runs(&runs);
        // current 200/s p50: (20 + 40) / 2 = 30; baseline (40 + 60) / 2 = 50
        assert_eq!(figure(&targets, "200/s p50 ÷ baseline"), (Some(0.6), Some(true)));
        assert_eq!(figure(&targets, "200/s p50 ÷ 25/s p50"), (Some(3.0), Some(false)));
        assert_eq!(figure(&targets, "200/s p99 ÷ 200/s p50"), (Some(2.0), Some(true)));
        assert_eq!(figure(&targets, "25/s p50 ÷ floor 25/s p50"), (Some(2.0), Some(false)));
        assert_eq!(figure(&targets, "flat out ÷ reference flat out"), (None, None));
        assert_eq!(figure(&targets, "lost transfers, every load"), (Some(0.0), Some(true)));
        assert_eq!(targets.versus_baseline.len(), 1);
        assert_eq!(targets.versus_baseline[0].p50, 0.6);
    }

    #[test]
    fn a_lost_transfer_anywhere_fails_its_target() {
        let mut lost = run("floor", "floor", "200/s", 200.0, 5.0, 9.0);
        lost.report.lost = 1;
        let targets = Targets::from_runs(&[lost]);
        assert_eq!(figure(&targets, "lost transfers, every load"), (Some(1.0), Some(false)));
        assert!(targets.markdown("abc").contains("| lost transfers, every load | 1 | = 0 | **no** |"));
    }
}
