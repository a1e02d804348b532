//! The one service shell: what every pagamentos service runs on, so that each supplies only
//! what is its own (its arguments, its database, its routes and tasks).
//!
//! # Layout
//! - [`supervisor`]: named critical tasks, one shutdown token, a task that stops shuts the
//!   process down with a non-zero exit; SIGTERM/ctrl-c begin an orderly shutdown.
//! - [`server`]: bind a router and serve it until shutdown, with the HTTP edge's bounds.
//! - [`shell`]: the start skeleton: [`Settings`] (what a service is given) and [`Shell`] (the
//!   steps every service takes in the same order: the topics checked at start, readiness, the
//!   HTTP task, the dead-letter gauges).
//!
//! # Architecture invariant
//! Knows no service and no domain: services depend on it, never the other way round, and it
//! is the only crate through which they reach `kafka-admin`.

#![forbid(unsafe_code)]

pub mod server;
pub mod shell;
pub mod supervisor;

pub use shell::{Error, Service, Settings, Shell};
pub use supervisor::{Drained, Supervisor};
