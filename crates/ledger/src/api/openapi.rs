//! The accounts API's OpenAPI 3.1 document, served at `GET /openapi.json` (`docs/reference/contract.md` §2),
//! derived by utoipa from the handlers' `#[utoipa::path]` attributes and the types they answer
//! with.
//!
//! Request bodies are read field by field (so every broken rule gets its own message), not
//! deserialised into a type; [`AccountRequestBody`] and [`DepositRequestBody`] describe them
//! with the contract's own types (their schemas come from `contracts`, feature `openapi`), and
//! tests keep them and the handlers in step.

use contracts::{AccountId, Amount, Cents, Currency};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Description of the bearer scheme in this document.
pub const BEARER: &str =
    "PAGAMENTOS_API_TOKEN or PAGAMENTOS_ADMIN_TOKEN (required unless the service runs with --insecure-no-auth); creating accounts and deposits needs the admin token. An API client's token (`pagamentos clients`) reads only its own accounts";

#[derive(Debug, utoipa::OpenApi)]
#[openapi(
    info(
        title = "pagamentos — ledger",
        description = "Accounts of the double-entry ledger. Money enters only here: an opening balance or a deposit is a double entry from the currency's issuer account EMISSOR-<MOEDA>, so the balances of a currency always sum to 0. Amounts are integer cents."
    ),
    components(schemas(web::Problem, web::FieldError)),
    tags(
        (name = "contas", description = "Accounts, deposits and entries"),
        (name = "operations", description = "Health, readiness, metrics and this document")
    )
)]
pub struct ApiDoc;

/// Body of `POST /contas`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountRequestBody {
    /// Must not start with `EMISSOR-` (the issuers' accounts).
    pub id: AccountId,
    #[serde(rename = "moeda")]
    pub currency: Currency,
    /// Opening balance in cents, 0 or more (a deposit with id
    /// `nameUUIDFromBytes("abertura:" + id)`).
    #[schema(value_type = Option<i64>, minimum = 0, default = 0)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(rename = "saldoInicialCentavos")]
    pub opening_balance_cents: Option<Cents>,
}

/// Body of `POST /contas/{id}/depositos`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DepositRequestBody {
    /// The deposit's idempotency key: the same id again answers the original.
    #[serde(rename = "depositoId")]
    pub deposit_id: Uuid,
    #[serde(rename = "valorEmCentavos")]
    pub amount_cents: Amount,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_frame_is_openapi_3_1_with_the_problem_schema() {
        let document = serde_json::to_value(<ApiDoc as utoipa::OpenApi>::openapi()).expect("json");
        assert_eq!(document["openapi"], "3.1.0");
        assert_eq!(document["info"]["version"], env!("CARGO_PKG_VERSION"));
        assert!(document["components"]["schemas"]["Problem"].is_object());
    }

    #[test]
    fn the_document_describes_the_contract_s_own_types() {
        let document = serde_json::to_value(super::super::document()).expect("json");
        let schemas = &document["components"]["schemas"];
        assert_eq!(schemas["Entry"]["properties"]["tipo"]["$ref"], json!("#/components/schemas/EntryKind"));
        assert_eq!(schemas["EntryKind"]["enum"], json!(["D", "C"]));
        let deposit = &schemas["DepositRequestBody"]["properties"]["valorEmCentavos"];
        assert_eq!(deposit["$ref"], json!("#/components/schemas/Amount"));
        assert_eq!(schemas["Amount"]["minimum"], json!(1));
        assert_eq!(schemas["Account"]["properties"]["id"]["$ref"], json!("#/components/schemas/AccountId"));
    }
}
