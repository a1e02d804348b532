//! Operators' Kafka tooling of pagamentos, apart from the runtime every service runs on
//! (`kafka`): what `pagamentos topics` and `pagamentos dlt` do, and what services do with it at
//! start (create missing topics) and in the background (count retained dead letters).
//!
//! # Layout
//! - [`topics`]: create or verify every topic of the plan; delete topics (tests clean up).
//! - [`dlt`]: list and replay dead letters, count those not yet replayed
//!   (`dlt_mensagens_retidas`).
//!
//! # Architecture invariant
//! Built on `kafka`'s client plumbing (configs, client creation, the producer) and never the
//! other way round: the consumer runtime and failure routing know nothing of this crate.
//! Errors of the topic administration are `kafka::Error`'s (`Admin`, `NoLeader`, `Refused`,
//! `Unreachable`), so a service's error type needs no new variant for them.

#![forbid(unsafe_code)]

pub mod dlt;
pub mod topics;
