//! The start-up rule for a service's own database (the shared floor of the services that own
//! one): a service connected as the schema's owner migrates it ("services also migrate on
//! start", docs/reference/contract.md §1); a service connected as a runtime role, which may not change the
//! schema, only checks that every migration it was built with is applied, and refuses to start
//! otherwise, naming `pagamentos migrate`. So the runtime role never needs the owner's powers,
//! and a binary newer than its database never runs against an old schema.

use std::collections::HashMap;

use sqlx::migrate::Migrator;
use sqlx::PgPool;

/// What [`migrate_or_check`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// Connected as `role`, the schema's owner (or a member of the owning role, or a
    /// superuser): migrations applied (if any were missing).
    Migrated { role: String },
    /// Connected as a role that does not own the schema: every migration was already applied.
    Checked,
}

impl Prepared {
    /// What a service connected to `database` says on `/readyz` and in its log when its role
    /// owns the schema (issue #46): it may change the schema and rewrite or delete what its
    /// runtime role may only append, so whoever takes the service holds the books. `None` for
    /// a runtime role.
    pub fn owner_warning(&self, database: &str) -> Option<String> {
        match self {
            Self::Migrated { role } => Some(format!(
                "connected to the {database} database as {role}, which owns its schema: the service may \
                 change the schema and rewrite what its runtime role may only append; run it as the \
                 runtime role (the stack's {database}_app) and migrate with `pagamentos migrate`"
            )),
            Self::Checked => None,
        }
    }

    /// [`Self::owner_warning`], logged as a warning naming `database`.
    pub fn warn_if_owner(&self, database: &str) -> Option<String> {
        let warning = self.owner_warning(database)?;
        tracing::warn!(database, "{warning}");
        Some(warning)
    }
}

/// Why a database is not ready for the service.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("migrating the database failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("reading the database's schema failed")]
    Database(#[from] sqlx::Error),
    #[error(
        "the database is not migrated (migrations {missing:?} missing) and role {role} does not \
         own its schema, so it may not migrate it: run `pagamentos migrate` with the schema \
         owner's URL first"
    )]
    NotMigrated { role: String, missing: Vec<i64> },
    #[error(
        "migration {version} applied to the database differs from the one this binary carries \
         (checksum mismatch): the schema was changed by another build"
    )]
    Modified { version: i64 },
}

/// Migrates `pool`'s database with `migrator` when the connected role owns the schema
/// (PostgreSQL's `pg_database_owner` counts: the database's owner owns `public`), else checks
/// that every migration of `migrator` was applied with the same checksum.
pub async fn migrate_or_check(pool: &PgPool, migrator: &Migrator) -> Result<Prepared, SchemaError> {
    let (role, owner): (String, bool) = sqlx::query_as(
        "SELECT current_user::text, pg_has_role(current_user, nspowner, 'USAGE') \
         FROM pg_namespace WHERE nspname = current_schema()",
    )
    .fetch_one(pool)
    .await?;
    if owner {
        migrator.run(pool).await?;
        return Ok(Prepared::Migrated { role });
    }
    let history_exists: bool =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(pool).await?;
    let applied: HashMap<i64, Vec<u8>> = if history_exists {
        sqlx::query_as::<_, (i64, Vec<u8>)>("SELECT version, checksum FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect()
    } else {
        HashMap::new()
    };
    let mut missing = Vec::new();
    for migration in migrator.iter().filter(|migration| !migration.migration_type.is_down_migration()) {
        match applied.get(&migration.version) {
            None => missing.push(migration.version),
            Some(checksum) if checksum.as_slice() != &*migration.checksum => {
                return Err(SchemaError::Modified { version: migration.version })
            }
            Some(_) => {}
        }
    }
    if !missing.is_empty() {
        return Err(SchemaError::NotMigrated { role, missing });
    }
    Ok(Prepared::Checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_is_warned_about() {
        let owner = Prepared::Migrated { role: "ledger".into() };
        let warning = owner.owner_warning("ledger").expect("the owner is warned about");
        assert!(warning.starts_with("connected to the ledger database as ledger, which owns its schema"));
        assert!(warning.contains("ledger_app"), "{warning}");
        assert_eq!(Prepared::Checked.owner_warning("ledger"), None);
        assert_eq!(Prepared::Checked.warn_if_owner("transferencias"), None);
    }
}
