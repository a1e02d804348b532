//! The settlement rules, pure: given the accounts a transfer touches (locked by the caller), is
//! it settled, or rejected and why? The database code and the property test's model both call
//! [`decide`], and the property test checks the database against the model.

use std::collections::HashMap;

use contracts::{AccountId, Amount, Cents, Currency, RejectionReason};
use uuid::Uuid;

/// What the ledger decided for a transfer; pinned once stored (the domain type, here for the
/// rules' callers).
pub use contracts::Outcome;

/// An account as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub currency: Currency,
    pub balance_cents: Cents,
    /// The currency's issuer account `EMISSOR-<MOEDA>`: the only kind that may go negative,
    /// never a side of a transfer.
    pub issuer: bool,
}

/// A transfer to settle, from a `TransferenciaAnalisada`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub transfer_id: Uuid,
    pub source: AccountId,
    pub destination: AccountId,
    /// At least 1 cent, by its type: a zero or negative amount never reaches the rules.
    pub amount_cents: Amount,
    pub currency: Currency,
}

/// A balance would leave the `i64` range: the transfer cannot be applied (and cannot occur
/// while the books balance, since Σ balances per currency is 0).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("settling transfer {transfer_id} would overflow the balance of account {account}")]
pub struct Overflow {
    pub transfer_id: Uuid,
    pub account: AccountId,
}

/// Decides `transfer` against `accounts` and, when it settles, moves the money in `accounts`.
///
/// In this order: an account missing (or an issuer account on either side) →
/// `CONTA_INEXISTENTE`; an account in another currency → `MOEDA_INCOMPATIVEL`; the source
/// balance below the amount → `SALDO_INSUFICIENTE`; otherwise settled.
///
/// Asserted (a failure is a bug or corrupt books, never a customer's mistake): the accounts it
/// reads are well-formed (an issuer flag only on `EMISSOR-…`, no customer balance below 0, the
/// table's `CHECK`); a settlement leaves the source at 0 or more, the destination exactly the
/// amount richer and the two balances' sum unchanged; a refusal changes nothing.
pub fn decide(transfer: &Transfer, accounts: &mut HashMap<AccountId, Account>) -> Result<Outcome, Overflow> {
    let (source_before, destination_before) = match refusal(transfer, accounts) {
        Err(reason) => return Ok(Outcome::Rejected(reason)),
        Ok(balances) => balances,
    };
    let same_account = transfer.source == transfer.destination;
    let amount = transfer.amount_cents.cents();
    let overflow =
        |account: &AccountId| Overflow { transfer_id: transfer.transfer_id, account: account.clone() };
    let debited = source_before.checked_sub(amount).ok_or_else(|| overflow(&transfer.source))?;
    // the same account on both sides (the settler refuses such records; the rule stays sound)
    let credited = if same_account { debited } else { destination_before }
        .checked_add(amount)
        .ok_or_else(|| overflow(&transfer.destination))?;

    assert!(debited >= Cents::ZERO, "{} overdrawn by {}: {debited}", transfer.source, transfer.transfer_id);
    if same_account {
        assert_eq!(credited, source_before, "a transfer to the same account changed its balance");
    } else {
        assert_eq!(
            credited.checked_sub(destination_before),
            Some(amount),
            "credit of {}",
            transfer.transfer_id
        );
        let sum = |a: Cents, b: Cents| i128::from(a.get()) + i128::from(b.get());
        assert_eq!(sum(debited, credited), sum(source_before, destination_before), "money made or lost");
    }
    account_mut(accounts, &transfer.source).balance_cents = debited;
    account_mut(accounts, &transfer.destination).balance_cents = credited;
    Ok(Outcome::Settled)
}

/// The first rule `transfer` breaks, or the balances of its source and destination.
fn refusal(
    transfer: &Transfer,
    accounts: &HashMap<AccountId, Account>,
) -> Result<(Cents, Cents), RejectionReason> {
    let customer = |id: &AccountId| {
        let account = accounts.get(id)?;
        assert_eq!(account.issuer, id.is_issuer(), "account {id}'s issuer flag is {}", account.issuer);
        assert!(
            account.issuer || account.balance_cents >= Cents::ZERO,
            "customer account {id} holds {}",
            account.balance_cents
        );
        (!account.issuer).then_some(account)
    };
    let (Some(source), Some(destination)) = (customer(&transfer.source), customer(&transfer.destination))
    else {
        return Err(RejectionReason::AccountNotFound);
    };
    if source.currency != transfer.currency || destination.currency != transfer.currency {
        return Err(RejectionReason::CurrencyMismatch);
    }
    if source.balance_cents < transfer.amount_cents.cents() {
        return Err(RejectionReason::InsufficientFunds);
    }
    Ok((source.balance_cents, destination.balance_cents))
}

/// An account [`refusal`] found: present by then.
fn account_mut<'a>(accounts: &'a mut HashMap<AccountId, Account>, id: &AccountId) -> &'a mut Account {
    accounts.get_mut(id).unwrap_or_else(|| panic!("account {id} was read a moment ago and is gone"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(id: &str) -> AccountId {
        AccountId::parse(id).expect("a well-formed account id")
    }

    fn currency(code: &str) -> Currency {
        Currency::parse(code).expect("an active currency")
    }

    fn accounts() -> HashMap<AccountId, Account> {
        let account =
            |code: &str, balance_cents, issuer| Account { currency: currency(code), balance_cents, issuer };
        HashMap::from([
            (id("A"), account("BRL", Cents::new(1_000), false)),
            (id("B"), account("BRL", Cents::ZERO, false)),
            (id("U"), account("USD", Cents::new(500), false)),
            (id("EMISSOR-BRL"), account("BRL", Cents::new(-1_000), true)),
            (id("MAX"), account("BRL", Cents::MAX, false)),
        ])
    }

    fn transfer(source: &str, destination: &str, amount_cents: i64) -> Transfer {
        Transfer {
            transfer_id: Uuid::nil(),
            source: id(source),
            destination: id(destination),
            amount_cents: Amount::new(amount_cents).expect("a test amount is positive"),
            currency: currency("BRL"),
        }
    }

    #[test]
    fn a_transfer_to_the_same_account_leaves_its_balance_as_it_was() {
        let mut accounts = accounts();
        assert_eq!(decide(&transfer("A", "A", 400), &mut accounts), Ok(Outcome::Settled));
        assert_eq!(accounts["A"].balance_cents, Cents::new(1_000));
    }

    #[test]
    fn a_covered_transfer_moves_the_money() {
        let mut accounts = accounts();
        assert_eq!(decide(&transfer("A", "B", 1_000), &mut accounts), Ok(Outcome::Settled));
        assert_eq!(accounts["A"].balance_cents, Cents::ZERO);
        assert_eq!(accounts["B"].balance_cents, Cents::new(1_000));
    }

    #[test]
    fn each_rejection_moves_nothing() {
        let cases = [
            (transfer("A", "NOPE", 1), RejectionReason::AccountNotFound),
            (transfer("NOPE", "A", 1), RejectionReason::AccountNotFound),
            (transfer("EMISSOR-BRL", "A", 1), RejectionReason::AccountNotFound),
            (transfer("A", "EMISSOR-BRL", 1), RejectionReason::AccountNotFound),
            (transfer("A", "U", 1), RejectionReason::CurrencyMismatch),
            (
                Transfer { currency: currency("USD"), ..transfer("A", "B", 1) },
                RejectionReason::CurrencyMismatch,
            ),
            (transfer("A", "B", 1_001), RejectionReason::InsufficientFunds),
        ];
        for (transfer, reason) in cases {
            let mut accounts = accounts();
            let before = accounts.clone();
            assert_eq!(decide(&transfer, &mut accounts), Ok(Outcome::Rejected(reason)), "{transfer:?}");
            assert_eq!(accounts, before);
        }
    }

    #[test]
    fn an_overflowing_credit_is_an_error_not_a_wrap() {
        let mut accounts = accounts();
        let error = decide(&transfer("A", "MAX", 1), &mut accounts).expect_err("overflow");
        assert_eq!(error.account, "MAX");
        assert_eq!(accounts["A"].balance_cents, Cents::new(1_000), "nothing moved");
    }

    #[test]
    #[should_panic(expected = "customer account B holds -1")]
    fn a_customer_account_below_zero_is_a_bug_not_a_rejection() {
        let mut accounts = accounts();
        accounts.get_mut("B").expect("B").balance_cents = Cents::new(-1);
        let _ = decide(&transfer("A", "B", 1), &mut accounts);
    }

    #[test]
    #[should_panic(expected = "issuer flag")]
    fn an_issuer_flag_on_a_customer_account_is_a_bug() {
        let mut accounts = accounts();
        accounts.get_mut("A").expect("A").issuer = true;
        let _ = decide(&transfer("A", "B", 1), &mut accounts);
    }

    #[test]
    fn outcome_columns() {
        assert_eq!(Outcome::Settled.result(), "LIQUIDADA");
        assert_eq!(Outcome::Settled.reason(), None);
        let rejected = Outcome::Rejected(RejectionReason::InsufficientFunds);
        assert_eq!((rejected.result(), rejected.reason()), ("REJEITADA", Some("SALDO_INSUFICIENTE")));
    }
}
