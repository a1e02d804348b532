//! `pagamentos ledger`: idempotent double-entry settlement (issue #6 brings the service).
//!
//! # Layout
//! - `migrations/`: the `ledger` database schema, embedded as [`MIGRATOR`]: the article's
//!   `conta`, `lancamento`, `transferencia_processada` and `outbox_evento`, with the contract's
//!   issuer accounts, byte-order account ids and `deposito` table.
//!
//! # Architecture invariant
//! Owns the `ledger` database; no other crate writes to it.

/// The `ledger` database's migrations, applied by `pagamentos migrate` and on start.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
