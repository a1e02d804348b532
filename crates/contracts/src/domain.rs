//! The domain's values (`docs/reference/contract.md` §2 and §4), so that wrong money and wrong names are
//! refused where they enter instead of travelling as bare integers and strings.
//!
//! - [`Cents`]: a balance or a sum of money; checked arithmetic only (an overflow is an answer,
//!   never a wrap). Made only by [`Cents::new`], by name: no bare integer turns into money.
//! - [`Amount`]: what a transfer or a deposit moves, at least 1 cent; it refuses zero and
//!   negatives wherever it is made, deserialised included, so an event cannot carry one.
//! - [`AccountId`], [`Currency`]: the field rules both APIs apply, and the issuers' accounts
//!   (`EMISSOR-<MOEDA>`) the ledger reserves.
//! - [`EntryKind`]: `D`/`C` of a `lancamento`.
//! - [`TransferStatus`]: `PENDENTE`/`LIQUIDADA`/`REJEITADA`; an unknown spelling is an error.
//! - [`Outcome`]: what the ledger decided for a transfer (settled, or rejected and why).
//!
//! Each serialises exactly as the wire has it (a plain integer, a plain string), so using them
//! changes no byte of an event or a response.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::events::RejectionReason;

/// An amount of money, in integer cents.
///
/// Any `i64` is a value (an issuer's balance is negative), but there is no `Add`/`Sub`: every
/// sum goes through [`Cents::checked_add`], [`Cents::checked_sub`] or [`Cents::checked_neg`]
/// and the caller says what an overflow means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Cents(i64);

/// An amount that a transfer or a deposit may not move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an amount must be greater than 0 cents, got {0}")]
pub struct NotPositive(pub i64);

impl Cents {
    pub const ZERO: Cents = Cents(0);
    pub const MAX: Cents = Cents(i64::MAX);

    /// A balance or a sum: any value.
    pub const fn new(cents: i64) -> Self {
        Self(cents)
    }

    pub const fn get(self) -> i64 {
        self.0
    }

    pub const fn is_positive(self) -> bool {
        self.0 > 0
    }

    pub fn checked_add(self, other: Cents) -> Option<Cents> {
        self.0.checked_add(other.0).map(Self)
    }

    pub fn checked_sub(self, other: Cents) -> Option<Cents> {
        self.0.checked_sub(other.0).map(Self)
    }

    pub fn checked_neg(self) -> Option<Cents> {
        self.0.checked_neg().map(Self)
    }
}

/// Text that is not a number of cents a setting accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCents {
    #[error("{0:?} is not a whole number of cents")]
    NotANumber(String),
    #[error("must be at least {min}, got {value}")]
    BelowMinimum { value: i64, min: i64 },
}

impl Cents {
    /// Cents written as text (a command-line argument, an environment variable), at least
    /// `min`: clap's `value_parser` for money settings.
    pub fn parse_at_least(text: &str, min: Cents) -> Result<Cents, InvalidCents> {
        let value: i64 = text.trim().parse().map_err(|_| InvalidCents::NotANumber(text.to_owned()))?;
        if value < min.0 {
            return Err(InvalidCents::BelowMinimum { value, min: min.0 });
        }
        Ok(Self(value))
    }

    /// A balance written as text that may not be negative (an opening balance).
    pub fn parse_balance(text: &str) -> Result<Cents, InvalidCents> {
        Self::parse_at_least(text, Cents::ZERO)
    }
}

impl From<Cents> for i64 {
    fn from(cents: Cents) -> Self {
        cents.0
    }
}

impl fmt::Display for Cents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An amount to move (a transfer's, a deposit's, an entry's): at least 1 cent.
///
/// Serialises as the plain integer; deserialising refuses 0 and negatives with
/// [`NotPositive`]'s message, so a `valorEmCentavos` of 0 fails to read like a missing field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Amount(Cents);

impl Amount {
    /// The smallest amount, 1 cent.
    pub const ONE_CENT: Amount = Amount::constant(1);

    pub const fn new(cents: i64) -> Result<Self, NotPositive> {
        if cents > 0 {
            Ok(Self(Cents(cents)))
        } else {
            Err(NotPositive(cents))
        }
    }

    /// `cents` as an amount where the value is a constant: fails to compile when not positive.
    pub const fn constant(cents: i64) -> Self {
        match Self::new(cents) {
            Ok(amount) => amount,
            Err(_) => panic!("an amount must be greater than 0 cents"),
        }
    }

    /// An amount written as text (a command-line argument): at least 1 cent.
    pub fn parse(text: &str) -> Result<Amount, InvalidCents> {
        Cents::parse_at_least(text, Cents(1)).map(Self)
    }

    /// The same value as cents, for arithmetic with balances.
    pub const fn cents(self) -> Cents {
        self.0
    }

    pub const fn get(self) -> i64 {
        self.0 .0
    }
}

impl TryFrom<i64> for Amount {
    type Error = NotPositive;

    fn try_from(cents: i64) -> Result<Self, NotPositive> {
        Self::new(cents)
    }
}

impl From<Amount> for i64 {
    fn from(amount: Amount) -> Self {
        amount.get()
    }
}

impl From<Amount> for Cents {
    fn from(amount: Amount) -> Self {
        amount.0
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Accounts reserved for the ledger's issuers (`EMISSOR-<MOEDA>`): never created through the
/// API, never a side of a transfer.
pub const ISSUER_PREFIX: &str = "EMISSOR-";
/// Longest account id (`VARCHAR(32)`).
pub const ACCOUNT_ID_LENGTH_MAX: usize = 32;

/// 1–32 characters of `[A-Za-z0-9_-]`, and not an issuer account.
pub fn validate_account_id(id: &str) -> Result<(), String> {
    validate_account_syntax(id)?;
    if id.starts_with(ISSUER_PREFIX) {
        return Err(format!("{ISSUER_PREFIX}… accounts are reserved for the ledger's issuers"));
    }
    Ok(())
}

/// 1–32 characters of `[A-Za-z0-9_-]`.
pub fn validate_account_syntax(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > ACCOUNT_ID_LENGTH_MAX {
        return Err(format!("must be 1 to {ACCOUNT_ID_LENGTH_MAX} characters"));
    }
    if !id.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-') {
        return Err("may contain only letters, digits, '_' and '-'".into());
    }
    Ok(())
}

/// An active ISO 4217 code, in capitals (`BRL`; not `brl`, `real` or `XYZ`).
pub fn is_active_currency(code: &str) -> bool {
    code.len() == 3
        && code.bytes().all(|byte| byte.is_ascii_uppercase())
        && iso_currency::Currency::from_code(code).is_some()
}

/// Defines, for a validated text newtype with a `parse(impl Into<String>)`: `Display`,
/// `AsRef<str>`, `Borrow<str>` (map lookups by `&str`), comparison with `str`, `TryFrom<String>`
/// (what a database row holds: `#[sqlx(try_from = "String")]`) and a `Deserialize` that refuses
/// what `parse` refuses, with its message.
macro_rules! text_value {
    ($type:ident, $error:ident) => {
        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $type {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $type {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $type {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $type {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl TryFrom<String> for $type {
            type Error = $error;

            fn try_from(text: String) -> Result<Self, $error> {
                Self::parse(text)
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                Self::parse(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A well-formed account id (1–32 of `[A-Za-z0-9_-]`), a customer's or an issuer's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct AccountId(String);

/// An account id that breaks the rules; the message says which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("account id {id:?} {message}")]
pub struct InvalidAccountId {
    pub id: String,
    pub message: String,
}

impl AccountId {
    /// Any well-formed id, issuers' included (what the ledger reads back).
    pub fn parse(id: impl Into<String>) -> Result<Self, InvalidAccountId> {
        let id = id.into();
        match validate_account_syntax(&id) {
            Ok(()) => Ok(Self(id)),
            Err(message) => Err(InvalidAccountId { id, message }),
        }
    }

    /// A customer's account: well-formed and not an issuer's (what the APIs accept).
    pub fn customer(id: impl Into<String>) -> Result<Self, InvalidAccountId> {
        let id = id.into();
        match validate_account_id(&id) {
            Ok(()) => Ok(Self(id)),
            Err(message) => Err(InvalidAccountId { id, message }),
        }
    }

    /// The issuer account of `currency`, `EMISSOR-<MOEDA>`.
    pub fn issuer(currency: &Currency) -> Self {
        Self(format!("{ISSUER_PREFIX}{}", currency.as_str()))
    }

    pub fn is_issuer(&self) -> bool {
        self.0.starts_with(ISSUER_PREFIX)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

text_value!(AccountId, InvalidAccountId);

/// An active ISO 4217 currency code in capitals (`BRL`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Currency(String);

/// Not an active ISO 4217 code in capitals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an active ISO 4217 currency code")]
pub struct InvalidCurrency(pub String);

impl Currency {
    pub fn parse(code: impl Into<String>) -> Result<Self, InvalidCurrency> {
        let code = code.into();
        if is_active_currency(&code) {
            Ok(Self(code))
        } else {
            Err(InvalidCurrency(code))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_value!(Currency, InvalidCurrency);

/// An unknown spelling of a closed set of names read from the database or the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownName {
    pub what: &'static str,
    pub value: String,
}

/// Defines `as_str`, `parse`, `Display`, `TryFrom<String>` and plain-string serde for an enum
/// of wire names.
macro_rules! wire_names {
    ($type:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $type {
            pub const ALL: &'static [$type] = &[$(Self::$variant),+];

            /// The wire and database spelling.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $(Self::$variant => $name),+
                }
            }

            /// The value spelled `text`; anything else is an error, never a default.
            pub fn parse(text: &str) -> Result<Self, UnknownName> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|value| value.as_str() == text)
                    .ok_or_else(|| UnknownName { what: $what, value: text.to_owned() })
            }
        }

        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl TryFrom<String> for $type {
            type Error = UnknownName;

            fn try_from(text: String) -> Result<Self, UnknownName> {
                Self::parse(&text)
            }
        }

        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::parse(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// `lancamento.tipo`: a debit (`D`) or a credit (`C`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    Debit,
    Credit,
}

wire_names!(EntryKind, "entry kind", { Debit => "D", Credit => "C" });

impl EntryKind {
    /// `amount` as it moves the balance of the entry's account: a debit takes it out.
    pub fn signed(self, amount: Cents) -> Option<Cents> {
        match self {
            Self::Debit => amount.checked_neg(),
            Self::Credit => Some(amount),
        }
    }
}

/// `status` of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferStatus {
    Pending,
    Settled,
    Rejected,
}

wire_names!(TransferStatus, "transfer status", {
    Pending => "PENDENTE",
    Settled => "LIQUIDADA",
    Rejected => "REJEITADA",
});

impl TransferStatus {
    pub fn is_final(self) -> bool {
        self != Self::Pending
    }
}

/// What the ledger decided for a transfer; pinned once stored
/// (`transferencia_processada.resultado` and `.motivo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Settled,
    Rejected(RejectionReason),
}

/// A stored outcome that is not one: an unknown result or reason, a rejection without a
/// reason, a settlement with one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{result:?} with reason {reason:?} is not an outcome")]
pub struct InvalidOutcome {
    pub result: String,
    pub reason: Option<String>,
}

impl Outcome {
    /// The final status it gives the transfer.
    pub fn status(&self) -> TransferStatus {
        match self {
            Self::Settled => TransferStatus::Settled,
            Self::Rejected(_) => TransferStatus::Rejected,
        }
    }

    /// `transferencia_processada.resultado`.
    pub fn result(&self) -> &'static str {
        self.status().as_str()
    }

    /// `transferencia_processada.motivo`.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Self::Settled => None,
            Self::Rejected(reason) => Some(reason.as_str()),
        }
    }

    /// The outcome stored as (`resultado`, `motivo`).
    pub fn parse(result: &str, reason: Option<&str>) -> Result<Self, InvalidOutcome> {
        let invalid = || InvalidOutcome { result: result.to_owned(), reason: reason.map(str::to_owned) };
        match (TransferStatus::parse(result), reason) {
            (Ok(TransferStatus::Settled), None) => Ok(Self::Settled),
            (Ok(TransferStatus::Rejected), Some(reason)) => {
                RejectionReason::parse(reason).map(Self::Rejected).ok_or_else(invalid)
            }
            _ => Err(invalid()),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Settled => f.write_str(self.result()),
            Self::Rejected(reason) => write!(f, "{} ({})", self.result(), reason.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cents_settings_are_read_with_their_floor() {
        assert_eq!(Amount::parse("10000000").map(Amount::get), Ok(10_000_000));
        assert_eq!(Amount::parse("0"), Err(InvalidCents::BelowMinimum { value: 0, min: 1 }));
        assert_eq!(Amount::parse("-5"), Err(InvalidCents::BelowMinimum { value: -5, min: 1 }));
        assert_eq!(Cents::parse_balance("0"), Ok(Cents::ZERO));
        assert_eq!(
            Cents::parse_balance("-1").map_err(|error| error.to_string()),
            Err("must be at least 0, got -1".to_owned())
        );
        assert_eq!(Amount::parse("1.5"), Err(InvalidCents::NotANumber("1.5".into())));
        assert_eq!(
            Amount::parse("9223372036854775808"),
            Err(InvalidCents::NotANumber("9223372036854775808".into()))
        );
    }

    #[test]
    fn cents_arithmetic_refuses_overflow_instead_of_wrapping() {
        assert_eq!(Cents::new(5).checked_add(Cents::new(7)), Some(Cents::new(12)));
        assert_eq!(Cents::MAX.checked_add(Cents::new(1)), None);
        assert_eq!(Cents::new(i64::MIN).checked_sub(Cents::new(1)), None);
        assert_eq!(Cents::new(i64::MIN).checked_neg(), None);
        assert_eq!(Cents::new(-3).checked_neg(), Some(Cents::new(3)));
    }

    #[test]
    fn an_amount_is_at_least_one_cent() {
        assert_eq!(Amount::new(1).map(Amount::get), Ok(1));
        assert_eq!(Amount::new(1), Ok(Amount::ONE_CENT));
        assert_eq!(Amount::new(0), Err(NotPositive(0)));
        assert_eq!(Amount::new(-5), Err(NotPositive(-5)));
        assert_eq!(Amount::new(i64::MIN), Err(NotPositive(i64::MIN)));
        assert_eq!(Amount::new(i64::MAX).map(Amount::cents), Ok(Cents::MAX));
    }

    #[test]
    fn an_amount_refuses_zero_and_negatives_when_deserialised() {
        assert_eq!(serde_json::from_str::<Amount>("30000").map(Amount::get).expect("read"), 30_000);
        assert_eq!(serde_json::to_string(&Amount::ONE_CENT).expect("json"), "1");
        for refused in ["0", "-1", "-9223372036854775808"] {
            let error = serde_json::from_str::<Amount>(refused).expect_err(refused).to_string();
            assert!(error.contains("greater than 0 cents"), "{refused}: {error}");
        }
        for malformed in ["1.5", "\"100\"", "null", "9223372036854775808"] {
            assert!(serde_json::from_str::<Amount>(malformed).is_err(), "{malformed}");
        }
    }

    #[test]
    fn cents_travel_as_a_plain_integer() {
        let text = serde_json::to_string(&Cents::new(-1_234)).expect("json");
        assert_eq!(text, "-1234");
        assert_eq!(serde_json::from_str::<Cents>("9223372036854775807").expect("max"), Cents::MAX);
        assert!(serde_json::from_str::<Cents>("9223372036854775808").is_err());
        assert!(serde_json::from_str::<Cents>("1.5").is_err());
        assert!(serde_json::from_str::<Cents>("\"100\"").is_err());
    }

    #[test]
    fn account_ids() {
        assert!(validate_account_id("CC-001_a").is_ok());
        assert!(validate_account_id("").is_err());
        assert!(validate_account_id(&"a".repeat(33)).is_err());
        assert!(validate_account_id("a b").is_err());
        assert!(validate_account_id("EMISSOR-BRL").is_err());
        assert!(validate_account_syntax("EMISSOR-BRL").is_ok());
        assert!(AccountId::parse("EMISSOR-BRL").expect("well-formed").is_issuer());
        assert!(AccountId::customer("EMISSOR-BRL").is_err());
        assert!(AccountId::parse("CC 1").is_err());
        let brl = Currency::parse("BRL").expect("active");
        assert_eq!(AccountId::issuer(&brl).as_str(), "EMISSOR-BRL");
        assert_eq!(serde_json::to_string(&AccountId::parse("CC-1").expect("ok")).expect("json"), "\"CC-1\"");
        assert!(serde_json::from_str::<AccountId>("\"CC 1\"").is_err());
    }

    #[test]
    fn currencies() {
        assert!(is_active_currency("BRL"));
        assert!(!is_active_currency("brl"));
        assert!(!is_active_currency("XYZ"));
        assert!(!is_active_currency("real"));
        assert_eq!(Currency::parse("XYZ"), Err(InvalidCurrency("XYZ".into())));
        let brl: Currency = serde_json::from_str("\"BRL\"").expect("json");
        assert_eq!(serde_json::to_string(&brl).expect("json"), "\"BRL\"");
    }

    #[test]
    fn entry_kinds_are_d_and_c_and_nothing_else() {
        assert_eq!(EntryKind::Debit.as_str(), "D");
        assert_eq!(EntryKind::parse("C"), Ok(EntryKind::Credit));
        assert!(EntryKind::parse("d").is_err());
        assert_eq!(serde_json::to_string(&EntryKind::Debit).expect("json"), "\"D\"");
        assert_eq!(EntryKind::Debit.signed(Cents::new(5)), Some(Cents::new(-5)));
        assert_eq!(EntryKind::Credit.signed(Cents::new(5)), Some(Cents::new(5)));
    }

    #[test]
    fn an_unknown_status_is_an_error_not_pending() {
        for status in TransferStatus::ALL {
            assert_eq!(TransferStatus::parse(status.as_str()), Ok(*status));
            let json = serde_json::to_string(status).expect("json");
            assert_eq!(json, format!("\"{}\"", status.as_str()));
            assert_eq!(serde_json::from_str::<TransferStatus>(&json).expect("json"), *status);
        }
        let error = TransferStatus::parse("CANCELADA").expect_err("unknown");
        assert_eq!(error.to_string(), "unknown transfer status \"CANCELADA\"");
        assert!(TransferStatus::try_from("pendente".to_owned()).is_err());
        assert!(serde_json::from_str::<TransferStatus>("\"\"").is_err());
    }

    #[test]
    fn outcomes_round_trip_through_their_stored_form() {
        let all =
            [Outcome::Settled].into_iter().chain(RejectionReason::ALL.into_iter().map(Outcome::Rejected));
        for outcome in all {
            assert_eq!(Outcome::parse(outcome.result(), outcome.reason()), Ok(outcome));
        }
        assert!(Outcome::parse("LIQUIDADA", Some("SALDO_INSUFICIENTE")).is_err());
        assert!(Outcome::parse("REJEITADA", None).is_err());
        assert!(Outcome::parse("REJEITADA", Some("OUTRO")).is_err());
        assert!(Outcome::parse("PENDENTE", None).is_err());
        assert_eq!(
            Outcome::Rejected(RejectionReason::InsufficientFunds).to_string(),
            "REJEITADA (SALDO_INSUFICIENTE)"
        );
    }
}
