//! What `pagamentos verify` reads of the `transferencias` database for invariant 4
//! (`docs/reference/contract.md` §4). The ledger's side is `ledger::verify`; comparing the two is the binary's.
//! Every stream is in id order, so the binary merges it with the ledger's in flat memory.

use std::time::Duration;

use futures::Stream;
use sqlx::PgPool;
use uuid::Uuid;

use contracts::Cents;

/// The ids of every transfer `LIQUIDADA` here, in id order.
pub fn settled_ids(pool: &PgPool) -> impl Stream<Item = Result<Uuid, sqlx::Error>> + '_ {
    sqlx::query_scalar::<_, Uuid>("SELECT id FROM transferencia WHERE status = 'LIQUIDADA' ORDER BY id")
        .fetch(pool)
}

/// A transfer's status, `None` when there is no such transfer.
pub async fn status(pool: &PgPool, id: Uuid) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT status FROM transferencia WHERE id = $1").bind(id).fetch_optional(pool).await
}

/// How many transfers are still `PENDENTE` more than `bound` after they were accepted, and the
/// oldest `limit` of them with their age in seconds, oldest first.
pub async fn pending_older_than(
    pool: &PgPool,
    bound: Duration,
    limit: i64,
) -> Result<(i64, Vec<(Uuid, i64)>), sqlx::Error> {
    const WHERE: &str = "WHERE status = 'PENDENTE' AND criada_em < now() - make_interval(secs => $1)";
    let seconds = bound.as_secs_f64();
    let total: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM transferencia {WHERE}"))
        .bind(seconds)
        .fetch_one(pool)
        .await?;
    let listed: Vec<(Uuid, i64)> = sqlx::query_as(&format!(
        "SELECT id, extract(epoch FROM now() - criada_em)::bigint FROM transferencia {WHERE} \
         ORDER BY criada_em LIMIT $2"
    ))
    .bind(seconds)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok((total, listed))
}

/// A transfer as `transferencia` has it. Accounts, currency, status and reason stay the
/// database's raw text: `verify` compares them with the ledger's and reports a corrupted value
/// as a difference, where parsing them would refuse the row and stop the whole check. The
/// amount is [`Cents`]: any `BIGINT` is one.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TransferRow {
    pub id: Uuid,
    #[sqlx(rename = "conta_origem")]
    pub source_account: String,
    #[sqlx(rename = "conta_destino")]
    pub destination_account: String,
    #[sqlx(rename = "valor_centavos", try_from = "database::columns::CentsColumn")]
    pub amount_cents: Cents,
    #[sqlx(rename = "moeda")]
    pub currency: String,
    pub status: String,
    #[sqlx(rename = "motivo_rejeicao")]
    pub rejection_reason: Option<String>,
}

/// Every transfer, in id order.
pub fn transfers(pool: &PgPool) -> impl Stream<Item = Result<TransferRow, sqlx::Error>> + '_ {
    sqlx::query_as::<_, TransferRow>(
        "SELECT id, conta_origem, conta_destino, valor_centavos, moeda::text AS moeda, status, motivo_rejeicao \
         FROM transferencia ORDER BY id",
    )
    .fetch(pool)
}
