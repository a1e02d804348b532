//! Accounts and deposits: an opening balance or a deposit is a double entry from the
//! currency's issuer account, idempotent on the deposit's id.

use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use contracts::{AccountId, Amount, Cents, Currency, EntryKind, Timestamp};

use super::{begin, connection, lock_accounts, Entries};
use crate::error::StoreError;

/// A customer account as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AccountRow {
    #[sqlx(try_from = "String")]
    pub id: AccountId,
    #[sqlx(rename = "moeda", try_from = "String")]
    pub currency: Currency,
    #[sqlx(rename = "saldo_centavos", try_from = "database::columns::CentsColumn")]
    pub balance_cents: Cents,
}

/// Why an account was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateAccountError {
    #[error("account {0} already exists")]
    Exists(AccountId),
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
    id: &AccountId,
    currency: &Currency,
    opening_cents: Cents,
) -> Result<AccountRow, CreateAccountError> {
    let mut transaction = begin(pool).await?;
    let created = sqlx::query(
        "INSERT INTO conta (id, saldo_centavos, moeda) VALUES ($1, 0, $2) ON CONFLICT (id) DO NOTHING",
    )
    .bind(id.as_str())
    .bind(currency.as_str())
    .execute(&mut *transaction)
    .await?;
    if created.rows_affected() == 0 {
        return Err(CreateAccountError::Exists(id.clone()));
    }
    // an opening balance of 0 moves nothing; a negative one is refused by the API's parser
    assert!(opening_cents >= Cents::ZERO, "an opening balance of {opening_cents} cents");
    if let Ok(opening) = Amount::new(opening_cents.get()) {
        let deposit_id = contracts::ids::opening_deposit_id(id.as_str());
        move_from_issuer(&mut transaction, deposit_id, id, currency, opening).await?;
    }
    transaction.commit().await?;
    Ok(AccountRow { id: id.clone(), currency: currency.clone(), balance_cents: opening_cents })
}

/// A stored deposit.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Deposit {
    pub id: Uuid,
    #[sqlx(rename = "conta_id", try_from = "String")]
    pub account: AccountId,
    #[sqlx(rename = "valor_centavos", try_from = "i64")]
    pub amount_cents: Amount,
    #[sqlx(rename = "criado_em", try_from = "OffsetDateTime")]
    pub created_at: Timestamp,
}

/// Why a deposit was not made.
#[derive(Debug, thiserror::Error)]
pub enum DepositError {
    #[error("no account {0}")]
    NoAccount(AccountId),
    #[error("deposit {id} was already made with another account or amount")]
    IdReused { id: Uuid, original: Deposit },
    #[error("the deposit would take the balance of {0} past the largest amount")]
    Overflow(AccountId),
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
    account: &AccountId,
    amount_cents: Amount,
) -> Result<DepositMade, DepositError> {
    let mut transaction = begin(pool).await?;
    let currency: Option<String> =
        sqlx::query_scalar("SELECT moeda FROM conta WHERE id = $1 AND NOT emissor")
            .bind(account.as_str())
            .fetch_optional(&mut *transaction)
            .await?;
    let Some(currency) = currency else { return Err(DepositError::NoAccount(account.clone())) };
    // what `conta.moeda` holds was checked when the account was created
    let currency = Currency::parse(currency).map_err(StoreError::from)?;
    if let Some(original) = find_deposit(&mut transaction, deposit_id).await? {
        return if original.account == *account && original.amount_cents == amount_cents {
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
                .ok_or_else(|| DepositError::NoAccount(account.clone()))?;
            if original.account == *account && original.amount_cents == amount_cents {
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
    account: &AccountId,
    currency: &Currency,
    amount_cents: Amount,
) -> Result<Deposit, DepositError> {
    let issuer = AccountId::issuer(currency);
    sqlx::query(
        "INSERT INTO conta (id, saldo_centavos, moeda, emissor) VALUES ($1, 0, $2, true) ON CONFLICT (id) DO NOTHING",
    )
    .bind(issuer.as_str())
    .bind(currency.as_str())
    .execute(&mut *connection)
    .await?;
    let ids = {
        let mut ids = vec![&issuer, account];
        ids.sort_unstable();
        ids
    };
    let accounts = lock_accounts(connection, &ids).await?;
    let balance = |id: &AccountId| accounts.get(id).map_or(Cents::ZERO, |account| account.balance_cents);
    let debited = balance(&issuer)
        .checked_sub(amount_cents.cents())
        .ok_or_else(|| DepositError::Overflow(issuer.clone()))?;
    let credited = balance(account)
        .checked_add(amount_cents.cents())
        .ok_or_else(|| DepositError::Overflow(account.clone()))?;
    let at = Timestamp::now();
    sqlx::query("INSERT INTO deposito (id, conta_id, valor_centavos, criado_em) VALUES ($1, $2, $3, $4)")
        .bind(deposit_id)
        .bind(account.as_str())
        .bind(amount_cents.get())
        .bind(at.as_offset_date_time())
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "UPDATE conta SET saldo_centavos = novo.saldo \
         FROM UNNEST($1::text[], $2::int8[]) AS novo(id, saldo) WHERE conta.id = novo.id",
    )
    .bind([issuer.as_str(), account.as_str()])
    .bind([debited.get(), credited.get()])
    .execute(&mut *connection)
    .await?;
    let mut entries = Entries::default();
    entries.push(deposit_id, &issuer, EntryKind::Debit, amount_cents);
    entries.push(deposit_id, account, EntryKind::Credit, amount_cents);
    entries.insert(connection, at.as_offset_date_time()).await?;
    Ok(Deposit { id: deposit_id, account: account.clone(), amount_cents, created_at: at })
}
