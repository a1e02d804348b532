//! The chaos suite's fault schedule: the faults, a schedule drawn from a seed (or the faults
//! named in `PAGAMENTOS_CHAOS_FAULTS`), and the seed printed again when a run fails.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::cluster::Isolated;
use super::network::Cut;

/// Traffic between two faults: drawn from this range.
pub const BETWEEN_FAULTS_MS: std::ops::Range<u64> = 2_000..6_000;
/// Longer than the group session timeout (the stack's `group.consumer.session.timeout.ms` and
/// the classic `session.timeout.ms` the services set: 10 s) and antifraude's
/// `transaction.timeout.ms` (10 s), so the paused instance is fenced on both counts.
const PAUSE: Duration = Duration::from_secs(20);
/// A pause lasts [`PAUSE`] plus up to this much, drawn.
const PAUSE_EXTRA_MS: u64 = 5_000;
/// How long a killed Kafka node of a cluster stays down.
const BROKER_DOWN: Duration = Duration::from_secs(8);
/// How long a Kafka node stays cut off: longer than the group session timeout and
/// antifraude's transaction timeout (10 s each), the brokers' registration with the controller
/// (`broker.session.timeout.ms`, 9 s) and the time a follower may lag before its leader drops
/// it from the ISR (`replica.lag.time.max.ms`, 30 s).
const PARTITION: Duration = Duration::from_secs(32);
/// A partition lasts [`PARTITION`] plus up to this much, drawn.
const PARTITION_EXTRA_MS: u64 = 4_000;
/// From the heal, how long the cluster has to take the node back into every ISR, and the
/// deployments to be ready again.
pub const PARTITION_RECOVERY: Duration = Duration::from_secs(120);

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// SIGKILL of B's service (0 transferencias, 1 ledger, 2 antifraude, 3 notificacoes) or of
    /// A (4), started again a second later.
    Kill(usize),
    /// `scripts/stack restart <part>`.
    Restart(&'static str),
    /// SIGSTOP of A for [`PAUSE`] or a little more, then SIGCONT.
    Pause,
    /// SIGSTOP of A, `scripts/stack restart <part>` while it is frozen, SIGCONT after the pause.
    PauseDuringRestart(&'static str),
    /// SIGKILL of Kafka node n (1–3) of a [`Cluster`], started again after [`BROKER_DOWN`].
    KillBroker(usize),
    /// A network partition of one Kafka node of a [`Cluster`] in network namespaces, for
    /// [`PARTITION`] or a little more, then healed.
    Partition(Isolated, Cut),
}

impl Fault {
    pub const ALL: [(&'static str, Fault); 10] = [
        ("kill-antifraude", Fault::Kill(2)),
        ("kill-ledger", Fault::Kill(1)),
        ("kill-transferencias", Fault::Kill(0)),
        ("kill-notificacoes", Fault::Kill(3)),
        ("kill-all", Fault::Kill(4)),
        ("restart-kafka", Fault::Restart("kafka")),
        ("restart-postgres", Fault::Restart("postgres")),
        ("pause-all", Fault::Pause),
        ("pause-all+restart-kafka", Fault::PauseDuringRestart("kafka")),
        ("pause-all+restart-postgres", Fault::PauseDuringRestart("postgres")),
    ];

    /// The default schedule: every single fault, and one combined fault whose restarted part
    /// the seed draws (both would add a minute to every run).
    fn default_schedule(rng: &mut StdRng) -> Vec<Fault> {
        let combined = if rng.random_bool(0.5) { "kafka" } else { "postgres" };
        Self::ALL
            .iter()
            .map(|(_, fault)| *fault)
            .filter(|fault| match fault {
                Fault::PauseDuringRestart(part) => *part == combined,
                _ => true,
            })
            .collect()
    }

    /// The faults named in `PAGAMENTOS_CHAOS_FAULTS` (comma-separated, in the order given), to
    /// reproduce one; `None` when unset.
    pub fn named() -> Option<Vec<Fault>> {
        let names = std::env::var("PAGAMENTOS_CHAOS_FAULTS").ok()?;
        names
            .split(',')
            .map(|name| {
                Self::ALL
                    .iter()
                    .find(|(known, _)| *known == name.trim())
                    .map(|(_, fault)| *fault)
                    .unwrap_or_else(|| {
                        let known: Vec<&str> = Self::ALL.iter().map(|(known, _)| *known).collect();
                        panic!("PAGAMENTOS_CHAOS_FAULTS: unknown fault {name:?}; known: {}", known.join(", "))
                    })
            })
            .collect::<Vec<_>>()
            .into()
    }

    pub fn describe(&self) -> String {
        match self {
            Fault::Kill(4) => "SIGKILL A: pagamentos all".into(),
            Fault::Kill(service) => {
                format!("SIGKILL B: {}", ["transferencias", "ledger", "antifraude", "notificacoes"][*service])
            }
            Fault::Restart(part) => format!("scripts/stack restart {part}"),
            Fault::Pause => "SIGSTOP A (pagamentos all)".into(),
            Fault::PauseDuringRestart(part) => {
                format!("SIGSTOP A, scripts/stack restart {part} while it is frozen")
            }
            Fault::KillBroker(node) => format!("SIGKILL of Kafka node {node}"),
            Fault::Partition(isolated, cut) => format!(
                "network partition: {} cut from {}",
                match isolated {
                    Isolated::Controller => "the active controller",
                    Isolated::Broker => "the node (not the controller) leading the most partitions",
                },
                match cut {
                    Cut::Brokers => "the other nodes (clients still reach it)",
                    Cut::Everyone => "the other nodes and every client",
                }
            ),
        }
    }
}

/// One step of a drawn schedule: traffic for `traffic_before`, then `fault`, which lasts `hold`
/// (how long a killed process or broker stays down, or a frozen one frozen).
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub traffic_before: Duration,
    pub fault: Fault,
    pub hold: Duration,
}

/// The run's seed: `PAGAMENTOS_CHAOS_SEED`, or drawn.
pub fn seed() -> u64 {
    match std::env::var("PAGAMENTOS_CHAOS_SEED") {
        Ok(text) => text.trim().parse().expect("PAGAMENTOS_CHAOS_SEED: a number (u64)"),
        Err(_) => rand::rng().random(),
    }
}

/// The schedule of `rounds` rounds drawn from `seed`: `faults` (or, when `None`, the default
/// faults in an order drawn per round), the traffic between them and how long each lasts.
pub fn draw_schedule(seed: u64, faults: Option<&[Fault]>, rounds: usize) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    for _ in 0..rounds {
        let round = match faults {
            Some(faults) => faults.to_vec(),
            None => {
                let mut round = Fault::default_schedule(&mut rng);
                rand::seq::SliceRandom::shuffle(round.as_mut_slice(), &mut rng);
                round
            }
        };
        for fault in round {
            let traffic_before = Duration::from_millis(rng.random_range(BETWEEN_FAULTS_MS));
            let hold = match fault {
                Fault::Kill(_) => Duration::from_millis(rng.random_range(200..2_000)),
                Fault::KillBroker(_) => BROKER_DOWN + Duration::from_millis(rng.random_range(0..2_000)),
                Fault::Partition(..) => {
                    PARTITION + Duration::from_millis(rng.random_range(0..PARTITION_EXTRA_MS))
                }
                Fault::Pause | Fault::PauseDuringRestart(_) => {
                    PAUSE + Duration::from_millis(rng.random_range(0..PAUSE_EXTRA_MS))
                }
                Fault::Restart(_) => Duration::ZERO,
            };
            steps.push(Step { traffic_before, fault, hold });
        }
    }
    steps
}

/// Prints the seed again when the test fails, next to the panic, with how to replay it.
pub struct SeedOnFailure(pub u64);

impl Drop for SeedOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("[chaos] FAILED with seed {0}: replay with PAGAMENTOS_CHAOS_SEED={0}", self.0);
        }
    }
}

/// `PAGAMENTOS_CHAOS_ROUNDS`, default 1.
pub fn rounds() -> usize {
    std::env::var("PAGAMENTOS_CHAOS_ROUNDS").ok().map_or(1, |text| {
        text.parse().ok().filter(|rounds| *rounds > 0).expect("PAGAMENTOS_CHAOS_ROUNDS: a positive number")
    })
}
