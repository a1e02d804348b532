//! The ledger's invariants (`docs/reference/contract.md` §4, 1–3 and 5), each one set-based query over the
//! whole database: a sequential scan and a hash aggregate, fast on millions of rows, no per-row
//! round trips. Invariant 4 needs the transfers database too and is checked by `pagamentos
//! verify`.
//!
//! Invariant 5 (money enters only from issuers) does not trust the `emissor` flag: an issuer
//! is `EMISSOR-<moeda>` by its id, every deposit must debit exactly that account, and a flag
//! on any other account is a break of its own (the schema's check constraint forbids one, but
//! whoever may change the schema may drop it). `not-negative` likewise lets only a real issuer
//! go below 0.
//!
//! Every check reports at most [`LISTED`] breaks by name, and how many there are in all.

use sqlx::{PgPool, Row};

use contracts::Cents;

/// Breaks named per check; the rest are counted.
pub const LISTED: i64 = 20;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Break {
    /// 1 to 5, as numbered in the contract.
    pub invariant: u8,
    /// Which rule of the invariant (a short name, stable for scripts).
    pub check: &'static str,
    /// The transfer, account or currency that breaks it.
    pub subject: String,
    /// The numbers that show it.
    pub detail: String,
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub invariant: u8,
    pub check: &'static str,
    /// What the check asserts, for the report.
    pub rule: &'static str,
    /// Breaks in all (only the first [`LISTED`] are in `breaks`).
    pub total: i64,
    pub breaks: Vec<Break>,
}

impl CheckResult {
    pub fn is_clean(&self) -> bool {
        self.total == 0
    }
}

/// A check: its query yields `subject`, `detail` and `total` (`COUNT(*) OVER ()`), at most
/// [`LISTED`] rows (`$1`).
struct Check {
    invariant: u8,
    name: &'static str,
    rule: &'static str,
    sql: &'static str,
}

const CHECKS: &[Check] = &[
    Check {
        invariant: 1,
        name: "debits-equal-credits",
        rule: "per transfer or deposit, the sum of its D entries equals the sum of its C entries",
        sql: "SELECT transferencia_id::text AS subject, \
                     format('debits %s, credits %s', d, c) AS detail, COUNT(*) OVER () AS total \
              FROM (SELECT transferencia_id, \
                           COALESCE(SUM(valor_centavos) FILTER (WHERE tipo = 'D'), 0) AS d, \
                           COALESCE(SUM(valor_centavos) FILTER (WHERE tipo = 'C'), 0) AS c \
                    FROM lancamento GROUP BY transferencia_id) s \
              WHERE d <> c ORDER BY transferencia_id LIMIT $1",
    },
    Check {
        invariant: 1,
        name: "settled-once",
        rule: "a settled transfer has exactly one D and one C entry (no transfer settled twice)",
        sql: "SELECT p.transferencia_id::text AS subject, \
                     format('%s D and %s C entries', COALESCE(e.nd, 0), COALESCE(e.nc, 0)) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM transferencia_processada p \
              LEFT JOIN (SELECT transferencia_id, COUNT(*) FILTER (WHERE tipo = 'D') AS nd, \
                                COUNT(*) FILTER (WHERE tipo = 'C') AS nc \
                         FROM lancamento GROUP BY transferencia_id) e USING (transferencia_id) \
              WHERE p.resultado = 'LIQUIDADA' AND (e.nd IS DISTINCT FROM 1 OR e.nc IS DISTINCT FROM 1) \
              ORDER BY p.transferencia_id LIMIT $1",
    },
    Check {
        invariant: 1,
        name: "rejected-without-entries",
        rule: "a rejected transfer moved no money",
        sql: "SELECT p.transferencia_id::text AS subject, \
                     format('REJEITADA (%s) but has %s entries', p.motivo, COUNT(*)) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM transferencia_processada p JOIN lancamento l USING (transferencia_id) \
              WHERE p.resultado <> 'LIQUIDADA' GROUP BY p.transferencia_id, p.motivo \
              ORDER BY p.transferencia_id LIMIT $1",
    },
    Check {
        invariant: 1,
        name: "deposit-entries",
        rule: "a deposit has exactly one D entry (its issuer) and one C entry (its account) of its amount",
        sql: "SELECT d.id::text AS subject, \
                     format('deposit of %s into %s has %s D and %s C entries', d.valor_centavos, d.conta_id, \
                            COUNT(*) FILTER (WHERE l.tipo = 'D'), COUNT(*) FILTER (WHERE l.tipo = 'C')) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM deposito d LEFT JOIN lancamento l ON l.transferencia_id = d.id \
              GROUP BY d.id, d.valor_centavos, d.conta_id \
              HAVING COUNT(*) FILTER (WHERE l.tipo = 'D' AND l.valor_centavos = d.valor_centavos) <> 1 \
                  OR COUNT(*) FILTER (WHERE l.tipo = 'C' AND l.valor_centavos = d.valor_centavos AND l.conta_id = d.conta_id) <> 1 \
                  OR COUNT(*) <> 2 \
              ORDER BY d.id LIMIT $1",
    },
    Check {
        invariant: 1,
        name: "entries-explained",
        rule: "every entry belongs to a decided transfer or a deposit",
        sql: "SELECT l.transferencia_id::text AS subject, \
                     format('%s entries with no settled transfer or deposit behind them', COUNT(*)) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM lancamento l \
              WHERE NOT EXISTS (SELECT 1 FROM transferencia_processada p \
                                WHERE p.transferencia_id = l.transferencia_id AND p.resultado = 'LIQUIDADA') \
                AND NOT EXISTS (SELECT 1 FROM deposito d WHERE d.id = l.transferencia_id) \
              GROUP BY l.transferencia_id ORDER BY l.transferencia_id LIMIT $1",
    },
    Check {
        invariant: 1,
        name: "one-currency",
        rule: "the entries of a transfer or deposit are all in accounts of one currency",
        sql: "SELECT l.transferencia_id::text AS subject, \
                     format('entries in %s', string_agg(DISTINCT c.moeda, ', ')) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM lancamento l JOIN conta c ON c.id = l.conta_id \
              GROUP BY l.transferencia_id HAVING COUNT(DISTINCT c.moeda) > 1 \
              ORDER BY l.transferencia_id LIMIT $1",
    },
    Check {
        invariant: 2,
        name: "balance-equals-entries",
        rule: "per account, saldo_centavos = sum of C entries - sum of D entries",
        sql: "SELECT c.id::text AS subject, \
                     format('saldo_centavos %s, entries say %s', c.saldo_centavos, COALESCE(e.net, 0)) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM conta c \
              LEFT JOIN (SELECT conta_id, \
                                SUM(CASE tipo WHEN 'C' THEN valor_centavos::numeric ELSE -valor_centavos::numeric END) AS net \
                         FROM lancamento GROUP BY conta_id) e ON e.conta_id = c.id \
              WHERE c.saldo_centavos::numeric <> COALESCE(e.net, 0) ORDER BY c.id LIMIT $1",
    },
    Check {
        invariant: 2,
        name: "not-negative",
        rule: "no account but an issuer's (EMISSOR-<moeda>) is below 0",
        sql: "SELECT id::text AS subject, format('saldo_centavos %s', saldo_centavos) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM conta \
              WHERE saldo_centavos < 0 AND NOT (emissor AND id = ('EMISSOR-' || moeda) COLLATE \"C\") \
              ORDER BY id LIMIT $1",
    },
    Check {
        invariant: 3,
        name: "currency-sums-to-zero",
        rule: "per currency, the balances of all accounts sum to 0",
        sql: "SELECT moeda::text AS subject, format('balances sum to %s', total_centavos) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM (SELECT moeda, SUM(saldo_centavos::numeric) AS total_centavos FROM conta GROUP BY moeda) s \
              WHERE total_centavos <> 0 ORDER BY moeda LIMIT $1",
    },
    Check {
        invariant: 5,
        name: "deposit-from-issuer",
        rule: "every deposit (opening balances included) is one D entry on its currency's EMISSOR-<moeda> \
               and one C entry on its account, both of its amount",
        sql: "SELECT d.id::text AS subject, \
                     format('deposit of %s into %s: D on %s, C on %s; money enters only from %s', \
                            d.valor_centavos, d.conta_id, \
                            COALESCE(string_agg(format('%s (%s)', l.conta_id, l.valor_centavos), ', ' \
                                                ORDER BY l.conta_id) FILTER (WHERE l.tipo = 'D'), 'nothing'), \
                            COALESCE(string_agg(format('%s (%s)', l.conta_id, l.valor_centavos), ', ' \
                                                ORDER BY l.conta_id) FILTER (WHERE l.tipo = 'C'), 'nothing'), \
                            'EMISSOR-' || c.moeda) AS detail, \
                     COUNT(*) OVER () AS total \
              FROM deposito d \
              LEFT JOIN conta c ON c.id = d.conta_id \
              LEFT JOIN lancamento l ON l.transferencia_id = d.id \
              GROUP BY d.id, d.valor_centavos, d.conta_id, c.moeda \
              HAVING COUNT(*) FILTER (WHERE l.tipo = 'D' AND l.valor_centavos = d.valor_centavos \
                                        AND l.conta_id = ('EMISSOR-' || c.moeda) COLLATE \"C\") <> 1 \
                  OR COUNT(*) FILTER (WHERE l.tipo = 'C' AND l.valor_centavos = d.valor_centavos \
                                        AND l.conta_id = d.conta_id) <> 1 \
                  OR COUNT(l.id) <> 2 \
              ORDER BY d.id LIMIT $1",
    },
    Check {
        invariant: 5,
        name: "issuer-flag",
        rule: "an account is flagged emissor if and only if its id is EMISSOR-<its moeda>",
        sql: "SELECT id::text AS subject, \
                     CASE WHEN emissor \
                          THEN format('flagged emissor, but only EMISSOR-%s is the issuer of %s', moeda, moeda) \
                          ELSE format('the issuer of %s, not flagged emissor', moeda) END AS detail, \
                     COUNT(*) OVER () AS total \
              FROM conta WHERE emissor IS DISTINCT FROM (id = ('EMISSOR-' || moeda) COLLATE \"C\") \
              ORDER BY id LIMIT $1",
    },
];

/// Runs the checks of invariants 1–3 and 5, in the contract's order, in one repeatable-read
/// snapshot (a settlement committing meanwhile cannot make a clean ledger look broken).
pub async fn ledger_invariants(pool: &PgPool) -> Result<Vec<CheckResult>, sqlx::Error> {
    let mut transaction = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *transaction)
        .await?;
    let mut results = Vec::with_capacity(CHECKS.len());
    for check in CHECKS {
        let rows = sqlx::query(check.sql).bind(LISTED).fetch_all(&mut *transaction).await?;
        let total = rows.first().map(|row| row.try_get::<i64, _>("total")).transpose()?.unwrap_or(0);
        let breaks = rows
            .iter()
            .map(|row| {
                Ok(Break {
                    invariant: check.invariant,
                    check: check.name,
                    subject: row.try_get("subject")?,
                    detail: row.try_get("detail")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        results.push(CheckResult {
            invariant: check.invariant,
            check: check.name,
            rule: check.rule,
            total,
            breaks,
        });
    }
    transaction.commit().await?;
    Ok(results)
}

/// The ids of the transfers the ledger settled, in id order, for invariant 4.
pub fn settled_transfer_ids(
    pool: &PgPool,
) -> impl futures::Stream<Item = Result<uuid::Uuid, sqlx::Error>> + '_ {
    sqlx::query_scalar("SELECT transferencia_id FROM transferencia_processada WHERE resultado = 'LIQUIDADA' ORDER BY transferencia_id")
        .fetch(pool)
}

/// What the ledger decided for one transfer, and what it moved: `source`, `destination`,
/// `amount_cents` and `currency` come from the settlement's `D` and `C` entries (the source
/// account's currency), so they are `None` for a rejection, which moves nothing and leaves
/// only its outcome. Like `transfers::verify::TransferRow`, the text stays raw so that a
/// corrupted value is reported as a difference rather than refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub transfer_id: uuid::Uuid,
    pub result: String,
    pub reason: Option<String>,
    pub source: Option<String>,
    pub destination: Option<String>,
    pub amount_cents: Option<Cents>,
    pub currency: Option<String>,
}

/// [`Decision`] as read (sqlx maps no `Option<i64>` to `Option<Cents>` by itself).
#[derive(sqlx::FromRow)]
struct DecisionRow {
    transfer_id: uuid::Uuid,
    result: String,
    reason: Option<String>,
    source: Option<String>,
    destination: Option<String>,
    amount_cents: Option<i64>,
    currency: Option<String>,
}

impl From<DecisionRow> for Decision {
    fn from(row: DecisionRow) -> Self {
        Self {
            transfer_id: row.transfer_id,
            result: row.result,
            reason: row.reason,
            source: row.source,
            destination: row.destination,
            amount_cents: row.amount_cents.map(Cents::new),
            currency: row.currency,
        }
    }
}

/// Every transfer the ledger decided, in id order, with its entries folded in (one scan of
/// `lancamento`, hash-joined), for invariant 4's field-by-field comparison.
pub fn decisions(pool: &PgPool) -> impl futures::Stream<Item = Result<Decision, sqlx::Error>> + '_ {
    use futures::TryStreamExt;
    sqlx::query_as::<_, DecisionRow>(
        "SELECT p.transferencia_id AS transfer_id, p.resultado AS result, p.motivo AS reason, \
                e.origem AS source, e.destino AS destination, e.valor AS amount_cents, \
                co.moeda::text AS currency \
         FROM transferencia_processada p \
         LEFT JOIN (SELECT transferencia_id, \
                           min(conta_id) FILTER (WHERE tipo = 'D') AS origem, \
                           min(conta_id) FILTER (WHERE tipo = 'C') AS destino, \
                           max(valor_centavos) FILTER (WHERE tipo = 'D') AS valor \
                    FROM lancamento GROUP BY transferencia_id) e USING (transferencia_id) \
         LEFT JOIN conta co ON co.id = e.origem \
         ORDER BY p.transferencia_id",
    )
    .fetch(pool)
    .map_ok(Decision::from)
}
