//! Database settings shared by the commands, and a connection that fails in bounded time
//! naming the server it tried.

use std::time::Duration;

use anyhow::Context as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

/// How long connecting may take before the database counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// The two databases: one per service, as the contract says.
#[derive(Clone, clap::Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL of the transfers database, as the runtime role (the stack's
    /// `transferencias_app`).
    #[arg(
        long,
        env = "TRANSFERENCIAS_DATABASE_URL",
        default_value = transfers::DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    pub transferencias_database_url: String,

    /// PostgreSQL URL of the ledger database, as the runtime role (the stack's `ledger_app`:
    /// may insert and read the books, not rewrite them).
    #[arg(
        long,
        env = "LEDGER_DATABASE_URL",
        default_value = ledger::DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    pub ledger_database_url: String,
}

impl std::fmt::Debug for DatabaseArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // by hand, so that no URL password, token or secret is ever printed
        f.debug_struct("DatabaseArgs")
            .field("transferencias_database_url", &telemetry::redact_url(&self.transferencias_database_url))
            .field("ledger_database_url", &telemetry::redact_url(&self.ledger_database_url))
            .finish()
    }
}

/// `url` without its password, for messages.
pub fn redacted(url: &str) -> String {
    match url.parse::<PgConnectOptions>() {
        Ok(options) => format!(
            "{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or_default()
        ),
        Err(_) => "(unparsable database URL)".into(),
    }
}

/// A small pool on `url`, failing within [`CONNECT_TIMEOUT`] with the address and the cause.
pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    let options: PgConnectOptions =
        url.parse().with_context(|| format!("invalid database URL for {}", redacted(url)))?;
    // one plain connection first: a pool would hide "connection refused" behind its own timeout
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
        .await
        .map_err(|_| {
            anyhow::anyhow!("PostgreSQL at {} did not answer within {CONNECT_TIMEOUT:?}", redacted(url))
        })?
        .with_context(|| format!("PostgreSQL at {} unreachable", redacted(url)))?;
    drop(probe);
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .with_context(|| format!("PostgreSQL at {} unreachable", redacted(url)))?;
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_the_password() {
        let text = redacted("postgres://pagamentos:s3cret@db.internal:6543/ledger");
        assert_eq!(text, "db.internal:6543/ledger");
    }
}
