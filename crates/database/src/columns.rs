//! Column types that turn a database value into a domain value by name, where `sqlx`'s
//! `#[sqlx(try_from = …)]` needs a type that decodes and converts.

use contracts::Cents;

/// A `BIGINT` read as [`Cents`]: any value is one (a balance, an issuer's negative one, a sum or a
/// row a verifier reads without judging it). For an amount that must be at least 1 cent read
/// `i64` into [`contracts::Amount`] instead (`try_from = "i64"`), which refuses the rest.
#[derive(Debug, Clone, Copy, sqlx::Type)]
#[sqlx(transparent)]
pub struct CentsColumn(i64);

impl From<CentsColumn> for Cents {
    fn from(column: CentsColumn) -> Self {
        Cents::new(column.0)
    }
}
