//! The chaos suite's harness (`tests/chaos.rs`): what it runs the bank workload on and reads
//! afterwards, and the suite's own schedule, workload, run and checks. Only the chaos suite
//! includes it (`tests/loss_diagnosis.rs` includes `dump.rs` alone).

pub mod bank;
pub mod checks;
pub mod cluster;
pub mod dump;
pub mod inspect;
pub mod network;
pub mod processes;
pub mod schedule;
pub mod workload;
