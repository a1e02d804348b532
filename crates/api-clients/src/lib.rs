//! API clients bound to their accounts (`docs/reference/contract.md` §1 `pagamentos clients`, §2 "API
//! clients"): besides the shared API token (every account, the article's API), an operator
//! creates clients, each with a bearer token of its own and the accounts it may debit and read.
//!
//! # Where clients live
//! Each service reaches only its own database, and both APIs need the clients: transferencias
//! to bind `POST /transferencias` and its reads, the ledger its account reads. So the table
//! `cliente_api` is in **both** databases (a migration in each service's `migrations/`), and
//! `pagamentos clients` writes both, as each database's owner; the services' runtime roles may
//! only read it. A token is 32 bytes from the operating system's CSPRNG ([`new_token`]); only
//! its SHA-256 is stored ([`web::auth::token_hash`]), looked up through a unique index on every
//! request of a client ([`Directory`]: nothing cached), so a revocation holds at once.
//!
//! # Layout
//! - [`Directory`]: the lookup the APIs authenticate a client's token with
//!   (`web::auth::ClientDirectory`).
//! - [`create`], [`list`], [`revoke`]: what `pagamentos clients` does in each database.
//! - [`new_token`], [`validate_name`]: a new client's token and name.

#![forbid(unsafe_code)]

use sqlx::{PgExecutor, PgPool};
use time::OffsetDateTime;

use web::auth::{ClientDirectory, ClientLookup, CLIENT_TOKEN_PREFIX};
use web::{ApiError, Client};

/// Longest client name.
pub const NAME_LENGTH_MAX: usize = 64;

/// Why a client could not be created, revoked or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a client named {0:?} exists already (revoked ones keep their name)")]
    NameTaken(String),
    #[error("the table cliente_api is missing: run `pagamentos migrate` first (this version's schema)")]
    NotMigrated,
    #[error("the operating system's random number generator failed: {0}")]
    Random(getrandom::Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl Error {
    fn from_database(error: sqlx::Error, name: &str) -> Self {
        match &error {
            sqlx::Error::Database(database) if database.code().as_deref() == Some("23505") => {
                Self::NameTaken(name.to_owned())
            }
            sqlx::Error::Database(database) if database.code().as_deref() == Some("42P01") => {
                Self::NotMigrated
            }
            _ => Self::Database(error),
        }
    }
}

/// A new client token: [`CLIENT_TOKEN_PREFIX`] and 32 bytes from the operating system's CSPRNG
/// in lowercase hex (what `web::auth::is_client_token` recognises).
pub fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(Error::Random)?;
    let mut token = String::with_capacity(CLIENT_TOKEN_PREFIX.len() + 64);
    token.push_str(CLIENT_TOKEN_PREFIX);
    for byte in bytes {
        token.push_str(&format!("{byte:02x}"));
    }
    Ok(token)
}

/// A client's name: 1 to [`NAME_LENGTH_MAX`] of `A-Z a-z 0-9 . _ -`.
pub fn validate_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= NAME_LENGTH_MAX
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(format!("a client's name is 1 to {NAME_LENGTH_MAX} of A-Z a-z 0-9 . _ -"))
    }
}

/// A row of `cliente_api`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ClientRow {
    #[sqlx(rename = "nome")]
    pub name: String,
    /// SHA-256 of its token, hex.
    #[sqlx(rename = "hash_token")]
    pub token_hash: String,
    #[sqlx(rename = "contas")]
    pub accounts: Vec<String>,
    #[sqlx(rename = "criado_em")]
    pub created_at: OffsetDateTime,
    #[sqlx(rename = "revogado_em")]
    pub revoked_at: Option<OffsetDateTime>,
}

/// Inserts the client `name` whose token hashes to `token_hash`, with `accounts`, through
/// `executor` (the database's owner: the runtime roles may not write the table).
pub async fn create<'e>(
    executor: impl PgExecutor<'e>,
    name: &str,
    token_hash: &str,
    accounts: &[String],
) -> Result<(), Error> {
    sqlx::query("INSERT INTO cliente_api (nome, hash_token, contas) VALUES ($1, $2, $3)")
        .bind(name)
        .bind(token_hash)
        .bind(accounts)
        .execute(executor)
        .await
        .map_err(|error| Error::from_database(error, name))?;
    Ok(())
}

/// Deletes the client `name` (a creation undone when the other database refused it).
pub async fn delete<'e>(executor: impl PgExecutor<'e>, name: &str) -> Result<bool, Error> {
    let deleted = sqlx::query("DELETE FROM cliente_api WHERE nome = $1")
        .bind(name)
        .execute(executor)
        .await
        .map_err(|error| Error::from_database(error, name))?;
    Ok(deleted.rows_affected() > 0)
}

/// Every client, revoked ones included, by name.
pub async fn list<'e>(executor: impl PgExecutor<'e>) -> Result<Vec<ClientRow>, Error> {
    sqlx::query_as("SELECT nome, hash_token, contas, criado_em, revogado_em FROM cliente_api ORDER BY nome")
        .fetch_all(executor)
        .await
        .map_err(|error| Error::from_database(error, ""))
}

/// What [`revoke`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// Revoked now, at this instant.
    Now(OffsetDateTime),
    /// It was revoked already, then.
    Already(OffsetDateTime),
    /// No client has that name.
    Unknown,
}

/// Revokes the client `name`: its token is refused from the next request on.
pub async fn revoke(pool: &PgPool, name: &str) -> Result<Revoked, Error> {
    let now: Option<OffsetDateTime> = sqlx::query_scalar(
        "UPDATE cliente_api SET revogado_em = now() WHERE nome = $1 AND revogado_em IS NULL RETURNING revogado_em",
    )
    .bind(name)
    .fetch_optional(pool)
    .await
    .map_err(|error| Error::from_database(error, name))?;
    if let Some(now) = now {
        return Ok(Revoked::Now(now));
    }
    let before: Option<Option<OffsetDateTime>> =
        sqlx::query_scalar("SELECT revogado_em FROM cliente_api WHERE nome = $1")
            .bind(name)
            .fetch_optional(pool)
            .await
            .map_err(|error| Error::from_database(error, name))?;
    Ok(match before {
        Some(Some(at)) => Revoked::Already(at),
        // revoked by nobody and not found by the update: only a concurrent delete gets here
        Some(None) | None => Revoked::Unknown,
    })
}

/// The clients of a service's own database, as its API authenticates them: one indexed query
/// (`cliente_api.hash_token` is unique) per request of a client, nothing cached, so a
/// revocation holds from the next request on.
#[derive(Debug, Clone)]
pub struct Directory {
    pool: PgPool,
    /// `transferencias` or `ledger`, for the log.
    database: &'static str,
}

impl Directory {
    pub fn new(pool: PgPool, database: &'static str) -> Self {
        Self { pool, database }
    }

    /// The client whose token hashes to `token_hash`, unless unknown or revoked.
    pub async fn lookup(&self, token_hash: &str) -> Result<Option<Client>, sqlx::Error> {
        let row: Option<(String, Vec<String>)> = sqlx::query_as(
            "SELECT nome, contas FROM cliente_api WHERE hash_token = $1 AND revogado_em IS NULL",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(name, accounts)| Client { name, accounts }))
    }
}

impl ClientDirectory for Directory {
    fn find<'a>(&'a self, token_hash: &'a str) -> ClientLookup<'a> {
        Box::pin(async move {
            self.lookup(token_hash).await.map_err(|error| {
                // never a pass: a client is refused while its token cannot be checked
                tracing::warn!(
                    database = self.database,
                    error = %telemetry::error_chain(&error),
                    "API clients cannot be looked up"
                );
                match database::failure::classify(&error) {
                    database::failure::FailureKind::Infrastructure => ApiError::Unavailable(format!(
                        "the {} database is unreachable; retry later",
                        self.database
                    )),
                    _ => ApiError::internal(error),
                }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_32_random_bytes_in_the_shape_the_apis_look_up() {
        let first = new_token().expect("token");
        let second = new_token().expect("token");
        assert!(web::auth::is_client_token(&first), "{first}");
        assert_ne!(first, second);
        assert_eq!(first.len(), CLIENT_TOKEN_PREFIX.len() + 64);
    }

    #[test]
    fn names_are_short_and_plain() {
        for name in ["loja-1", "a", "Parceiro_X.prod", &"n".repeat(NAME_LENGTH_MAX)] {
            assert!(validate_name(name).is_ok(), "{name}");
        }
        for name in ["", "com espaço", "a/b", "ç", &"n".repeat(NAME_LENGTH_MAX + 1)] {
            assert!(validate_name(name).is_err(), "{name}");
        }
    }
}
