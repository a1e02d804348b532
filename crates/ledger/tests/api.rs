//! The accounts API (docs/reference/contract.md §2) on the real service: status codes, problem+json, money
//! moved as double entries, idempotent deposits, tokens.

use crate::common;

use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

use common::{spawn_ledger, spawn_ledger_with_auth, TestLedger};

async fn post(ledger: &TestLedger, path: &str, body: Value) -> Response {
    ledger.http.post(ledger.url(path)).json(&body).send().await.expect("POST")
}

async fn get(ledger: &TestLedger, path: &str) -> Response {
    ledger.http.get(ledger.url(path)).send().await.expect("GET")
}

/// The status and the problem+json body of a refused request.
async fn problem(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let content_type = response.headers()["content-type"].to_str().expect("content type").to_owned();
    assert_eq!(content_type, "application/problem+json", "status {status}");
    (status, response.json().await.expect("problem body"))
}

async fn account_rows(ledger: &TestLedger) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM conta").fetch_one(ledger.pool()).await.expect("count")
}

#[tokio::test]
async fn an_account_is_created_once_and_its_opening_balance_is_a_double_entry() {
    let ledger = spawn_ledger().await;
    let response =
        post(&ledger, "/contas", json!({"id": "CC-1", "moeda": "BRL", "saldoInicialCentavos": 5_000})).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["location"], "/contas/CC-1");
    let body: Value = response.json().await.expect("body");
    assert_eq!(body, json!({"id": "CC-1", "moeda": "BRL", "saldoCentavos": 5_000}));

    let again = post(&ledger, "/contas", json!({"id": "CC-1", "moeda": "BRL"})).await;
    let (status, body) = problem(again).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(ledger.balance("CC-1").await, 5_000, "a refused creation changes nothing");
    assert_eq!(ledger.balance("EMISSOR-BRL").await, -5_000);

    let entries: Value = get(&ledger, "/contas/CC-1/lancamentos").await.json().await.expect("entries");
    let entries = entries.as_array().expect("array");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["tipo"], "C");
    assert_eq!(entries[0]["valorCentavos"], 5_000);
    assert_eq!(entries[0]["transferenciaId"], contracts::ids::opening_deposit_id("CC-1").to_string());

    let without_opening = post(&ledger, "/contas", json!({"id": "CC-2", "moeda": "USD"})).await;
    assert_eq!(without_opening.status(), StatusCode::CREATED);
    assert_eq!(ledger.balance("CC-2").await, 0);
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn an_opening_balance_past_what_the_issuer_can_owe_is_422_and_documented() {
    // found by Schemathesis: two opening balances of i64::MAX would take EMISSOR-BRL below
    // i64::MIN; the answer was right but missing from the OpenAPI document
    let ledger = spawn_ledger().await;
    let first =
        post(&ledger, "/contas", json!({"id": "BIG-1", "moeda": "BRL", "saldoInicialCentavos": i64::MAX}))
            .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let second =
        post(&ledger, "/contas", json!({"id": "BIG-2", "moeda": "BRL", "saldoInicialCentavos": i64::MAX}))
            .await;
    let (status, body) = problem(second).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["type"], "/problems/amount-out-of-range");
    assert_eq!(account_rows(&ledger).await, 2, "BIG-1 and the issuer; BIG-2 not created");
    ledger.assert_books_balance().await;
    let document: Value = get(&ledger, "/openapi.json").await.json().await.expect("document");
    let responses = &document["paths"]["/contas"]["post"]["responses"];
    assert!(responses.get("422").is_some(), "POST /contas documents 422: {responses}");
    ledger.stop().await;
}

#[tokio::test]
async fn bad_account_requests_get_a_clear_error_and_create_nothing() {
    let ledger = spawn_ledger().await;
    let cases = [
        (json!({"id": "EMISSOR-BRL", "moeda": "BRL"}), "id"),
        (json!({"id": "CC-1", "moeda": "real"}), "moeda"),
        (json!({"id": "CC-1", "moeda": "XYZ"}), "moeda"),
        (json!({"id": "CC-1", "moeda": "BRL", "saldoInicialCentavos": -1}), "saldoInicialCentavos"),
        (json!({"id": "CC-1", "moeda": "BRL", "saldoInicialCentavos": "10"}), "saldoInicialCentavos"),
        (json!({"moeda": "BRL"}), "id"),
        (json!({"id": "CC 1!", "moeda": "BRL"}), "id"),
        (json!({"id": "C".repeat(33), "moeda": "BRL"}), "id"),
        (json!({"id": "CC-1"}), "moeda"),
    ];
    for (body, field) in cases {
        let (status, problem) = problem(post(&ledger, "/contas", body.clone()).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert!(problem.to_string().contains(field), "{body}: the problem names {field}: {problem}");
    }
    let not_json = ledger
        .http
        .post(ledger.url("/contas"))
        .header("content-type", "text/plain")
        .body(r#"{"id":"CC-1","moeda":"BRL"}"#)
        .send()
        .await
        .expect("POST");
    assert_eq!(problem(not_json).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let malformed = ledger
        .http
        .post(ledger.url("/contas"))
        .header("content-type", "application/json")
        .body(r#"{"id":"CC-1","#)
        .send()
        .await
        .expect("POST");
    assert_eq!(problem(malformed).await.0, StatusCode::BAD_REQUEST);
    let huge = json!({"id": "CC-1", "moeda": "BRL", "padding": "x".repeat(17 * 1024)});
    assert_eq!(problem(post(&ledger, "/contas", huge).await).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(account_rows(&ledger).await, 0);
    ledger.stop().await;
}

#[tokio::test]
async fn a_deposit_is_made_once_per_deposit_id() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-1", "BRL", 0).await;
    ledger.create_account("CC-2", "BRL", 100).await;
    let id = Uuid::new_v4();
    let first =
        post(&ledger, "/contas/CC-1/depositos", json!({"depositoId": id, "valorEmCentavos": 700})).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("body");
    assert_eq!(first["depositoId"], id.to_string());
    let replay =
        post(&ledger, "/contas/CC-1/depositos", json!({"depositoId": id, "valorEmCentavos": 700})).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.json::<Value>().await.expect("body"), first, "the original deposit, as it was");

    let other_amount =
        post(&ledger, "/contas/CC-1/depositos", json!({"depositoId": id, "valorEmCentavos": 701})).await;
    assert_eq!(problem(other_amount).await.0, StatusCode::UNPROCESSABLE_ENTITY);
    let other_account =
        post(&ledger, "/contas/CC-2/depositos", json!({"depositoId": id, "valorEmCentavos": 700})).await;
    assert_eq!(problem(other_account).await.0, StatusCode::UNPROCESSABLE_ENTITY);
    for account in ["CC-9", "EMISSOR-BRL"] {
        let response = post(
            &ledger,
            &format!("/contas/{account}/depositos"),
            json!({"depositoId": Uuid::new_v4(), "valorEmCentavos": 1}),
        )
        .await;
        assert_eq!(problem(response).await.0, StatusCode::NOT_FOUND, "{account}");
    }
    for body in [
        json!({"depositoId": Uuid::new_v4(), "valorEmCentavos": 0}),
        json!({"depositoId": Uuid::new_v4(), "valorEmCentavos": -5}),
        json!({"depositoId": "not-a-uuid", "valorEmCentavos": 5}),
        json!({"valorEmCentavos": 5}),
        json!({"depositoId": Uuid::new_v4()}),
    ] {
        let response = post(&ledger, "/contas/CC-1/depositos", body.clone()).await;
        assert_eq!(problem(response).await.0, StatusCode::BAD_REQUEST, "{body}");
    }
    assert_eq!(ledger.balance("CC-1").await, 700, "one deposit moved money");
    assert_eq!(ledger.balance("CC-2").await, 100);
    assert_eq!(ledger.balance("EMISSOR-BRL").await, -800);
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn twenty_concurrent_deposits_with_one_id_move_the_money_once() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-1", "BRL", 0).await;
    let id = Uuid::new_v4();
    let requests = (0..20).map(|_| {
        let ledger = &ledger;
        async move {
            post(ledger, "/contas/CC-1/depositos", json!({"depositoId": id, "valorEmCentavos": 250}))
                .await
                .status()
        }
    });
    let statuses = futures::future::join_all(requests).await;
    let created = statuses.iter().filter(|status| **status == StatusCode::CREATED).count();
    let replayed = statuses.iter().filter(|status| **status == StatusCode::OK).count();
    assert_eq!((created, replayed), (1, 19), "{statuses:?}");
    assert_eq!(ledger.balance("CC-1").await, 250);
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn accounts_and_their_entries_are_read_newest_first() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-1", "BRL", 100).await;
    for cents in [1, 2, 3] {
        ledger.deposit("CC-1", cents).await;
    }
    let account: Value = get(&ledger, "/contas/CC-1").await.json().await.expect("account");
    assert_eq!(account, json!({"id": "CC-1", "moeda": "BRL", "saldoCentavos": 106}));
    let issuer: Value = get(&ledger, "/contas/EMISSOR-BRL").await.json().await.expect("issuer");
    assert_eq!(issuer["saldoCentavos"], -106);

    let entries: Value = get(&ledger, "/contas/CC-1/lancamentos").await.json().await.expect("entries");
    let amounts: Vec<i64> = entries
        .as_array()
        .expect("array")
        .iter()
        .map(|entry| entry["valorCentavos"].as_i64().expect("cents"))
        .collect();
    assert_eq!(amounts, [3, 2, 1, 100]);
    let two: Value = get(&ledger, "/contas/CC-1/lancamentos?limit=2").await.json().await.expect("entries");
    assert_eq!(two.as_array().expect("array").len(), 2);
    assert_eq!(two[0]["valorCentavos"], 3);

    assert_eq!(problem(get(&ledger, "/contas/CC-9").await).await.0, StatusCode::NOT_FOUND);
    assert_eq!(problem(get(&ledger, "/contas/CC-9/lancamentos").await).await.0, StatusCode::NOT_FOUND);
    assert_eq!(problem(get(&ledger, "/contas/bad%20id!").await).await.0, StatusCode::BAD_REQUEST);
    for limit in ["0", "-1", "abc", "100000"] {
        let response = get(&ledger, &format!("/contas/CC-1/lancamentos?limit={limit}")).await;
        assert_eq!(problem(response).await.0, StatusCode::BAD_REQUEST, "limit={limit}");
    }
    assert_eq!(problem(get(&ledger, "/nope").await).await.0, StatusCode::NOT_FOUND);
    ledger.stop().await;
}

#[tokio::test]
async fn with_tokens_writes_need_the_admin_token_and_reads_either() {
    let ledger = spawn_ledger_with_auth(1, web::AuthArgs::tokens("api-secret", "admin-secret"), |_| {}).await;
    let create = |token: Option<&'static str>, id: &'static str| {
        let mut request = ledger
            .http
            .post(ledger.url("/contas"))
            .json(&json!({"id": id, "moeda": "BRL", "saldoInicialCentavos": 10}));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    assert_eq!(problem(create(None, "CC-1").await.expect("POST")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(problem(create(Some("wrong"), "CC-1").await.expect("POST")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        problem(create(Some("api-secret"), "CC-1").await.expect("POST")).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(create(Some("admin-secret"), "CC-1").await.expect("POST").status(), StatusCode::CREATED);

    let deposit = |token: &'static str| {
        ledger
            .http
            .post(ledger.url("/contas/CC-1/depositos"))
            .bearer_auth(token)
            .json(&json!({"depositoId": Uuid::new_v4(), "valorEmCentavos": 5}))
            .send()
    };
    assert_eq!(problem(deposit("api-secret").await.expect("POST")).await.0, StatusCode::FORBIDDEN);
    assert_eq!(deposit("admin-secret").await.expect("POST").status(), StatusCode::CREATED);

    assert_eq!(problem(get(&ledger, "/contas/CC-1").await).await.0, StatusCode::UNAUTHORIZED);
    for token in ["api-secret", "admin-secret"] {
        let response =
            ledger.http.get(ledger.url("/contas/CC-1")).bearer_auth(token).send().await.expect("GET");
        assert_eq!(response.status(), StatusCode::OK, "{token}");
        let response = ledger
            .http
            .get(ledger.url("/contas/CC-1/lancamentos"))
            .bearer_auth(token)
            .send()
            .await
            .expect("GET");
        assert_eq!(response.status(), StatusCode::OK, "{token}");
    }
    // health, metrics and the API document stay open to probes and scrapers
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(get(&ledger, path).await.status(), StatusCode::OK, "{path}");
    }
    assert_eq!(ledger.balance("CC-1").await, 15);
    ledger.stop().await;
}

#[tokio::test]
async fn the_openapi_document_lists_every_route() {
    let ledger = spawn_ledger().await;
    let document: Value = get(&ledger, "/openapi.json").await.json().await.expect("document");
    assert!(document["openapi"].as_str().expect("version").starts_with("3.1"));
    let paths = document["paths"].as_object().expect("paths");
    let mut documented = Vec::new();
    for (path, item) in paths {
        for method in item.as_object().expect("path item").keys() {
            documented.push(format!("{method} {path}"));
        }
    }
    documented.sort();
    assert_eq!(
        documented,
        [
            "get /contas/{id}",
            "get /contas/{id}/lancamentos",
            "get /healthz",
            "get /metrics",
            "get /openapi.json",
            "get /readyz",
            "post /contas",
            "post /contas/{id}/depositos",
        ]
    );
    // every documented route is served (anything but the fallback's "no such route")
    for route in &documented {
        let (method, path) = route.split_once(' ').expect("route");
        let url = ledger.url(&path.replace("{id}", "CC-OPENAPI"));
        let request = match method {
            "post" => ledger.http.post(url).json(&json!({})),
            _ => ledger.http.get(url),
        };
        let answer: Value = request.send().await.expect("send").json().await.unwrap_or(Value::Null);
        assert_ne!(answer["detail"], "no such route", "{route}");
    }
    assert_eq!(document["security"], json!([{"bearer": []}]));
    assert_eq!(document["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    ledger.stop().await;
}

/// `body` without each of `fields` in turn is refused with a 400 naming that field.
async fn refuses_each_missing(ledger: &TestLedger, path: &str, body: &Value, fields: &[String]) {
    for field in fields {
        let mut without = body.clone();
        without.as_object_mut().expect("object").remove(field);
        let (status, refusal) = problem(post(ledger, path, without).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} without {field}");
        assert_eq!(refusal["errors"][0]["field"], field.as_str());
    }
}

/// The documented request bodies are what the handlers read: an example built from each schema's
/// properties is accepted, and every property the schema requires is required by the handler.
#[tokio::test]
async fn the_documented_request_bodies_are_what_the_handlers_read() {
    let ledger = spawn_ledger().await;
    let document: Value = get(&ledger, "/openapi.json").await.json().await.expect("document");
    let schemas = &document["components"]["schemas"];
    let example = |name: &str, values: &Value| -> Value {
        let properties = schemas[name]["properties"].as_object().expect("properties");
        let mut body = serde_json::Map::new();
        for field in properties.keys() {
            body.insert(field.clone(), values[field].clone());
        }
        assert_eq!(body.len(), values.as_object().expect("values").len(), "{name} documents other fields");
        Value::Object(body)
    };
    let required = |name: &str| -> Vec<String> {
        schemas[name]["required"]
            .as_array()
            .expect("required")
            .iter()
            .map(|field| field.as_str().expect("name").to_owned())
            .collect()
    };

    let account =
        example("AccountRequestBody", &json!({"id": "CC-DOC", "moeda": "BRL", "saldoInicialCentavos": 100}));
    assert_eq!(required("AccountRequestBody"), ["id", "moeda"]);
    assert_eq!(post(&ledger, "/contas", account.clone()).await.status(), StatusCode::CREATED);
    refuses_each_missing(&ledger, "/contas", &account, &required("AccountRequestBody")).await;

    let deposit = example(
        "DepositRequestBody",
        &json!({"depositoId": "0b7e6b2c-3f7a-4d3e-9a51-0c1d2e3f4a5b", "valorEmCentavos": 5}),
    );
    assert_eq!(required("DepositRequestBody"), ["depositoId", "valorEmCentavos"]);
    assert_eq!(
        post(&ledger, "/contas/CC-DOC/depositos", deposit.clone()).await.status(),
        StatusCode::CREATED
    );
    refuses_each_missing(&ledger, "/contas/CC-DOC/depositos", &deposit, &required("DepositRequestBody"))
        .await;
    // and what the handlers answer has the documented required fields
    let account: Value = get(&ledger, "/contas/CC-DOC").await.json().await.expect("account");
    for field in required("Account") {
        assert!(account.get(&field).is_some(), "Account.{field} not answered");
    }
    ledger.stop().await;
}
