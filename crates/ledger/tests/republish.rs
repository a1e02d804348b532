//! `ledger::republish::outcome` on a database of its own (no Kafka): what it sends again and
//! what it refuses. The whole path through the relay and the projection is tested with the
//! system in `crates/pagamentos/tests/republish.rs`.

use contracts::ids::{derived_event_id, REJECTED_BY_LEDGER_PREFIX, SETTLED_PREFIX};
use contracts::RejectionReason;
use ledger::republish::{outcome, ReemitError, Reemitted};
use ledger::settlement::{Outcome, Transfer};
use ledger::store::{self, OutcomeTopics};
use ledger::testing;
use serde_json::Value;
use sqlx::PgPool;
use testkit::TestDatabase;
use uuid::Uuid;

fn topics() -> OutcomeTopics {
    OutcomeTopics {
        settled: "t.transferencias.liquidada".into(),
        rejected: "t.transferencias.rejeitada".into(),
    }
}

fn transfer(source: &str, destination: &str, amount_cents: i64) -> Transfer {
    testing::transfer(Uuid::new_v4(), source, destination, amount_cents, "BRL")
}

async fn settle(pool: &PgPool, transfer: &Transfer) {
    testing::settle(pool, std::slice::from_ref(transfer), &topics()).await;
}

/// A database of its own with two BRL accounts: `source` holding 1 000, `destination` none.
async fn books(source: &str, destination: &str) -> TestDatabase {
    let database = TestDatabase::create(&ledger::MIGRATOR).await;
    testing::open_account(&database.pool, source, "BRL", 1_000).await;
    testing::open_account(&database.pool, destination, "BRL", 0).await;
    database
}

/// (payload, published) of the outbox row `id`, if any.
async fn outbox_row(pool: &PgPool, id: Uuid) -> Option<(Value, bool)> {
    let row: Option<(String, bool)> =
        sqlx::query_as("SELECT payload, publicado_em IS NOT NULL FROM outbox_evento WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await
            .expect("outbox row");
    row.map(|(payload, published)| (serde_json::from_str(&payload).expect("json"), published))
}

async fn mark_published(pool: &PgPool, id: Uuid) {
    sqlx::query("UPDATE outbox_evento SET publicado_em = now() WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .expect("mark");
}

#[tokio::test]
async fn the_outcome_sent_again_is_the_event_the_ledger_wrote_and_only_once_while_it_waits() {
    let database = books("RE-A", "RE-B").await;
    let pool = &database.pool;
    let settled = transfer("RE-A", "RE-B", 300);
    let rejected = transfer("RE-B", "RE-A", 5_000);
    settle(pool, &settled).await;
    settle(pool, &rejected).await;
    let settled_event = derived_event_id(SETTLED_PREFIX, settled.transfer_id);
    let rejected_event = derived_event_id(REJECTED_BY_LEDGER_PREFIX, rejected.transfer_id);
    let (original, _) = outbox_row(pool, settled_event).await.expect("written by settle");

    // still unpublished: nothing added
    assert_eq!(
        outcome(pool, &settled, &topics(), false).await.expect("outcome"),
        Reemitted::AlreadyWaiting { event_id: settled_event, outcome: Outcome::Settled }
    );

    // published and then deleted (the day-old cleanup): written again, byte for byte the same
    // event; published and still kept: replaced by an unpublished row of the same event
    mark_published(pool, settled_event).await;
    mark_published(pool, rejected_event).await;
    sqlx::query("DELETE FROM outbox_evento WHERE id = $1")
        .bind(settled_event)
        .execute(pool)
        .await
        .expect("clean");
    // a dry run writes nothing
    assert_eq!(
        outcome(pool, &settled, &topics(), true).await.expect("dry run"),
        Reemitted::Queued { event_id: settled_event, outcome: Outcome::Settled }
    );
    assert_eq!(outbox_row(pool, settled_event).await, None);
    assert_eq!(
        outcome(pool, &settled, &topics(), false).await.expect("outcome"),
        Reemitted::Queued { event_id: settled_event, outcome: Outcome::Settled }
    );
    assert_eq!(outbox_row(pool, settled_event).await, Some((original, false)));
    assert_eq!(
        outcome(pool, &rejected, &topics(), false).await.expect("outcome"),
        Reemitted::Queued {
            event_id: rejected_event,
            outcome: Outcome::Rejected(RejectionReason::InsufficientFunds)
        }
    );
    let (payload, published) = outbox_row(pool, rejected_event).await.expect("replaced");
    assert!(!published);
    assert_eq!(
        (payload["motivo"].as_str(), payload["contaOrigem"].as_str()),
        (Some("SALDO_INSUFICIENTE"), Some("RE-B"))
    );
    // no money moved
    assert_eq!(
        store::find_account(pool, &testing::account("RE-A"))
            .await
            .expect("read")
            .expect("account")
            .balance_cents
            .get(),
        700
    );
}

#[tokio::test]
async fn an_undecided_transfer_is_not_the_ledgers_and_disagreeing_entries_are_refused() {
    let database = books("RE-C", "RE-D").await;
    let pool = &database.pool;
    assert_eq!(
        outcome(pool, &transfer("RE-C", "RE-D", 1), &topics(), false).await.expect("outcome"),
        Reemitted::NotDecided
    );

    let settled = transfer("RE-C", "RE-D", 300);
    settle(pool, &settled).await;
    let event = derived_event_id(SETTLED_PREFIX, settled.transfer_id);
    mark_published(pool, event).await;
    // transferencias says 301 where the ledger moved 300: neither version is sent
    let claimed = Transfer { amount_cents: contracts::Amount::constant(301), ..settled.clone() };
    let error = outcome(pool, &claimed, &topics(), false).await.expect_err("disagrees");
    assert!(matches!(error, ReemitError::Disagrees { .. }), "{error}");
    assert!(error.to_string().contains("D RE-C 300 BRL, C RE-D 300 BRL"), "{error}");
    assert!(error.to_string().contains("D RE-C 301 BRL, C RE-D 301 BRL"), "{error}");
    assert_eq!(outbox_row(pool, event).await.map(|(_, published)| published), Some(true), "left alone");
    let swapped =
        Transfer { source: testing::account("RE-D"), destination: testing::account("RE-C"), ..settled };
    assert!(matches!(
        outcome(pool, &swapped, &topics(), false).await.expect_err("disagrees"),
        ReemitError::Disagrees { .. }
    ));
}
