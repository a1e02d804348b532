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

pub use crate::money::{Amount, Cents, InvalidCents, NotPositive};

use crate::events::RejectionReason;

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
