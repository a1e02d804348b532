//! Setup shared by the ledger's tests and the system tests (`crates/pagamentos/tests`):
//! accounts opened and transfers settled through [`crate::store`], as the service does, without
//! Kafka. Every helper panics on failure: a test's setup that fails is the test failing.

use sqlx::PgPool;
use uuid::Uuid;

use contracts::{AccountId, Amount, Cents, Currency};

use crate::settlement::Transfer;
use crate::store::{self, AccountRow, OutcomeTopics, Request, Settlement};

/// A well-formed account id.
pub fn account(id: &str) -> AccountId {
    AccountId::parse(id).unwrap_or_else(|invalid| panic!("{invalid}"))
}

/// An active currency.
pub fn currency(code: &str) -> Currency {
    Currency::parse(code).unwrap_or_else(|invalid| panic!("{invalid}"))
}

/// Opens account `id` in `currency` with `opening_cents` (from the issuer).
pub async fn open_account(pool: &PgPool, id: &str, currency_code: &str, opening_cents: i64) -> AccountRow {
    store::create_account(pool, &account(id), &currency(currency_code), Cents::new(opening_cents))
        .await
        .unwrap_or_else(|error| panic!("open account {id}: {error}"))
}

/// A transfer of `amount_cents` (> 0) from `source` to `destination` in `currency`.
pub fn transfer(
    transfer_id: Uuid,
    source: &str,
    destination: &str,
    amount_cents: i64,
    currency_code: &str,
) -> Transfer {
    Transfer {
        transfer_id,
        source: account(source),
        destination: account(destination),
        amount_cents: Amount::new(amount_cents).unwrap_or_else(|refused| panic!("{refused}")),
        currency: currency(currency_code),
    }
}

/// Settles `transfers` in one transaction, as one batch of the settler (no trace context).
pub async fn settle(pool: &PgPool, transfers: &[Transfer], topics: &OutcomeTopics) -> Settlement {
    let requests: Vec<Request> = transfers
        .iter()
        .map(|transfer| Request { transfer: transfer.clone(), traceparent: None, tracestate: None })
        .collect();
    store::settle(pool, &requests, topics).await.unwrap_or_else(|error| panic!("settle: {error}"))
}
