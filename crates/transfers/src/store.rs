//! The `transferencias` database: transfers, their outbox events and idempotency keys.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

use contracts::{AccountId, Amount, Currency, EventType, Timestamp, TransferStatus};

use crate::domain::{Status, TransferRequest};

/// A status that is not one of `transferencia`'s: the database holds what this binary does not
/// know (a newer writer, a hand edit); never read as `PENDENTE`.
pub type UnknownStatus = contracts::domain::UnknownName;
use crate::error::{Refusal, StoreError};

/// A row of `transferencia`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Transfer {
    pub id: Uuid,
    #[sqlx(rename = "conta_origem", try_from = "String")]
    pub source_account: AccountId,
    #[sqlx(rename = "conta_destino", try_from = "String")]
    pub destination_account: AccountId,
    #[sqlx(rename = "valor_centavos", try_from = "i64")]
    pub amount_cents: Amount,
    #[sqlx(rename = "moeda", try_from = "String")]
    pub currency: Currency,
    /// An unknown spelling in the row fails the read (`sqlx::Error::ColumnDecode`).
    #[sqlx(try_from = "StatusColumn")]
    pub status: TransferStatus,
    #[sqlx(rename = "motivo_rejeicao")]
    pub rejection_reason: Option<String>,
    #[sqlx(rename = "criada_em")]
    pub created_at: OffsetDateTime,
    #[sqlx(rename = "atualizada_em")]
    pub updated_at: OffsetDateTime,
}

/// `transferencia.status` as read: a [`TransferStatus`], or a decode error that names the
/// spelling this binary does not know (its source is [`UnknownStatus`]).
#[derive(Debug)]
pub struct StatusColumn(TransferStatus);

impl sqlx::Type<Postgres> for StatusColumn {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <String as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, Postgres> for StatusColumn {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<Postgres>>::decode(value)?;
        Ok(Self(TransferStatus::parse(text)?))
    }
}

impl From<StatusColumn> for TransferStatus {
    fn from(column: StatusColumn) -> Self {
        column.0
    }
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
pub struct EventTarget {
    pub topic: Arc<str>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// One transfer to create, as the API accepted it: owned, so it can wait for a batch.
#[derive(Debug, Clone)]
pub struct NewTransfer {
    pub request: TransferRequest,
    pub key: Option<IdempotencyKey>,
    pub target: EventTarget,
}

const SELECT_TRANSFER: &str = "SELECT id, conta_origem, conta_destino, valor_centavos, moeda, status, \
     motivo_rejeicao, criada_em, atualizada_em FROM transferencia";

/// The transfer row's columns as `create` returns them.
const RETURNING_TRANSFER: &str =
    "RETURNING id, conta_origem, conta_destino, valor_centavos, moeda, status, motivo_rejeicao, criada_em, atualizada_em";

/// In one transaction: claim the Idempotency-Key (if any), insert the transfer, insert its
/// `TransferenciaSolicitada` in the outbox. Four round trips to PostgreSQL on the way that
/// accepts a transfer: `BEGIN`, the key and the transfer in one statement, the outbox row,
/// `COMMIT`. [`create_batch`] does the same for many transfers in one transaction.
pub async fn create(pool: &PgPool, new: &NewTransfer) -> Result<Created, StoreError> {
    create_batch(pool, &[new]).await?.pop().expect("one answer per transfer")
}

/// [`create`] for every transfer of `batch` in one transaction (a group commit): each gets its
/// own answer (created, replayed, or refused for its key), all committed together. `Err`: the
/// transaction failed, nothing was written, and it has been rolled back (its keys are free
/// again) unless the connection broke; [`StoreError::OutcomeUnknown`]: the connection broke
/// during `COMMIT`, so the batch may be written or not.
///
/// The batch costs the same four round trips as one transfer: one statement claims the keys
/// and inserts the transfers of every request whose key is free (or that has none), one inserts
/// their events. A request whose key it could not claim costs a few statements more, alone (see
/// [`resolve_held_key`]).
///
/// A key is claimed under a transaction-scoped advisory lock on (scope, key), taken without
/// waiting: a request that finds it held answers `409` at once (the other request is in
/// flight), and a request holding it never waits on another's uncommitted claim. Two requests
/// with one key in the same batch: the second sees the first's claim, as if it came after it.
pub async fn create_batch(
    pool: &PgPool,
    batch: &[&NewTransfer],
) -> Result<Vec<Result<Created, StoreError>>, StoreError> {
    let mut tx = pool.begin().await?;
    let answers = match create_all(&mut tx, batch).await {
        Ok(answers) => answers,
        Err(error) => {
            // ended here, not left to the drop: a dropped transaction is only queued for
            // rollback (or its connection closed), and until the server has ended it, it
            // keeps the advisory locks of the keys it claimed. The writer retries these
            // requests one by one, on other connections: they would find their own keys
            // "in flight" (seen once in a full test run, on a loaded machine)
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(error = %rollback, "rolling back a failed batch of transfers");
            }
            return Err(error);
        }
    };
    tx.commit().await.map_err(commit_failed)?;
    Ok(answers)
}

/// What a failed `COMMIT` means: an error the server answered (a deferred constraint, a
/// serialization failure, the server shutting down) ended the transaction without writing it;
/// any other failure (the connection broke, timed out, answered garbage) leaves the outcome
/// unknown: the server may have committed before the answer was lost.
fn commit_failed(error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::Database(_) => StoreError::Database(error),
        other => StoreError::OutcomeUnknown(Arc::new(other)),
    }
}

/// A transfer inserted in this transaction, with its event's id and payload (not written yet).
struct Accepted {
    transfer: Transfer,
    event: (Uuid, String),
}

/// Every transfer of `batch` in `tx`, answers in `batch`'s order. The outer `Err` fails the
/// transaction; an inner one refuses that request alone (its key is reused, in flight, or points
/// nowhere).
async fn create_all(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[&NewTransfer],
) -> Result<Vec<Result<Created, StoreError>>, StoreError> {
    // a key's first request in the batch claims it with the others; a later one is resolved
    // below, after that claim, as if it came in a batch of its own after it
    let mut keys = std::collections::HashSet::new();
    let (claims, repeats): (Vec<usize>, Vec<usize>) = (0..batch.len())
        .partition(|&index| batch[index].key.as_ref().is_none_or(|key| keys.insert((&key.scope, &key.key))));
    let claimed: Vec<&NewTransfer> = claims.iter().map(|&index| batch[index]).collect();
    let mut answers: Vec<Option<Result<Created, StoreError>>> = batch.iter().map(|_| None).collect();
    let mut accepted = Vec::with_capacity(claims.len());
    for (index, inserted) in claims.iter().copied().zip(insert_transfers(tx, &claimed).await?) {
        if let Some(Accepted { transfer, event }) = inserted {
            answers[index] = Some(Ok(Created::New(transfer)));
            accepted.push((index, event));
        }
    }
    // requests whose key was not claimed above, in order: first claims first, then repeats
    let unclaimed: Vec<usize> =
        claims.into_iter().filter(|&index| answers[index].is_none()).chain(repeats).collect();
    for index in unclaimed {
        let key = batch[index].key.as_ref().expect("a request without a key is always inserted");
        answers[index] = Some(match resolve_held_key(tx, batch[index], key).await? {
            Ok(Resolved::Inserted(Accepted { transfer, event })) => {
                accepted.push((index, event));
                Ok(Created::New(transfer))
            }
            Ok(Resolved::Replayed(transfer)) => Ok(Created::Replayed(transfer)),
            Err(refused) => Err(refused),
        });
    }
    let events: Vec<outbox::NewEvent<'_>> = accepted
        .iter()
        .map(|(index, (event_id, payload))| {
            let NewTransfer { request, target, .. } = batch[*index];
            outbox::NewEvent {
                id: *event_id,
                topic: &target.topic,
                key: request.source_account.as_str(),
                event_type: EventType::TransferRequested.as_str(),
                payload,
                traceparent: target.traceparent.as_deref(),
                tracestate: target.tracestate.as_deref(),
            }
        })
        .collect();
    outbox::insert_many(tx, &events).await?;
    Ok(answers.into_iter().map(|answer| answer.expect("every request answered")).collect())
}

/// What [`resolve_held_key`] found.
enum Resolved {
    /// The key was free after all (expired and deleted, or deleted by the cleanup): claimed now.
    Inserted(Accepted),
    /// The key's transfer, for a replay of the request that created it.
    Replayed(Transfer),
}

/// A request whose key [`insert_transfers`] could not claim: the key is committed (a replay, a
/// misuse, or expired), held by a transaction in flight, or was claimed by an earlier request
/// of this transaction. An expired key found in the way is deleted and the claim retried once;
/// so is a key that the expired-key cleanup deleted between the claim and the look at what was
/// in its way.
async fn resolve_held_key(
    tx: &mut Transaction<'_, Postgres>,
    new: &NewTransfer,
    key: &IdempotencyKey,
) -> Result<Result<Resolved, StoreError>, StoreError> {
    for attempt in 0..2 {
        if attempt > 0 {
            if let Some(inserted) = insert_transfers(tx, &[new]).await?.pop().flatten() {
                return Ok(Ok(Resolved::Inserted(inserted)));
            }
        }
        let held: Option<(String, Uuid, bool)> = sqlx::query_as(
            "SELECT hash_requisicao, transferencia_id, expira_em <= now() FROM chave_idempotencia \
             WHERE escopo = $1 AND chave = $2",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .fetch_optional(&mut **tx)
        .await?;
        match held {
            // nothing committed in the way: either a request not committed yet holds the key's
            // lock, or the cleanup (which takes no lock) deleted an expired row since the claim
            None if !key_lock(tx, key).await? => return Ok(Err(Refusal::KeyInFlight.into())),
            None => {}
            Some((_, _, true)) => {
                // only the lock's holder may delete: another deleting it is in flight
                if !key_lock(tx, key).await? {
                    return Ok(Err(Refusal::KeyInFlight.into()));
                }
                // gone already if the cleanup got there first: the claim is retried either way
                sqlx::query(
                    "DELETE FROM chave_idempotencia WHERE escopo = $1 AND chave = $2 AND expira_em <= now()",
                )
                .bind(&key.scope)
                .bind(&key.key)
                .execute(&mut **tx)
                .await?;
            }
            Some((fingerprint, transfer_id, false)) => {
                if fingerprint != key.fingerprint {
                    return Ok(Err(Refusal::KeyReused.into()));
                }
                let transfer = find(&mut **tx, transfer_id).await?;
                return Ok(transfer.map(Resolved::Replayed).ok_or(StoreError::KeyWithoutTransfer));
            }
        }
    }
    Ok(Err(Refusal::KeyInFlight.into()))
}

/// Takes `key`'s transaction-scoped advisory lock without waiting (`true` if this transaction
/// holds it now, also when it already did).
async fn key_lock(tx: &mut Transaction<'_, Postgres>, key: &IdempotencyKey) -> Result<bool, StoreError> {
    let (locked,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_xact_lock(hashtext($1), hashtext($2))")
        .bind(&key.scope)
        .bind(&key.key)
        .fetch_one(&mut **tx)
        .await?;
    Ok(locked)
}

/// Inserts, in one statement, the transfer of every request in `requests` that has no key or
/// claims its key (the key's row in the same statement): `None` for a request whose key is
/// taken (committed, or claimed earlier in this transaction) or whose lock another transaction
/// holds. The keys of `requests` must differ. The events are built, not written.
async fn insert_transfers(
    tx: &mut Transaction<'_, Postgres>,
    requests: &[&NewTransfer],
) -> Result<Vec<Option<Accepted>>, StoreError> {
    let ids: Vec<Uuid> = requests.iter().map(|_| Uuid::new_v4()).collect();
    // microseconds, as PostgreSQL stores them; each event is built from its row as returned
    // ([`crate::republish::request_event`]), so its criadaEm is the row's criada_em
    let created_at: Vec<OffsetDateTime> =
        requests.iter().map(|_| Timestamp::now().as_offset_date_time()).collect();
    let keys = requests.iter().map(|new| new.key.as_ref());
    // every claim of a key holds its lock first, so ON CONFLICT only ever meets a committed row
    // (or one this transaction wrote) and never waits; the lock lasts until this transaction
    // ends. `novo` is materialized: each lock is tried once
    let inserted: Vec<Transfer> = sqlx::query_as(&format!(
        "WITH novo AS MATERIALIZED ( \
           SELECT n.*, CASE WHEN n.escopo IS NULL THEN true \
                       ELSE pg_try_advisory_xact_lock(hashtext(n.escopo), hashtext(n.chave)) END AS livre \
           FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int8[], $5::text[], $6::timestamptz[], \
                       $7::text[], $8::text[], $9::text[], $10::float8[]) \
                AS n(id, conta_origem, conta_destino, valor_centavos, moeda, criada_em, \
                     escopo, chave, hash_requisicao, ttl_segundos)), \
         chave AS ( \
           INSERT INTO chave_idempotencia (escopo, chave, hash_requisicao, transferencia_id, expira_em) \
           SELECT escopo, chave, hash_requisicao, id, now() + make_interval(secs => ttl_segundos) \
           FROM novo WHERE escopo IS NOT NULL AND livre \
           ON CONFLICT DO NOTHING RETURNING transferencia_id) \
         INSERT INTO transferencia \
           (id, conta_origem, conta_destino, valor_centavos, moeda, status, criada_em, atualizada_em) \
         SELECT id, conta_origem, conta_destino, valor_centavos, moeda, $11, criada_em, criada_em FROM novo \
         WHERE escopo IS NULL OR id IN (SELECT transferencia_id FROM chave) {RETURNING_TRANSFER}"
    ))
    .bind(&ids)
    .bind(requests.iter().map(|new| new.request.source_account.as_str()).collect::<Vec<_>>())
    .bind(requests.iter().map(|new| new.request.destination_account.as_str()).collect::<Vec<_>>())
    .bind(requests.iter().map(|new| new.request.amount_cents.get()).collect::<Vec<_>>())
    .bind(requests.iter().map(|new| new.request.currency.as_str()).collect::<Vec<_>>())
    .bind(&created_at)
    .bind(keys.clone().map(|key| key.map(|key| key.scope.as_str())).collect::<Vec<_>>())
    .bind(keys.clone().map(|key| key.map(|key| key.key.as_str())).collect::<Vec<_>>())
    .bind(keys.clone().map(|key| key.map(|key| key.fingerprint.as_str())).collect::<Vec<_>>())
    .bind(keys.map(|key| key.map(|key| key.ttl.as_secs_f64())).collect::<Vec<_>>())
    .bind(Status::Pending.as_str())
    .fetch_all(&mut **tx)
    .await?;
    let mut inserted: std::collections::HashMap<Uuid, Transfer> =
        inserted.into_iter().map(|transfer| (transfer.id, transfer)).collect();
    ids.iter()
        .map(|id| {
            let Some(transfer) = inserted.remove(id) else { return Ok(None) };
            let event = crate::republish::request_event(&transfer, Uuid::new_v4());
            let payload = serde_json::to_string(&event).map_err(StoreError::Encode)?;
            Ok(Some(Accepted { transfer, event: (event.event_id, payload) }))
        })
        .collect()
}

/// The transfer `id`, read through `executor` (the pool, or an open transaction that may hold
/// it uncommitted).
pub async fn find<'e>(executor: impl sqlx::PgExecutor<'e>, id: Uuid) -> Result<Option<Transfer>, StoreError> {
    Ok(sqlx::query_as(&format!("{SELECT_TRANSFER} WHERE id = $1")).bind(id).fetch_optional(executor).await?)
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

/// Newest first, the transfers touching one of `accounts` (an API client's): all of them, or,
/// with `other` (not one of `accounts`), those between `other` and one of `accounts`. Two
/// disjoint sides, each on its index: debits from `accounts`, and credits to `accounts` from
/// elsewhere.
pub async fn list_touching(
    pool: &PgPool,
    accounts: &[String],
    other: Option<&str>,
    status: Option<Status>,
    limit: i64,
) -> Result<Vec<Transfer>, StoreError> {
    let status = status.map(|status| status.as_str());
    Ok(sqlx::query_as(&format!(
        "SELECT * FROM (({SELECT_TRANSFER} WHERE conta_origem = ANY($1) \
             AND ($2::text IS NULL OR conta_destino = $2) AND ($3::text IS NULL OR status = $3) \
             ORDER BY criada_em DESC, id DESC LIMIT $4) \
           UNION ALL ({SELECT_TRANSFER} WHERE conta_destino = ANY($1) AND conta_origem <> ALL($1) \
             AND ($2::text IS NULL OR conta_origem = $2) AND ($3::text IS NULL OR status = $3) \
             ORDER BY criada_em DESC, id DESC LIMIT $4)) AS both_sides \
         ORDER BY criada_em DESC, id DESC LIMIT $4"
    ))
    .bind(accounts)
    .bind(other)
    .bind(status)
    .bind(limit)
    .fetch_all(pool)
    .await?)
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
    pub decided: contracts::Outcome,
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
    let statuses: Vec<&str> = unique.iter().map(|outcome| outcome.decided.result()).collect();
    let reasons: Vec<Option<&str>> = unique.iter().map(|outcome| outcome.decided.reason()).collect();
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
    let updated = updated
        .into_iter()
        .map(|(id, status)| Ok((id, Status::parse(&status)?)))
        .collect::<Result<_, UnknownStatus>>()?;
    Ok(Projected { updated, already_final: known.len(), unknown })
}
