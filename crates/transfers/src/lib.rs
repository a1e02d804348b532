//! `pagamentos transferencias`: the transfers service (issue #4 brings its API, outbox relay and
//! status projection).
//!
//! # Layout
//! - `migrations/`: the `transferencias` database schema, embedded as [`MIGRATOR`]: the
//!   article's `transferencia` and `outbox_evento` tables.
//!
//! # Architecture invariant
//! Owns the `transferencias` database; no other crate writes to it.

/// The `transferencias` database's migrations, applied by `pagamentos migrate` and on start.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
