//! `pagamentos migrate`: applies both databases' embedded, versioned migrations, as the role
//! that owns each schema. The services run as runtime roles that may not change the schema
//! (the ledger's may not even rewrite its books), so migrating takes the owner's URL:
//! `--<database>-migration-database-url`, else the service's URL when one is given, else the
//! local stack's owner role.

use std::process::ExitCode;

use ::database::schema::Prepared;
use anyhow::Context as _;

use crate::database::{connect, redacted, Owner, OwnerDatabases};

#[derive(clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    owners: OwnerDatabases,

    /// Migrate only this database (default: both).
    #[arg(long, value_enum)]
    only: Option<Database>,

    #[command(flatten)]
    transport: telemetry::transport::TransportArgs,
}

impl std::fmt::Debug for MigrateArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // the owners' URLs redacted by their own Debug
        f.debug_struct("MigrateArgs")
            .field("owners", &self.owners)
            .field("only", &self.only)
            .field("transport", &self.transport)
            .finish()
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
    let owners: Vec<(Database, Owner)> = [Database::Transfers, Database::Ledger]
        .into_iter()
        .zip(args.owners.owners())
        .filter(|(database, _)| args.only.is_none_or(|only| only == *database))
        .collect();
    let databases: Vec<(&'static str, &str)> =
        owners.iter().map(|(_, owner)| (owner.setting, owner.url.as_str())).collect();
    crate::transport::check("migrate", &args.transport, None, &databases)?;
    for (database, Owner { url, .. }) in owners {
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
