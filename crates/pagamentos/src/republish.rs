//! `pagamentos republish`: sends the `TransferenciaSolicitada` of stuck transfers again, from
//! the transfers database, through its outbox (see [`transfers::republish`]). For a transfer
//! that `verify` reports as `PENDENTE` too long and "not decided by the ledger": its request
//! event was lost on the way (or a stage was down and its input expired). Every stage is
//! idempotent by transfer id, so re-sending a transfer that was decided meanwhile changes
//! nothing.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use uuid::Uuid;

use transfers::republish::{self, Republished};

use crate::database;
use crate::verify::parse_duration;

#[derive(Debug, clap::Args)]
pub struct RepublishArgs {
    /// Every transfer still `PENDENTE` this long after it was accepted (`300`, `300s`, `5m`,
    /// `1h`); the default selection when no `--id` is given.
    #[arg(long, value_parser = parse_duration, conflicts_with = "ids")]
    pending_older_than: Option<Duration>,

    /// Only this transfer (repeatable), whatever its status: a decided one is sent again too,
    /// and changes nothing downstream.
    #[arg(long = "id", value_name = "UUID")]
    ids: Vec<Uuid>,

    /// List what would be sent, write nothing.
    #[arg(long)]
    dry_run: bool,

    /// PostgreSQL URL of the transfers database.
    #[arg(
        long,
        env = "TRANSFERENCIAS_DATABASE_URL",
        default_value = transfers::DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    transferencias_database_url: String,

    /// Prefix of every topic name, as the services run with (empty in production).
    #[arg(long = "topic-prefix", env = "PAGAMENTOS_TOPIC_PREFIX", default_value = "")]
    topic_prefix: String,
}

/// The selection when nothing is said: what `verify` calls stuck by default.
const DEFAULT_BOUND: Duration = Duration::from_secs(300);

pub async fn run(args: RepublishArgs) -> anyhow::Result<ExitCode> {
    let pool = database::connect(&args.transferencias_database_url, 2).await?;
    let topic = format!("{}{}", args.topic_prefix, contracts::topics::REQUESTED);
    let (selected, missing) = if args.ids.is_empty() {
        let bound = args.pending_older_than.unwrap_or(DEFAULT_BOUND);
        (republish::stuck(&pool, bound).await?, Vec::new())
    } else {
        let found = republish::find_all(&pool, &args.ids).await?;
        let missing: Vec<Uuid> =
            args.ids.iter().copied().filter(|id| !found.iter().any(|transfer| transfer.id == *id)).collect();
        (found, missing)
    };

    let mut out = String::new();
    let (mut queued, mut waiting) = (0, 0);
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    for transfer in &selected {
        let age_s = now as i64 - transfer.criada_em.unix_timestamp();
        let what = format!("{} {} for {age_s} s", transfer.id, transfer.status);
        let outcome = if args.dry_run {
            match republish::waiting(&pool, transfer.id).await? {
                Some(event_id) => Republished::AlreadyWaiting(event_id),
                None => {
                    let _ = writeln!(out, "{what}: would be sent again to {topic}");
                    queued += 1;
                    continue;
                }
            }
        } else {
            republish::republish(&pool, transfer, &topic).await?
        };
        match outcome {
            Republished::Queued(event_id) => {
                queued += 1;
                tracing::info!(transfer_id = %transfer.id, %event_id, %topic, "request event queued again");
                let _ = writeln!(out, "{what}: queued again in the outbox as event {event_id}");
            }
            Republished::AlreadyWaiting(event_id) => {
                waiting += 1;
                let _ = writeln!(
                    out,
                    "{what}: event {event_id} is still unpublished in the outbox (the relay is behind \
                     or down: see outbox_pendentes), nothing added"
                );
            }
        }
    }
    for id in &missing {
        let _ = writeln!(out, "{id}: no such transfer");
    }
    let verb = if args.dry_run { "would send" } else { "queued" };
    let _ = writeln!(
        out,
        "republish: {verb} {queued}, {waiting} already waiting, {} not found{}",
        missing.len(),
        if args.dry_run { " (dry run)" } else { "" }
    );
    print!("{out}");
    Ok(if missing.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
