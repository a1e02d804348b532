//! The `ledger` database: batched settlement, accounts, deposits, entries.
//!
//! Every write that moves money locks the accounts it touches in one statement,
//! `ORDER BY id FOR UPDATE` (byte order, `COLLATE "C"`), so two transactions never wait on each
//! other in a cycle. Every movement is a double entry: one `D` and one `C` row in `lancamento`
//! with the same `transferencia_id` (a transfer's id, or a deposit's `depositoId`).

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use contracts::events::OutcomeDetails;
use contracts::ids::{derived_event_id, REJECTED_BY_LEDGER_PREFIX, SETTLED_PREFIX};
use contracts::{
    AccountId, Cents, Currency, EntryKind, EventType, Timestamp, TransferRejected, TransferSettled,
};

use crate::error::StoreError;
use crate::settlement::{decide, Account, Outcome, Transfer};

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

/// A transaction; failing to get one (whatever PostgreSQL answered: refused, shutting down,
/// unknown database) means the database is unavailable, never that a record is at fault.
async fn begin(pool: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    pool.begin().await.map_err(StoreError::Unavailable)
}

/// A connection, with the same rule as [`begin`].
async fn connection(pool: &PgPool) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
    pool.acquire().await.map_err(StoreError::Unavailable)
}

/// A `conta` row as the settlement rules read it.
#[derive(Debug, sqlx::FromRow)]
struct LockedAccount {
    id: String,
    #[sqlx(rename = "moeda")]
    currency: String,
    #[sqlx(rename = "saldo_centavos", try_from = "i64")]
    balance_cents: Cents,
    #[sqlx(rename = "emissor")]
    issuer: bool,
}

/// Locks `ids` (those that exist) in byte order and reads them.
async fn lock_accounts(
    connection: &mut PgConnection,
    ids: &[String],
) -> Result<HashMap<String, Account>, sqlx::Error> {
    let rows: Vec<LockedAccount> = sqlx::query_as(
        "SELECT id, moeda, saldo_centavos, emissor FROM conta WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    )
    .bind(ids)
    .fetch_all(&mut *connection)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let account =
                Account { currency: row.currency, balance_cents: row.balance_cents, issuer: row.issuer };
            (row.id, account)
        })
        .collect())
}

/// Settles `requests` in one transaction: per transfer the business key is checked (a
/// transfer decided before is left alone: its outcome is pinned), the rules decide, the
/// outcome is stored, the money moves as one `D` and one `C` entry, and the outcome event goes
/// to the outbox. A transfer rejected by the rules does not affect the others. Duplicates
/// within `requests` count once.
pub async fn settle(
    pool: &PgPool,
    requests: &[Request],
    topics: &OutcomeTopics,
) -> Result<Settlement, StoreError> {
    let mut transaction = begin(pool).await?;
    let mut account_ids: Vec<String> = requests
        .iter()
        .flat_map(|request| [request.transfer.source.clone(), request.transfer.destination.clone()])
        .collect();
    account_ids.sort_unstable();
    account_ids.dedup();
    let mut accounts = lock_accounts(&mut transaction, &account_ids).await?;
    let before: HashMap<String, Cents> =
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

    let changed: Vec<(&String, Cents)> = accounts
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

/// `lancamento` rows to insert with one statement.
#[derive(Debug, Default)]
struct Entries {
    transfer_ids: Vec<Uuid>,
    accounts: Vec<String>,
    kinds: Vec<EntryKind>,
    amounts: Vec<Cents>,
}

impl Entries {
    fn push(&mut self, transfer_id: Uuid, account: &str, kind: EntryKind, amount_cents: Cents) {
        assert!(amount_cents.is_positive(), "an entry of {amount_cents} cents");
        self.transfer_ids.push(transfer_id);
        self.accounts.push(account.to_owned());
        self.kinds.push(kind);
        self.amounts.push(amount_cents);
    }

    /// Σ debits = Σ credits, per transfer: each transfer's entries are a debit and a credit of
    /// the same amount.
    fn balanced(&self) -> bool {
        let mut per_transfer: HashMap<Uuid, i128> = HashMap::new();
        for ((transfer_id, kind), amount) in self.transfer_ids.iter().zip(&self.kinds).zip(&self.amounts) {
            let amount = i128::from(amount.get());
            let signed = match kind {
                EntryKind::Debit => -amount,
                EntryKind::Credit => amount,
            };
            *per_transfer.entry(*transfer_id).or_default() += signed;
        }
        per_transfer.values().all(|sum| *sum == 0)
    }

    async fn insert(&self, connection: &mut PgConnection, at: OffsetDateTime) -> Result<(), sqlx::Error> {
        if self.transfer_ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO lancamento (transferencia_id, conta_id, tipo, valor_centavos, criado_em) \
             SELECT id, conta, tipo, valor, $5 FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::int8[]) \
             AS l(id, conta, tipo, valor)",
        )
        .bind(&self.transfer_ids)
        .bind(&self.accounts)
        .bind(self.kinds.iter().map(EntryKind::as_str).collect::<Vec<_>>())
        .bind(self.amounts.iter().map(|amount| amount.get()).collect::<Vec<_>>())
        .bind(at)
        .execute(connection)
        .await?;
        Ok(())
    }
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
        key: transfer.source.clone(),
        event_type,
        payload,
        traceparent: request.traceparent.clone(),
        tracestate: request.tracestate.clone(),
    })
}

/// A customer account as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AccountRow {
    pub id: String,
    #[sqlx(rename = "moeda")]
    pub currency: String,
    #[sqlx(rename = "saldo_centavos", try_from = "i64")]
    pub balance_cents: Cents,
}

/// Why an account was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateAccountError {
    #[error("account {0} already exists")]
    Exists(String),
    #[error(transparent)]
    Deposit(#[from] DepositError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CreateAccountError {
    fn from(error: sqlx::Error) -> Self {
        Self::Store(StoreError::Database(error))
    }
}

/// Creates account `id` in `currency`; an opening balance is a deposit from the issuer with id
/// `nameUUIDFromBytes("abertura:" + id)`, in the same transaction.
pub async fn create_account(
    pool: &PgPool,
    id: &str,
    currency: &Currency,
    opening_cents: Cents,
) -> Result<AccountRow, CreateAccountError> {
    let mut transaction = begin(pool).await?;
    let created = sqlx::query(
        "INSERT INTO conta (id, saldo_centavos, moeda) VALUES ($1, 0, $2) ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(currency.as_str())
    .execute(&mut *transaction)
    .await?;
    if created.rows_affected() == 0 {
        return Err(CreateAccountError::Exists(id.to_owned()));
    }
    if opening_cents.is_positive() {
        let deposit_id = contracts::ids::opening_deposit_id(id);
        move_from_issuer(&mut transaction, deposit_id, id, currency, opening_cents).await?;
    }
    transaction.commit().await?;
    Ok(AccountRow { id: id.to_owned(), currency: currency.as_str().to_owned(), balance_cents: opening_cents })
}

/// A stored deposit.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Deposit {
    pub id: Uuid,
    #[sqlx(rename = "conta_id")]
    pub account: String,
    #[sqlx(rename = "valor_centavos", try_from = "i64")]
    pub amount_cents: Cents,
    #[sqlx(rename = "criado_em", try_from = "OffsetDateTime")]
    pub created_at: Timestamp,
}

/// Why a deposit was not made.
#[derive(Debug, thiserror::Error)]
pub enum DepositError {
    #[error("no account {0}")]
    NoAccount(String),
    #[error("deposit {id} was already made with another account or amount")]
    IdReused { id: Uuid, original: Deposit },
    #[error("the deposit would take the balance of {0} past the largest amount")]
    Overflow(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for DepositError {
    fn from(error: sqlx::Error) -> Self {
        Self::Store(StoreError::Database(error))
    }
}

/// Whether a deposit was made now or had been made before with the same data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DepositMade {
    New(Deposit),
    Replayed(Deposit),
}

/// Deposits `amount_cents` into `account`, idempotent on `deposit_id`.
pub async fn deposit(
    pool: &PgPool,
    deposit_id: Uuid,
    account: &str,
    amount_cents: Cents,
) -> Result<DepositMade, DepositError> {
    let mut transaction = begin(pool).await?;
    let currency: Option<String> =
        sqlx::query_scalar("SELECT moeda FROM conta WHERE id = $1 AND NOT emissor")
            .bind(account)
            .fetch_optional(&mut *transaction)
            .await?;
    let Some(currency) = currency else { return Err(DepositError::NoAccount(account.to_owned())) };
    // what `conta.moeda` holds was checked when the account was created
    let currency = Currency::parse(currency).map_err(StoreError::from)?;
    if let Some(original) = find_deposit(&mut transaction, deposit_id).await? {
        return if original.account == account && original.amount_cents == amount_cents {
            Ok(DepositMade::Replayed(original))
        } else {
            Err(DepositError::IdReused { id: deposit_id, original })
        };
    }
    let made = move_from_issuer(&mut transaction, deposit_id, account, &currency, amount_cents).await;
    match made {
        Ok(deposit) => {
            transaction.commit().await?;
            Ok(DepositMade::New(deposit))
        }
        // the same depositoId committed by a concurrent request meanwhile
        Err(DepositError::Store(StoreError::Database(sqlx::Error::Database(error))))
            if error.is_unique_violation() =>
        {
            drop(transaction);
            let mut connection = connection(pool).await?;
            let original = find_deposit(&mut connection, deposit_id)
                .await?
                .ok_or(DepositError::NoAccount(account.to_owned()))?;
            if original.account == account && original.amount_cents == amount_cents {
                Ok(DepositMade::Replayed(original))
            } else {
                Err(DepositError::IdReused { id: deposit_id, original })
            }
        }
        Err(error) => Err(error),
    }
}

async fn find_deposit(connection: &mut PgConnection, id: Uuid) -> Result<Option<Deposit>, sqlx::Error> {
    sqlx::query_as("SELECT id, conta_id, valor_centavos, criado_em FROM deposito WHERE id = $1")
        .bind(id)
        .fetch_optional(connection)
        .await
}

/// A deposit as a double entry from the currency's issuer account (created on demand), both
/// accounts locked in byte order.
async fn move_from_issuer(
    connection: &mut PgConnection,
    deposit_id: Uuid,
    account: &str,
    currency: &Currency,
    amount_cents: Cents,
) -> Result<Deposit, DepositError> {
    let issuer = AccountId::issuer(currency).into_string();
    sqlx::query(
        "INSERT INTO conta (id, saldo_centavos, moeda, emissor) VALUES ($1, 0, $2, true) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&issuer)
    .bind(currency.as_str())
    .execute(&mut *connection)
    .await?;
    let ids = {
        let mut ids = vec![issuer.clone(), account.to_owned()];
        ids.sort_unstable();
        ids
    };
    let accounts = lock_accounts(connection, &ids).await?;
    let balance = |id: &str| accounts.get(id).map_or(Cents::ZERO, |account| account.balance_cents);
    let debited =
        balance(&issuer).checked_sub(amount_cents).ok_or_else(|| DepositError::Overflow(issuer.clone()))?;
    let credited = balance(account)
        .checked_add(amount_cents)
        .ok_or_else(|| DepositError::Overflow(account.to_owned()))?;
    let at = Timestamp::now();
    sqlx::query("INSERT INTO deposito (id, conta_id, valor_centavos, criado_em) VALUES ($1, $2, $3, $4)")
        .bind(deposit_id)
        .bind(account)
        .bind(amount_cents.get())
        .bind(at.as_offset_date_time())
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "UPDATE conta SET saldo_centavos = novo.saldo \
         FROM UNNEST($1::text[], $2::int8[]) AS novo(id, saldo) WHERE conta.id = novo.id",
    )
    .bind([issuer.as_str(), account])
    .bind([debited.get(), credited.get()])
    .execute(&mut *connection)
    .await?;
    let mut entries = Entries::default();
    entries.push(deposit_id, &issuer, EntryKind::Debit, amount_cents);
    entries.push(deposit_id, account, EntryKind::Credit, amount_cents);
    entries.insert(connection, at.as_offset_date_time()).await?;
    Ok(Deposit { id: deposit_id, account: account.to_owned(), amount_cents, created_at: at })
}

/// Account `id` (issuer accounts included), if it exists.
pub async fn find_account(pool: &PgPool, id: &str) -> Result<Option<AccountRow>, StoreError> {
    let mut connection = connection(pool).await?;
    Ok(sqlx::query_as("SELECT id, moeda, saldo_centavos FROM conta WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?)
}

/// One `lancamento` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Entry {
    pub id: i64,
    #[sqlx(rename = "transferencia_id")]
    pub transfer_id: Uuid,
    /// An unknown `tipo` fails the read (`sqlx::Error::ColumnDecode`).
    #[sqlx(rename = "tipo", try_from = "String")]
    pub kind: EntryKind,
    #[sqlx(rename = "valor_centavos", try_from = "i64")]
    pub amount_cents: Cents,
    #[sqlx(rename = "criado_em", try_from = "OffsetDateTime")]
    pub created_at: Timestamp,
}

/// The newest `limit` entries of `account`, newest first.
pub async fn entries(pool: &PgPool, account: &str, limit: i64) -> Result<Vec<Entry>, StoreError> {
    let mut connection = connection(pool).await?;
    Ok(sqlx::query_as(
        "SELECT id, transferencia_id, tipo, valor_centavos, criado_em FROM lancamento \
         WHERE conta_id = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(account)
    .bind(limit)
    .fetch_all(&mut *connection)
    .await?)
}

/// The stored outcome of `transfer_id`, if decided (`resultado`, `motivo`); a pair that is no
/// outcome is [`StoreError::InvalidOutcome`].
pub async fn outcome(pool: &PgPool, transfer_id: Uuid) -> Result<Option<Outcome>, StoreError> {
    let mut connection = connection(pool).await?;
    let row: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT resultado, motivo FROM transferencia_processada WHERE transferencia_id = $1")
            .bind(transfer_id)
            .fetch_optional(&mut *connection)
            .await?;
    row.map(|(result, reason)| Outcome::parse(&result, reason.as_deref()).map_err(StoreError::from))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_balance_per_transfer_not_only_in_total() {
        let (one, two) = (Uuid::new_v4(), Uuid::new_v4());
        let mut entries = Entries::default();
        let cents = Cents::new;
        entries.push(one, "A", EntryKind::Debit, cents(100));
        entries.push(one, "B", EntryKind::Credit, cents(100));
        assert!(entries.balanced());
        // the totals match, each transfer does not
        entries.push(two, "A", EntryKind::Debit, cents(50));
        entries.push(one, "B", EntryKind::Credit, cents(50));
        entries.push(two, "B", EntryKind::Credit, cents(1));
        entries.push(one, "A", EntryKind::Debit, cents(1));
        assert!(!entries.balanced());
    }

    #[test]
    #[should_panic(expected = "an entry of 0 cents")]
    fn an_entry_of_nothing_is_a_bug() {
        Entries::default().push(Uuid::new_v4(), "A", EntryKind::Debit, Cents::ZERO);
    }
}
