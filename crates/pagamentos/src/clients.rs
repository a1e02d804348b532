//! `pagamentos clients create|list|revoke`: API clients bound to their accounts (`docs/reference/contract.md`
//! §1, §2). Each service reaches only its own database and both APIs authenticate clients, so
//! a client is a row of `cliente_api` in **both** databases ([`api_clients`]), written here as
//! each database's owner (the services' runtime roles may only read the table; the admin token
//! manages nothing here). Owner URLs as `pagamentos migrate` takes them.
//!
//! The two databases cannot commit together: `create` inserts in both inside open transactions
//! and commits the ledger's, then transferencias'; should the second commit fail, the ledger's
//! row is deleted again and the token is never shown (a half-created client is unusable).
//! `revoke` revokes in transferencias first (where money is debited), then in the ledger; a
//! failure in between exits 1 saying so, and running it again finishes the job.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use api_clients::{ClientRow, Revoked};
use sqlx::PgPool;

use crate::database::{Owner, OwnerDatabases};

use crate::database::{connect, redacted};

#[derive(Debug, clap::Args)]
pub struct ClientsCommand {
    #[command(subcommand)]
    action: Action,
}

/// Where every action connects: both databases as their owner.
#[derive(Debug, clap::Args)]
struct Connection {
    #[command(flatten)]
    databases: OwnerDatabases,

    #[command(flatten)]
    transport: telemetry::transport::TransportArgs,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Create a client that may debit (`contaOrigem` of `POST /transferencias`) and read
    /// (transfers touching them, `GET /contas/{id}` and its entries) only the accounts given;
    /// anything else is `403` (a debit) or `404` (a read) with its token. Its Idempotency-Keys
    /// are its own. The new bearer token is printed once, alone, on stdout (so
    /// `TOKEN=$(pagamentos clients create …)` keeps it): only its SHA-256 is stored, so it can
    /// never be shown again. A lost token is revoked and the client created anew under
    /// another name.
    Create {
        /// The client's name, unique for ever (revoked clients keep theirs): 1 to 64 of
        /// `A-Z a-z 0-9 . _ -`.
        name: String,
        /// The accounts it may use, comma-separated (`CC-001,CC-002`); never an `EMISSOR-…`
        /// account. They need not be opened yet.
        #[arg(long, value_delimiter = ',', required = true, num_args = 1..)]
        accounts: Vec<String>,

        #[command(flatten)]
        connection: Connection,
    },
    /// List every client (name, accounts, created, revoked), from the transfers database,
    /// flagging any whose row in the ledger's database differs or is missing (a `create` or
    /// `revoke` that failed half-way: revoke it again, or create another).
    List {
        #[command(flatten)]
        connection: Connection,
    },
    /// Revoke a client: its token is refused (`401`) from the next request on, in both APIs.
    /// Revoking a revoked client changes nothing; an unknown name exits 1.
    Revoke {
        /// The client's name.
        name: String,

        #[command(flatten)]
        connection: Connection,
    },
}

/// What an error of `owner`'s database means for the operator.
fn in_database(owner: &Owner, error: api_clients::Error) -> anyhow::Error {
    let hint = match &error {
        api_clients::Error::Database(sqlx::Error::Database(database))
            if database.code().as_deref() == Some("42501") =>
        {
            format!(" (the URL's role may not write clients: give the owner's, {})", owner.setting)
        }
        _ => String::new(),
    };
    anyhow::Error::new(error).context(format!("{} database {}{hint}", owner.database, redacted(&owner.url)))
}

pub async fn run(command: ClientsCommand) -> anyhow::Result<ExitCode> {
    let (Action::Create { connection, .. } | Action::List { connection } | Action::Revoke { connection, .. }) =
        &command.action;
    let [transfers, ledger] = connection.databases.owners();
    crate::transport::check(
        "clients",
        &connection.transport,
        None,
        &[(transfers.setting, transfers.url.as_str()), (ledger.setting, ledger.url.as_str())],
    )?;
    let transfers_pool = connect(&transfers.url, 1).await?;
    let ledger_pool = connect(&ledger.url, 1).await?;
    let databases = Databases { transfers: (&transfers, &transfers_pool), ledger: (&ledger, &ledger_pool) };
    match &command.action {
        Action::Create { name, accounts, .. } => create(&databases, name, accounts).await,
        Action::List { .. } => list(&databases).await,
        Action::Revoke { name, .. } => revoke(&databases, name).await,
    }
}

struct Databases<'a> {
    transfers: (&'a Owner, &'a PgPool),
    ledger: (&'a Owner, &'a PgPool),
}

/// The accounts given, checked (a customer account's syntax, never an issuer), without repeats,
/// in the order given.
fn accounts(given: &[String]) -> anyhow::Result<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut accounts = Vec::new();
    for account in given.iter().map(|account| account.trim()).filter(|account| !account.is_empty()) {
        contracts::AccountId::customer(account)
            .map_err(|invalid| anyhow::anyhow!("--accounts {account:?}: {}", invalid.message))?;
        if seen.insert(account.to_owned()) {
            accounts.push(account.to_owned());
        }
    }
    anyhow::ensure!(!accounts.is_empty(), "--accounts: at least one account");
    Ok(accounts)
}

async fn create(databases: &Databases<'_>, name: &str, given: &[String]) -> anyhow::Result<ExitCode> {
    api_clients::validate_name(name).map_err(|message| anyhow::anyhow!("{name:?}: {message}"))?;
    let accounts = accounts(given)?;
    let token = api_clients::new_token()?;
    let hash = web::auth::token_hash(&token);
    let ((transfers, transfers_pool), (ledger, ledger_pool)) = (databases.transfers, databases.ledger);

    // inserted in both before either commits: a name taken (or any refusal) writes neither
    let mut in_transfers = transfers_pool.begin().await.context("transfers database")?;
    api_clients::create(&mut *in_transfers, name, &hash, &accounts)
        .await
        .map_err(|error| in_database(transfers, error))?;
    let mut in_ledger = ledger_pool.begin().await.context("ledger database")?;
    api_clients::create(&mut *in_ledger, name, &hash, &accounts)
        .await
        .map_err(|error| in_database(ledger, error))?;
    in_ledger.commit().await.context("committing the client in the ledger database")?;
    if let Err(error) = in_transfers.commit().await {
        let undone = match api_clients::delete(ledger_pool, name).await {
            Ok(_) => "undone in the ledger database".to_owned(),
            Err(undo) => format!(
                "NOT undone in the ledger database ({undo}): its row there is harmless (nobody has \
                 its token), `clients revoke {name}` marks it"
            ),
        };
        return Err(anyhow::Error::new(error)
            .context(format!("committing the client in the transfers database failed; {undone}")));
    }

    let opened: Vec<String> = sqlx::query_scalar("SELECT id::text FROM conta WHERE id = ANY($1)")
        .bind(&accounts)
        .fetch_all(ledger_pool)
        .await
        .unwrap_or_else(|_| accounts.clone());
    let unopened: Vec<&String> = accounts.iter().filter(|account| !opened.contains(account)).collect();
    if !unopened.is_empty() {
        eprintln!("note: not opened in the ledger yet (the client may use them once they are): {unopened:?}");
    }
    eprintln!(
        "client {name} created in both databases for the accounts {}; its bearer token follows, shown this \
         once (only its SHA-256 is stored):",
        accounts.join(", ")
    );
    println!("{token}");
    Ok(ExitCode::SUCCESS)
}

fn when(at: Option<sqlx::types::time::OffsetDateTime>) -> String {
    at.map_or_else(|| "-".to_owned(), |at| contracts::Timestamp::from(at).to_string())
}

/// One line of `clients list`: the client as one database has it, and what the ledger says.
fn row(out: &mut String, client: &ClientRow, ledger_says: &str) {
    let _ = writeln!(
        out,
        "{:<24} {:<40} {:<28} {:<28} {ledger_says}",
        client.name,
        client.accounts.join(","),
        when(Some(client.created_at)),
        when(client.revoked_at),
    );
}

async fn list(databases: &Databases<'_>) -> anyhow::Result<ExitCode> {
    let ((transfers, transfers_pool), (ledger, ledger_pool)) = (databases.transfers, databases.ledger);
    let clients = api_clients::list(transfers_pool).await.map_err(|error| in_database(transfers, error))?;
    let in_ledger = api_clients::list(ledger_pool).await.map_err(|error| in_database(ledger, error))?;
    let mut out = String::new();
    let _ = writeln!(out, "{:<24} {:<40} {:<28} {:<28} LEDGER", "NAME", "ACCOUNTS", "CREATED", "REVOKED");
    let same = |ours: &ClientRow, theirs: &ClientRow| {
        ours.token_hash == theirs.token_hash
            && ours.accounts == theirs.accounts
            && ours.revoked_at.is_some() == theirs.revoked_at.is_some()
    };
    for client in &clients {
        let ledger_says = match in_ledger.iter().find(|row| row.name == client.name) {
            Some(row) if same(client, row) => "same",
            Some(row) if row.revoked_at.is_none() && client.revoked_at.is_some() => "NOT REVOKED there",
            Some(_) => "DIFFERS",
            None => "MISSING",
        };
        row(&mut out, client, ledger_says);
    }
    for orphan in in_ledger.iter().filter(|row| !clients.iter().any(|client| client.name == row.name)) {
        row(&mut out, orphan, "ONLY in the ledger");
    }
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

async fn revoke(databases: &Databases<'_>, name: &str) -> anyhow::Result<ExitCode> {
    let ((transfers, transfers_pool), (ledger, ledger_pool)) = (databases.transfers, databases.ledger);
    // transferencias first: that is where a token debits
    let first =
        api_clients::revoke(transfers_pool, name).await.map_err(|error| in_database(transfers, error))?;
    let second = api_clients::revoke(ledger_pool, name).await.map_err(|error| {
        in_database(ledger, error).context(format!(
            "{name} is revoked in the transfers database but NOT in the ledger's (its token still reads \
             its accounts there): run `pagamentos clients revoke {name}` again"
        ))
    })?;
    let say = |database: &str, revoked: Revoked| match revoked {
        Revoked::Now(at) => format!("revoked in the {database} database at {}", when(Some(at))),
        Revoked::Already(at) => {
            format!("already revoked in the {database} database since {}", when(Some(at)))
        }
        Revoked::Unknown => format!("not found in the {database} database"),
    };
    println!("client {name}: {}; {}", say("transfers", first), say("ledger", second));
    Ok(if first == Revoked::Unknown && second == Revoked::Unknown {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_are_customer_accounts_without_repeats() {
        let given = |ids: &[&str]| ids.iter().map(|id| (*id).to_owned()).collect::<Vec<_>>();
        assert_eq!(accounts(&given(&["CC-1", " CC-2", "CC-1", ""])).expect("valid"), ["CC-1", "CC-2"]);
        for bad in [&["EMISSOR-BRL"][..], &["com espaço"], &[""], &["x".repeat(33).as_str()]] {
            assert!(accounts(&given(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn owners_are_the_migration_urls_else_the_services_else_the_stacks() {
        let none = OwnerDatabases {
            transferencias_migration_database_url: None,
            ledger_migration_database_url: None,
            transferencias_database_url: None,
            ledger_database_url: None,
        };
        let [transfers, ledger] = none.clone().owners();
        assert_eq!(transfers.url, transfers::DEFAULT_MIGRATION_DATABASE_URL);
        assert_eq!(ledger.url, ledger::DEFAULT_MIGRATION_DATABASE_URL);
        let given = OwnerDatabases {
            transferencias_migration_database_url: Some("postgres://o@h/t".into()),
            ledger_database_url: Some("postgres://s@h/l".into()),
            ..none
        };
        let [transfers, ledger] = given.owners();
        assert_eq!(
            (transfers.setting, transfers.url.as_str()),
            ("TRANSFERENCIAS_MIGRATION_DATABASE_URL", "postgres://o@h/t")
        );
        assert_eq!((ledger.setting, ledger.url.as_str()), ("LEDGER_DATABASE_URL", "postgres://s@h/l"));
    }
}
