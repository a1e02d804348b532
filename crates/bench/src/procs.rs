//! CPU and memory (PSS) of the processes under test, read from `/proc` through `procfs`:
//! `pagamentos all`, the Kafka broker (the JVM running `kafka.Kafka`), PostgreSQL (every
//! `postgres` process, plus what the postmaster collected from backends that exited) and
//! `pagamentos loadgen`.

use std::collections::BTreeMap;

use procfs::process::{all_processes, Process};
use serde::Serialize;

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

fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// utime + stime (+ cutime + cstime when `children`) of one process, in clock ticks.
fn ticks(pid: u32, children: bool) -> u64 {
    let Some(stat) = process(pid).and_then(|process| process.stat().ok()) else { return 0 };
    let waited_for = if children { (stat.cutime.max(0) + stat.cstime.max(0)) as u64 } else { 0 };
    stat.utime + stat.stime + waited_for
}

/// Memory of one process in KiB: its proportional set size (shared pages divided among the
/// processes sharing them, so PostgreSQL's shared buffers count once across its backends), or
/// its resident set where PSS is not available.
fn memory_kib(pid: u32) -> u64 {
    let Some(process) = process(pid) else { return 0 };
    let pss_bytes = process
        .smaps_rollup()
        .ok()
        .and_then(|rollup| rollup.memory_map_rollup.0.first()?.extension.map.get("Pss").copied());
    pss_bytes.map(|bytes| bytes / 1024).or_else(|| process.status().ok()?.vmrss).unwrap_or(0)
}

/// The command name of a process (`/proc/<pid>/stat`'s, as `comm`), and its parent's pid.
fn comm_and_parent(process: &Process) -> Option<(String, i32)> {
    let stat = process.stat().ok()?;
    Some((stat.comm, stat.ppid))
}

impl Parts {
    fn members(&self) -> BTreeMap<Part, Vec<(u32, bool)>> {
        let mut members: BTreeMap<Part, Vec<(u32, bool)>> = BTreeMap::new();
        members.entry(Part::Pagamentos).or_default().push((self.pagamentos, false));
        if let Some(pid) = self.loadgen {
            members.entry(Part::Loadgen).or_default().push((pid, false));
        }
        for process in all_processes().into_iter().flatten().flatten() {
            let Some((comm, parent)) = comm_and_parent(&process) else { continue };
            let Ok(pid) = u32::try_from(process.pid()) else { continue };
            if comm == "postgres" {
                // the postmaster (its parent is not postgres) also counts its exited children
                let parent_comm = Process::new(parent).ok().as_ref().and_then(comm_and_parent);
                let postmaster = parent_comm.is_none_or(|(comm, _)| comm != "postgres");
                members.entry(Part::Postgres).or_default().push((pid, postmaster));
            } else if comm == "java"
                && process
                    .cmdline()
                    .is_ok_and(|arguments| arguments.iter().any(|arg| arg.contains("kafka.Kafka")))
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

    /// CPU ticks used so far by the load generator (0 once it has exited or when there is none).
    /// One `stat` read: unlike [`Self::cpu_ticks`] it does not list every process.
    pub fn loadgen_ticks(&self) -> u64 {
        self.loadgen.map_or(0, |pid| ticks(pid, false))
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
            // clock ticks of `/proc/<pid>/stat`: `sysconf(_SC_CLK_TCK)` of them a second
            let used = ticks.saturating_sub(before.get(part).copied().unwrap_or(0)) as f64
                / procfs::ticks_per_second() as f64;
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
        let as_loadgen = Parts { pagamentos: std::process::id(), loadgen: Some(std::process::id()) };
        assert!(as_loadgen.loadgen_ticks() >= after[&Part::Pagamentos]);
        assert!(me.memory()[&Part::Pagamentos] > 1_000);
        let percent = cpu_percent(&before, &after, 1.0);
        assert!(percent[&Part::Pagamentos] > 0.0);
    }
}
