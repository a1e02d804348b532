//! The `transferencias` database: transfers, their outbox events and idempotency keys.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

use contracts::{EventType, Timestamp, TransferRequested};

use crate::domain::{Status, TransferRequest};
use crate::error::StoreError;

/// A row of `transferencia`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Transfer {
    pub id: Uuid,
    pub conta_origem: String,
    pub conta_destino: String,
    pub valor_centavos: i64,
    pub moeda: String,
    pub status: String,
    pub motivo_rejeicao: Option<String>,
    pub criada_em: OffsetDateTime,
    pub atualizada_em: OffsetDateTime,
}

/// An Idempotency-Key as stored: scoped by caller, bound to the request's fingerprint.
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    /// Who sent it (a hash of the caller's token, or `anonimo`).
    pub scope: String,
    pub key: String,
    pub fingerprint: String,
    pub ttl: Duration,
}

/// What `create` did.
#[derive(Debug, Clone)]
pub enum Created {
    New(Transfer),
    /// The key was used before with the same request: the original transfer, as it is now.
    Replayed(Transfer),
}

/// Where the `TransferenciaSolicitada` event goes, with the trace context of the request.
#[derive(Debug, Clone)]
pub struct EventTarget<'a> {
    pub topic: &'a str,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
}

const SELECT_TRANSFER: &str = "SELECT id, conta_origem, conta_destino, valor_centavos, moeda, status, \
     motivo_rejeicao, criada_em, atualizada_em FROM transferencia";

/// How long a request waits for another request holding the same Idempotency-Key before it is
/// answered `409`.
const IN_FLIGHT_WAIT_MS: u32 = 200;

/// In one transaction: claim the Idempotency-Key (if any), insert the transfer, insert its
/// `TransferenciaSolicitada` in the outbox.
pub async fn create(
    pool: &PgPool,
    request: &TransferRequest,
    key: Option<&IdempotencyKey>,
    target: &EventTarget<'_>,
) -> Result<Created, StoreError> {
    // an expired key found in the way is deleted and the claim retried once
    for _ in 0..2 {
        let mut tx = pool.begin().await?;
        if let Some(key) = key {
            match claim_key(&mut tx, key).await? {
                Claim::Claimed(id) => {
                    let transfer = insert_transfer(&mut tx, id, request, target).await?;
                    tx.commit().await?;
                    return Ok(Created::New(transfer));
                }
                Claim::Taken { fingerprint, transfer_id, expired: false } => {
                    drop(tx);
                    if fingerprint != key.fingerprint {
                        return Err(StoreError::KeyReused);
                    }
                    let transfer = find(pool, transfer_id).await?.ok_or(StoreError::KeyWithoutTransfer)?;
                    return Ok(Created::Replayed(transfer));
                }
                Claim::Taken { expired: true, .. } => {
                    sqlx::query("DELETE FROM chave_idempotencia WHERE escopo = $1 AND chave = $2 AND expira_em <= now()")
                        .bind(&key.scope)
                        .bind(&key.key)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    continue;
                }
            }
        }
        let transfer = insert_transfer(&mut tx, Uuid::new_v4(), request, target).await?;
        tx.commit().await?;
        return Ok(Created::New(transfer));
    }
    Err(StoreError::KeyInFlight)
}

enum Claim {
    Claimed(Uuid),
    Taken { fingerprint: String, transfer_id: Uuid, expired: bool },
}

async fn claim_key(tx: &mut Transaction<'_, Postgres>, key: &IdempotencyKey) -> Result<Claim, StoreError> {
    // a request still holding the key (uncommitted) makes ours wait on its row: bounded, then 409
    sqlx::query(&format!("SET LOCAL lock_timeout = '{IN_FLIGHT_WAIT_MS}ms'")).execute(&mut **tx).await?;
    let id = Uuid::new_v4();
    let claimed = sqlx::query(
        "INSERT INTO chave_idempotencia (escopo, chave, hash_requisicao, transferencia_id, expira_em) \
         VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5)) ON CONFLICT DO NOTHING",
    )
    .bind(&key.scope)
    .bind(&key.key)
    .bind(&key.fingerprint)
    .bind(id)
    .bind(key.ttl.as_secs_f64())
    .execute(&mut **tx)
    .await
    .map_err(|error| match &error {
        sqlx::Error::Database(database) if database.code().as_deref() == Some("55P03") => {
            StoreError::KeyInFlight
        }
        _ => StoreError::Database(error),
    })?
    .rows_affected();
    sqlx::query("SET LOCAL lock_timeout = 0").execute(&mut **tx).await?;
    if claimed == 1 {
        return Ok(Claim::Claimed(id));
    }
    let (fingerprint, transfer_id, expired): (String, Uuid, bool) = sqlx::query_as(
        "SELECT hash_requisicao, transferencia_id, expira_em <= now() FROM chave_idempotencia \
         WHERE escopo = $1 AND chave = $2",
    )
    .bind(&key.scope)
    .bind(&key.key)
    .fetch_one(&mut **tx)
    .await?;
    Ok(Claim::Taken { fingerprint, transfer_id, expired })
}

async fn insert_transfer(
    tx: &mut Transaction<'_, Postgres>,
    id: Uuid,
    request: &TransferRequest,
    target: &EventTarget<'_>,
) -> Result<Transfer, StoreError> {
    // microseconds, as PostgreSQL stores them: the event's criadaEm equals the row's criada_em
    let created_at = Timestamp::now();
    let transfer: Transfer = sqlx::query_as(
        "INSERT INTO transferencia (id, conta_origem, conta_destino, valor_centavos, moeda, status, criada_em, atualizada_em) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
         RETURNING id, conta_origem, conta_destino, valor_centavos, moeda, status, motivo_rejeicao, criada_em, atualizada_em",
    )
    .bind(id)
    .bind(&request.source_account)
    .bind(&request.destination_account)
    .bind(request.amount_cents)
    .bind(&request.currency)
    .bind(Status::Pending.as_str())
    .bind(created_at.as_offset_date_time())
    .fetch_one(&mut **tx)
    .await?;
    let event = TransferRequested {
        event_id: Uuid::new_v4(),
        transfer_id: id,
        source_account: request.source_account.clone(),
        destination_account: request.destination_account.clone(),
        amount_cents: request.amount_cents,
        currency: request.currency.clone(),
        created_at,
    };
    let payload = serde_json::to_string(&event).map_err(StoreError::Encode)?;
    outbox::insert(
        tx,
        &outbox::NewEvent {
            id: event.event_id,
            topic: target.topic,
            key: &request.source_account,
            event_type: EventType::TransferRequested.as_str(),
            payload: &payload,
            traceparent: target.traceparent,
            tracestate: target.tracestate,
        },
    )
    .await?;
    Ok(transfer)
}

pub async fn find(pool: &PgPool, id: Uuid) -> Result<Option<Transfer>, StoreError> {
    Ok(sqlx::query_as(&format!("{SELECT_TRANSFER} WHERE id = $1")).bind(id).fetch_optional(pool).await?)
}

/// Filters of `GET /transferencias`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub account: Option<String>,
    pub status: Option<Status>,
    pub limit: i64,
}

/// Newest first; `account` matches either side.
pub async fn list(pool: &PgPool, filter: &ListFilter) -> Result<Vec<Transfer>, StoreError> {
    let status = filter.status.map(|status| status.as_str());
    let rows = match &filter.account {
        // the two indexed sides (disjoint: origin != destination) instead of an OR the planner
        // cannot index
        Some(account) => {
            sqlx::query_as(&format!(
                "SELECT * FROM (({SELECT_TRANSFER} WHERE conta_origem = $1 AND ($2::text IS NULL OR status = $2) \
                   ORDER BY criada_em DESC, id DESC LIMIT $3) \
                 UNION ALL ({SELECT_TRANSFER} WHERE conta_destino = $1 AND ($2::text IS NULL OR status = $2) \
                   ORDER BY criada_em DESC, id DESC LIMIT $3)) AS both_sides \
                 ORDER BY criada_em DESC, id DESC LIMIT $3"
            ))
            .bind(account)
            .bind(status)
            .bind(filter.limit)
            .fetch_all(pool)
            .await?
        }
        None => {
            sqlx::query_as(&format!(
                "{SELECT_TRANSFER} WHERE ($1::text IS NULL OR status = $1) ORDER BY criada_em DESC, id DESC LIMIT $2"
            ))
            .bind(status)
            .bind(filter.limit)
            .fetch_all(pool)
            .await?
        }
    };
    Ok(rows)
}

/// Deletes expired Idempotency-Keys, a small batch at a time; returns how many.
pub async fn delete_expired_keys(pool: &PgPool) -> Result<u64, StoreError> {
    let mut deleted = 0;
    loop {
        let rows = sqlx::query(
            "DELETE FROM chave_idempotencia WHERE (escopo, chave) IN \
             (SELECT escopo, chave FROM chave_idempotencia WHERE expira_em <= now() LIMIT 1000)",
        )
        .execute(pool)
        .await?
        .rows_affected();
        deleted += rows;
        if rows < 1000 {
            return Ok(deleted);
        }
    }
}

/// An outcome to project onto a transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub transfer_id: Uuid,
    pub status: Status,
    pub reason: Option<String>,
}

/// What projecting a batch of outcomes did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Projected {
    /// Transfers that left `PENDENTE` now, with their new status.
    pub updated: Vec<(Uuid, Status)>,
    /// Outcomes for transfers that already had a final status (duplicates, late events).
    pub already_final: usize,
    /// Outcomes for transfers this database does not know.
    pub unknown: Vec<Uuid>,
}

/// Sets each transfer's final status if it is still `PENDENTE`, in one transaction. The first
/// outcome of a transfer wins; a final status is never overwritten.
pub async fn project(pool: &PgPool, outcomes: &[Outcome]) -> Result<Projected, StoreError> {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&Outcome> = outcomes.iter().filter(|outcome| seen.insert(outcome.transfer_id)).collect();
    let ids: Vec<Uuid> = unique.iter().map(|outcome| outcome.transfer_id).collect();
    let statuses: Vec<&str> = unique.iter().map(|outcome| outcome.status.as_str()).collect();
    let reasons: Vec<Option<&str>> = unique.iter().map(|outcome| outcome.reason.as_deref()).collect();
    let mut tx = pool.begin().await?;
    let updated: Vec<(Uuid, String)> = sqlx::query_as(
        "UPDATE transferencia AS t SET status = u.status, motivo_rejeicao = u.motivo, atualizada_em = now() \
         FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(id, status, motivo) \
         WHERE t.id = u.id AND t.status = 'PENDENTE' RETURNING t.id, t.status",
    )
    .bind(&ids)
    .bind(&statuses)
    .bind(&reasons)
    .fetch_all(&mut *tx)
    .await?;
    let updated_ids: std::collections::HashSet<Uuid> = updated.iter().map(|(id, _)| *id).collect();
    let rest: Vec<Uuid> = ids.iter().copied().filter(|id| !updated_ids.contains(id)).collect();
    let known: Vec<Uuid> = if rest.is_empty() {
        Vec::new()
    } else {
        sqlx::query_scalar("SELECT id FROM transferencia WHERE id = ANY($1)")
            .bind(&rest)
            .fetch_all(&mut *tx)
            .await?
    };
    tx.commit().await?;
    let unknown: Vec<Uuid> = rest.iter().copied().filter(|id| !known.contains(id)).collect();
    Ok(Projected {
        updated: updated
            .into_iter()
            .map(|(id, status)| (id, Status::parse(&status).unwrap_or(Status::Pending)))
            .collect(),
        already_final: known.len(),
        unknown,
    })
}
