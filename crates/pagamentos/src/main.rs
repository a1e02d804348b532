//! `pagamentos`: one binary, one subcommand per service plus operator tools (`docs/reference/contract.md` §1).
//!
//! # Layout
//! - [`database`]: the two database URLs and a bounded-time connection.
//! - [`migrate`]: `pagamentos migrate`, both databases' embedded migrations.
//! - [`topics`]: `pagamentos topics`, create or verify every topic.
//! - [`services`]: the service subcommands on the supervised shell (`service::supervisor`):
//!   start, wait for a signal or a stopped task, drain, exit status.
//! - [`replication`]: the replication floor (3, or an explicit opt-in below it).
//! - [`verify`]: `pagamentos verify`, the books against the contract's invariants.
//! - [`dlt`]: `pagamentos dlt list|replay`, dead letters for operators.
//! - [`republish`]: `pagamentos republish`, the request event of stuck transfers again.
//! - [`clients`]: `pagamentos clients create|list|revoke`, API clients bound to their accounts.
//! - [`transport`]: the check every connecting command starts with: no plaintext or unverified
//!   connection off the machine without `--insecure-transport`.
//!
//! This crate only parses arguments, wires crates together and handles signals; the work is
//! done in the crates it calls.

#![forbid(unsafe_code)]

mod clients;
mod database;
mod dlt;
mod load;
mod migrate;
mod replication;
mod republish;
mod services;
mod topics;
mod transport;
mod verify;

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use telemetry::logging::LogFormat;

/// Event-driven money transfers on Apache Kafka and PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "pagamentos", version, propagate_version = true)]
struct Cli {
    /// Log line format on stderr.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Json, global = true)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The transfers service: REST API (port 8080), outbox relay and status projection.
    #[command(name = "transferencias")]
    Transfers(services::TransfersCommand),
    /// The antifraud service: scores transfers inside Kafka transactions (health on 8082).
    #[command(name = "antifraude")]
    Antifraud(services::AntifraudCommand),
    /// The ledger: settles analysed transfers as double entries, accounts API (port 8081).
    Ledger(services::LedgerCommand),
    /// All four services in one process (the local and demo default), each on its own port:
    /// transferencias 8080, ledger 8081, antifraude 8082, notificacoes 8083; one shutdown
    /// signal drains them all.
    All(Box<services::AllCommand>),
    /// Notifications: one webhook per outcome event, non-blocking retry topics, then the
    /// dead-letter topic (health on 8083).
    #[command(name = "notificacoes")]
    Notifications(services::NotificationsCommand),
    /// Inspect (`list`) or re-drive (`replay`) the dead letters of any `-dlt` topic.
    Dlt(dlt::DltCommand),
    /// Apply the embedded database migrations as each schema's owner (services also migrate on
    /// start when their role owns the schema, else they check that this ran).
    Migrate(migrate::MigrateArgs),
    /// Create or verify every topic idempotently; exit 1 if an existing topic differs from the
    /// configuration (partitions, replication factor, min.insync.replicas, retention). Fewer
    /// than 3 replicas are refused without `--allow-under-replicated`, as by every service.
    Topics(topics::TopicsCommand),
    /// Drive transfers through the HTTP API on an open-loop schedule and report throughput and
    /// latency from each POST to its final status; the last line is one JSON object. Exit 1
    /// when any accepted transfer never reached a final status, or one had both a settlement
    /// and a rejection event.
    Loadgen(Box<loadgen::LoadgenArgs>),
    /// Check the books: the ledger's invariants 1–3 and, with `--scope all` (default), that a
    /// transfer is LIQUIDADA in transferencias iff the ledger settled it, that every decided
    /// transfer has the same outcome, amount, accounts and currency in both databases, and that
    /// none is PENDENTE longer than `--pending-older-than` (4). Exit 1 and a report naming
    /// every break; 0 when clean.
    Verify(verify::VerifyArgs),
    /// Send again the event stuck transfers wait for: every transfer PENDENTE longer than
    /// `--pending-older-than` (default 5m), or the `--id`s given. Decided by the ledger: its
    /// outcome event (`TransferenciaLiquidada`/`TransferenciaRejeitada`, the same `eventoId`),
    /// rebuilt from the ledger's decision (a settlement checked against its entries) and
    /// written to the ledger's outbox. Not decided by the ledger: its request event
    /// (`TransferenciaSolicitada`), rebuilt from the transfers database and written to its
    /// outbox. The services' relays publish them as the first time. Safe to repeat: every stage
    /// is idempotent by transfer id (a decided transfer moves no money again) and every
    /// consumer by `eventoId`. Exit 1 when an `--id` is unknown or the ledger's entries
    /// disagree with the transfer.
    Republish(republish::RepublishArgs),
    /// API clients, each with a bearer token of its own and the accounts it may debit and read
    /// (`POST /transferencias` from another account: 403; reads of others' transfers and
    /// accounts: 404), its Idempotency-Keys its own. Written to both databases as their owner
    /// (the owner URLs `pagamentos migrate` takes); the admin token manages nothing here.
    Clients(clients::ClientsCommand),
}

/// Parses the command line and environment. A bad value that came from an environment
/// variable is reported with the variable's name, which clap alone does not say.
fn parse_arguments() -> Cli {
    let command = Cli::command();
    let parsed = command.clone().try_get_matches().and_then(|matches| Cli::from_arg_matches(&matches));
    match parsed {
        Ok(cli) => cli,
        Err(error) => {
            if matches!(error.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation) {
                if let Some(variable) = environment_source(&command, &error) {
                    let _ = error.print();
                    eprintln!("note: the value came from the environment variable {variable}");
                    std::process::exit(2);
                }
            }
            if error.kind() == ErrorKind::MissingRequiredArgument {
                let variables = missing_variables(&command, &error);
                if !variables.is_empty() {
                    let _ = error.print();
                    eprintln!("note: or set the environment variable(s) {}", variables.join(", "));
                    std::process::exit(2);
                }
            }
            error.exit()
        }
    }
}

/// The environment variables that could have given the missing required arguments.
fn missing_variables(command: &clap::Command, error: &clap::Error) -> Vec<String> {
    let Some(ContextValue::Strings(missing)) = error.get(ContextKind::InvalidArg) else { return Vec::new() };
    missing
        .iter()
        .filter_map(|arg| {
            let long = arg.split_whitespace().next()?.trim_start_matches("--");
            let mut commands = vec![command];
            while let Some(current) = commands.pop() {
                for candidate in current.get_arguments() {
                    if candidate.get_long() == Some(long) {
                        return candidate.get_env().map(|env| env.to_string_lossy().into_owned());
                    }
                }
                commands.extend(current.get_subcommands());
            }
            None
        })
        .collect()
}

/// The environment variable behind the argument `error` complains about, when that argument
/// was not given on the command line.
fn environment_source(command: &clap::Command, error: &clap::Error) -> Option<String> {
    let Some(ContextValue::String(invalid)) = error.get(ContextKind::InvalidArg) else { return None };
    let long = invalid.split_whitespace().next()?.trim_start_matches("--");
    let given_on_command_line =
        std::env::args().any(|arg| arg == format!("--{long}") || arg.starts_with(&format!("--{long}=")));
    if given_on_command_line {
        return None;
    }
    let mut commands = vec![command];
    while let Some(current) = commands.pop() {
        for arg in current.get_arguments() {
            if arg.get_long() == Some(long) {
                if let Some(env) = arg.get_env() {
                    if std::env::var_os(env).is_some() {
                        return Some(env.to_string_lossy().into_owned());
                    }
                }
            }
        }
        commands.extend(current.get_subcommands());
    }
    None
}

fn main() -> ExitCode {
    let cli = parse_arguments();
    telemetry::logging::init("pagamentos", cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Transfers(args) => services::run::<transfers::Transfers>(args).await,
            Command::Antifraud(args) => services::run::<antifraud::Antifraud>(args).await,
            Command::Migrate(args) => migrate::run(args).await,
            Command::Topics(args) => topics::run(args).await,
            Command::Ledger(args) => services::run::<ledger::Ledger>(args).await,
            Command::Verify(args) => verify::run(args).await,
            Command::Republish(args) => republish::run(args).await,
            Command::Clients(args) => clients::run(args).await,
            Command::Notifications(args) => services::run::<notifications::Notifications>(args).await,
            Command::All(args) => services::all(*args).await,
            Command::Dlt(args) => dlt::run(args).await,
            Command::Loadgen(args) => load::run(*args).await,
        }
    });
    telemetry::logging::shutdown();
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsed_options_never_print_their_secrets() {
        let cli = Cli::try_parse_from([
            "pagamentos",
            "all",
            "--transferencias-database-url",
            "postgres://transferencias:pw-transfers@db:5432/transferencias",
            "--ledger-database-url",
            "postgres://ledger:pw-ledger@db:5432/ledger?sslmode=verify-full",
            "--api-token",
            "token-api",
            "--admin-token",
            "token-admin",
            "--webhook-url",
            "https://user:pw-hook@hooks.example.com/in?token=token-query",
            "--webhook-secret",
            "whsec-secret",
            "--kafka-security-protocol",
            "sasl_ssl",
            "--kafka-sasl-username",
            "ledger",
            "--kafka-sasl-password",
            "pw-kafka",
            "--kafka-ssl-key-password",
            "pw-kafka-key",
        ])
        .expect("parses");
        let printed = format!("{cli:?}");
        assert!(printed.contains("hooks.example.com") && printed.contains("db:5432"), "{printed}");
        for secret in [
            "pw-transfers",
            "pw-ledger",
            "token-api",
            "token-admin",
            "pw-hook",
            "token-query",
            "whsec-secret",
            "pw-kafka",
        ] {
            assert!(!printed.contains(secret), "{secret} printed: {printed}");
        }
    }
}
