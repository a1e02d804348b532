//! `summary.md`: the machine, the loads' table and the per-hop table.

use crate::procs::Part;
use crate::{Args, Measured, HOPS};

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

pub(crate) fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator == 0.0 {
        return 0.0;
    }
    (numerator / denominator * 1000.0).round() / 1000.0
}

/// CPU milliseconds of pagamentos, Kafka and PostgreSQL (not the load generator) per final
/// transfer over the load: the "CPU per transfer".
pub(crate) fn cpu_ms_per_transfer(run: &Measured) -> f64 {
    let finals = run.report.settled + run.report.rejected;
    if finals == 0 {
        return 0.0;
    }
    let percent: f64 = [Part::Pagamentos, Part::Kafka, Part::Postgres]
        .iter()
        .map(|part| run.cpu_percent.get(part).copied().unwrap_or(0.0))
        .sum();
    let cpu_seconds = percent / 100.0 * run.seconds;
    (cpu_seconds * 1_000.0 / finals as f64 * 100.0).round() / 100.0
}

pub(crate) fn summary(args: &Args, runs: &[Measured], comparison: &str, date: &str, plot: &str) -> String {
    let mut text = format!(
        "## {date} — scripts/bench, commit `{}`\n\nMachine: {}. Loads: flat out = closed loop with {} transfers in flight end to end; 200/s = open loop; Zipf = flat out with `--skew {}`; hot-credit / hot-debit = flat out with every transfer crediting / debiting one account (the debited one opens with as much as all the others together); sweep = open loop, {} s each. {} accounts per load. CPU in % of one core over the load (sending + draining); CPU ms per transfer = CPU seconds of pagamentos + Kafka + PostgreSQL over the load ÷ final transfers.\n\n",
        args.commit, machine(), args.flat_concurrency, args.skew, args.sweep_duration, args.accounts
    );
    text.push_str("| profile | load | sent | final | rejected | lost | throughput/s | p50 ms | p95 ms | p99 ms | max ms | CPU % pagamentos / kafka / postgres / loadgen | CPU ms per transfer | memory MiB (PSS) pagamentos / kafka / postgres | PG commits/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        let r = &run.report;
        let cpu = |part| run.cpu_percent.get(&part).copied().unwrap_or(0.0);
        let mem = |part| run.memory_mib_max.get(&part).copied().unwrap_or(0.0);
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} / {} | {} | {} / {} / {} | {} |\n",
            run.profile,
            run.load,
            r.sent,
            r.settled + r.rejected,
            r.rejected,
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
            cpu_ms_per_transfer(run),
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
