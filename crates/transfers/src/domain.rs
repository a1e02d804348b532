//! A transfer request and its validation (`docs/reference/contract.md` §2): every rule is checked and every
//! broken one reported, so a client fixes its request in one round trip.

use contracts::{AccountId, Amount, Currency};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use contracts::domain::validate_account_syntax;
pub use web::FieldError;

/// A request that passed every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRequest {
    pub source_account: AccountId,
    pub destination_account: AccountId,
    pub amount_cents: Amount,
    pub currency: Currency,
}

impl TransferRequest {
    /// Validates a `POST /transferencias` body. Unknown fields are ignored, as in every reader
    /// of the contract.
    pub fn parse(body: &Value) -> Result<Self, Vec<FieldError>> {
        let Some(object) = body.as_object() else {
            return Err(vec![FieldError::new("body", "must be a JSON object")]);
        };
        let mut errors = Vec::new();
        let source = account(object, "contaOrigem", &mut errors);
        let destination = account(object, "contaDestino", &mut errors);
        if let (Some(source), Some(destination)) = (&source, &destination) {
            if source == destination {
                errors.push(FieldError::new("contaDestino", "must differ from contaOrigem"));
            }
        }
        let amount = match object.get("valorEmCentavos") {
            None | Some(Value::Null) => {
                errors.push(FieldError::new("valorEmCentavos", "is required"));
                None
            }
            Some(Value::Number(number)) => match number.as_i64() {
                Some(cents) => match Amount::new(cents) {
                    Ok(cents) => Some(cents),
                    Err(_) => {
                        errors.push(FieldError::new("valorEmCentavos", "must be greater than 0"));
                        None
                    }
                },
                None if number.is_u64() => {
                    errors.push(FieldError::new("valorEmCentavos", "must be at most 9223372036854775807"));
                    None
                }
                None => {
                    errors.push(FieldError::new("valorEmCentavos", "must be a whole number of cents"));
                    None
                }
            },
            Some(_) => {
                errors.push(FieldError::new("valorEmCentavos", "must be an integer number of cents"));
                None
            }
        };
        let currency = web::required_text(object, "moeda", &mut errors, |code| {
            Currency::parse(code).map_err(|invalid| invalid.to_string())
        });
        match (source, destination, amount, currency) {
            (Some(source_account), Some(destination_account), Some(amount_cents), Some(currency))
                if errors.is_empty() =>
            {
                Ok(Self { source_account, destination_account, amount_cents, currency })
            }
            _ => Err(errors),
        }
    }

    /// SHA-256 of the request's meaning (not its bytes: key order and spacing do not matter),
    /// hex: what an Idempotency-Key is bound to.
    pub fn fingerprint(&self) -> String {
        let mut hasher = Sha256::new();
        for part in [
            self.source_account.as_str(),
            self.destination_account.as_str(),
            &self.amount_cents.to_string(),
            self.currency.as_str(),
        ] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        hex::encode(hasher.finalize())
    }
}

fn account(
    object: &Map<String, Value>,
    field: &'static str,
    errors: &mut Vec<FieldError>,
) -> Option<AccountId> {
    web::required_text(object, field, errors, |id| AccountId::customer(id).map_err(|invalid| invalid.message))
}

/// `status` of a transfer: the domain type (an unknown spelling is an error, never `PENDENTE`).
pub use contracts::TransferStatus as Status;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn valid() -> Value {
        json!({"contaOrigem": "CC-001", "contaDestino": "CC_002", "valorEmCentavos": 30000, "moeda": "BRL"})
    }

    fn errors_of(body: Value) -> Vec<(&'static str, String)> {
        TransferRequest::parse(&body)
            .expect_err("must be refused")
            .into_iter()
            .map(|error| (error.field, error.message))
            .collect()
    }

    fn with(field: &str, value: Value) -> Value {
        let mut body = valid();
        body[field] = value;
        body
    }

    #[test]
    fn a_valid_request_parses_and_ignores_unknown_fields() {
        let mut body = valid();
        body["canal"] = json!("pix");
        let request = TransferRequest::parse(&body).expect("valid");
        assert_eq!(request.source_account, "CC-001");
        assert_eq!(request.destination_account, "CC_002");
        assert_eq!(request.amount_cents.get(), 30_000);
        assert_eq!(request.currency, "BRL");
    }

    #[test]
    fn every_rule_names_its_field() {
        let cases = [
            (json!([1, 2]), "body"),
            (with("contaOrigem", json!(null)), "contaOrigem"),
            (with("contaOrigem", json!(17)), "contaOrigem"),
            (with("contaOrigem", json!("")), "contaOrigem"),
            (with("contaOrigem", json!("a".repeat(33))), "contaOrigem"),
            (with("contaOrigem", json!("CC 001")), "contaOrigem"),
            (with("contaOrigem", json!("CC-ã")), "contaOrigem"),
            (with("contaOrigem", json!("EMISSOR-BRL")), "contaOrigem"),
            (with("contaDestino", json!("EMISSOR-BRL")), "contaDestino"),
            (with("contaDestino", json!("CC-001")), "contaDestino"),
            (with("valorEmCentavos", json!(0)), "valorEmCentavos"),
            (with("valorEmCentavos", json!(-5)), "valorEmCentavos"),
            (with("valorEmCentavos", json!(1.5)), "valorEmCentavos"),
            (with("valorEmCentavos", json!("100")), "valorEmCentavos"),
            (with("valorEmCentavos", json!(u64::MAX)), "valorEmCentavos"),
            (with("moeda", json!("real")), "moeda"),
            (with("moeda", json!("XYZ")), "moeda"),
            (with("moeda", json!("brl")), "moeda"),
            (with("moeda", json!(986)), "moeda"),
        ];
        for (body, field) in cases {
            let errors = errors_of(body.clone());
            assert_eq!(errors.len(), 1, "{body}: {errors:?}");
            assert_eq!(errors[0].0, field, "{body}: {errors:?}");
        }
    }

    #[test]
    fn all_broken_rules_are_reported_at_once() {
        let errors = errors_of(json!({"valorEmCentavos": 0}));
        let fields: Vec<&str> = errors.iter().map(|(field, _)| *field).collect();
        assert_eq!(fields, ["contaOrigem", "contaDestino", "valorEmCentavos", "moeda"]);
    }

    #[test]
    fn fingerprint_depends_on_meaning_only() {
        let a = TransferRequest::parse(&valid()).expect("valid");
        let reordered = json!({"moeda": "BRL", "valorEmCentavos": 30000, "contaDestino": "CC_002", "contaOrigem": "CC-001"});
        assert_eq!(a.fingerprint(), TransferRequest::parse(&reordered).expect("valid").fingerprint());
        let other = TransferRequest::parse(&with("valorEmCentavos", json!(30001))).expect("valid");
        assert_ne!(a.fingerprint(), other.fingerprint());
        assert_eq!(a.fingerprint().len(), 64);
    }

    proptest! {
        #[test]
        fn arbitrary_json_never_panics(text in "\\PC{0,200}") {
            if let Ok(value) = serde_json::from_str::<Value>(&text) {
                let _ = TransferRequest::parse(&value);
            }
        }

        #[test]
        fn arbitrary_field_values_never_panic(
            source in proptest::option::of(".{0,40}"),
            amount in proptest::num::i64::ANY,
            currency in "[A-Za-z]{0,4}",
        ) {
            let body = json!({"contaOrigem": source, "contaDestino": "X", "valorEmCentavos": amount, "moeda": currency});
            match TransferRequest::parse(&body) {
                Ok(request) => prop_assert_eq!(request.amount_cents.get(), amount),
                Err(errors) => prop_assert!(!errors.is_empty()),
            }
        }
    }
}
