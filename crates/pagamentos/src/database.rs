//! Database settings shared by the commands, and a connection that fails in bounded time
//! naming the server it tried.

use std::time::Duration;

use sqlx::PgPool;

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

/// `url` without its password, for messages (every host of a failover list).
pub fn redacted(url: &str) -> String {
    let Ok(hosts) = ::database::Hosts::parse(url) else { return "(unparsable database URL)".into() };
    let database = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, path)| path.split('?').next().unwrap_or_default())
        .unwrap_or_default();
    format!("{}/{database}", hosts.addresses().replace(", ", ","))
}

/// A small pool on `url` (one host or a failover list), failing within [`CONNECT_TIMEOUT`]
/// with the address and the cause. The operator commands scan whole tables (`verify`) or
/// build indexes (`migrate`), so they run without a statement timeout; the lock and
/// idle-in-transaction limits and the keepalives are the services'.
pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    let settings = ::database::PoolSettings {
        database: "pagamentos",
        max_connections,
        acquire_timeout: CONNECT_TIMEOUT,
        session: ::database::Session { statement_timeout: Duration::ZERO, ..Default::default() },
    };
    Ok(::database::connect(url, &settings).await?)
}

/// The URLs of both databases as the roles that own their schemas: what `pagamentos migrate` and
/// `pagamentos clients` connect with.
#[derive(Clone, clap::Args)]
pub struct OwnerDatabases {
    /// PostgreSQL URL of the transfers database as the role that owns its schema [default:
    /// TRANSFERENCIAS_DATABASE_URL when given, else the stack's owner role `transferencias`].
    #[arg(long, env = "TRANSFERENCIAS_MIGRATION_DATABASE_URL", hide_env_values = true)]
    pub transferencias_migration_database_url: Option<String>,

    /// PostgreSQL URL of the ledger database as the role that owns its schema [default:
    /// LEDGER_DATABASE_URL when given, else the stack's owner role `ledger`]. The ledger's
    /// runtime role (LEDGER_DATABASE_URL) may not change the schema.
    #[arg(long, env = "LEDGER_MIGRATION_DATABASE_URL", hide_env_values = true)]
    pub ledger_migration_database_url: Option<String>,

    /// PostgreSQL URL of the transfers database (used when no migration URL is given; it must
    /// then be the owner's: the runtime role may not change the schema nor write clients).
    #[arg(long, env = "TRANSFERENCIAS_DATABASE_URL", hide_env_values = true)]
    pub transferencias_database_url: Option<String>,

    /// PostgreSQL URL of the ledger database (used when no migration URL is given; as above).
    #[arg(long, env = "LEDGER_DATABASE_URL", hide_env_values = true)]
    pub ledger_database_url: Option<String>,
}

impl std::fmt::Debug for OwnerDatabases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // by hand, so that no URL password is ever printed
        let redact = |url: &Option<String>| url.as_deref().map(telemetry::redact_url);
        f.debug_struct("OwnerDatabases")
            .field(
                "transferencias_migration_database_url",
                &redact(&self.transferencias_migration_database_url),
            )
            .field("ledger_migration_database_url", &redact(&self.ledger_migration_database_url))
            .field("transferencias_database_url", &redact(&self.transferencias_database_url))
            .field("ledger_database_url", &redact(&self.ledger_database_url))
            .finish()
    }
}

/// One database's owner URL and the setting it came from.
pub struct Owner {
    /// `transferencias` or `ledger`.
    pub database: &'static str,
    pub setting: &'static str,
    pub url: String,
}

impl OwnerDatabases {
    /// The migration URL, else the service's, else the stack's owner (on localhost).
    pub fn owners(&self) -> [Owner; 2] {
        let pick = |database,
                    migration: &Option<String>,
                    migration_setting,
                    service: &Option<String>,
                    service_setting,
                    stack: &str| {
            let (setting, url) = match (migration, service) {
                (Some(url), _) => (migration_setting, url.clone()),
                (None, Some(url)) => (service_setting, url.clone()),
                (None, None) => (migration_setting, stack.to_owned()),
            };
            Owner { database, setting, url }
        };
        [
            pick(
                "transferencias",
                &self.transferencias_migration_database_url,
                "TRANSFERENCIAS_MIGRATION_DATABASE_URL",
                &self.transferencias_database_url,
                "TRANSFERENCIAS_DATABASE_URL",
                transfers::DEFAULT_MIGRATION_DATABASE_URL,
            ),
            pick(
                "ledger",
                &self.ledger_migration_database_url,
                "LEDGER_MIGRATION_DATABASE_URL",
                &self.ledger_database_url,
                "LEDGER_DATABASE_URL",
                ledger::DEFAULT_MIGRATION_DATABASE_URL,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_the_password() {
        let text = redacted("postgres://pagamentos:s3cret@db.internal:6543/ledger");
        assert_eq!(text, "db.internal:6543/ledger");
        let text =
            redacted("postgres://ledger:s3cret@db1:5442,db2:5443/ledger?target_session_attrs=read-write");
        assert_eq!(text, "db1:5442,db2:5443/ledger");
    }
}
