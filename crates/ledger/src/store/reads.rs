//! Reads for the accounts API and `pagamentos verify`: an account, its entries, a transfer's
//! stored outcome.

use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use contracts::{AccountId, Amount, EntryKind, Timestamp};

use super::{connection, AccountRow};
use crate::error::StoreError;
use crate::settlement::Outcome;

/// Account `id` (issuer accounts included), if it exists.
pub async fn find_account(pool: &PgPool, id: &AccountId) -> Result<Option<AccountRow>, StoreError> {
    let mut connection = connection(pool).await?;
    Ok(sqlx::query_as("SELECT id, moeda, saldo_centavos FROM conta WHERE id = $1")
        .bind(id.as_str())
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
    pub amount_cents: Amount,
    #[sqlx(rename = "criado_em", try_from = "OffsetDateTime")]
    pub created_at: Timestamp,
}

/// The newest `limit` entries of `account`, newest first.
pub async fn entries(pool: &PgPool, account: &AccountId, limit: i64) -> Result<Vec<Entry>, StoreError> {
    let mut connection = connection(pool).await?;
    Ok(sqlx::query_as(
        "SELECT id, transferencia_id, tipo, valor_centavos, criado_em FROM lancamento \
         WHERE conta_id = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(account.as_str())
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
