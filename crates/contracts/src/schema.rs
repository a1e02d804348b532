//! OpenAPI schemas of the domain's values (feature `openapi`), built from the rules their parsers
//! apply: the APIs' documents describe the types the handlers use, not copies kept beside them.
//!
//! Each value serialises as a plain integer or string (see [`crate::domain`]), so each schema is
//! that primitive with the value's constraints: [`Amount`] a minimum of 1, [`AccountId`] and
//! [`Currency`] their patterns, the wire-name enums their spellings (`ALL`, `as_str`).

use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use crate::domain::ACCOUNT_ID_LENGTH_MAX;
use crate::{AccountId, Amount, Cents, Currency, EntryKind, RejectionReason, TransferStatus};

/// The pattern of an account id ([`crate::domain::validate_account_syntax`]).
pub const ACCOUNT_ID_PATTERN: &str = "^[A-Za-z0-9_-]{1,32}$";
/// The shape of a currency code; the code must also be an active ISO 4217 one.
pub const CURRENCY_PATTERN: &str = "^[A-Z]{3}$";

fn integer_cents(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .description(Some(description))
}

fn names(description: &str, names: impl IntoIterator<Item = &'static str>) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .enum_values(Some(names))
        .into()
}

impl PartialSchema for Cents {
    fn schema() -> RefOr<Schema> {
        integer_cents("Integer cents (a balance may be negative only for an issuer account)").into()
    }
}

impl ToSchema for Cents {}

impl PartialSchema for Amount {
    fn schema() -> RefOr<Schema> {
        integer_cents("Integer cents, at least 1").minimum(Some(1)).examples([30_000]).into()
    }
}

impl ToSchema for Amount {}

impl PartialSchema for AccountId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("An account id: 1–32 of A-Z a-z 0-9 _ -"))
            .pattern(Some(ACCOUNT_ID_PATTERN))
            .min_length(Some(1))
            .max_length(Some(ACCOUNT_ID_LENGTH_MAX))
            .examples(["CC-001"])
            .into()
    }
}

impl ToSchema for AccountId {}

impl PartialSchema for Currency {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("An active ISO 4217 currency code, in capitals"))
            .pattern(Some(CURRENCY_PATTERN))
            .examples(["BRL"])
            .into()
    }
}

impl ToSchema for Currency {}

impl PartialSchema for TransferStatus {
    fn schema() -> RefOr<Schema> {
        names("`status` of a transfer", TransferStatus::ALL.iter().map(TransferStatus::as_str))
    }
}

impl ToSchema for TransferStatus {}

impl PartialSchema for RejectionReason {
    fn schema() -> RefOr<Schema> {
        names("Why a transfer was rejected", RejectionReason::ALL.iter().map(RejectionReason::as_str))
    }
}

impl ToSchema for RejectionReason {}

impl PartialSchema for EntryKind {
    fn schema() -> RefOr<Schema> {
        names("`tipo` of an entry: debit (D) or credit (C)", EntryKind::ALL.iter().map(EntryKind::as_str))
    }
}

impl ToSchema for EntryKind {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn schema<T: ToSchema>() -> Value {
        serde_json::to_value(T::schema()).expect("json")
    }

    fn pattern_accepts(pattern: &str, text: &str) -> bool {
        regex::Regex::new(pattern).expect("a valid pattern").is_match(text)
    }

    #[test]
    fn the_documented_names_are_the_wire_spellings() {
        assert_eq!(schema::<TransferStatus>()["enum"], json!(["PENDENTE", "LIQUIDADA", "REJEITADA"]));
        assert_eq!(
            schema::<RejectionReason>()["enum"],
            json!(["BLOQUEADA_ANTIFRAUDE", "CONTA_INEXISTENTE", "MOEDA_INCOMPATIVEL", "SALDO_INSUFICIENTE"])
        );
        assert_eq!(schema::<EntryKind>()["enum"], json!(["D", "C"]));
        assert_eq!(
            (TransferStatus::name(), EntryKind::name()),
            ("TransferStatus".into(), "EntryKind".into())
        );
    }

    #[test]
    fn an_amount_is_documented_as_what_it_accepts() {
        let amount = schema::<Amount>();
        assert_eq!((amount["type"].clone(), amount["minimum"].clone()), (json!("integer"), json!(1)));
        assert_eq!(Amount::new(1).map(Amount::get), Ok(1));
        assert!(Amount::new(0).is_err());
        assert!(schema::<Cents>().get("minimum").is_none(), "a balance has no floor on the wire");
    }

    #[test]
    fn the_documented_patterns_agree_with_the_parsers() {
        assert_eq!(schema::<AccountId>()["pattern"], json!(ACCOUNT_ID_PATTERN));
        assert_eq!(schema::<Currency>()["pattern"], json!(CURRENCY_PATTERN));
        let ids = ["CC-001", "a", "_-", &"x".repeat(32), "", &"x".repeat(33), "a b", "é", "CC.1"];
        for id in ids {
            assert_eq!(pattern_accepts(ACCOUNT_ID_PATTERN, id), AccountId::parse(id).is_ok(), "{id:?}");
        }
        // the pattern is the shape; the parser also requires an active code
        for code in ["BRL", "USD", "brl", "BR", "BRLX", "R$1"] {
            assert_eq!(pattern_accepts(CURRENCY_PATTERN, code), Currency::parse(code).is_ok(), "{code:?}");
        }
        assert!(pattern_accepts(CURRENCY_PATTERN, "XYZ") && Currency::parse("XYZ").is_err());
    }
}
