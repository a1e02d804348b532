//! The API's OpenAPI 3.1 document, served at `GET /openapi.json` (`CONTRACT.md` §2).
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
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "pagamentos — transferencias",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Money transfers: accepted here, announced on Kafka through a transactional outbox, settled by the ledger. Amounts are integer cents."
        },
        "paths": {
            "/transferencias": {
                "post": {
                    "summary": "Request a transfer",
                    "parameters": [{
                        "name": "Idempotency-Key", "in": "header", "required": false,
                        "description": "1–255 visible ASCII characters. The same key with the same request answers 202 again with Idempotent-Replayed: true; with another request 422; while the first is in flight 409.",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 255}
                    }],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TransferRequest"}}}},
                    "responses": {
                        "202": {
                            "description": "Accepted, status PENDENTE",
                            "headers": {
                                "Location": {"schema": {"type": "string"}},
                                "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}}
                            },
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Transfer"}}}
                        },
                        "400": problem_response("Invalid request; `errors` lists each broken rule"),
                        "401": problem_response("A bearer token is required"),
                        "409": problem_response("A request with this Idempotency-Key is in flight"),
                        "413": problem_response("Body over 16 KiB"),
                        "415": problem_response("Body is not JSON"),
                        "422": problem_response("Idempotency-Key already used with another request")
                    }
                },
                "get": {
                    "summary": "List transfers, newest first",
                    "parameters": [
                        {"name": "conta", "in": "query", "description": "Either side", "schema": {"$ref": "#/components/schemas/AccountId"}},
                        {"name": "status", "in": "query", "schema": {"$ref": "#/components/schemas/Status"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}}
                    ],
                    "responses": {
                        "200": {"description": "Transfers", "content": {"application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/Transfer"}}}}},
                        "400": problem_response("Bad query"),
                        "401": problem_response("A bearer token is required")
                    }
                }
            },
            "/transferencias/{id}": {
                "get": {
                    "summary": "One transfer",
                    "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string", "format": "uuid"}}],
                    "responses": {
                        "200": {"description": "The transfer", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Transfer"}}}},
                        "400": problem_response("Malformed id"),
                        "401": problem_response("A bearer token is required"),
                        "404": problem_response("Unknown transfer")
                    }
                }
            },
            "/healthz": {"get": {"summary": "Process alive", "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Database and Kafka reachable", "responses": {"200": {"description": "ready"}, "503": {"description": "not ready, with the failing dependencies"}}}},
            "/metrics": {"get": {"summary": "Prometheus text format", "responses": {"200": {"description": "metrics"}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "Required when PAGAMENTOS_API_TOKEN is set"}},
            "schemas": {
                "AccountId": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,32}$", "description": "EMISSOR-… accounts are reserved and never a side of a transfer"},
                "Status": {"type": "string", "enum": ["PENDENTE", "LIQUIDADA", "REJEITADA"]},
                "TransferRequest": {
                    "type": "object",
                    "required": ["contaOrigem", "contaDestino", "valorEmCentavos", "moeda"],
                    "properties": {
                        "contaOrigem": {"$ref": "#/components/schemas/AccountId"},
                        "contaDestino": {"$ref": "#/components/schemas/AccountId"},
                        "valorEmCentavos": {"type": "integer", "format": "int64", "minimum": 1},
                        "moeda": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "An active ISO 4217 code"}
                    }
                },
                "Transfer": {
                    "type": "object",
                    "required": ["id", "contaOrigem", "contaDestino", "valorEmCentavos", "moeda", "status", "motivoRejeicao", "criadaEm", "atualizadaEm"],
                    "properties": {
                        "id": {"type": "string", "format": "uuid"},
                        "contaOrigem": {"$ref": "#/components/schemas/AccountId"},
                        "contaDestino": {"$ref": "#/components/schemas/AccountId"},
                        "valorEmCentavos": {"type": "integer", "format": "int64"},
                        "moeda": {"type": "string"},
                        "status": {"$ref": "#/components/schemas/Status"},
                        "motivoRejeicao": {"type": ["string", "null"], "enum": ["BLOQUEADA_ANTIFRAUDE", "CONTA_INEXISTENTE", "MOEDA_INCOMPATIVEL", "SALDO_INSUFICIENTE", null]},
                        "criadaEm": {"type": "string", "format": "date-time"},
                        "atualizadaEm": {"type": "string", "format": "date-time"}
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
