//! Money: [`Cents`] (a balance or a sum, any `i64`, checked arithmetic only) and [`Amount`] (what
//! a transfer, a deposit or an entry moves: at least 1 cent, refused otherwise wherever it is
//! made, deserialised included).

use std::fmt;

use serde::{Deserialize, Serialize};

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
}
