//! `pagamentos verify`, the binary: exit 0 on clean books, 1 naming what broke (invariant 4
//! in both directions, `--scope ledger` leaving it out; invariant 5, money minted by a deposit
//! that debits anything but its currency's issuer, or by an issuer flag on another account), a
//! clear error when a database is unreachable.

use std::process::Output;

use uuid::Uuid;

use ledger::store::OutcomeTopics;
use ledger::testing;
use testkit::TestDatabase;

struct Books {
    ledger: TestDatabase,
    transfers: TestDatabase,
}

/// Transfers database with one settled and one rejected transfer; the ledger agreeing.
async fn books() -> (Books, Uuid) {
    testkit::init_logs();
    let books = Books {
        ledger: TestDatabase::create(&ledger::MIGRATOR).await,
        transfers: TestDatabase::create(&transfers::MIGRATOR).await,
    };
    testing::open_account(&books.ledger.pool, "A", "BRL", 1_000).await;
    testing::open_account(&books.ledger.pool, "B", "BRL", 0).await;
    let (settled, rejected) = (Uuid::new_v4(), Uuid::new_v4());
    books.settle(&[(settled, 300), (rejected, 5_000)]).await;
    books.transfer(settled, "LIQUIDADA").await;
    books.transfer_as(rejected, "REJEITADA", 5_000, Some("SALDO_INSUFICIENTE")).await;
    // blocked by antifraude: decided before the ledger, which never hears of it (no break)
    books.transfer_as(Uuid::new_v4(), "REJEITADA", 900_000, Some("BLOQUEADA_ANTIFRAUDE")).await;
    (books, settled)
}

impl Books {
    async fn settle(&self, transfers: &[(Uuid, i64)]) {
        let transfers: Vec<_> = transfers
            .iter()
            .map(|(transfer_id, amount_cents)| {
                testing::transfer(*transfer_id, "A", "B", *amount_cents, "BRL")
            })
            .collect();
        let topics = OutcomeTopics { settled: "liquidada".into(), rejected: "rejeitada".into() };
        testing::settle(&self.ledger.pool, &transfers, &topics).await;
    }

    async fn transfer(&self, id: Uuid, status: &str) {
        self.transfer_as(id, status, 300, None).await;
    }

    async fn transfer_as(&self, id: Uuid, status: &str, amount_cents: i64, reason: Option<&str>) {
        sqlx::query(
            "INSERT INTO transferencia (id, conta_origem, conta_destino, valor_centavos, moeda, status, motivo_rejeicao) \
             VALUES ($1, 'A', 'B', $3, 'BRL', $2, $4)",
        )
        .bind(id)
        .bind(status)
        .bind(amount_cents)
        .bind(reason)
        .execute(&self.transfers.pool)
        .await
        .expect("transfer");
    }

    async fn verify(&self, args: &[&str]) -> Output {
        verify_with(&self.ledger.url, &self.transfers.url, args).await
    }
}

async fn verify_with(ledger_url: &str, transfers_url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_pagamentos"))
        .arg("verify")
        .args(args)
        .env("LEDGER_DATABASE_URL", ledger_url)
        .env("TRANSFERENCIAS_DATABASE_URL", transfers_url)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run pagamentos verify")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn clean_books_exit_0() {
    let (books, _) = books().await;
    let output = books.verify(&[]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{report}");
    assert_eq!(report.lines().last(), Some("verify: clean (14 checks)"), "{report}");
    assert!(!report.contains("BROKEN"));
}

#[tokio::test]
async fn a_transfer_settled_on_one_side_only_is_named_either_way() {
    let (books, _) = books().await;
    // LIQUIDADA in transferencias, never settled by the ledger
    let only_transfers = Uuid::new_v4();
    books.transfer(only_transfers, "LIQUIDADA").await;
    let output = books.verify(&[]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains("BROKEN invariant 4 settled-in-both"), "{report}");
    assert!(report.contains(&only_transfers.to_string()), "{report}");
    assert_eq!(report.lines().last(), Some("verify: 1 breaks in 1 of 14 checks"), "{report}");

    // --scope ledger leaves invariant 4 (and the transfers database) out
    let output =
        verify_with(&books.ledger.url, "postgres://nobody@127.0.0.1:1/none", &["--scope", "ledger"]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{report}");
    assert_eq!(report.lines().last(), Some("verify: clean (11 checks)"), "{report}");

    // settled by the ledger, still PENDENTE in transferencias
    let (books, _) = self::books().await;
    let only_ledger = Uuid::new_v4();
    books.settle(&[(only_ledger, 10)]).await;
    books.transfer(only_ledger, "PENDENTE").await;
    let output = books.verify(&[]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains(&only_ledger.to_string()), "{report}");
    assert!(report.contains("settled by the ledger, PENDENTE in transferencias"), "{report}");
}

#[tokio::test]
async fn a_decided_transfer_that_differs_between_the_databases_is_named_with_the_fields() {
    let (books, settled) = books().await;
    let output = books.verify(&[]).await;
    assert_eq!(output.status.code(), Some(0), "clean before the tamper: {}", stdout(&output));

    // one row tampered with in the transfers database: amount and destination of a settlement
    sqlx::query("UPDATE transferencia SET valor_centavos = 301, conta_destino = 'C' WHERE id = $1")
        .bind(settled)
        .execute(&books.transfers.pool)
        .await
        .expect("tamper");
    let output = books.verify(&[]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains("BROKEN invariant 4 decided-alike"), "{report}");
    assert!(
        report.contains(&format!(
            "{settled}: amount 301 in transferencias, 300 in the ledger; destination C in transferencias, \
             B in the ledger"
        )),
        "{report}"
    );
    assert_eq!(report.lines().last(), Some("verify: 1 breaks in 1 of 14 checks"), "{report}");

    // a rejection: the reason differs, and one rejected on the transfers side only
    let (books, _) = self::books().await;
    sqlx::query(
        "UPDATE transferencia SET motivo_rejeicao = 'BLOQUEADA_ANTIFRAUDE' WHERE status = 'REJEITADA'",
    )
    .execute(&books.transfers.pool)
    .await
    .expect("tamper");
    let unknown = Uuid::new_v4();
    books.transfer_as(unknown, "REJEITADA", 300, Some("CONTA_INEXISTENTE")).await;
    let output = books.verify(&[]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(
        report.contains(
            "outcome REJEITADA (BLOQUEADA_ANTIFRAUDE) in transferencias, REJEITADA (SALDO_INSUFICIENTE) in the ledger"
        ),
        "{report}"
    );
    assert!(
        report.contains(&format!(
            "{unknown}: REJEITADA (CONTA_INEXISTENTE) in transferencias, not decided by the ledger"
        )),
        "{report}"
    );
    assert_eq!(report.lines().last(), Some("verify: 2 breaks in 1 of 14 checks"), "{report}");

    // the ledger's side: its outcome row says settled where transferencias says rejected
    let (books, _) = self::books().await;
    sqlx::query(
        "UPDATE transferencia_processada SET resultado = 'LIQUIDADA', motivo = NULL WHERE motivo IS NOT NULL",
    )
    .execute(&books.ledger.pool)
    .await
    .expect("tamper");
    let output = books.verify(&[]).await;
    let report = stdout(&output);
    assert!(
        report.contains("outcome REJEITADA (SALDO_INSUFICIENTE) in transferencias, LIQUIDADA in the ledger"),
        "{report}"
    );
}

#[tokio::test]
async fn a_transfer_pending_past_the_bound_is_a_break_naming_what_the_ledger_knows() {
    let (books, _) = books().await;
    let (lost, unheard, recent) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    // accepted 10 minutes ago and never decided: its request event was lost somewhere
    books.transfer(lost, "PENDENTE").await;
    // settled by the ledger 10 minutes ago, the outcome event never projected
    books.settle(&[(unheard, 10)]).await;
    books.transfer(unheard, "PENDENTE").await;
    sqlx::query("UPDATE transferencia SET criada_em = now() - interval '10 minutes' WHERE id = ANY($1)")
        .bind(vec![lost, unheard])
        .execute(&books.transfers.pool)
        .await
        .expect("age them");
    // in flight: younger than the bound
    books.transfer(recent, "PENDENTE").await;

    let output = books.verify(&[]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains("BROKEN invariant 4 pending-too-long"), "{report}");
    let line = |id: Uuid| report.lines().find(|line| line.contains(&id.to_string())).map(str::to_owned);
    let lost_line = line(lost).expect("the lost transfer is named");
    assert!(
        lost_line.contains("PENDENTE for 6") && lost_line.contains("not decided by the ledger"),
        "{lost_line}"
    );
    assert!(
        report.contains(&format!("{unheard}: PENDENTE for 6"))
            && report.contains("LIQUIDADA in the ledger: its outcome event did not reach transferencias"),
        "{report}"
    );
    assert!(!report.contains(&format!("{recent}: PENDENTE")), "a transfer in flight is not stuck: {report}");

    // a longer bound: nothing is stuck (the settled one still breaks settled-in-both)
    let output = books.verify(&["--pending-older-than", "1h"]).await;
    let report = stdout(&output);
    assert!(report.contains("ok    invariant 4 pending-too-long"), "{report}");
    let refused = books.verify(&["--pending-older-than", "5 minutes"]).await;
    assert_eq!(refused.status.code(), Some(2), "a malformed bound is refused");
}

#[tokio::test]
async fn a_broken_balance_exits_1_naming_invariant_2() {
    let (books, _) = books().await;
    sqlx::query("UPDATE conta SET saldo_centavos = saldo_centavos + 7 WHERE id = 'B'")
        .execute(&books.ledger.pool)
        .await
        .expect("update");
    let output = books.verify(&["--scope", "ledger"]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains("BROKEN invariant 2 balance-equals-entries"), "{report}");
    assert!(report.contains("BROKEN invariant 3 currency-sums-to-zero"), "{report}");
}

/// Plants, as the owner, a deposit `id` of `cents` into `credited` debiting `debited`, with its
/// entries and both balances moved: every invariant but 5 stays whole.
async fn plant_deposit(pool: &sqlx::PgPool, id: Uuid, debited: &str, credited: &str, cents: i64) {
    let mut transaction = pool.begin().await.expect("begin");
    sqlx::query("INSERT INTO deposito (id, conta_id, valor_centavos) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(credited)
        .bind(cents)
        .execute(&mut *transaction)
        .await
        .expect("the deposit");
    sqlx::query(
        "INSERT INTO lancamento (transferencia_id, conta_id, tipo, valor_centavos) \
         VALUES ($1, $2, 'D', $4), ($1, $3, 'C', $4)",
    )
    .bind(id)
    .bind(debited)
    .bind(credited)
    .bind(cents)
    .execute(&mut *transaction)
    .await
    .expect("its entries");
    for (account, moved) in [(debited, -cents), (credited, cents)] {
        sqlx::query("UPDATE conta SET saldo_centavos = saldo_centavos + $2 WHERE id = $1")
            .bind(account)
            .bind(moved)
            .execute(&mut *transaction)
            .await
            .expect("a balance");
    }
    transaction.commit().await.expect("commit");
}

#[tokio::test]
async fn a_deposit_that_debits_a_customer_is_named_by_invariant_5() {
    let (books, _) = books().await;
    // A holds 700 after the settlement: a "deposit" of all of it into B, from A, not from the
    // issuer; every entry, balance and sum still agrees
    let deposit = Uuid::new_v4();
    plant_deposit(&books.ledger.pool, deposit, "A", "B", 700).await;
    let output = books.verify(&["--scope", "ledger"]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains("BROKEN invariant 5 deposit-from-issuer"), "{report}");
    assert!(
        report.contains(&format!(
            "{deposit}: deposit of 700 into B: D on A (700), C on B (700); money enters only from EMISSOR-BRL"
        )),
        "{report}"
    );
    assert_eq!(report.lines().last(), Some("verify: 1 breaks in 1 of 11 checks"), "{report}");
}

#[tokio::test]
async fn an_issuer_flag_on_another_account_is_named_by_invariant_5() {
    let (books, _) = books().await;
    let pool = &books.ledger.pool;
    // the schema refuses the flag on any account but EMISSOR-<moeda>, even to the owner
    let refused = sqlx::query("UPDATE conta SET emissor = true WHERE id = 'A'")
        .execute(pool)
        .await
        .expect_err("the check constraint refuses an issuer flag on A");
    assert!(refused.to_string().contains("conta_emissor_check"), "{refused}");
    // whoever may change the schema may drop the constraint: verify does not trust the flag
    sqlx::raw_sql(
        "ALTER TABLE conta DROP CONSTRAINT IF EXISTS conta_emissor_check; \
         UPDATE conta SET emissor = true WHERE id = 'A'",
    )
    .execute(pool)
    .await
    .expect("as the owner, without the constraint");
    let output = books.verify(&["--scope", "ledger"]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains("BROKEN invariant 5 issuer-flag"), "{report}");
    assert!(report.contains("A: flagged emissor, but only EMISSOR-BRL is the issuer of BRL"), "{report}");
    assert_eq!(report.lines().last(), Some("verify: 1 breaks in 1 of 11 checks"), "{report}");

    // and the money it then mints: A, "an issuer", debited below 0 for a deposit into B
    let deposit = Uuid::new_v4();
    plant_deposit(pool, deposit, "A", "B", 5_000).await;
    let output = books.verify(&["--scope", "ledger"]).await;
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains("BROKEN invariant 2 not-negative"), "{report}");
    assert!(report.contains("A: saldo_centavos -4300"), "{report}");
    assert!(report.contains("BROKEN invariant 5 deposit-from-issuer"), "{report}");
    assert!(report.contains(&format!("{deposit}: deposit of 5000 into B: D on A (5000)")), "{report}");
    assert!(report.contains("BROKEN invariant 5 issuer-flag"), "{report}");
    assert_eq!(report.lines().last(), Some("verify: 3 breaks in 3 of 11 checks"), "{report}");
}

#[tokio::test]
async fn an_unreachable_database_is_a_clear_error() {
    let output =
        verify_with("postgres://pagamentos:secret@127.0.0.1:1/ledger", "postgres://x@127.0.0.1:1/t", &[])
            .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("127.0.0.1:1"), "names the address: {stderr}");
    assert!(!stderr.contains("secret"), "never the password: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
