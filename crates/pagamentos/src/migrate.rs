//! `pagamentos migrate`: applies both databases' embedded, versioned migrations.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::database::{connect, redacted, DatabaseArgs};

#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    databases: DatabaseArgs,

    /// Migrate only this database (default: both).
    #[arg(long, value_enum)]
    only: Option<Database>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Database {
    Transferencias,
    Ledger,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let targets = [
        (Database::Transferencias, &args.databases.transferencias_database_url, &transfers::MIGRATOR),
        (Database::Ledger, &args.databases.ledger_database_url, &ledger::MIGRATOR),
    ];
    for (database, url, migrator) in targets {
        if args.only.is_some_and(|only| only != database) {
            continue;
        }
        let pool = connect(url, 1).await?;
        migrator.run(&pool).await.with_context(|| format!("migrating {}", redacted(url)))?;
        let latest = migrator.iter().map(|migration| migration.version).max().unwrap_or_default();
        println!("migrated {} to version {latest}", redacted(url));
        pool.close().await;
    }
    Ok(ExitCode::SUCCESS)
}
