//! Hostile HTTP input against the transfers API, in process: arbitrary bytes as bodies, content
//! types, `Idempotency-Key`s, ids and queries. Whatever arrives, the answer is a problem+json
//! 4xx (or `503` when a well-formed request needs the database, which here is unreachable:
//! a pool that never connects), never a `500`, never a panic, and it names the status it has.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request};
use proptest::prelude::*;
use serde_json::Value;
use tower::ServiceExt;

fn app() -> axum::Router {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(40))
        .connect_lazy("postgres://nobody:nothing@127.0.0.1:1/none")
        .expect("lazy pool");
    transfers::api::router(transfers::api::AppState {
        writer: transfers::writer::Writer::direct(pool.clone(), outbox::Waker::default()),
        pool,
        requested_topic: "t.transferencias.solicitada".into(),
        idempotency_ttl: Duration::from_secs(60),
        idempotency_key_required: true,
        tokens: web::Tokens::Disabled,
        backlog: outbox::metrics::Backlog::default(),
        max_pending: 100_000,
    })
}

/// Sends `request`; checks the answer's shape; returns its status.
fn answer(runtime: &tokio::runtime::Runtime, request: Request<Body>) -> Result<u16, TestCaseError> {
    let (status, content_type, body) = runtime.block_on(async {
        let response = app().oneshot(request).await.expect("infallible");
        let status = response.status().as_u16();
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        (status, content_type, body)
    });
    prop_assert!(status != 500, "500 for a hostile request: {}", String::from_utf8_lossy(&body));
    prop_assert!((400..500).contains(&status) || status == 503, "unexpected status {status}");
    prop_assert_eq!(content_type, Some(HeaderValue::from_static("application/problem+json")));
    let problem: Value =
        serde_json::from_slice(&body).map_err(|error| TestCaseError::fail(error.to_string()))?;
    prop_assert_eq!(problem["status"].as_u64(), Some(u64::from(status)));
    prop_assert!(problem["type"].as_str().is_some_and(|kind| kind.starts_with("/problems/")));
    prop_assert!(problem["detail"].as_str().is_some_and(|detail| !detail.is_empty()));
    Ok(status)
}

/// Bodies: raw bytes, JSON-looking text, JSON with the right fields holding anything, huge ones.
fn bodies() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        Just(serde_json::json!({"nested": [1, 2]})),
        Just(Value::from(u64::MAX)),
    ];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        "\\PC{0,300}".prop_map(String::into_bytes),
        (field.clone(), field.clone(), field.clone(), field).prop_map(|(source, destination, amount, currency)| {
            serde_json::to_vec(&serde_json::json!({
                "contaOrigem": source, "contaDestino": destination, "valorEmCentavos": amount, "moeda": currency
            }))
            .expect("json")
        }),
        // well-formed ones too: they pass validation and meet the unreachable database
        ("[A-Za-z0-9_-]{1,33}", "[A-Za-z0-9_-]{1,33}", any::<i64>(), prop_oneof![Just("BRL"), Just("USD"), Just("real")])
            .prop_map(|(source, destination, amount, currency)| {
                serde_json::to_vec(&serde_json::json!({
                    "contaOrigem": source, "contaDestino": destination, "valorEmCentavos": amount, "moeda": currency
                }))
                .expect("json")
            }),
        (16_000usize..20_000).prop_map(|size| {
            let mut body = b"{\"contaOrigem\":\"".to_vec();
            body.resize(size, b'A');
            body
        }),
    ]
}

fn content_types() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        Just(Some(b"application/json".to_vec())),
        Just(Some(b"application/json; charset=utf-8".to_vec())),
        Just(Some(b"text/plain".to_vec())),
        Just(None),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Some),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn hostile_posts_get_a_problem_never_a_500(
        body in bodies(),
        content_type in content_types(),
        key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let mut request = Request::builder().method(Method::POST).uri("/transferencias");
        if let Some(content_type) = content_type.and_then(|bytes| HeaderValue::from_bytes(&bytes).ok()) {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        if let Some(key) = key.and_then(|bytes| HeaderValue::from_bytes(&bytes).ok()) {
            request = request.header("Idempotency-Key", key);
        }
        let status = answer(&runtime, request.body(Body::from(body)).expect("request"))?;
        prop_assert!(status != 202, "accepted without a database");
    }
}

proptest! {
    // ids and queries that parse reach the (unreachable) database: a pool timeout each
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    #[test]
    fn hostile_ids_and_queries_get_a_problem_never_a_500(
        id in prop_oneof!["[^/?#]{1,80}", any::<u128>().prop_map(|bits| uuid::Uuid::from_u128(bits).to_string())],
        query in "[ -~]{0,120}",
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let encoded: String =
            id.bytes().map(|byte| if byte.is_ascii_alphanumeric() { (byte as char).to_string() } else { format!("%{byte:02X}") }).collect();
        let get = Request::get(format!("/transferencias/{encoded}")).body(Body::empty()).expect("request");
        answer(&runtime, get)?;
        let encoded_query: String = query
            .bytes()
            .map(|byte| if byte.is_ascii_alphanumeric() || b"=&_-".contains(&byte) { (byte as char).to_string() } else { format!("%{byte:02X}") })
            .collect();
        let list = Request::get(format!("/transferencias?{encoded_query}")).body(Body::empty()).expect("request");
        answer(&runtime, list)?;
    }
}
