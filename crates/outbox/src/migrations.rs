//! `outbox_evento`'s migrations: the outbox owns its table in every database that hosts one.
//!
//! A service's migrator is [`with_outbox`] of its own migrations: the outbox's migrations
//! (`crates/outbox/migrations/`, from `20261203000003` on, and every later change of the table)
//! are merged in by version, so `pagamentos migrate` and a service's start apply them in version
//! order with the service's own; and a line `--! outbox:<part>` in a service's migration is
//! replaced by that part of the table's first two migrations (`crates/outbox/sql/<part>.sql`).
//!
//! # Why parts inside the services' files
//! Before the outbox owned its table, each service's first two migrations (`…0001_schema`,
//! `…0002_outbox_trace_notify…`) created it next to the service's own tables, and deployed
//! databases record those migrations by version and checksum (`_sqlx_migrations`, SHA-384 of
//! the file's bytes). sqlx refuses a database whose applied migration differs by a byte from
//! the binary's (`VersionMismatch`) or is missing from it (`VersionMissing`). So those two
//! migrations keep their version and, once assembled, their exact bytes: the parts are cut out
//! of them verbatim, the markers stand where the parts stood, and each service has a test that
//! its assembled migrations carry the checksums deployed databases recorded. The parts
//! therefore hold statements only: a comment there would be part of the bytes.

use std::borrow::Cow;
use std::sync::LazyLock;

use futures::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};

/// A line of a service's migration that stands for a part of the table's migrations.
const MARKER: &str = "--! outbox:";

/// The statements of the table's first two migrations, by the name a marker gives.
const PARTS: [(&str, &str); 3] = [
    ("table", include_str!("../sql/table.sql")),
    ("trace_columns", include_str!("../sql/trace_columns.sql")),
    ("notify", include_str!("../sql/notify.sql")),
];

/// The outbox's own migrations, merged into every service's.
static OWN: Migrator = sqlx::migrate!("./migrations");

/// The outbox's table alone, for a database that hosts nothing else (the outbox's tests and
/// benchmarks): the parts as the first two migrations, then the outbox's own.
pub static STANDALONE: LazyLock<Migrator> = LazyLock::new(|| {
    let part = |name: &str| part(name).to_owned();
    let first = Migration::new(
        20261203000001,
        "outbox table".into(),
        MigrationType::Simple,
        part("table").into(),
        false,
    );
    let second = Migration::new(
        20261203000002,
        "outbox trace notify".into(),
        MigrationType::Simple,
        format!("{}\n{}", part("trace_columns"), part("notify")).into(),
        false,
    );
    merged(vec![first, second])
});

/// `service`'s migrations with the outbox's: each marker line replaced by its part (and the
/// checksum computed from the result, as sqlx computes it from a file), the outbox's own
/// migrations merged in by version.
///
/// # Panics
/// On a marker that names no part, or a version both `service` and the outbox use: the
/// migrations a binary is built with are wrong, and each service's tests build its migrator.
pub fn with_outbox(service: &Migrator) -> Migrator {
    merged(service.iter().map(assemble).collect())
}

/// Every migration of `migrator` as (version, SHA-384 checksum in hex), in order: what a
/// deployed database's `_sqlx_migrations` records, for the services' tests that pin them.
pub fn checksums(migrator: &Migrator) -> Vec<(i64, String)> {
    migrator
        .iter()
        .map(|migration| {
            (migration.version, migration.checksum.iter().map(|byte| format!("{byte:02x}")).collect())
        })
        .collect()
}

/// Panics unless `migrator`'s migrations are exactly `recorded` (version, checksum in hex): the
/// services' tests that pin what deployed databases recorded call it with their list.
pub fn assert_checksums(migrator: &Migrator, recorded: &[(i64, &str)]) {
    let recorded: Vec<(i64, String)> =
        recorded.iter().map(|(version, checksum)| (*version, (*checksum).to_owned())).collect();
    assert_eq!(checksums(migrator), recorded, "a migration deployed databases recorded has changed");
}

fn part(name: &str) -> &'static str {
    PARTS
        .iter()
        .find(|(candidate, _)| *candidate == name)
        .map(|(_, sql)| *sql)
        .unwrap_or_else(|| panic!("no outbox migration part named {name:?}"))
}

fn assemble(migration: &Migration) -> Migration {
    if !migration.sql.contains(MARKER) {
        return migration.clone();
    }
    let sql: String = migration
        .sql
        .split_inclusive('\n')
        .map(|line| match line.strip_prefix(MARKER) {
            Some(name) => part(name.trim_end()),
            None => line,
        })
        .collect();
    Migration::new(
        migration.version,
        migration.description.clone(),
        migration.migration_type,
        Cow::Owned(sql),
        migration.no_tx,
    )
}

fn merged(mut migrations: Vec<Migration>) -> Migrator {
    for own in OWN.iter() {
        assert!(
            migrations.iter().all(|migration| migration.version != own.version),
            "migration {} is both the outbox's and the service's",
            own.version
        );
        migrations.push(own.clone());
    }
    migrations.sort_by_key(|migration| migration.version);
    // resolves at once: the migrations are in memory, nothing is read
    futures::executor::block_on(Migrator::new(Assembled(migrations)))
        .unwrap_or_else(|error| panic!("outbox migrations: {error}"))
}

/// Migrations already in memory, as a source for [`Migrator::new`].
#[derive(Debug)]
struct Assembled(Vec<Migration>);

impl MigrationSource<'static> for Assembled {
    fn resolve(self) -> BoxFuture<'static, Result<Vec<Migration>, BoxDynError>> {
        Box::pin(std::future::ready(Ok(self.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_replaced_by_their_part_and_nothing_else_changes() {
        let service = Migration::new(
            7,
            "schema".into(),
            MigrationType::Simple,
            "CREATE TABLE x ();\n--! outbox:trace_columns\n-- end\n".into(),
            false,
        );
        let assembled = assemble(&service);
        assert_eq!(assembled.sql, format!("CREATE TABLE x ();\n{}-- end\n", part("trace_columns")));
        let direct = Migration::new(7, "schema".into(), MigrationType::Simple, assembled.sql.clone(), false);
        assert_eq!(assembled.checksum, direct.checksum, "the checksum of the assembled text");
        let plain = Migration::new(8, "x".into(), MigrationType::Simple, "SELECT 1;\n".into(), false);
        assert_eq!(assemble(&plain).checksum, plain.checksum);
    }

    #[test]
    fn the_standalone_table_has_every_migration_in_version_order() {
        let versions: Vec<i64> = STANDALONE.iter().map(|migration| migration.version).collect();
        assert_eq!(
            versions,
            [20261203000001, 20261203000002, 20261203000003, 20261203000004, 20261206000001, 20261208000047]
        );
        assert!(STANDALONE.iter().all(|migration| !migration.sql.contains(MARKER)));
    }

    #[test]
    #[should_panic(expected = "no outbox migration part")]
    fn an_unknown_part_is_refused() {
        assemble(&Migration::new(1, "x".into(), MigrationType::Simple, "--! outbox:nope\n".into(), false));
    }
}
