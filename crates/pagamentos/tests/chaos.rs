//! The chaos suite: the bank workload under faults, judged the way Jepsen's bank test judges a
//! database. Transfers flow continuously through the HTTP API over a fixed set of funded
//! accounts, served by two deployments that share the databases and topics: `pagamentos all`
//! (deployment A) and the four services as separate processes (deployment B). One fault after
//! another, with traffic in between:
//!
//! 1. SIGKILL of each of B's services (antifraude, ledger, transferencias, notificacoes), each
//!    started again a moment later, then SIGKILL of A (`pagamentos all`), started again;
//! 2. `scripts/stack restart kafka`, then `scripts/stack restart postgres`;
//! 3. SIGSTOP of A for longer than the group session timeout (its partitions move to B; A wakes
//!    up a zombie, holding batches and transactions of partitions it no longer owns), SIGCONT.
//!
//! The client is a careful one: every POST carries an `Idempotency-Key` and is retried, on
//! either deployment, until it is answered (a killed API, a request in flight elsewhere, a
//! database restart). Afterwards the pipeline drains and the test checks: every accepted
//! transfer is final; the database holds no transfer the client was not told about; no transfer
//! moved money twice; antifraude produced one output per request record (exactly-once through
//! its Kafka transactions); Σ balances of the accounts is what was paid in; `pagamentos verify` is clean;
//! every outcome was notified; the dead-letter topics are empty. Its figures are its last line.
//!
//! A second test runs the same workload on a three-broker cluster of its own (replication 3,
//! `min.insync.replicas` 2) and SIGKILLs each broker in turn under load. A third runs it on such
//! a cluster whose nodes each live in a network namespace of their own ([`Network`]) and cuts
//! one node off the network, twice, each time for longer than the session and transaction
//! timeouts: first the active controller from the other two nodes only (its quorum traffic and
//! replication; clients still reach it), then the broker leading the most partitions from
//! everyone. Each cut is proven real (the others elect a new controller when it was one, and
//! drop the node from leadership and every ISR) and healed; the node must be back in every
//! ISR and both deployments ready again before the schedule goes on.
//!
//! Faults also combine: `pause-all+restart-kafka` restarts the broker while A is frozen, so A
//! wakes up to a broker that has forgotten its sessions and transactions as well as its
//! partitions.
//!
//! While the faults run, a reader reads every customer balance in one snapshot, over and over
//! (Jepsen's bank reads): every read must show Σ conserved and no negative balance. Since the
//! set of accounts is closed, Σ cannot see a transfer applied twice between two of them, so
//! afterwards every settled transfer is also checked entry by entry: one debit of the requested
//! amount on the requested source, one credit on the requested destination.
//!
//! **Seeded**: the order of the faults in each round, the traffic between them, how long a fault
//! lasts, which part a combined fault restarts, and the transfers offered are all drawn from one
//! seed, printed at the start, in the figures and on failure. `PAGAMENTOS_CHAOS_SEED=<n>` replays
//! the same schedule (the systems' own timing is not replayable: the seed fixes what is done and
//! when, not how the processes interleave).
//!
//! They restart the shared broker and database or start a cluster, so they are `#[ignore]`d and
//! run alone by `scripts/test`. `PAGAMENTOS_CHAOS_ROUNDS=N` runs the fault schedule N times (a soak run);
//! `PAGAMENTOS_CHAOS_FAULTS=pause-all,restart-kafka` runs only the faults named, in that order
//! (see [`Fault`]).
//!
//! The tests are here; the schedule, the workload, the run and its checks are the harness's
//! (`common/chaos/`: `schedule.rs`, `workload.rs`, `bank.rs`, `checks.rs`).

use crate::common;
use crate::common::chaos as harness;

use common::system::System;
use harness::bank::bank_under_faults;
use harness::cluster::{Cluster, Isolated};
use harness::network::Cut;
use harness::schedule::{draw_schedule, rounds, Fault, Step};

/// The same seed draws the same schedule; another seed another one; every round holds each
/// single fault once and one combined fault.
#[test]
fn a_seed_replays_its_schedule() {
    let describe = |steps: &[Step]| -> Vec<String> {
        steps
            .iter()
            .map(|step| format!("{:?} {:?} {:?}", step.traffic_before, step.fault, step.hold))
            .collect()
    };
    let first = draw_schedule(42, None, 3);
    assert_eq!(describe(&first), describe(&draw_schedule(42, None, 3)));
    assert_ne!(describe(&first), describe(&draw_schedule(43, None, 3)));
    for round in first.chunks(first.len() / 3) {
        let combined = round.iter().filter(|step| matches!(step.fault, Fault::PauseDuringRestart(_))).count();
        assert_eq!(combined, 1, "{:?}", describe(round));
        for (_, fault) in
            Fault::ALL.iter().filter(|(_, fault)| !matches!(fault, Fault::PauseDuringRestart(_)))
        {
            assert_eq!(
                round.iter().filter(|step| step.fault == *fault).count(),
                1,
                "{fault:?} in {:?}",
                describe(round)
            );
        }
    }
    // named faults keep their order
    let named = [Fault::Pause, Fault::Kill(1)];
    let steps = draw_schedule(7, Some(&named), 2);
    let order: Vec<Fault> = steps.iter().map(|step| step.fault).collect();
    assert_eq!(order, [Fault::Pause, Fault::Kill(1), Fault::Pause, Fault::Kill(1)]);
}

#[tokio::test]
#[ignore = "restarts the shared broker and database: scripts/test runs it alone"]
async fn money_is_neither_lost_nor_doubled_through_crashes_restarts_and_pauses() {
    let system = System::new().await;
    bank_under_faults(&system, Fault::named().as_deref(), rounds(), None).await;
}

#[tokio::test]
#[ignore = "starts a three-broker Kafka cluster of its own: scripts/test runs it alone"]
async fn with_three_brokers_killing_any_one_under_load_loses_nothing() {
    let cluster = Cluster::up().await;
    let mut args = testkit::kafka_args();
    args.bootstrap_servers = cluster.bootstrap.clone();
    // declared after the cluster, so dropped before it: its topics are deleted while it runs
    let system = System::on_kafka(args, 3).await;
    let schedule = [Fault::KillBroker(2), Fault::KillBroker(1), Fault::KillBroker(3)];
    bank_under_faults(&system, Some(&schedule), rounds(), Some(&cluster)).await;
}

#[tokio::test]
#[ignore = "starts a three-broker Kafka cluster of its own in network namespaces: scripts/test runs it alone"]
async fn with_three_brokers_partitioning_one_from_the_others_loses_nothing() {
    let cluster = Cluster::up_in_namespaces().await;
    let mut args = testkit::kafka_args();
    args.bootstrap_servers = cluster.bootstrap.clone();
    // declared after the cluster, so dropped before it: its topics are deleted while it runs
    let system = System::on_kafka(args, 3).await;
    let schedule = [
        Fault::Partition(Isolated::Controller, Cut::Brokers),
        Fault::Partition(Isolated::Broker, Cut::Everyone),
    ];
    bank_under_faults(&system, Some(&schedule), rounds(), Some(&cluster)).await;
}
