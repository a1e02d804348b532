//! `summary.md`: the machine, the loads' table and the per-hop table.

use crate::procs::Part;
use crate::system::WarmUp;
use crate::targets::Targets;
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

pub(crate) fn summary(
    args: &Args,
    runs: &[Measured],
    warm_ups: &[WarmUp],
    targets: &Targets,
    comparison: &str,
    date: &str,
    plot: &str,
) -> String {
    let rounds = match &args.baseline {
        Some(_) => {
            format!("rounds baseline (`{}`), current, current, baseline on one stack", args.baseline_commit)
        }
        None => "one round of the current binary".to_owned(),
    };
    let mut text = format!(
        "## {date} — scripts/bench, commit `{}`\n\nMachine: {}. {rounds}, each on fresh databases and topics: the floor program first (its own database and topics; its \"pagamentos\" CPU is the bench driver running it), then `pagamentos all --profile fast`, warmed up at 200/s until two 5 s chunks in a row have p50s within 15 % (at most {} s), then each load for {} s. Loads: 25/s and 200/s = open loop; flat out = closed loop with {} transfers in flight end to end; Zipf = flat out with `--skew {}`; hot-credit / hot-debit = flat out with every transfer crediting / debiting one account (the debited one opens with as much as all the others together); sweep = open loop, {} s each. The reference profile runs flat out once, after the rounds, with the current binary. {} accounts per load. CPU in % of one core over the load (sending + draining); CPU ms per transfer = CPU seconds of pagamentos + Kafka + PostgreSQL over the load ÷ final transfers.\n\n",
        args.commit, machine(), args.warm_up_max, args.duration, args.flat_concurrency, args.skew, args.sweep_duration, args.accounts
    );
    text.push_str(&targets.markdown(&args.baseline_commit));
    text.push_str("\nWarm-up of each round (p50 ms of each 5 s chunk at 200/s):\n\n| round | binary | seconds | chunks' p50 ms | steady |\n|---|---|---|---|---|\n");
    for warm_up in warm_ups {
        let chunks: Vec<String> = warm_up.p50_ms.iter().map(f64::to_string).collect();
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            warm_up.round,
            warm_up.binary,
            warm_up.seconds,
            chunks.join(", "),
            if warm_up.steady { "yes" } else { "no (cut at --warm-up-max)" }
        ));
    }
    text.push_str("\nEvery load:\n\n| round | binary | profile | load | sent | final | rejected | lost | throughput/s | p50 ms | p95 ms | p99 ms | max ms | CPU % pagamentos / kafka / postgres / loadgen | CPU ms per transfer | memory MiB (PSS) pagamentos / kafka / postgres | PG commits/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        let r = &run.report;
        let cpu = |part| run.cpu_percent.get(&part).copied().unwrap_or(0.0);
        let mem = |part| run.memory_mib_max.get(&part).copied().unwrap_or(0.0);
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} / {} | {} | {} / {} / {} | {} |\n",
            run.round,
            run.binary,
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
    text.push_str("\nPer hop (from the services' histograms; mean / p50 / p99 in ms, percentiles interpolated in coarse buckets):\n\n| round | binary | profile | load | ");
    text.push_str(&HOPS.iter().map(|spec| spec.name).collect::<Vec<_>>().join(" | "));
    text.push_str(" |\n|---|---|---|---|");
    text.push_str(&"---|".repeat(HOPS.len()));
    text.push('\n');
    let main_loads = |run: &&Measured| {
        run.binary != "floor" && (run.offered_per_s.is_none() || !run.load.starts_with("sweep"))
    };
    for run in runs.iter().filter(main_loads) {
        text.push_str(&format!("| {} | {} | {} | {} |", run.round, run.binary, run.profile, run.load));
        for spec in &HOPS {
            match run.hops.get(spec.name) {
                Some(hop) => text.push_str(&format!(" {} / {} / {} |", hop.mean_ms, hop.p50_ms, hop.p99_ms)),
                None => text.push_str(" – |"),
            }
        }
        text.push('\n');
    }
    let floors: Vec<&Measured> = runs.iter().filter(|run| run.binary == "floor").collect();
    if !floors.is_empty() {
        text.push_str("\nThe floor's steps (mean / p50 / p99 in ms, from the wall-clock stamps each stage adds to the message): commit = the one-row commit, from when the message was due; produce → consume = the acks=all produce until the transaction's consumer has it; transaction → consume = the Kafka transaction (produce, offsets, commit) until the next consumer has it; commit, produce → consume = the batch's commit and produce until the end sees it.\n\n| round | rate | ");
        text.push_str(&crate::floor::STEPS.join(" | "));
        text.push_str(" |\n|---|---|");
        text.push_str(&"---|".repeat(crate::floor::STEPS.len()));
        text.push('\n');
        for run in floors {
            text.push_str(&format!("| {} | {} |", run.round, run.load));
            for step in crate::floor::STEPS {
                match run.hops.get(step) {
                    Some(hop) => {
                        text.push_str(&format!(" {} / {} / {} |", hop.mean_ms, hop.p50_ms, hop.p99_ms))
                    }
                    None => text.push_str(" – |"),
                }
            }
            text.push('\n');
        }
    }
    text.push_str(&format!(
        "\nComparison (the current binary's last flat-out round against the reference profile): `{comparison}`\n\n![latency vs offered load: p50 solid, p99 thin, per binary and the floor]({plot})\n"
    ));
    text
}
