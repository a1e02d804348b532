//! `pagamentos migrate`: applies both databases' embedded, versioned migrations, as the role
//! that owns each schema. The services run as runtime roles that may not change the schema
//! (the ledger's may not even rewrite its books), so migrating takes the owner's URL:
//! `--<database>-migration-database-url`, else the service's URL when one is given, else the
//! local stack's owner role.

use std::process::ExitCode;

use ::database::schema::Prepared;
use anyhow::Context as _;

use crate::database::{connect, redacted};

#[derive(clap::Args)]
pub struct MigrateArgs {
    /// PostgreSQL URL of the transfers database as the role that owns its schema [default:
    /// TRANSFERENCIAS_DATABASE_URL when given, else the stack's owner role `transferencias`].
    #[arg(long, env = "TRANSFERENCIAS_MIGRATION_DATABASE_URL", hide_env_values = true)]
    transferencias_migration_database_url: Option<String>,

    /// PostgreSQL URL of the ledger database as the role that owns its schema [default:
    /// LEDGER_DATABASE_URL when given, else the stack's owner role `ledger`]. The ledger's
    /// runtime role (LEDGER_DATABASE_URL) may not change the schema.
    #[arg(long, env = "LEDGER_MIGRATION_DATABASE_URL", hide_env_values = true)]
    ledger_migration_database_url: Option<String>,

    /// PostgreSQL URL of the transfers database (used when no migration URL is given).
    #[arg(long, env = "TRANSFERENCIAS_DATABASE_URL", hide_env_values = true)]
    transferencias_database_url: Option<String>,

    /// PostgreSQL URL of the ledger database (used when no migration URL is given).
    #[arg(long, env = "LEDGER_DATABASE_URL", hide_env_values = true)]
    ledger_database_url: Option<String>,

    /// Migrate only this database (default: both).
    #[arg(long, value_enum)]
    only: Option<Database>,

    #[command(flatten)]
    transport: telemetry::transport::TransportArgs,
}

impl std::fmt::Debug for MigrateArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // by hand, so that no URL password is ever printed
        let redact = |url: &Option<String>| url.as_deref().map(telemetry::redact_url);
        f.debug_struct("MigrateArgs")
            .field(
                "transferencias_migration_database_url",
                &redact(&self.transferencias_migration_database_url),
            )
            .field("ledger_migration_database_url", &redact(&self.ledger_migration_database_url))
            .field("transferencias_database_url", &redact(&self.transferencias_database_url))
            .field("ledger_database_url", &redact(&self.ledger_database_url))
            .field("only", &self.only)
            .field("transport", &self.transport)
            .finish()
    }
}

impl MigrateArgs {
    /// The owner's URL of each database: the migration URL, else the service's, else the stack's.
    fn owner_urls(&self) -> [(Database, String); 2] {
        let pick = |migration: &Option<String>, service: &Option<String>, stack: &str| {
            migration.clone().or_else(|| service.clone()).unwrap_or_else(|| stack.to_owned())
        };
        [
            (
                Database::Transfers,
                pick(
                    &self.transferencias_migration_database_url,
                    &self.transferencias_database_url,
                    transfers::DEFAULT_MIGRATION_DATABASE_URL,
                ),
            ),
            (
                Database::Ledger,
                pick(
                    &self.ledger_migration_database_url,
                    &self.ledger_database_url,
                    ledger::DEFAULT_MIGRATION_DATABASE_URL,
                ),
            ),
        ]
    }
}

impl MigrateArgs {
    /// The setting the owner's URL of `database` comes from (the stack's default is on
    /// localhost, so it never needs naming).
    fn owner_setting(&self, database: Database) -> &'static str {
        match (database, &self.transferencias_migration_database_url, &self.ledger_migration_database_url) {
            (Database::Transfers, Some(_), _) | (Database::Ledger, _, Some(_)) => {
                database.migration_variable()
            }
            (Database::Transfers, None, _) => "TRANSFERENCIAS_DATABASE_URL",
            (Database::Ledger, _, None) => "LEDGER_DATABASE_URL",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Database {
    #[value(name = "transferencias")]
    Transfers,
    Ledger,
}

impl Database {
    fn migration_variable(self) -> &'static str {
        match self {
            Database::Transfers => "TRANSFERENCIAS_MIGRATION_DATABASE_URL",
            Database::Ledger => "LEDGER_MIGRATION_DATABASE_URL",
        }
    }

    fn migrator(self) -> &'static sqlx::migrate::Migrator {
        match self {
            Database::Transfers => &transfers::MIGRATOR,
            Database::Ledger => &ledger::MIGRATOR,
        }
    }
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let owners = args.owner_urls();
    let databases: Vec<(&'static str, &str)> = owners
        .iter()
        .filter(|(database, _)| args.only.is_none_or(|only| only == *database))
        .map(|(database, url)| (args.owner_setting(*database), url.as_str()))
        .collect();
    crate::transport::check("migrate", &args.transport, None, &databases)?;
    for (database, url) in args.owner_urls() {
        if args.only.is_some_and(|only| only != database) {
            continue;
        }
        let migrator = database.migrator();
        let pool = connect(&url, 1).await?;
        let prepared = ::database::schema::migrate_or_check(&pool, migrator).await.with_context(|| {
            format!(
                "migrating {} (the URL's role must own the schema: {})",
                redacted(&url),
                database.migration_variable()
            )
        })?;
        let latest = migrator.iter().map(|migration| migration.version).max().unwrap_or_default();
        match prepared {
            Prepared::Migrated { .. } => println!("migrated {} to version {latest}", redacted(&url)),
            // a role that does not own the schema found nothing to do: say so, it migrated nothing
            Prepared::Checked => println!(
                "{} is at version {latest} already (checked only: the URL's role does not own the schema)",
                redacted(&url)
            ),
        }
        pool.close().await;
    }
    Ok(ExitCode::SUCCESS)
}
