//! CPU and memory (PSS) of the processes under test, read from `/proc`: `pagamentos all`, the Kafka
//! broker (the JVM running `kafka.Kafka`), PostgreSQL (every `postgres` process, plus what
//! the postmaster collected from backends that exited) and `pagamentos loadgen`.

use std::collections::BTreeMap;
use std::fs;

use serde::Serialize;

/// Clock ticks per second of `/proc/<pid>/stat` (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// Which processes make up each part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    Pagamentos,
    Kafka,
    Postgres,
    /// The load generator itself, on the same cores.
    Loadgen,
}

/// The processes of each part, found again at each reading (PostgreSQL backends come and go).
#[derive(Debug, Clone, Copy)]
pub struct Parts {
    pub pagamentos: u32,
    pub loadgen: Option<u32>,
}

fn read(path: String) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// utime + stime (+ cutime + cstime when `children`) of one process, in ticks.
fn ticks(pid: u32, children: bool) -> u64 {
    let Some(stat) = read(format!("/proc/{pid}/stat")) else { return 0 };
    // fields after the command (which may hold spaces) start after the last ')'
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17
    let field = |n: usize| fields.get(n - 3).and_then(|value| value.parse::<u64>().ok()).unwrap_or(0);
    field(14) + field(15) + if children { field(16) + field(17) } else { 0 }
}

/// Memory of one process in KiB: its proportional set size (shared pages divided among the
/// processes sharing them, so PostgreSQL's shared buffers count once across its backends), or
/// its resident set where PSS is not available.
fn memory_kib(pid: u32) -> u64 {
    let field = |path: String, name: &str| {
        read(path).and_then(|text| {
            text.lines().find_map(|line| {
                line.strip_prefix(name).and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            })
        })
    };
    field(format!("/proc/{pid}/smaps_rollup"), "Pss:")
        .or_else(|| field(format!("/proc/{pid}/status"), "VmRSS:"))
        .unwrap_or(0)
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|entries| entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

impl Parts {
    fn members(&self) -> BTreeMap<Part, Vec<(u32, bool)>> {
        let mut members: BTreeMap<Part, Vec<(u32, bool)>> = BTreeMap::new();
        members.entry(Part::Pagamentos).or_default().push((self.pagamentos, false));
        if let Some(pid) = self.loadgen {
            members.entry(Part::Loadgen).or_default().push((pid, false));
        }
        for pid in all_pids() {
            let comm = read(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "postgres" {
                // the postmaster (its parent is not postgres) also counts its exited children
                let parent = read(format!("/proc/{pid}/stat"))
                    .and_then(|stat| stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<u32>().ok())
                    .unwrap_or(0);
                let parent_comm = read(format!("/proc/{parent}/comm")).unwrap_or_default();
                members.entry(Part::Postgres).or_default().push((pid, parent_comm.trim() != "postgres"));
            } else if comm.trim() == "java"
                && read(format!("/proc/{pid}/cmdline")).is_some_and(|cmdline| cmdline.contains("kafka.Kafka"))
            {
                members.entry(Part::Kafka).or_default().push((pid, false));
            }
        }
        members
    }

    /// CPU ticks used so far by each part.
    pub fn cpu_ticks(&self) -> BTreeMap<Part, u64> {
        self.members()
            .into_iter()
            .map(|(part, pids)| (part, pids.iter().map(|&(pid, children)| ticks(pid, children)).sum()))
            .collect()
    }

    /// Memory of each part now (PSS), in KiB.
    pub fn memory(&self) -> BTreeMap<Part, u64> {
        self.members()
            .into_iter()
            .map(|(part, pids)| (part, pids.iter().map(|&(pid, _)| memory_kib(pid)).sum()))
            .collect()
    }
}

/// CPU use between two readings, in percent of one core.
pub fn cpu_percent(
    before: &BTreeMap<Part, u64>,
    after: &BTreeMap<Part, u64>,
    seconds: f64,
) -> BTreeMap<Part, f64> {
    after
        .iter()
        .map(|(part, &ticks)| {
            let used = ticks.saturating_sub(before.get(part).copied().unwrap_or(0)) as f64 / TICKS_PER_SECOND;
            (*part, (used / seconds.max(0.001) * 1_000.0).round() / 10.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_and_memory() {
        let me = Parts { pagamentos: std::process::id(), loadgen: None };
        let before = me.cpu_ticks();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert_ne!(x, 1);
        let after = me.cpu_ticks();
        assert!(after[&Part::Pagamentos] > before[&Part::Pagamentos]);
        assert!(me.memory()[&Part::Pagamentos] > 1_000);
        let percent = cpu_percent(&before, &after, 1.0);
        assert!(percent[&Part::Pagamentos] > 0.0);
    }
}
