//! The transfers API against the real stack: what a client sees, and what reaches Kafka.

use crate::common;

use kafka::rdkafka::message::Message;
use serde_json::{json, Value};

use common::{header, payload, receive, spawn_app, spawn_app_with, spawn_app_with_auth, transfer};
use contracts::topics;

#[tokio::test]
async fn an_accepted_transfer_is_announced_exactly_once_as_committed() {
    let app = spawn_app().await;
    let reader = app.reader(topics::REQUESTED);

    let response = app.post_transfer(&transfer("CC-001", "CC-002", 30_000), None).await;
    assert_eq!(response.status(), 202);
    let location = response.headers()["location"].to_str().expect("location").to_owned();
    let body: Value = response.json().await.expect("body");
    let id = body["id"].as_str().expect("id").to_owned();
    assert_eq!(location, format!("/transferencias/{id}"));
    assert_eq!(body["status"], "PENDENTE");
    assert_eq!(body["motivoRejeicao"], Value::Null);
    assert_eq!(body["valorEmCentavos"], 30_000);

    let record = receive(&reader, 1).await.remove(0);
    assert_eq!(record.key(), Some(b"CC-001".as_slice()));
    let event = payload(&record);
    assert_eq!(event["transferenciaId"], id.as_str());
    assert_eq!(event["contaOrigem"], "CC-001");
    assert_eq!(event["contaDestino"], "CC-002");
    assert_eq!(event["valorEmCentavos"], 30_000);
    assert_eq!(event["moeda"], "BRL");
    assert_eq!(event["criadaEm"], body["criadaEm"], "the event's timestamp is the row's");
    assert_eq!(header(&record, "evento-id").as_deref(), event["eventoId"].as_str());
    assert_eq!(header(&record, "evento-tipo").as_deref(), Some("TransferenciaSolicitada"));
    let traceparent = header(&record, "traceparent").expect("traceparent header");
    assert_eq!(traceparent.len(), 55, "{traceparent}");

    let fetched: Value = app.get_transfer(&id).await.json().await.expect("body");
    assert_eq!(fetched, body);
    // every outbox row is published (acknowledged) by now: the topic holds all it ever will
    testkit::outbox_published(&app.database.pool).await;
    let written = testkit::records_written(&app.topics.args, &app.topics.topic(topics::REQUESTED)).await;
    assert_eq!(written, 1, "one transfer, one event");
    app.stop().await;
}

#[tokio::test]
async fn an_idempotent_replay_returns_the_original_and_publishes_nothing() {
    let app = spawn_app().await;
    let body = transfer("CC-001", "CC-002", 500);
    let first = app.post_transfer(&body, Some("key-1")).await;
    assert_eq!(first.status(), 202);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.expect("body");

    // the same request, keys in another order: the same meaning
    let reordered =
        json!({"moeda": "BRL", "valorEmCentavos": 500, "contaDestino": "CC-002", "contaOrigem": "CC-001"});
    let again = app.post_transfer(&reordered, Some("key-1")).await;
    assert_eq!(again.status(), 202);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.expect("body");
    assert_eq!(again["id"], first["id"]);

    let misuse = app.post_transfer(&transfer("CC-001", "CC-002", 501), Some("key-1")).await;
    assert_eq!(misuse.status(), 422);
    assert_eq!(misuse.headers()["content-type"], "application/problem+json");

    // another key is another transfer
    let other = app.post_transfer(&body, Some("key-2")).await;
    let other: Value = other.json().await.expect("body");
    assert_ne!(other["id"], first["id"]);
    assert_eq!(app.outbox_rows().await, 2, "a replay writes no event");
    app.stop().await;
}

/// The expired-key cleanup takes no lock: deleting the row between a request's claim (which
/// met it) and its look at what was in the way must not turn the request into a `409`.
#[tokio::test]
async fn an_expired_key_is_claimed_again_while_the_cleanup_deletes_it() {
    let app = spawn_app().await;
    for round in 0..40 {
        let key = format!("race-{round}");
        let first = app.post_transfer(&transfer("CC-001", "CC-002", 500), Some(&key)).await;
        assert_eq!(first.status(), 202);
        sqlx::query("UPDATE chave_idempotencia SET expira_em = now() - interval '1 second' WHERE chave = $1")
            .bind(&key)
            .execute(&app.database.pool)
            .await
            .expect("expire the key");
        let body = transfer("CC-001", "CC-002", 999);
        let (again, cleanup) = tokio::join!(
            app.post_transfer(&body, Some(&key)),
            transfers::store::delete_expired_keys(&app.database.pool),
        );
        cleanup.expect("cleanup");
        assert_eq!(again.status(), 202, "round {round}: a new transfer, the cleanup or not");
        assert!(again.headers().get("idempotent-replayed").is_none());
    }
    app.stop().await;
}

#[tokio::test]
async fn an_expired_key_is_forgotten() {
    let app = spawn_app().await;
    let first: Value =
        app.post_transfer(&transfer("CC-001", "CC-002", 500), Some("old")).await.json().await.expect("body");
    sqlx::query("UPDATE chave_idempotencia SET expira_em = now() - interval '1 second'")
        .execute(&app.database.pool)
        .await
        .expect("expire the key");
    // another request with the expired key is a new transfer, not a 422
    let second = app.post_transfer(&transfer("CC-001", "CC-002", 999), Some("old")).await;
    assert_eq!(second.status(), 202);
    assert!(second.headers().get("idempotent-replayed").is_none());
    let second: Value = second.json().await.expect("body");
    assert_ne!(second["id"], first["id"]);
    let replay = app.post_transfer(&transfer("CC-001", "CC-002", 999), Some("old")).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay: Value = replay.json().await.expect("body");
    assert_eq!(replay["id"], second["id"]);
    app.stop().await;
}

#[tokio::test]
async fn fifty_concurrent_requests_with_one_key_create_one_transfer() {
    let app = spawn_app().await;
    let body = transfer("CC-001", "CC-002", 700);
    let requests = (0..50).map(|_| app.post_transfer(&body, Some("same-key")));
    let responses = futures::future::join_all(requests).await;
    let mut ids = std::collections::HashSet::new();
    for response in responses {
        match response.status().as_u16() {
            202 => {
                let body: Value = response.json().await.expect("body");
                ids.insert(body["id"].as_str().expect("id").to_owned());
            }
            409 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ids.len(), 1, "every 202 names the same transfer");
    let transfers: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia")
        .fetch_one(&app.database.pool)
        .await
        .expect("count");
    assert_eq!(transfers, 1);
    assert_eq!(app.outbox_rows().await, 1);
    app.stop().await;
}

#[tokio::test]
async fn a_key_held_by_a_request_in_flight_is_answered_409_without_waiting_for_it() {
    // no server-side limit ends a wait for the key's lock before the client's own limit
    let app = spawn_app_with(|args| {
        args.database_lock_timeout_ms = 600_000;
        args.database_statement_timeout_ms = 600_000;
    })
    .await;
    // what a request in flight holds between its claim and its commit: the key's lock
    let mut in_flight = app.database.pool.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('anonimo'), hashtext('busy-key'))")
        .execute(&mut *in_flight)
        .await
        .expect("hold the key's lock");
    let body = transfer("CC-001", "CC-002", 700);
    let response = tokio::time::timeout(testkit::PATIENCE, app.post_transfer(&body, Some("busy-key")))
        .await
        .expect("answered while the other request is still in flight, not after it");
    assert_eq!(response.status(), 409);
    let problem: Value = response.json().await.expect("problem");
    assert_eq!(problem["type"], "/problems/idempotency-key-in-flight");
    assert_eq!(app.outbox_rows().await, 0);
    in_flight.rollback().await.expect("the other request gives up");
    let response = app.post_transfer(&body, Some("busy-key")).await;
    assert_eq!(response.status(), 202, "the key is free again");
    assert_eq!(app.outbox_rows().await, 1);
    app.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_problem_and_never_a_5xx() {
    let app = spawn_app().await;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"contaDestino": "B", "valorEmCentavos": 1, "moeda": "BRL"}), "contaOrigem"),
        (transfer("A", "A", 1), "contaDestino"),
        (transfer("A", "B", 0), "valorEmCentavos"),
        (transfer("A", "B", -3), "valorEmCentavos"),
        (
            json!({"contaOrigem": "A", "contaDestino": "B", "valorEmCentavos": 1.5, "moeda": "BRL"}),
            "valorEmCentavos",
        ),
        (
            json!({"contaOrigem": "A", "contaDestino": "B", "valorEmCentavos": "1", "moeda": "BRL"}),
            "valorEmCentavos",
        ),
        (json!({"contaOrigem": "A", "contaDestino": "B", "valorEmCentavos": 1, "moeda": "real"}), "moeda"),
        (json!({"contaOrigem": "A", "contaDestino": "B", "valorEmCentavos": 1, "moeda": "XYZ"}), "moeda"),
        (transfer("EMISSOR-BRL", "B", 1), "contaOrigem"),
        (transfer("A", "EMISSOR-BRL", 1), "contaDestino"),
        (transfer(&"x".repeat(33), "B", 1), "contaOrigem"),
        (transfer("A B", "B", 1), "contaOrigem"),
        (json!("not an object"), "body"),
    ];
    for (body, field) in cases {
        let response = app.post_transfer(&body, None).await;
        assert_eq!(response.status(), 400, "{body}");
        assert_eq!(response.headers()["content-type"], "application/problem+json");
        let problem: Value = response.json().await.expect("problem");
        assert_eq!(problem["status"], 400);
        assert!(problem["type"].is_string() && problem["title"].is_string() && problem["detail"].is_string());
        assert_eq!(problem["errors"][0]["field"], field, "{body}: {problem}");
    }

    let raw = |content_type: &'static str, body: Vec<u8>| {
        app.http.post(app.url("/transferencias")).header("content-type", content_type).body(body).send()
    };
    let malformed = raw("application/json", b"{\"contaOrigem\": ".to_vec()).await.expect("send");
    assert_eq!(malformed.status(), 400);
    assert_eq!(malformed.headers()["content-type"], "application/problem+json");
    let form = raw("application/x-www-form-urlencoded", b"a=b".to_vec()).await.expect("send");
    assert_eq!(form.status(), 415);
    let mut huge = transfer("A", "B", 1);
    huge["padding"] = json!("x".repeat(17 * 1024));
    let too_large = raw("application/json", serde_json::to_vec(&huge).expect("json")).await.expect("send");
    assert_eq!(too_large.status(), 413);
    assert_eq!(too_large.headers()["content-type"], "application/problem+json");

    let bad_key = app
        .http
        .post(app.url("/transferencias"))
        .header("Idempotency-Key", "has space")
        .json(&transfer("A", "B", 1))
        .send()
        .await
        .expect("send");
    assert_eq!(bad_key.status(), 400);

    assert_eq!(app.get_transfer("not-a-uuid").await.status(), 400);
    assert_eq!(app.get_transfer("3f2c9a4e-1b7d-4c8e-9f00-5a6b7c8d9e01").await.status(), 404);
    for query in ["?limit=0", "?limit=501", "?limit=x", "?status=PAGA", "?conta=a%20b"] {
        let response = app.http.get(app.url(&format!("/transferencias{query}"))).send().await.expect("send");
        assert_eq!(response.status(), 400, "{query}");
    }
    assert_eq!(app.outbox_rows().await, 0, "bad input writes nothing");
    app.stop().await;
}

#[tokio::test]
async fn listing_filters_by_either_side_and_status_newest_first() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for (source, destination) in [("A", "B"), ("C", "A"), ("C", "D"), ("A", "D")] {
        let body: Value =
            app.post_transfer(&transfer(source, destination, 10), None).await.json().await.expect("body");
        ids.push(body["id"].as_str().expect("id").to_owned());
    }
    let app = &app;
    let list = |query: &'static str| async move {
        let response = app.http.get(app.url(&format!("/transferencias{query}"))).send().await.expect("send");
        assert_eq!(response.status(), 200, "{query}");
        let rows: Vec<Value> = response.json().await.expect("rows");
        rows.into_iter().map(|row| row["id"].as_str().expect("id").to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(list("?conta=A").await, [ids[3].clone(), ids[1].clone(), ids[0].clone()]);
    assert_eq!(list("?conta=A&limit=2").await, [ids[3].clone(), ids[1].clone()]);
    assert_eq!(list("?status=PENDENTE").await.len(), 4);
    assert_eq!(list("?status=LIQUIDADA").await.len(), 0);
    assert_eq!(list("").await.first(), Some(&ids[3]));
}

#[tokio::test]
async fn with_tokens_every_api_route_requires_one() {
    let app = spawn_app_with_auth(web::AuthArgs::tokens("api-secret", "admin-secret"), |_| {}).await;
    let body = transfer("A", "B", 1);
    let post = |token: Option<&'static str>, key: &'static str| {
        let mut request =
            app.http.post(app.url("/transferencias")).header("Idempotency-Key", key).json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let anonymous = post(None, "k0").await.expect("send");
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    assert_eq!(post(Some("nope"), "k0").await.expect("send").status(), 401);
    for token in ["api-secret", "admin-secret"] {
        assert_eq!(post(Some(token), "k1").await.expect("send").status(), 202, "{token}");
    }
    let list = app.http.get(app.url("/transferencias")).send().await.expect("send");
    assert_eq!(list.status(), 401);
    // keys are scoped by caller: the same key from two callers is two transfers
    let a: Value = post(Some("api-secret"), "k").await.expect("send").json().await.expect("body");
    let b: Value = post(Some("admin-secret"), "k").await.expect("send").json().await.expect("body");
    assert_ne!(a["id"], b["id"]);
    // health, metrics and the API document stay open; /readyz has nothing to warn about
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(app.http.get(app.url(path)).send().await.expect("send").status(), 200, "{path}");
    }
    let ready = app.http.get(app.url("/readyz")).send().await.expect("send").text().await.expect("text");
    assert_eq!(ready, "ready\n");
    app.stop().await;
}

#[tokio::test]
async fn without_tokens_the_service_refuses_to_start_unless_told_to_run_open() {
    let database = testkit::TestDatabase::create(&transfers::MIGRATOR).await;
    let topics = testkit::TestTopics::plan(1).await;
    let settings = |auth: web::AuthArgs| transfers::Settings {
        args: transfers::TransfersArgs {
            listen: "127.0.0.1:0".parse().expect("address"),
            database_url: database.url.clone(),
            database_connections: 2,
            database_statement_timeout_ms: 30_000,
            database_lock_timeout_ms: 10_000,
            database_idle_in_transaction_timeout_ms: 180_000,
            database_acquire_timeout_ms: 10_000,
            idempotency_key_ttl_seconds: 60,
            outbox_retention_seconds: 60,
            outbox_max_pending: 10,
            idempotency_key_required: true,
        },
        auth,
        kafka: topics.args.clone(),
        topics: kafka::TopicArgs { partitions: 1, replicas: 1 },
        profile: kafka::Profile::Fast,
        metrics: telemetry::health::MetricsRoute::ServicePort,
        producer: None,
    };
    for auth in [
        web::AuthArgs::default(),
        web::AuthArgs { api_token: Some("only-api".into()), ..web::AuthArgs::default() },
        web::AuthArgs::tokens("same", "same"),
    ] {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let tracker = tokio_util::task::TaskTracker::new();
        let refused = transfers::start(
            settings(auth.clone()),
            &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
        )
        .await;
        assert!(matches!(refused, Err(transfers::Error::Auth(_))), "{auth:?}: {refused:?}");
        assert!(tracker.is_empty(), "{auth:?}: nothing was started");
    }
    // the open mode is explicit, and /readyz says so (and, after it, that the test's database
    // is reached as its owner, issue #46)
    let app = spawn_app_with_auth(web::AuthArgs::insecure(), |_| {}).await;
    let ready = app.http.get(app.url("/readyz")).send().await.expect("send");
    assert_eq!(ready.status(), 200);
    let role = app.database.pool.connect_options().get_username().to_owned();
    let owner = database::schema::Prepared::Migrated { role }.owner_warning("transferencias").expect("owner");
    assert_eq!(
        ready.text().await.expect("text"),
        format!(
            "ready\nwarning: authentication disabled (--insecure-no-auth): every caller is an admin\n\
             warning: {owner}\n"
        )
    );
    app.stop().await;
}

#[tokio::test]
async fn the_idempotency_key_is_required_unless_configured_optional() {
    let app = spawn_app().await;
    let missing = app.post_transfer_with(&transfer("A", "B", 1), None).await;
    assert_eq!(missing.status(), 400);
    let problem: Value = missing.json().await.expect("problem");
    assert_eq!(problem["type"], "/problems/validation");
    assert_eq!(problem["errors"][0]["field"], "Idempotency-Key", "{problem}");
    assert_eq!(app.outbox_rows().await, 0, "nothing was written");
    app.stop().await;

    // the article's API: the key is optional
    let open = spawn_app_with(|args| args.idempotency_key_required = false).await;
    let response = open.post_transfer_with(&transfer("A", "B", 1), None).await;
    assert_eq!(response.status(), 202);
    open.stop().await;
}

#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let app = spawn_app().await;
    let response = app.http.get(app.url("/openapi.json")).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let document: Value = response.json().await.expect("json");
    assert_eq!(document["openapi"], "3.1.0");
    let paths = document["paths"].as_object().expect("paths");
    for (path, methods) in [
        ("/transferencias", vec!["post", "get"]),
        ("/transferencias/{id}", vec!["get"]),
        ("/healthz", vec!["get"]),
        ("/readyz", vec!["get"]),
        ("/metrics", vec!["get"]),
        ("/openapi.json", vec!["get"]),
    ] {
        for method in methods {
            assert!(paths[path][method].is_object(), "{method} {path} undocumented");
            // and the route really exists: anything but the fallback's 404 "no such route"
            let url = app.url(&path.replace("{id}", "3f2c9a4e-1b7d-4c8e-9f00-5a6b7c8d9e01"));
            let request = if method == "post" {
                app.http.post(url).json(&transfer("A", "B", 1))
            } else {
                app.http.get(url)
            };
            let answer = request.send().await.expect("send");
            let problem: Value = answer.json().await.unwrap_or(Value::Null);
            assert_ne!(problem["detail"], "no such route", "{method} {path}");
        }
    }
    // and nothing else is documented (utoipa-axum registers each API route with its doc)
    assert_eq!(paths.len(), 6, "{:?}", paths.keys().collect::<Vec<_>>());
    let required = &document["components"]["schemas"]["Transfer"]["required"];
    assert_eq!(required.as_array().map(Vec::len), Some(9));
    // a transfer as answered has exactly the documented properties
    let created: Value = app.post_transfer(&transfer("A", "B", 1), None).await.json().await.expect("json");
    let mut answered: Vec<&String> = created.as_object().expect("object").keys().collect();
    let properties =
        document["components"]["schemas"]["Transfer"]["properties"].as_object().expect("properties");
    let mut documented: Vec<&String> = properties.keys().collect();
    answered.sort();
    documented.sort();
    assert_eq!(answered, documented);
    assert_eq!(document["security"], serde_json::json!([{"bearer": []}]));
    app.stop().await;
}

#[tokio::test]
async fn past_the_outbox_bound_new_transfers_are_shed_with_503_and_retry_after() {
    let app = spawn_app_with(|args| args.outbox_max_pending = 3).await;
    // rows no broker takes (an empty topic name is refused before sending), so they stay
    // pending, as rows do while Kafka is away
    for n in 0..3 {
        sqlx::query(
            "INSERT INTO outbox_evento (id, topico, chave, tipo, payload) VALUES ($1, '', $2, 'X', '{}')",
        )
        .bind(uuid::Uuid::new_v4())
        .bind(format!("stuck-{n}"))
        .execute(&app.database.pool)
        .await
        .expect("stuck row");
    }
    // the backlog is measured once a second: until then transfers are still accepted
    testkit::eventually("POST answered 503 once the backlog is measured", testkit::PATIENCE, || async {
        let response = app.post_transfer(&transfer("SHED-A", "SHED-B", 100), None).await;
        (response.status() == 503).then_some(())
    })
    .await;
    let transfers_before: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia")
        .fetch_one(&app.database.pool)
        .await
        .expect("count");
    let shed = app.post_transfer(&transfer("SHED-A", "SHED-B", 100), Some("shed-1")).await;
    assert_eq!(shed.status(), 503);
    assert_eq!(shed.headers()["retry-after"], "5");
    assert_eq!(shed.headers()["content-type"], "application/problem+json");
    let problem: Value = shed.json().await.expect("problem");
    assert_eq!(problem["type"], "/problems/overloaded");
    assert_eq!(problem["status"], 503);
    // the 3 stuck rows, plus rows of transfers accepted before the first measurement that the
    // relay had not published yet when it was taken
    let detail = problem["detail"].as_str().expect("detail");
    let (waiting, rest) = detail.split_once(' ').expect("a count first");
    assert!(waiting.parse::<i64>().is_ok_and(|waiting| waiting >= 3), "{problem}");
    assert_eq!(rest, "transfers are waiting to be published (bound 3); retry in 5 s", "{problem}");
    // a broken request still learns what is wrong with it
    let broken = app.post_transfer(&transfer("SHED-A", "SHED-A", 100), None).await;
    assert_eq!(broken.status(), 400);
    let transfers_after: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia")
        .fetch_one(&app.database.pool)
        .await
        .expect("count");
    assert_eq!(transfers_after, transfers_before, "a shed request wrote nothing");

    // the backlog drains (here: the stuck rows go) and the same request, same key, is accepted
    sqlx::query("DELETE FROM outbox_evento WHERE topico = ''")
        .execute(&app.database.pool)
        .await
        .expect("unstick");
    let accepted = testkit::eventually("POST accepted again", testkit::PATIENCE, || async {
        let response = app.post_transfer(&transfer("SHED-A", "SHED-B", 100), Some("shed-1")).await;
        (response.status() == 202).then_some(response)
    })
    .await;
    assert!(accepted.headers().get("idempotent-replayed").is_none(), "the shed attempt left no trace");
}
