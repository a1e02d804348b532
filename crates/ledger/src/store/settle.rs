//! Batched, idempotent settlement: the business key, the rules, the entries, the outcome
//! event, all in one transaction.

use std::collections::{HashMap, HashSet};

use sqlx::PgPool;
use uuid::Uuid;

use contracts::events::OutcomeDetails;
use contracts::ids::{derived_event_id, REJECTED_BY_LEDGER_PREFIX, SETTLED_PREFIX};
use contracts::{AccountId, Cents, EntryKind, EventType, Timestamp, TransferRejected, TransferSettled};

use super::{begin, lock_accounts, Entries};
use crate::error::StoreError;
use crate::settlement::{decide, Outcome, Transfer};

/// Where outcome events go (with the configured topic prefix).
#[derive(Debug, Clone)]
pub struct OutcomeTopics {
    pub settled: String,
    pub rejected: String,
}

/// A transfer to settle and the trace of the record that asked for it.
#[derive(Debug, Clone)]
pub struct Request {
    pub transfer: Transfer,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// What one settlement transaction decided.
#[derive(Debug, Default)]
pub struct Settlement {
    /// Newly decided transfers, in input order.
    pub decided: Vec<(Uuid, Outcome)>,
    /// Transfers decided before (pinned): nothing was done for them.
    pub already_decided: Vec<Uuid>,
}

/// Settles `requests` in one transaction: per transfer the business key is checked (a
/// transfer decided before is left alone: its outcome is pinned), the rules decide, the
/// outcome is stored, the money moves as one `D` and one `C` entry, and the outcome event goes
/// to the outbox. A transfer rejected by the rules does not affect the others. Duplicates
/// within `requests` count once.
// Over 100 lines on purpose: every step runs inside the one database transaction over the same
// locked accounts and per-batch maps; split, each part would take all of them.
pub async fn settle(
    pool: &PgPool,
    requests: &[Request],
    topics: &OutcomeTopics,
) -> Result<Settlement, StoreError> {
    let mut transaction = begin(pool).await?;
    let mut account_ids: Vec<&AccountId> = requests
        .iter()
        .flat_map(|request| [&request.transfer.source, &request.transfer.destination])
        .collect();
    account_ids.sort_unstable();
    account_ids.dedup();
    let mut accounts = lock_accounts(&mut transaction, &account_ids).await?;
    let before: HashMap<AccountId, Cents> =
        accounts.iter().map(|(id, account)| (id.clone(), account.balance_cents)).collect();

    // after the locks: whoever decided a transfer touching these accounts has committed
    let transfer_ids: Vec<Uuid> = requests.iter().map(|request| request.transfer.transfer_id).collect();
    let decided_before: HashSet<Uuid> = sqlx::query_scalar(
        "SELECT transferencia_id FROM transferencia_processada WHERE transferencia_id = ANY($1)",
    )
    .bind(&transfer_ids)
    .fetch_all(&mut *transaction)
    .await?
    .into_iter()
    .collect();

    let now = Timestamp::now();
    let at = now.as_offset_date_time();
    let mut settlement = Settlement::default();
    let mut seen = HashSet::new();
    let mut events = Vec::new();
    let mut entries = Entries::default();
    for request in requests {
        let transfer = &request.transfer;
        if decided_before.contains(&transfer.transfer_id) || !seen.insert(transfer.transfer_id) {
            settlement.already_decided.push(transfer.transfer_id);
            continue;
        }
        let outcome = decide(transfer, &mut accounts)?;
        if outcome == Outcome::Settled {
            entries.push(transfer.transfer_id, &transfer.source, EntryKind::Debit, transfer.amount_cents);
            entries.push(
                transfer.transfer_id,
                &transfer.destination,
                EntryKind::Credit,
                transfer.amount_cents,
            );
        }
        events.push(outcome_event(request, outcome, now, topics)?);
        settlement.decided.push((transfer.transfer_id, outcome));
    }
    if settlement.decided.is_empty() {
        transaction.commit().await?;
        return Ok(settlement);
    }

    let ids: Vec<Uuid> = settlement.decided.iter().map(|(id, _)| *id).collect();
    let results: Vec<&str> = settlement.decided.iter().map(|(_, outcome)| outcome.result()).collect();
    let reasons: Vec<Option<&str>> = settlement.decided.iter().map(|(_, outcome)| outcome.reason()).collect();
    let claimed: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO transferencia_processada (transferencia_id, resultado, motivo, processada_em) \
         SELECT id, resultado, motivo, $4 FROM UNNEST($1::uuid[], $2::text[], $3::text[]) AS d(id, resultado, motivo) \
         ON CONFLICT (transferencia_id) DO NOTHING RETURNING transferencia_id",
    )
    .bind(&ids)
    .bind(&results)
    .bind(&reasons)
    .bind(at)
    .fetch_all(&mut *transaction)
    .await?;
    if claimed.len() != ids.len() {
        // only a transfer whose accounts do not exist escapes the account locks; roll back and
        // let the retry see the other instance's decision
        let claimed: HashSet<Uuid> = claimed.into_iter().collect();
        let lost = ids
            .iter()
            .find(|id| !claimed.contains(id))
            .copied()
            .expect("fewer decisions claimed than ids (all distinct): one id is unclaimed");
        return Err(StoreError::DecidedConcurrently(lost));
    }

    let changed: Vec<(&AccountId, Cents)> = accounts
        .iter()
        .filter(|(id, account)| before.get(*id) != Some(&account.balance_cents))
        .map(|(id, account)| (id, account.balance_cents))
        .collect();
    if !changed.is_empty() {
        let (ids, balances): (Vec<&str>, Vec<i64>) =
            changed.iter().map(|(id, balance)| (id.as_str(), balance.get())).unzip();
        sqlx::query(
            "UPDATE conta SET saldo_centavos = novo.saldo \
             FROM UNNEST($1::text[], $2::int8[]) AS novo(id, saldo) WHERE conta.id = novo.id",
        )
        .bind(&ids)
        .bind(&balances)
        .execute(&mut *transaction)
        .await?;
    }
    // the invariants the books rest on, checked before they are committed: every settlement is
    // one debit and one credit of the same amount, and the balances moved by exactly the
    // entries (so Σ balances per currency stays 0)
    assert!(entries.balanced(), "settlement entries do not balance: {entries:?}");
    let moved: i128 = changed
        .iter()
        .map(|(id, balance)| {
            i128::from(balance.get()) - i128::from(before.get(*id).copied().unwrap_or_default().get())
        })
        .sum();
    assert_eq!(moved, 0, "settlement moved balances by a non-zero sum: {changed:?}");
    entries.insert(&mut transaction, at).await?;
    let new_events: Vec<outbox::NewEvent<'_>> = events.iter().map(OutcomeEvent::as_new_event).collect();
    outbox::insert_many(&mut transaction, &new_events).await?;
    transaction.commit().await?;
    Ok(settlement)
}

/// An outcome event ready for the outbox.
#[derive(Debug)]
pub(crate) struct OutcomeEvent {
    pub(crate) id: Uuid,
    topic: String,
    key: String,
    event_type: EventType,
    payload: String,
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl OutcomeEvent {
    pub(crate) fn as_new_event(&self) -> outbox::NewEvent<'_> {
        outbox::NewEvent {
            id: self.id,
            topic: &self.topic,
            key: &self.key,
            event_type: self.event_type.as_str(),
            payload: &self.payload,
            traceparent: self.traceparent.as_deref(),
            tracestate: self.tracestate.as_deref(),
        }
    }
}

/// `TransferenciaLiquidada` or `TransferenciaRejeitada`, with ids derived from the transfer id
/// (`"liquidada:"` / `"rejeitada-ledger:"`), so a re-run writes the same event.
pub(crate) fn outcome_event(
    request: &Request,
    outcome: Outcome,
    at: Timestamp,
    topics: &OutcomeTopics,
) -> Result<OutcomeEvent, serde_json::Error> {
    let transfer = &request.transfer;
    let details = OutcomeDetails {
        source_account: Some(transfer.source.clone()),
        destination_account: Some(transfer.destination.clone()),
        amount_cents: Some(transfer.amount_cents),
        currency: Some(transfer.currency.clone()),
    };
    let (id, topic, event_type, payload) = match outcome {
        Outcome::Settled => {
            let id = derived_event_id(SETTLED_PREFIX, transfer.transfer_id);
            let event =
                TransferSettled { event_id: id, transfer_id: transfer.transfer_id, settled_at: at, details };
            (id, &topics.settled, EventType::TransferSettled, serde_json::to_string(&event)?)
        }
        Outcome::Rejected(reason) => {
            let id = derived_event_id(REJECTED_BY_LEDGER_PREFIX, transfer.transfer_id);
            let event = TransferRejected {
                event_id: id,
                transfer_id: transfer.transfer_id,
                reason,
                rejected_at: at,
                details,
            };
            (id, &topics.rejected, EventType::TransferRejected, serde_json::to_string(&event)?)
        }
    };
    Ok(OutcomeEvent {
        id,
        topic: topic.clone(),
        key: transfer.source.as_str().to_owned(),
        event_type,
        payload,
        traceparent: request.traceparent.clone(),
        tracestate: request.tracestate.clone(),
    })
}
