//! `pagamentos republish`: sends again the event a stuck transfer waits for, the two cases of
//! `verify`'s `pending-too-long`:
//! - "not decided by the ledger": its `TransferenciaSolicitada` was lost on the way (or a stage
//!   was down and its input expired). Rebuilt from the transfers database and written to its
//!   outbox (see [`transfers::republish`]).
//! - decided by the ledger, "its outcome event did not reach transferencias": the ledger's
//!   outcome is pinned (a request sent again moves nothing and emits nothing), so its
//!   `TransferenciaLiquidada`/`TransferenciaRejeitada` is rebuilt from the ledger's decision
//!   and written to the ledger's outbox (see [`ledger::republish`]).
//!
//! Every stage is idempotent by transfer id and every consumer by `eventoId`, so sending a
//! transfer that was decided meanwhile changes nothing.
//!
//! Refused: a transfer final in transferencias (`LIQUIDADA`/`REJEITADA`) that the ledger never
//! decided. Its decision was taken elsewhere (antifraude blocked it, `REJEITADA
//! (BLOQUEADA_ANTIFRAUDE)`), and only the ledger's decisions are pinned: its request sent
//! again would be analysed afresh (after the threshold changed, it passes) and settle what
//! was decided otherwise. It is named, nothing is sent, and the command exits 1.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use uuid::Uuid;

use contracts::TransferStatus;
use ledger::republish::{self as outcomes, Reemitted};
use ledger::settlement::Outcome;
use ledger::store::OutcomeTopics;
use transfers::republish::{self, Republished};

use crate::database;
use crate::verify::parse_duration;

#[derive(Debug, clap::Args)]
pub struct RepublishArgs {
    /// Every transfer still `PENDENTE` this long after it was accepted (`300`, `300s`, `5m`,
    /// `1h`); the default selection when no `--id` is given.
    #[arg(long, value_parser = parse_duration, conflicts_with = "ids")]
    pending_older_than: Option<Duration>,

    /// Only this transfer (repeatable), whatever its status: a decided one is sent again too
    /// (its outcome event when the ledger decided it), and changes nothing downstream; one
    /// final without the ledger's decision (blocked by antifraude) is refused.
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

    /// PostgreSQL URL of the ledger database: its decisions say which event a transfer waits
    /// for, and its outbox sends the outcome events again.
    #[arg(long, env = "LEDGER_DATABASE_URL", default_value = ledger::DEFAULT_DATABASE_URL, hide_env_values = true)]
    ledger_database_url: String,

    /// Prefix of every topic name, as the services run with (empty in production).
    #[arg(long = "topic-prefix", env = "PAGAMENTOS_TOPIC_PREFIX", default_value = "")]
    topic_prefix: String,

    #[command(flatten)]
    transport: telemetry::transport::TransportArgs,
}

/// The selection when nothing is said: what `verify` calls stuck by default.
const DEFAULT_BOUND: Duration = Duration::from_secs(300);

// Over 100 lines on purpose: the command's steps (checks, selection, comparison with the ledger's
// decisions, re-emission, report) run once, in order, over the same two pools and selection.
pub async fn run(args: RepublishArgs) -> anyhow::Result<ExitCode> {
    let databases = [
        ("TRANSFERENCIAS_DATABASE_URL", args.transferencias_database_url.as_str()),
        ("LEDGER_DATABASE_URL", args.ledger_database_url.as_str()),
    ];
    crate::transport::check("republish", &args.transport, None, &databases)?;
    let pool = database::connect(&args.transferencias_database_url, 2).await?;
    let ledger_pool = database::connect(&args.ledger_database_url, 2).await?;
    let topic = format!("{}{}", args.topic_prefix, contracts::topics::REQUESTED);
    let outcome_topics = OutcomeTopics {
        settled: format!("{}{}", args.topic_prefix, contracts::topics::SETTLED),
        rejected: format!("{}{}", args.topic_prefix, contracts::topics::REJECTED),
    };
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
    let (mut queued, mut waiting, mut disagreeing, mut refused) = (0, 0, 0, 0);
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    for transfer in &selected {
        let age_s = now as i64 - transfer.created_at.unix_timestamp();
        let what = format!("{} {} for {age_s} s", transfer.id, transfer.status);
        // decided by the ledger: its outcome event is what the transfer waits for
        let facts = ledger::settlement::Transfer {
            transfer_id: transfer.id,
            source: transfer.source_account.clone(),
            destination: transfer.destination_account.clone(),
            amount_cents: transfer.amount_cents,
            currency: transfer.currency.clone(),
        };
        match outcomes::outcome(&ledger_pool, &facts, &outcome_topics, args.dry_run).await {
            Ok(Reemitted::NotDecided) if transfer.status != TransferStatus::Pending => {
                // decided, but not by the ledger: its request would be decided again
                refused += 1;
                let status = match &transfer.rejection_reason {
                    Some(reason) => format!("{} ({reason})", transfer.status),
                    None => transfer.status.to_string(),
                };
                tracing::warn!(transfer_id = %transfer.id, %status, "republish refused: final, and never decided by the ledger");
                let _ = writeln!(
                    out,
                    "{what}: refused: {status} in transferencias and never decided by the ledger (decided \
                     before it, e.g. blocked by antifraude): its request sent again would be decided afresh \
                     and could settle it; nothing sent"
                );
                continue;
            }
            Ok(Reemitted::NotDecided) => {}
            Ok(Reemitted::Queued { event_id, outcome }) => {
                queued += 1;
                let decided = decided(outcome);
                if args.dry_run {
                    let _ = writeln!(
                        out,
                        "{what}: {decided} in the ledger: its outcome event {event_id} would be sent again"
                    );
                } else {
                    tracing::info!(transfer_id = %transfer.id, %event_id, "outcome event queued again");
                    let _ = writeln!(
                        out,
                        "{what}: {decided} in the ledger: its outcome event {event_id} queued again in the ledger's outbox"
                    );
                }
                continue;
            }
            Ok(Reemitted::AlreadyWaiting { event_id, outcome }) => {
                waiting += 1;
                let _ = writeln!(
                    out,
                    "{what}: {} in the ledger: its outcome event {event_id} is still unpublished in the \
                     ledger's outbox (the ledger's relay is behind or down: see \
                     outbox_pendentes{{database=\"ledger\"}}), nothing added",
                    decided(outcome)
                );
                continue;
            }
            Err(error @ outcomes::ReemitError::Disagrees { .. }) => {
                disagreeing += 1;
                let _ = writeln!(out, "{what}: {error}");
                continue;
            }
            Err(outcomes::ReemitError::Store(error)) => return Err(error.into()),
        }
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
        "republish: {verb} {queued}, {waiting} already waiting, {} not found{}{}{}",
        missing.len(),
        if disagreeing > 0 { format!(", {disagreeing} disagreeing with the ledger") } else { String::new() },
        if refused > 0 { format!(", {refused} refused") } else { String::new() },
        if args.dry_run { " (dry run)" } else { "" }
    );
    print!("{out}");
    Ok(if missing.is_empty() && disagreeing == 0 && refused == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn decided(outcome: Outcome) -> String {
    outcome.to_string()
}
