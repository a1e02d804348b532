//! The `ledger` database: batched settlement, accounts, deposits, entries.
//!
//! Every write that moves money locks the accounts it touches in one statement,
//! `ORDER BY id FOR UPDATE` (byte order, `COLLATE "C"`), so two transactions never wait on each
//! other in a cycle. Every movement is a double entry: one `D` and one `C` row in `lancamento`
//! with the same `transferencia_id` (a transfer's id, or a deposit's `depositoId`).
//!
//! # Layout
//! - `settle`: batched, idempotent settlement and its outcome events.
//! - `accounts`: accounts and deposits (a deposit is a double entry from the issuer).
//! - `reads`: an account, its entries, a transfer's stored outcome.
//!
//! What they share is here: getting a transaction or a connection, locking accounts, writing
//! entries.

mod accounts;
mod reads;
mod settle;

use std::collections::HashMap;

use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use contracts::{AccountId, Amount, Cents, Currency, EntryKind};

use crate::error::StoreError;
use crate::settlement::Account;

pub use accounts::{
    create_account, deposit, AccountRow, CreateAccountError, Deposit, DepositError, DepositMade,
};
pub use reads::{entries, find_account, outcome, Entry};
pub(crate) use settle::outcome_event;
pub use settle::{settle, OutcomeTopics, Request, Settlement};

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
    #[sqlx(try_from = "String")]
    id: AccountId,
    /// Parsed by [`lock_accounts`], so that a value that is no currency is
    /// [`StoreError::InvalidCurrency`] (a permanent failure of the record), not a decode error
    /// (which reads as the database being unavailable and would stop the settler).
    #[sqlx(rename = "moeda")]
    currency: String,
    #[sqlx(rename = "saldo_centavos", try_from = "database::columns::CentsColumn")]
    balance_cents: Cents,
    #[sqlx(rename = "emissor")]
    issuer: bool,
}

/// Locks `ids` (those that exist) in byte order and reads them.
async fn lock_accounts(
    connection: &mut PgConnection,
    ids: &[&AccountId],
) -> Result<HashMap<AccountId, Account>, StoreError> {
    let rows: Vec<LockedAccount> = sqlx::query_as(
        "SELECT id, moeda, saldo_centavos, emissor FROM conta WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    )
    .bind(ids.iter().map(|id| id.as_str()).collect::<Vec<_>>())
    .fetch_all(&mut *connection)
    .await?;
    rows.into_iter()
        .map(|row| {
            let currency = Currency::parse(row.currency)?;
            Ok((row.id, Account { currency, balance_cents: row.balance_cents, issuer: row.issuer }))
        })
        .collect()
}

/// `lancamento` rows to insert with one statement.
#[derive(Debug, Default)]
struct Entries {
    transfer_ids: Vec<Uuid>,
    accounts: Vec<AccountId>,
    kinds: Vec<EntryKind>,
    amounts: Vec<Amount>,
}

impl Entries {
    fn push(&mut self, transfer_id: Uuid, account: &AccountId, kind: EntryKind, amount_cents: Amount) {
        self.transfer_ids.push(transfer_id);
        self.accounts.push(account.clone());
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

    /// How many rows: the four columns are parallel vectors, and `UNNEST` would pad a shorter
    /// one with NULLs rather than refuse it, so unequal lengths are a bug stopped here.
    fn rows(&self) -> usize {
        let rows = self.transfer_ids.len();
        assert_eq!(self.accounts.len(), rows, "entry columns of unequal length");
        assert_eq!(self.kinds.len(), rows, "entry columns of unequal length");
        assert_eq!(self.amounts.len(), rows, "entry columns of unequal length");
        rows
    }

    async fn insert(&self, connection: &mut PgConnection, at: OffsetDateTime) -> Result<(), sqlx::Error> {
        if self.rows() == 0 {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO lancamento (transferencia_id, conta_id, tipo, valor_centavos, criado_em) \
             SELECT id, conta, tipo, valor, $5 FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::int8[]) \
             AS l(id, conta, tipo, valor)",
        )
        .bind(&self.transfer_ids)
        .bind(self.accounts.iter().map(AccountId::as_str).collect::<Vec<_>>())
        .bind(self.kinds.iter().map(EntryKind::as_str).collect::<Vec<_>>())
        .bind(self.amounts.iter().map(|amount| amount.get()).collect::<Vec<_>>())
        .bind(at)
        .execute(connection)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(id: &str) -> AccountId {
        AccountId::parse(id).expect("a well-formed account id")
    }

    #[test]
    fn entries_balance_per_transfer_not_only_in_total() {
        let (one, two) = (Uuid::new_v4(), Uuid::new_v4());
        let mut entries = Entries::default();
        let cents = |value| Amount::new(value).expect("positive");
        entries.push(one, &account("A"), EntryKind::Debit, cents(100));
        entries.push(one, &account("B"), EntryKind::Credit, cents(100));
        assert!(entries.balanced());
        // the totals match, each transfer does not
        entries.push(two, &account("A"), EntryKind::Debit, cents(50));
        entries.push(one, &account("B"), EntryKind::Credit, cents(50));
        entries.push(two, &account("B"), EntryKind::Credit, cents(1));
        entries.push(one, &account("A"), EntryKind::Debit, cents(1));
        assert!(!entries.balanced());
    }

    #[test]
    #[should_panic(expected = "entry columns of unequal length")]
    fn entry_columns_of_unequal_length_are_a_bug() {
        let mut entries = Entries::default();
        entries.push(Uuid::new_v4(), &account("A"), EntryKind::Debit, Amount::ONE_CENT);
        entries.kinds.push(EntryKind::Credit);
        entries.rows();
    }
}
