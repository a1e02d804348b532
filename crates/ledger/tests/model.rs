//! The ledger database against a model: random sequences of account openings, deposits (with
//! reused and replayed ids) and settlement batches (with duplicates inside a batch, transfers
//! delivered again with other contents, missing and issuer accounts, other currencies, amounts
//! beyond the balance) run through the real store on a database of their own, and through a
//! small in-memory model written here from the contract's rules, independently of the crate's
//! own `settlement::decide`. After every step the outcomes agree; at the end the balances, the
//! decisions, the entries and the invariants do.

use crate::common;

use std::collections::HashMap;

use proptest::prelude::*;
use uuid::Uuid;

use contracts::AccountId;

use ledger::settlement::{Outcome, Transfer};
use ledger::store::{self, CreateAccountError, DepositError, DepositMade, OutcomeTopics, Request};
use testkit::TestDatabase;

const CURRENCIES: [&str; 2] = ["BRL", "USD"];
/// Customer accounts the sequences may open.
const OPENABLE: usize = 5;

/// Index → account id: `CC-0`…`CC-4` may be opened, then the BRL issuer, then one never opened.
fn account_id(index: usize) -> AccountId {
    let id = match index {
        n if n < OPENABLE => format!("CC-{n}"),
        OPENABLE => "EMISSOR-BRL".to_owned(),
        _ => "CC-9".to_owned(),
    };
    AccountId::parse(id).expect("a well-formed account id")
}

fn amount(cents: i64) -> contracts::Amount {
    contracts::Amount::new(cents).expect("the strategies draw positive amounts")
}

fn transfer_id(index: usize) -> Uuid {
    Uuid::from_u128(0x7000 + index as u128)
}

fn deposit_id(index: usize) -> Uuid {
    Uuid::from_u128(0xd000 + index as u128)
}

#[derive(Debug, Clone)]
struct TransferStep {
    id: usize,
    source: usize,
    destination: usize,
    cents: i64,
    currency: usize,
}

#[derive(Debug, Clone)]
enum Step {
    Open { account: usize, currency: usize, opening_cents: i64 },
    Deposit { id: usize, account: usize, cents: i64 },
    Settle(Vec<TransferStep>),
}

fn transfer_step() -> impl Strategy<Value = TransferStep> {
    (0..12usize, 0..OPENABLE + 2, 0..OPENABLE + 2, 1..4_000i64, 0..4usize).prop_map(
        |(id, source, destination, cents, currency)| TransferStep {
            id,
            source,
            // the settler refuses a record with the same account on both sides before the store
            destination: if destination == source { (destination + 1) % (OPENABLE + 2) } else { destination },
            cents,
            // mostly BRL, so that most transfers get past the currency rule
            currency: usize::from(currency == 3),
        },
    )
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0..OPENABLE, 0..4usize, prop_oneof![Just(0i64), 1..5_000i64]).prop_map(
            |(account, currency, opening_cents)| Step::Open {
                account,
                currency: usize::from(currency == 3),
                opening_cents,
            }
        ),
        2 => (0..4usize, 0..OPENABLE + 2, 1..3_000i64)
            .prop_map(|(id, account, cents)| Step::Deposit { id, account, cents }),
        4 => prop::collection::vec(transfer_step(), 1..8).prop_map(Step::Settle),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ModelAccount {
    currency: String,
    balance_cents: i64,
}

/// The contract's rules over plain maps.
#[derive(Debug, Default)]
struct Model {
    accounts: HashMap<String, ModelAccount>,
    /// Issuer balance per currency (an issuer account exists once it has moved money).
    issuers: HashMap<String, i64>,
    deposits: HashMap<Uuid, (String, i64)>,
    /// Transfer id → (`resultado`, `motivo`).
    decided: HashMap<Uuid, (&'static str, Option<&'static str>)>,
}

#[derive(Debug, PartialEq, Eq)]
enum DepositResult {
    New,
    Replayed,
    NoAccount,
    IdReused,
}

impl Model {
    fn open(&mut self, id: &str, currency: &str, opening_cents: i64) -> bool {
        if self.accounts.contains_key(id) {
            return false;
        }
        self.accounts.insert(id.to_owned(), ModelAccount { currency: currency.to_owned(), balance_cents: 0 });
        if opening_cents > 0 {
            self.move_from_issuer(id, opening_cents);
        }
        true
    }

    fn move_from_issuer(&mut self, id: &str, cents: i64) {
        let account = self.accounts.get_mut(id).expect("open account");
        account.balance_cents += cents;
        *self.issuers.entry(account.currency.clone()).or_default() -= cents;
    }

    fn deposit(&mut self, id: Uuid, account: &str, cents: i64) -> DepositResult {
        if !self.accounts.contains_key(account) {
            return DepositResult::NoAccount;
        }
        match self.deposits.get(&id) {
            Some((original, amount)) if original == account && *amount == cents => DepositResult::Replayed,
            Some(_) => DepositResult::IdReused,
            None => {
                self.deposits.insert(id, (account.to_owned(), cents));
                self.move_from_issuer(account, cents);
                DepositResult::New
            }
        }
    }

    /// One batch: (newly decided in input order, already decided).
    #[allow(clippy::type_complexity)]
    fn settle(
        &mut self,
        transfers: &[Transfer],
    ) -> (Vec<(Uuid, &'static str, Option<&'static str>)>, Vec<Uuid>) {
        let mut decided = Vec::new();
        let mut already = Vec::new();
        for transfer in transfers {
            if self.decided.contains_key(&transfer.transfer_id) {
                already.push(transfer.transfer_id);
                continue;
            }
            let outcome = self.rule(transfer);
            if outcome.0 == "LIQUIDADA" {
                self.accounts.get_mut(transfer.source.as_str()).expect("source").balance_cents -=
                    transfer.amount_cents.get();
                self.accounts.get_mut(transfer.destination.as_str()).expect("destination").balance_cents +=
                    transfer.amount_cents.get();
            }
            self.decided.insert(transfer.transfer_id, outcome);
            decided.push((transfer.transfer_id, outcome.0, outcome.1));
        }
        (decided, already)
    }

    fn rule(&self, transfer: &Transfer) -> (&'static str, Option<&'static str>) {
        let (Some(source), Some(destination)) =
            (self.accounts.get(transfer.source.as_str()), self.accounts.get(transfer.destination.as_str()))
        else {
            return ("REJEITADA", Some("CONTA_INEXISTENTE"));
        };
        if source.currency != transfer.currency.as_str() || destination.currency != transfer.currency.as_str()
        {
            return ("REJEITADA", Some("MOEDA_INCOMPATIVEL"));
        }
        if source.balance_cents < transfer.amount_cents.get() {
            return ("REJEITADA", Some("SALDO_INSUFICIENTE"));
        }
        ("LIQUIDADA", None)
    }
}

fn fail(error: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(error.to_string())
}

fn topics() -> OutcomeTopics {
    OutcomeTopics { settled: "model.liquidada".into(), rejected: "model.rejeitada".into() }
}

// Over 100 lines on purpose: the model and the database take each step side by side, one match arm
// per step kind.
async fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let database = TestDatabase::create(&ledger::MIGRATOR).await;
    let pool = &database.pool;
    let mut model = Model::default();
    for step in steps {
        match step {
            Step::Open { account, currency, opening_cents } => {
                let id = account_id(account);
                let created = store::create_account(
                    pool,
                    &id,
                    &contracts::Currency::parse(CURRENCIES[currency]).expect("currency"),
                    contracts::Cents::new(opening_cents),
                )
                .await;
                let expected = model.open(id.as_str(), CURRENCIES[currency], opening_cents);
                match created {
                    Ok(_) => prop_assert!(expected, "{id} opened twice"),
                    Err(CreateAccountError::Exists(_)) => prop_assert!(!expected, "{id} refused"),
                    Err(error) => return Err(TestCaseError::fail(format!("open {id}: {error}"))),
                }
            }
            Step::Deposit { id, account, cents } => {
                let (id, account) = (deposit_id(id), account_id(account));
                let result = match store::deposit(pool, id, &account, amount(cents)).await {
                    Ok(DepositMade::New(_)) => DepositResult::New,
                    Ok(DepositMade::Replayed(_)) => DepositResult::Replayed,
                    Err(DepositError::NoAccount(_)) => DepositResult::NoAccount,
                    Err(DepositError::IdReused { .. }) => DepositResult::IdReused,
                    Err(error) => return Err(TestCaseError::fail(format!("deposit: {error}"))),
                };
                prop_assert_eq!(
                    result,
                    model.deposit(id, account.as_str(), cents),
                    "deposit {} into {}",
                    id,
                    account
                );
            }
            Step::Settle(batch) => {
                let transfers: Vec<Transfer> = batch
                    .iter()
                    .map(|step| Transfer {
                        transfer_id: transfer_id(step.id),
                        source: account_id(step.source),
                        destination: account_id(step.destination),
                        amount_cents: amount(step.cents),
                        currency: contracts::Currency::parse(CURRENCIES[step.currency]).expect("currency"),
                    })
                    .collect();
                let requests: Vec<Request> = transfers
                    .iter()
                    .map(|transfer| Request {
                        transfer: transfer.clone(),
                        traceparent: None,
                        tracestate: None,
                    })
                    .collect();
                let settlement = store::settle(pool, &requests, &topics()).await.map_err(fail)?;
                let actual: Vec<(Uuid, &'static str, Option<&'static str>)> = settlement
                    .decided
                    .iter()
                    .map(|(id, outcome): &(Uuid, Outcome)| (*id, outcome.result(), outcome.reason()))
                    .collect();
                let (expected, already) = model.settle(&transfers);
                prop_assert_eq!(actual, expected);
                prop_assert_eq!(settlement.already_decided, already);
            }
        }
    }

    // balances: every customer account and every issuer
    let rows: Vec<(String, String, i64, bool)> =
        sqlx::query_as("SELECT id, moeda, saldo_centavos, emissor FROM conta")
            .fetch_all(pool)
            .await
            .map_err(fail)?;
    let mut customers = HashMap::new();
    for (id, currency, balance_cents, issuer) in rows {
        if issuer {
            prop_assert_eq!(balance_cents, model.issuers.get(&currency).copied().unwrap_or(0), "{}", id);
        } else {
            prop_assert!(balance_cents >= 0, "{id} is negative");
            customers.insert(id, ModelAccount { currency, balance_cents });
        }
    }
    prop_assert_eq!(&customers, &model.accounts);

    // decisions, and entries only for settled transfers, one D and one C each
    let decisions: Vec<(Uuid, String, Option<String>, i64, i64)> = sqlx::query_as(
        "SELECT p.transferencia_id, p.resultado, p.motivo, \
                count(l.id) FILTER (WHERE l.tipo = 'D'), count(l.id) FILTER (WHERE l.tipo = 'C') \
         FROM transferencia_processada p LEFT JOIN lancamento l USING (transferencia_id) \
         GROUP BY p.transferencia_id, p.resultado, p.motivo",
    )
    .fetch_all(pool)
    .await
    .map_err(fail)?;
    prop_assert_eq!(decisions.len(), model.decided.len());
    for (id, result, reason, debits, credits) in decisions {
        let expected = model.decided.get(&id).copied();
        prop_assert_eq!(Some((result.as_str(), reason.as_deref())), expected, "transfer {}", id);
        let entries = if result == "LIQUIDADA" { (1, 1) } else { (0, 0) };
        prop_assert_eq!((debits, credits), entries, "entries of {}", id);
    }
    let outbox: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_evento").fetch_one(pool).await.map_err(fail)?;
    prop_assert_eq!(outbox, model.decided.len() as i64, "one outcome event per decision");

    let broken = common::broken_invariants(pool).await;
    prop_assert!(broken.is_empty(), "broken invariants: {broken:?}");
    Ok(())
}

proptest! {
    // each case creates and migrates a database: a few dozen cases, many steps each
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_ledger_database_agrees_with_the_model(steps in prop::collection::vec(step(), 1..40)) {
        testkit::init_logs();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(run(steps))?;
    }
}
