//! `ledger::verify` against books broken by hand: each break is reported by exactly the checks
//! it violates, naming the transfer, account or currency.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::PgPool;
use uuid::Uuid;

use ledger::store::{self, OutcomeTopics};
use ledger::testing;
use testkit::TestDatabase;

/// A ledger with A (BRL 1 000), B (BRL 0), U (USD 500), transfer `settled` A → B 300 and
/// transfer `rejected` A → B 5 000 (short of funds).
struct Books {
    database: TestDatabase,
    settled: Uuid,
    rejected: Uuid,
}

async fn books() -> Books {
    testkit::init_logs();
    let database = TestDatabase::create(&ledger::MIGRATOR).await;
    let pool = &database.pool;
    for (id, currency, opening) in [("A", "BRL", 1_000), ("B", "BRL", 0), ("U", "USD", 500)] {
        testing::open_account(pool, id, currency, opening).await;
    }
    let (settled, rejected) = (Uuid::new_v4(), Uuid::new_v4());
    let topics = OutcomeTopics { settled: "liquidada".into(), rejected: "rejeitada".into() };
    let transfers = [
        testing::transfer(settled, "A", "B", 300, "BRL"),
        testing::transfer(rejected, "A", "B", 5_000, "BRL"),
    ];
    testing::settle(pool, &transfers, &topics).await;
    assert_eq!(
        store::outcome(pool, rejected).await.expect("outcome").expect("decided").result(),
        "REJEITADA"
    );
    let books = Books { database, settled, rejected };
    assert!(broken(books.pool()).await.is_empty(), "the books start clean");
    books
}

impl Books {
    fn pool(&self) -> &PgPool {
        &self.database.pool
    }

    async fn execute(&self, sql: &str) {
        sqlx::raw_sql(sql).execute(self.pool()).await.expect(sql);
    }

    /// A `D` entry in `debited` and a `C` entry in `credited` for `transfer`, by hand.
    async fn add_entries(&self, transfer: &str, debited: &str, credited: &str, cents: i64) {
        sqlx::query(
            "INSERT INTO lancamento (transferencia_id, conta_id, tipo, valor_centavos) \
             VALUES ($1::uuid, $2, 'D', $4), ($1::uuid, $3, 'C', $4)",
        )
        .bind(transfer)
        .bind(debited)
        .bind(credited)
        .bind(cents)
        .execute(self.pool())
        .await
        .expect("entries");
    }
}

/// Broken check → its listed subjects.
async fn broken(pool: &PgPool) -> BTreeMap<&'static str, BTreeSet<String>> {
    ledger::verify::ledger_invariants(pool)
        .await
        .expect("verify")
        .into_iter()
        .filter(|result| !result.is_clean())
        .map(|result| (result.check, result.breaks.into_iter().map(|b| b.subject).collect()))
        .collect()
}

fn expected(checks: &[(&'static str, &[&str])]) -> BTreeMap<&'static str, BTreeSet<String>> {
    checks
        .iter()
        .map(|(check, subjects)| (*check, subjects.iter().map(|s| (*s).to_owned()).collect()))
        .collect()
}

#[tokio::test]
async fn a_lost_entry_is_unbalanced_unsettled_and_unexplained_balance() {
    let books = books().await;
    let t = books.settled.to_string();
    books.execute(&format!("DELETE FROM lancamento WHERE transferencia_id = '{t}' AND tipo = 'C'")).await;
    assert_eq!(
        broken(books.pool()).await,
        expected(&[
            ("debits-equal-credits", &[&t]),
            ("settled-once", &[&t]),
            ("balance-equals-entries", &["B"]),
        ])
    );
}

#[tokio::test]
async fn a_balance_changed_by_hand_breaks_invariants_2_and_3() {
    let books = books().await;
    books.execute("UPDATE conta SET saldo_centavos = saldo_centavos + 1 WHERE id = 'B'").await;
    assert_eq!(
        broken(books.pool()).await,
        expected(&[("balance-equals-entries", &["B"]), ("currency-sums-to-zero", &["BRL"])])
    );
}

#[tokio::test]
async fn a_transfer_settled_twice_is_named() {
    let books = books().await;
    let t = books.settled.to_string();
    books.add_entries(&t, "A", "B", 300).await;
    assert_eq!(
        broken(books.pool()).await,
        expected(&[("settled-once", &[&t]), ("balance-equals-entries", &["A", "B"])])
    );
}

#[tokio::test]
async fn money_without_entries_or_below_zero_is_found() {
    let books = books().await;
    books.execute("INSERT INTO conta (id, saldo_centavos, moeda) VALUES ('X', 50, 'BRL')").await;
    assert_eq!(
        broken(books.pool()).await,
        expected(&[("balance-equals-entries", &["X"]), ("currency-sums-to-zero", &["BRL"])])
    );

    let books = self::books().await;
    books.execute("ALTER TABLE conta DROP CONSTRAINT conta_saldo_centavos_check").await;
    books.execute("UPDATE conta SET saldo_centavos = -5 WHERE id = 'B'").await;
    assert_eq!(
        broken(books.pool()).await,
        expected(&[
            ("balance-equals-entries", &["B"]),
            ("not-negative", &["B"]),
            ("currency-sums-to-zero", &["BRL"]),
        ])
    );
}

#[tokio::test]
async fn entries_of_a_rejected_or_unknown_transfer_are_found() {
    let books = books().await;
    let t = books.rejected.to_string();
    books.add_entries(&t, "A", "B", 10).await;
    assert_eq!(
        broken(books.pool()).await,
        expected(&[
            ("rejected-without-entries", &[&t]),
            ("entries-explained", &[&t]),
            ("balance-equals-entries", &["A", "B"]),
        ])
    );

    let books = self::books().await;
    let unknown = Uuid::new_v4().to_string();
    books.add_entries(&unknown, "A", "U", 10).await;
    assert_eq!(
        broken(books.pool()).await,
        expected(&[
            ("entries-explained", &[&unknown]),
            ("one-currency", &[&unknown]),
            ("balance-equals-entries", &["A", "U"]),
        ])
    );
}

#[tokio::test]
async fn twenty_breaks_are_listed_and_all_are_counted() {
    let books = books().await;
    books
        .execute(
            "INSERT INTO conta (id, saldo_centavos, moeda) \
             SELECT format('X%s', lpad(n::text, 2, '0')), 1, 'BRL' FROM generate_series(1, 25) AS n",
        )
        .await;
    let results = ledger::verify::ledger_invariants(books.pool()).await.expect("verify");
    let balances = results.iter().find(|result| result.check == "balance-equals-entries").expect("check");
    assert_eq!(balances.total, 25);
    assert_eq!(balances.breaks.len(), ledger::verify::LISTED as usize);
    assert_eq!(balances.breaks[0].subject, "X01", "listed in id order");
    assert_eq!(balances.breaks[0].detail, "saldo_centavos 1, entries say 0");
}
