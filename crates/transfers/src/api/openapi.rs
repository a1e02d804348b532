//! The API's OpenAPI 3.1 document, served at `GET /openapi.json` (`docs/reference/contract.md` §2), derived by
//! utoipa from the handlers' `#[utoipa::path]` attributes and the types they answer with.
//!
//! The request body is read field by field (so every broken rule gets its own message), not
//! deserialised into a type; [`TransferRequestBody`] describes it with the contract's own types
//! (their schemas come from `contracts`, feature `openapi`), and a test keeps it and the parser
//! in step.

use contracts::{AccountId, Amount, Currency};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Description of the bearer scheme in this document.
pub const BEARER: &str =
    "PAGAMENTOS_API_TOKEN or PAGAMENTOS_ADMIN_TOKEN (required unless the service runs with --insecure-no-auth), or an API client's token (`pagamentos clients`): it debits and reads only its own accounts, its Idempotency-Keys its own";

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "pagamentos — transferencias",
        description = "Money transfers: accepted here, announced on Kafka through a transactional outbox, settled by the ledger. Amounts are integer cents."
    ),
    components(schemas(web::Problem, web::FieldError)),
    tags(
        (name = "transferencias", description = "Requesting and following transfers"),
        (name = "operations", description = "Health, readiness, metrics and this document")
    )
)]
#[derive(Debug)]
pub struct ApiDoc;

/// Body of `POST /transferencias`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferRequestBody {
    /// Never an `EMISSOR-…` account (the ledger's issuers).
    #[serde(rename = "contaOrigem")]
    pub source_account: AccountId,
    /// Must differ from `contaOrigem`.
    #[serde(rename = "contaDestino")]
    pub destination_account: AccountId,
    #[serde(rename = "valorEmCentavos")]
    pub amount_cents: Amount,
    #[serde(rename = "moeda")]
    pub currency: Currency,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Status, TransferRequest};
    use contracts::RejectionReason;
    use serde_json::{json, Value};

    fn schema(name: &str) -> Value {
        let document = serde_json::to_value(super::super::document()).expect("json");
        document["components"]["schemas"][name].clone()
    }

    #[test]
    fn the_documented_body_is_what_the_parser_reads() {
        let body = TransferRequestBody {
            source_account: AccountId::parse("CC-001").expect("an id"),
            destination_account: AccountId::parse("CC-002").expect("an id"),
            amount_cents: Amount::new(30_000).expect("positive"),
            currency: Currency::parse("BRL").expect("a currency"),
        };
        let value = serde_json::to_value(&body).expect("json");
        TransferRequest::parse(&value).expect("the documented body is accepted");
        // every documented field is required by the parser, under that name
        let object = value.as_object().expect("object");
        for field in object.keys() {
            let mut without = object.clone();
            without.remove(field);
            let errors = TransferRequest::parse(&Value::Object(without)).expect_err("refused");
            assert!(errors.iter().any(|error| error.field == field), "{field} not required by the parser");
        }
    }

    #[test]
    fn the_document_describes_the_contract_s_own_types() {
        let transfer = schema("Transfer");
        let reference = |property: &str| transfer["properties"][property]["$ref"].clone();
        assert_eq!(reference("status"), json!("#/components/schemas/TransferStatus"));
        assert_eq!(reference("contaOrigem"), json!("#/components/schemas/AccountId"));
        assert_eq!(reference("valorEmCentavos"), json!("#/components/schemas/Amount"));
        let statuses: Vec<Value> = Status::ALL.iter().map(|status| json!(status.as_str())).collect();
        assert_eq!(schema("TransferStatus")["enum"], json!(statuses));
        let reasons: Vec<Value> = RejectionReason::ALL.iter().map(|reason| json!(reason.as_str())).collect();
        assert_eq!(schema("RejectionReason")["enum"], json!(reasons));
        assert_eq!(schema("Amount")["minimum"], json!(1));
        let body = schema("TransferRequestBody");
        assert_eq!(body["properties"]["valorEmCentavos"]["$ref"], json!("#/components/schemas/Amount"));
    }

    #[test]
    fn the_frame_is_openapi_3_1_with_the_problem_schema() {
        let document = serde_json::to_value(<ApiDoc as utoipa::OpenApi>::openapi()).expect("json");
        assert_eq!(document["openapi"], "3.1.0");
        assert_eq!(document["info"]["version"], env!("CARGO_PKG_VERSION"));
        let required = schema("Problem")["required"].clone();
        for field in ["type", "title", "status", "detail"] {
            assert!(required.as_array().expect("required").contains(&json!(field)), "{field}");
        }
    }
}
