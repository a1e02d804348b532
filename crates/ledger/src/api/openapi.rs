//! The accounts API's OpenAPI 3.1 document, served at `GET /openapi.json` (`CONTRACT.md` §2).
//!
//! Written by hand next to the handlers it describes: a route or field added there is added
//! here in the same change (the test in `tests/api.rs` checks the routes match).

use serde_json::{json, Value};

/// The document.
pub fn document() -> Value {
    let problem = json!({"$ref": "#/components/schemas/Problem"});
    let problem_response = |description: &str| {
        json!({
            "description": description,
            "content": {"application/problem+json": {"schema": problem}}
        })
    };
    let account_path = json!({"name": "id", "in": "path", "required": true, "schema": {"$ref": "#/components/schemas/AccountId"}});
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "pagamentos — ledger",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Accounts of the double-entry ledger. Money enters only here: an opening balance or a deposit is a double entry from the currency's issuer account EMISSOR-<MOEDA>, so the balances of a currency always sum to 0. Amounts are integer cents."
        },
        "paths": {
            "/contas": {
                "post": {
                    "summary": "Create an account, optionally with an opening balance",
                    "description": "Needs the admin token when PAGAMENTOS_ADMIN_TOKEN is set. The opening balance is a deposit with id nameUUIDFromBytes(\"abertura:\" + id).",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AccountRequest"}}}},
                    "responses": {
                        "201": {
                            "description": "Created",
                            "headers": {"Location": {"schema": {"type": "string"}}},
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Account"}}}
                        },
                        "400": problem_response("Invalid request (EMISSOR-… ids are reserved); `errors` lists each broken rule"),
                        "401": problem_response("A bearer token is required"),
                        "403": problem_response("The admin token is required"),
                        "409": problem_response("The account exists"),
                        "413": problem_response("Body over 16 KiB"),
                        "415": problem_response("Body is not JSON")
                    }
                }
            },
            "/contas/{id}": {
                "get": {
                    "summary": "One account (issuer accounts included)",
                    "parameters": [account_path],
                    "responses": {
                        "200": {"description": "The account", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Account"}}}},
                        "400": problem_response("Malformed id"),
                        "401": problem_response("A bearer token is required"),
                        "404": problem_response("Unknown account")
                    }
                }
            },
            "/contas/{id}/depositos": {
                "post": {
                    "summary": "Deposit into an account, idempotent on depositoId",
                    "description": "Needs the admin token when PAGAMENTOS_ADMIN_TOKEN is set.",
                    "parameters": [account_path],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DepositRequest"}}}},
                    "responses": {
                        "201": {"description": "Deposited", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Deposit"}}}},
                        "200": {"description": "This deposit was made before: the original, no money moved", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Deposit"}}}},
                        "400": problem_response("Invalid request; `errors` lists each broken rule"),
                        "401": problem_response("A bearer token is required"),
                        "403": problem_response("The admin token is required"),
                        "404": problem_response("Unknown account (or an issuer account)"),
                        "413": problem_response("Body over 16 KiB"),
                        "415": problem_response("Body is not JSON"),
                        "422": problem_response("depositoId already used with another account or amount, or the balance would overflow")
                    }
                }
            },
            "/contas/{id}/lancamentos": {
                "get": {
                    "summary": "An account's entries, newest first",
                    "parameters": [
                        account_path,
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}}
                    ],
                    "responses": {
                        "200": {"description": "Entries", "content": {"application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/Entry"}}}}},
                        "400": problem_response("Malformed id or limit"),
                        "401": problem_response("A bearer token is required"),
                        "404": problem_response("Unknown account")
                    }
                }
            },
            "/healthz": {"get": {"summary": "Process alive", "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Database and Kafka reachable", "responses": {"200": {"description": "ready"}, "503": {"description": "not ready, with the failing dependencies"}}}},
            "/metrics": {"get": {"summary": "Prometheus text format", "responses": {"200": {"description": "metrics"}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "Required when PAGAMENTOS_API_TOKEN or PAGAMENTOS_ADMIN_TOKEN is set; writes need the admin token"}},
            "schemas": {
                "AccountId": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,32}$"},
                "AccountRequest": {
                    "type": "object",
                    "required": ["id", "moeda"],
                    "properties": {
                        "id": {"$ref": "#/components/schemas/AccountId", "description": "Must not start with EMISSOR-"},
                        "moeda": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "An active ISO 4217 code"},
                        "saldoInicialCentavos": {"type": "integer", "format": "int64", "minimum": 0, "default": 0}
                    }
                },
                "Account": {
                    "type": "object",
                    "required": ["id", "moeda", "saldoCentavos"],
                    "properties": {
                        "id": {"$ref": "#/components/schemas/AccountId"},
                        "moeda": {"type": "string"},
                        "saldoCentavos": {"type": "integer", "format": "int64", "description": "Negative only for an issuer account"}
                    }
                },
                "DepositRequest": {
                    "type": "object",
                    "required": ["depositoId", "valorEmCentavos"],
                    "properties": {
                        "depositoId": {"type": "string", "format": "uuid"},
                        "valorEmCentavos": {"type": "integer", "format": "int64", "minimum": 1}
                    }
                },
                "Deposit": {
                    "type": "object",
                    "required": ["depositoId", "contaId", "valorEmCentavos", "criadoEm"],
                    "properties": {
                        "depositoId": {"type": "string", "format": "uuid"},
                        "contaId": {"$ref": "#/components/schemas/AccountId"},
                        "valorEmCentavos": {"type": "integer", "format": "int64"},
                        "criadoEm": {"type": "string", "format": "date-time"}
                    }
                },
                "Entry": {
                    "type": "object",
                    "required": ["id", "transferenciaId", "tipo", "valorCentavos", "criadoEm"],
                    "properties": {
                        "id": {"type": "integer", "format": "int64"},
                        "transferenciaId": {"type": "string", "format": "uuid", "description": "The transfer's id, or the depositoId"},
                        "tipo": {"type": "string", "enum": ["D", "C"]},
                        "valorCentavos": {"type": "integer", "format": "int64"},
                        "criadoEm": {"type": "string", "format": "date-time"}
                    }
                },
                "Problem": {
                    "type": "object",
                    "required": ["type", "title", "status", "detail"],
                    "properties": {
                        "type": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                        "errors": {"type": "array", "items": {"type": "object", "required": ["field", "message"], "properties": {"field": {"type": "string"}, "message": {"type": "string"}}}}
                    }
                }
            }
        },
        "security": [{}, {"bearer": []}]
    })
}
