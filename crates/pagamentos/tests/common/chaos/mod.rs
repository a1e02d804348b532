//! The chaos suite's harness (`tests/chaos.rs`): what it runs the bank workload on and reads
//! afterwards. Only the chaos suite includes it; the faults, the workload and the checks are
//! the suite's own.

pub mod cluster;
pub mod dump;
pub mod inspect;
pub mod network;
pub mod processes;
