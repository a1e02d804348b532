//! Re-publishing the request event of stuck transfers (`pagamentos republish`): the outbox
//! deletes its rows a day after publishing them, so a `TransferenciaSolicitada` lost in Kafka
//! afterwards (retention expired before a stage consumed it, a topic on a failed disk with one
//! replica) could never be sent again. It is rebuilt from the `transferencia` row, exactly as
//! [`crate::store::create`] wrote it (same topic, key `contaOrigem`, type, payload fields and
//! `criadaEm`; a new `eventoId`), and written to the outbox, so the relay publishes it with the
//! same headers and in per-key order. Safe because every stage is idempotent by transfer id:
//! antifraude analyses it again, the ledger's outcome is pinned (a decided transfer moves no
//! money and emits nothing again).

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use contracts::{EventType, Timestamp, TransferRequested};

use crate::error::StoreError;
use crate::store::Transfer;

/// What [`republish`] did for one transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Republished {
    /// A new outbox row with this `eventoId`; the relay publishes it.
    Queued(Uuid),
    /// An unpublished outbox row for this transfer is there already (this `eventoId`): the
    /// relay has not sent it yet, nothing was added.
    AlreadyWaiting(Uuid),
}

const SELECT: &str = "SELECT id, conta_origem, conta_destino, valor_centavos, moeda, status, \
     motivo_rejeicao, criada_em, atualizada_em FROM transferencia";

/// The transfers `PENDENTE` for more than `bound`, oldest first.
pub async fn stuck(pool: &PgPool, bound: Duration) -> Result<Vec<Transfer>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "{SELECT} WHERE status = 'PENDENTE' AND criada_em < now() - make_interval(secs => $1) \
         ORDER BY criada_em, id"
    ))
    .bind(bound.as_secs_f64())
    .fetch_all(pool)
    .await?)
}

/// The transfers `ids` that exist, in the order given.
pub async fn find_all(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<Transfer>, StoreError> {
    let found: Vec<Transfer> =
        sqlx::query_as(&format!("{SELECT} WHERE id = ANY($1)")).bind(ids).fetch_all(pool).await?;
    Ok(ids.iter().filter_map(|id| found.iter().find(|transfer| transfer.id == *id).cloned()).collect())
}

/// The `TransferenciaSolicitada` of `transfer`, with the `eventoId` `event_id`: the event
/// [`crate::store::create_batch`] writes when it accepts the transfer, built from its row.
pub fn request_event(transfer: &Transfer, event_id: Uuid) -> TransferRequested {
    TransferRequested {
        event_id,
        transfer_id: transfer.id,
        source_account: transfer.source_account.clone(),
        destination_account: transfer.destination_account.clone(),
        amount_cents: transfer.amount_cents,
        currency: transfer.currency.clone(),
        created_at: Timestamp::from(transfer.created_at),
    }
}

/// The unpublished `TransferenciaSolicitada` outbox row of `transfer_id`, if any.
pub async fn waiting<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    transfer_id: Uuid,
) -> Result<Option<Uuid>, StoreError> {
    // the partial index of unpublished rows keeps this small while the relay keeps up
    Ok(sqlx::query_scalar(
        "SELECT id FROM outbox_evento WHERE publicado_em IS NULL AND tipo = $1 \
         AND payload::jsonb ->> 'transferenciaId' = $2 LIMIT 1",
    )
    .bind(EventType::TransferRequested.as_str())
    .bind(transfer_id.to_string())
    .fetch_optional(executor)
    .await?)
}

/// Writes `transfer`'s request event to the outbox for `topic` (behind the configured prefix),
/// unless an unpublished one is waiting there already.
pub async fn republish(pool: &PgPool, transfer: &Transfer, topic: &str) -> Result<Republished, StoreError> {
    let mut tx = pool.begin().await?;
    // one republish at a time per transfer: two operators running it together add one row
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('republicar'), hashtext($1))")
        .bind(transfer.id.to_string())
        .execute(&mut *tx)
        .await?;
    if let Some(event_id) = waiting(&mut *tx, transfer.id).await? {
        tx.commit().await?;
        return Ok(Republished::AlreadyWaiting(event_id));
    }
    let event = request_event(transfer, Uuid::new_v4());
    let payload = serde_json::to_string(&event).map_err(StoreError::Encode)?;
    outbox::insert(
        &mut tx,
        &outbox::NewEvent {
            id: event.event_id,
            topic,
            key: transfer.source_account.as_str(),
            event_type: EventType::TransferRequested.as_str(),
            payload: &payload,
            traceparent: None,
            tracestate: None,
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Republished::Queued(event.event_id))
}
