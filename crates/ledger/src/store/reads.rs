//! Reads for the accounts API and `pagamentos verify`: an account, its entries, a transfer's
//! stored outcome.

use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use contracts::Timestamp;

use super::{connection, AccountRow};
use crate::error::StoreError;

/// Account `id` (issuer accounts included), if it exists.
pub async fn find_account(pool: &PgPool, id: &str) -> Result<Option<AccountRow>, StoreError> {
    let mut connection = connection(pool).await?;
    let row = sqlx::query("SELECT id, moeda, saldo_centavos FROM conta WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?;
    let account = row
        .map(|row| {
            Ok::<_, sqlx::Error>(AccountRow {
                id: row.try_get("id")?,
                currency: row.try_get::<String, _>("moeda")?,
                balance_cents: row.try_get("saldo_centavos")?,
            })
        })
        .transpose()?;
    Ok(account)
}

/// One `lancamento` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: i64,
    pub transfer_id: Uuid,
    pub kind: String,
    pub amount_cents: i64,
    pub created_at: Timestamp,
}

/// The newest `limit` entries of `account`, newest first.
pub async fn entries(pool: &PgPool, account: &str, limit: i64) -> Result<Vec<Entry>, StoreError> {
    let mut connection = connection(pool).await?;
    let rows = sqlx::query(
        "SELECT id, transferencia_id, tipo, valor_centavos, criado_em FROM lancamento \
         WHERE conta_id = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(account)
    .bind(limit)
    .fetch_all(&mut *connection)
    .await?;
    let entries = rows
        .into_iter()
        .map(|row| {
            Ok(Entry {
                id: row.try_get("id")?,
                transfer_id: row.try_get("transferencia_id")?,
                kind: row.try_get::<String, _>("tipo")?,
                amount_cents: row.try_get("valor_centavos")?,
                created_at: row.try_get::<OffsetDateTime, _>("criado_em")?.into(),
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(entries)
}

/// The stored outcome of `transfer_id`, if decided: (`resultado`, `motivo`).
pub async fn outcome(
    pool: &PgPool,
    transfer_id: Uuid,
) -> Result<Option<(String, Option<String>)>, StoreError> {
    let mut connection = connection(pool).await?;
    let row =
        sqlx::query_as("SELECT resultado, motivo FROM transferencia_processada WHERE transferencia_id = $1")
            .bind(transfer_id)
            .fetch_optional(&mut *connection)
            .await?;
    Ok(row)
}
