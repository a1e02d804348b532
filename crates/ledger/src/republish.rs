//! Sending a decided transfer's outcome event again (`pagamentos republish`). The ledger's
//! outcome is pinned: a request event sent again for a transfer it decided moves nothing and
//! emits nothing, so a `TransferenciaLiquidada`/`TransferenciaRejeitada` lost after the ledger
//! published it (retention expired before the projection read it, a topic on a failed disk,
//! the outbox row deleted a day later) would leave the transfer `PENDENTE` in transferencias
//! for good. This rebuilds the event exactly as [`crate::store::settle`] wrote it (the derived
//! `eventoId`, so every consumer sees the same event; the decision's time; the transfer's
//! fields) from the decision, checks a settlement against its entries, and writes it to the
//! ledger's outbox, whose relay publishes it as the first time. Safe: the projection sets a
//! status only while it is `PENDENTE`, and notification receivers dedupe by `eventoId`.

use contracts::EntryKind;
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::StoreError;
use crate::settlement::{Outcome, Transfer};
use crate::store::{outcome_event, OutcomeTopics, Request};

/// What [`outcome`] did for one transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reemitted {
    /// The ledger has not decided this transfer: its outcome is not the ledger's to send.
    NotDecided,
    /// The outcome event `event_id` is in the outbox again (or would be, in a dry run).
    Queued { event_id: Uuid, outcome: Outcome },
    /// The outcome event `event_id` is in the outbox unpublished already: the relay is behind
    /// or down; nothing was added.
    AlreadyWaiting { event_id: Uuid, outcome: Outcome },
}

/// Why an outcome was not sent again.
#[derive(Debug, thiserror::Error)]
pub enum ReemitError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The ledger's entries for the transfer do not match the transfer as given: one side was
    /// changed outside the services, or a bug. Sending either version would spread it.
    #[error("transfer {transfer_id}: {detail}; not sent (run pagamentos verify)")]
    Disagrees { transfer_id: Uuid, detail: String },
}

impl From<sqlx::Error> for ReemitError {
    fn from(error: sqlx::Error) -> Self {
        Self::Store(error.into())
    }
}

/// Writes the ledger's outcome event for `transfer` to its outbox again, unless the ledger has
/// not decided it or the event is waiting unpublished there already. `dry_run` writes nothing
/// and says what would be done. A published outbox row of the event (kept for a day) is
/// replaced by a new one, so the relay sends it again in acceptance order of today.
pub async fn outcome(
    pool: &PgPool,
    transfer: &Transfer,
    topics: &OutcomeTopics,
    dry_run: bool,
) -> Result<Reemitted, ReemitError> {
    let mut tx = pool.begin().await.map_err(StoreError::Unavailable)?;
    // one republish at a time per transfer: two operators running it together add one row
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('reemitir'), hashtext($1))")
        .bind(transfer.transfer_id.to_string())
        .execute(&mut *tx)
        .await?;
    let decision: Option<(String, Option<String>, OffsetDateTime)> = sqlx::query_as(
        "SELECT resultado, motivo, processada_em FROM transferencia_processada WHERE transferencia_id = $1",
    )
    .bind(transfer.transfer_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((result, reason, decided_at)) = decision else { return Ok(Reemitted::NotDecided) };
    let disagrees = |detail: String| ReemitError::Disagrees { transfer_id: transfer.transfer_id, detail };
    let outcome = Outcome::parse(&result, reason.as_deref())
        .map_err(|invalid| disagrees(format!("the ledger's decision is malformed: {invalid}")))?;
    if outcome == Outcome::Settled {
        check_entries(&mut tx, transfer).await.map_err(|detail| match detail {
            Checked::Disagrees(detail) => disagrees(detail),
            Checked::Database(error) => error.into(),
        })?;
    }

    let request = Request { transfer: transfer.clone(), traceparent: None, tracestate: None };
    let event = outcome_event(&request, outcome, decided_at.into(), topics).map_err(StoreError::Encode)?;
    let published: Option<bool> =
        sqlx::query_scalar("SELECT publicado_em IS NOT NULL FROM outbox_evento WHERE id = $1")
            .bind(event.id)
            .fetch_optional(&mut *tx)
            .await?;
    if published == Some(false) {
        return Ok(Reemitted::AlreadyWaiting { event_id: event.id, outcome });
    }
    if dry_run {
        return Ok(Reemitted::Queued { event_id: event.id, outcome });
    }
    if published == Some(true) {
        sqlx::query("DELETE FROM outbox_evento WHERE id = $1").bind(event.id).execute(&mut *tx).await?;
    }
    outbox::insert(&mut tx, &event.as_new_event()).await.map_err(StoreError::Outbox)?;
    tx.commit().await?;
    Ok(Reemitted::Queued { event_id: event.id, outcome })
}

enum Checked {
    Disagrees(String),
    Database(sqlx::Error),
}

/// A settlement's entries are one debit of the source and one credit of the destination, both
/// of the transfer's amount, in accounts of its currency.
async fn check_entries(connection: &mut sqlx::PgConnection, transfer: &Transfer) -> Result<(), Checked> {
    // raw text, as the database holds it: a corrupted value is reported as a disagreement
    let entries: Vec<(String, String, i64, String)> = sqlx::query_as(
        "SELECT l.conta_id, l.tipo, l.valor_centavos, c.moeda FROM lancamento AS l \
         JOIN conta AS c ON c.id = l.conta_id WHERE l.transferencia_id = $1 ORDER BY l.tipo DESC",
    )
    .bind(transfer.transfer_id)
    .fetch_all(connection)
    .await
    .map_err(Checked::Database)?;
    let expected = [
        (
            transfer.source.to_string(),
            EntryKind::Debit.to_string(),
            transfer.amount_cents.get(),
            transfer.currency.to_string(),
        ),
        (
            transfer.destination.to_string(),
            EntryKind::Credit.to_string(),
            transfer.amount_cents.get(),
            transfer.currency.to_string(),
        ),
    ];
    if entries != expected {
        let shown = |rows: &[(String, String, i64, String)]| {
            rows.iter()
                .map(|(account, kind, cents, currency)| format!("{kind} {account} {cents} {currency}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Checked::Disagrees(format!(
            "the ledger's entries [{}] are not the transfer's [{}]",
            shown(&entries),
            shown(&expected)
        )));
    }
    Ok(())
}
