//! API clients bound to their accounts (`docs/reference/contract.md` §1 `pagamentos clients`, §2 "API
//! clients"; issue #46 item 8), against `pagamentos all` running as the runtime roles (which may
//! read `cliente_api`, never write it), the clients created by the command as each database's
//! owner. With a client's token: a debit of another's account is `403`
//! `/problems/forbidden-account` and writes nothing; another's transfer is `404`; the list holds
//! only transfers touching its accounts; another's account and entries in the ledger are `404`;
//! its Idempotency-Keys are its own; a revoked token is `401` at once, in both APIs. The shared
//! API token still reaches every account. Each test has its own databases and topics.

use crate::common;

use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::process::Child;

use common::system::System;
use common::API_TOKEN;
use testkit::TestDatabase;

/// `default_url`'s role (a runtime role of the stack) on the test server's database `name`.
fn as_role(default_url: &str, name: &str) -> PgConnectOptions {
    let server: PgConnectOptions = testkit::admin_database_url().parse().expect("admin URL");
    let role: PgConnectOptions = default_url.parse().expect("default URL");
    role.host(server.get_host()).port(server.get_port()).database(name)
}

/// The system migrated by the owner (the deploy step), then started as the runtime roles.
async fn started() -> (System, Child) {
    let system = System::new().await;
    ledger::MIGRATOR.run(&system.ledger_db.pool).await.expect("migrate the ledger as its owner");
    transfers::MIGRATOR.run(&system.transfers_db.pool).await.expect("migrate transferencias as its owner");
    let ledger_url = as_role(ledger::DEFAULT_DATABASE_URL, &system.ledger_db.name).to_url_lossy().to_string();
    let transfers_url =
        as_role(transfers::DEFAULT_DATABASE_URL, &system.transfers_db.name).to_url_lossy().to_string();
    let all = system
        .start_with(&[
            ("LEDGER_DATABASE_URL", ledger_url.as_str()),
            ("TRANSFERENCIAS_DATABASE_URL", transfers_url.as_str()),
        ])
        .await;
    (system, all)
}

/// An HTTP client sending `token`.
fn bearer(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().expect("header value"));
    reqwest::Client::builder().default_headers(headers).build().expect("HTTP client")
}

/// `POST /transferencias` with `key`: (status, body).
async fn post(system: &System, http: &reqwest::Client, key: &str, from: &str, to: &str) -> (u16, Value) {
    let response = http
        .post(system.api("/transferencias"))
        .header("Idempotency-Key", key)
        .json(&json!({"contaOrigem": from, "contaDestino": to, "valorEmCentavos": 100, "moeda": "BRL"}))
        .send()
        .await
        .expect("POST /transferencias");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = http.get(url).send().await.expect("GET");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The ids of a list's transfers, and whether each touches `accounts`.
fn ids_touching(list: &Value, accounts: &[&str]) -> (Vec<String>, bool) {
    let transfers = list.as_array().expect("a JSON array");
    let ids = transfers.iter().map(|t| t["id"].as_str().expect("id").to_owned()).collect();
    let all_touch = transfers.iter().all(|t| {
        accounts.iter().any(|account| t["contaOrigem"] == *account || t["contaDestino"] == *account)
    });
    (ids, all_touch)
}

// Over 100 lines on purpose: one scenario on one running system, read top to bottom; its steps
// build on each other's state, so splitting it would only pass that state around.
#[tokio::test]
async fn a_client_debits_and_reads_only_its_own_accounts_and_the_shared_token_all() {
    let (system, mut all) = started().await;
    for account in ["CL-A", "CL-B", "CL-C"] {
        system.open_account(account, 100_000).await;
    }
    let token = system.create_client("loja", "CL-A").await;
    // stored only as its hash
    let rows: Vec<String> = sqlx::query_scalar("SELECT row_to_json(c)::text FROM cliente_api c")
        .fetch_all(&system.transfers_db.pool)
        .await
        .expect("clients");
    assert_eq!(rows.len(), 1);
    assert!(rows[0].contains(&web::auth::token_hash(&token)) && !rows[0].contains(&token), "{rows:?}");
    let client = bearer(&token);
    let shared = bearer(API_TOKEN);

    // its own account: accepted, and settled as any other
    let (status, own) = post(&system, &client, "k-own", "CL-A", "CL-B").await;
    assert_eq!(status, 202, "{own}");
    let own_id = own["id"].as_str().expect("id").to_owned();
    assert_eq!(system.final_status(&own_id).await.0, "LIQUIDADA");

    // another's account: 403 with its problem type, nothing written (transfer, key, event)
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia")
        .fetch_one(&system.transfers_db.pool)
        .await
        .expect("count");
    let (status, problem) = post(&system, &client, "k-theirs", "CL-B", "CL-A").await;
    assert_eq!(status, 403, "{problem}");
    assert_eq!(problem["type"], "/problems/forbidden-account", "{problem}");
    assert_eq!(problem["status"], 403);
    let (transfers, keys, events): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM transferencia), \
                (SELECT count(*) FROM chave_idempotencia WHERE chave = 'k-theirs'), \
                (SELECT count(*) FROM outbox_evento WHERE chave = 'CL-B')",
    )
    .fetch_one(&system.transfers_db.pool)
    .await
    .expect("counts");
    assert_eq!((transfers, keys, events), (before, 0, 0), "a refused debit wrote something");

    // the shared token reaches every account: a transfer between B and C
    let (status, theirs) = post(&system, &shared, "k-shared", "CL-B", "CL-C").await;
    assert_eq!(status, 202, "{theirs}");
    let theirs_id = theirs["id"].as_str().expect("id").to_owned();
    let (status, _) = post(&system, &shared, "k-shared-2", "CL-C", "CL-A").await;
    assert_eq!(status, 202);

    // one transfer: its own 200, another's 404 (as an unknown one), to the shared token both 200
    let (status, body) = get(&client, &system.api(&format!("/transferencias/{own_id}"))).await;
    assert_eq!((status, body["id"].as_str()), (200, Some(own_id.as_str())));
    let (status, problem) = get(&client, &system.api(&format!("/transferencias/{theirs_id}"))).await;
    assert_eq!(status, 404, "{problem}");
    assert_eq!(problem["type"], "/problems/not-found");
    let (status, _) = get(&shared, &system.api(&format!("/transferencias/{theirs_id}"))).await;
    assert_eq!(status, 200);

    // the list: only transfers touching CL-A, whatever the filter
    let (status, list) = get(&client, &system.api("/transferencias")).await;
    assert_eq!(status, 200, "{list}");
    let (ids, touching) = ids_touching(&list, &["CL-A"]);
    assert!(touching, "{list}");
    assert_eq!(ids.len(), 2, "its own and the one paid into CL-A: {list}");
    assert!(ids.contains(&own_id) && !ids.contains(&theirs_id), "{list}");
    for filter in ["?conta=CL-B", "?conta=CL-C", "?conta=CL-A", "?status=PENDENTE", "?conta=CL-B&limit=1"] {
        let (status, list) = get(&client, &system.api(&format!("/transferencias{filter}"))).await;
        assert_eq!(status, 200, "{filter}: {list}");
        let (ids, touching) = ids_touching(&list, &["CL-A"]);
        assert!(touching && !ids.contains(&theirs_id), "{filter}: {list}");
    }
    let (_, list) = get(&client, &system.api("/transferencias?conta=CL-B")).await;
    assert_eq!(ids_touching(&list, &["CL-A"]).0, [own_id.as_str()], "CL-B's transfers with CL-A: {list}");
    let (_, list) = get(&shared, &system.api("/transferencias")).await;
    assert_eq!(list.as_array().map(Vec::len), Some(3), "the shared token lists everything: {list}");

    // the ledger: its account and entries, nobody else's (404, as an unknown account)
    let (status, account) = get(&client, &system.ledger("/contas/CL-A")).await;
    assert_eq!((status, account["id"].as_str()), (200, Some("CL-A")), "{account}");
    let (status, entries) = get(&client, &system.ledger("/contas/CL-A/lancamentos")).await;
    assert_eq!(status, 200, "{entries}");
    for path in
        ["/contas/CL-B", "/contas/CL-B/lancamentos", "/contas/EMISSOR-BRL", "/contas/EMISSOR-BRL/lancamentos"]
    {
        let (status, problem) = get(&client, &system.ledger(path)).await;
        assert_eq!(status, 404, "{path}: {problem}");
        assert_eq!(problem["type"], "/problems/not-found", "{path}");
    }
    let (status, _) = get(&shared, &system.ledger("/contas/CL-B")).await;
    assert_eq!(status, 200, "the shared token reads every account");
    // and it is no admin: no accounts, no deposits
    let response = client
        .post(system.ledger("/contas"))
        .json(&json!({"id": "CL-D", "moeda": "BRL"}))
        .send()
        .await
        .expect("POST /contas");
    assert_eq!(response.status(), 403);
    let response = client
        .post(system.ledger("/contas/CL-A/depositos"))
        .json(&json!({"depositoId": uuid::Uuid::new_v4(), "valorEmCentavos": 1}))
        .send()
        .await
        .expect("POST depositos");
    assert_eq!(response.status(), 403);

    // documented: the 403 of POST /transferencias
    let (status, document) = get(&client, &system.api("/openapi.json")).await;
    assert_eq!(status, 200);
    let forbidden = &document["paths"]["/transferencias"]["post"]["responses"]["403"]["description"];
    assert!(
        forbidden.as_str().is_some_and(|text| text.contains("/problems/forbidden-account")),
        "{forbidden}"
    );

    system.all_decided().await;
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
    all.kill().await.expect("stop pagamentos all");
}

#[tokio::test]
async fn idempotency_keys_are_scoped_per_client() {
    let (system, mut all) = started().await;
    system.open_account("ID-A", 100_000).await;
    system.open_account("ID-B", 0).await;
    let first = bearer(&system.create_client("primeiro", "ID-A").await);
    let second = bearer(&system.create_client("segundo", "ID-A,ID-B").await);
    let shared = bearer(API_TOKEN);

    // one key, one body, three callers: three transfers, none a replay
    let mut ids = Vec::new();
    for http in [&first, &second, &shared] {
        let response = http
            .post(system.api("/transferencias"))
            .header("Idempotency-Key", "a-mesma-chave")
            .json(&json!({"contaOrigem": "ID-A", "contaDestino": "ID-B", "valorEmCentavos": 100, "moeda": "BRL"}))
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), 202);
        assert!(response.headers().get("idempotent-replayed").is_none(), "replayed another's transfer");
        ids.push(response.json::<Value>().await.expect("body")["id"].as_str().expect("id").to_owned());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{ids:?}");
    // within one client, the key still replays
    let response = first
        .post(system.api("/transferencias"))
        .header("Idempotency-Key", "a-mesma-chave")
        .json(&json!({"contaOrigem": "ID-A", "contaDestino": "ID-B", "valorEmCentavos": 100, "moeda": "BRL"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 202);
    assert_eq!(response.headers().get("idempotent-replayed").map(|v| v.as_bytes()), Some(&b"true"[..]));
    let scopes: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT escopo) FROM chave_idempotencia WHERE chave = 'a-mesma-chave'",
    )
    .fetch_one(&system.transfers_db.pool)
    .await
    .expect("scopes");
    assert_eq!(scopes, 3);
    all.kill().await.expect("stop pagamentos all");
}

#[tokio::test]
async fn a_revoked_token_is_refused_at_once_in_both_apis() {
    let (system, mut all) = started().await;
    system.open_account("RV-A", 100_000).await;
    system.open_account("RV-B", 0).await;
    let token = system.create_client("revogavel", "RV-A").await;
    let client = bearer(&token);
    assert_eq!(get(&client, &system.api("/transferencias?conta=RV-A")).await.0, 200);
    assert_eq!(get(&client, &system.ledger("/contas/RV-A")).await.0, 200);

    let (code, stdout, stderr) = system.clients(&["revoke", "revogavel"]).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    // the very next requests: no cache to wait out
    assert_eq!(get(&client, &system.api("/transferencias?conta=RV-A")).await.0, 401);
    assert_eq!(get(&client, &system.ledger("/contas/RV-A")).await.0, 401);
    assert_eq!(post(&system, &client, "k-revoked", "RV-A", "RV-B").await.0, 401);
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia")
        .fetch_one(&system.transfers_db.pool)
        .await
        .expect("count");
    assert_eq!(written, 0);
    // a token of a client's shape that nobody was given: 401 as well
    let forged = bearer(&format!("{}{}", web::auth::CLIENT_TOKEN_PREFIX, "0".repeat(64)));
    assert_eq!(get(&forged, &system.api("/transferencias")).await.0, 401);

    // revoked once, listed as such in both databases; the name is not given out again
    let (code, stdout, _) = system.clients(&["revoke", "revogavel"]).await;
    assert_eq!(code, 0);
    assert!(stdout.contains("already revoked"), "{stdout}");
    let (code, stdout, stderr) = system.clients(&["list"]).await;
    assert_eq!(code, 0, "{stderr}");
    let line = stdout.lines().find(|line| line.starts_with("revogavel")).expect("listed");
    assert!(line.contains("RV-A") && line.ends_with("same") && !line.contains(" - "), "{stdout}");
    assert!(!stdout.contains(&token) && !stdout.contains(&web::auth::token_hash(&token)), "{stdout}");
    let (code, _, stderr) = system.clients(&["create", "revogavel", "--accounts", "RV-A"]).await;
    assert_ne!(code, 0);
    assert!(stderr.contains("exists already"), "{stderr}");
    let (code, stdout, _) = system.clients(&["revoke", "ninguem"]).await;
    assert_eq!(code, 1, "{stdout}");
    // refused before anything is written: an issuer account, a bad name
    let (code, _, stderr) = system.clients(&["create", "emissor", "--accounts", "RV-A,EMISSOR-BRL"]).await;
    assert_ne!(code, 0, "{stderr}");
    let (code, _, _) = system.clients(&["create", "com espaço", "--accounts", "RV-A"]).await;
    assert_ne!(code, 0);
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM cliente_api")
        .fetch_one(&system.ledger_db.pool)
        .await
        .expect("count");
    assert_eq!(count, 1);
    all.kill().await.expect("stop pagamentos all");
}

#[tokio::test]
async fn the_runtime_roles_read_clients_but_never_write_them() {
    for (migrator, default_url) in [
        (&*transfers::MIGRATOR, transfers::DEFAULT_DATABASE_URL),
        (&*ledger::MIGRATOR, ledger::DEFAULT_DATABASE_URL),
    ] {
        let database = TestDatabase::create(migrator).await;
        let hash = "a".repeat(64);
        sqlx::query("INSERT INTO cliente_api (nome, hash_token, contas) VALUES ('dono', $1, '{CC-1}')")
            .bind(&hash)
            .execute(&database.pool)
            .await
            .expect("the owner creates clients");
        let mut runtime = as_role(default_url, &database.name).connect().await.expect("runtime role");
        let found: i64 = sqlx::query_scalar("SELECT count(*) FROM cliente_api WHERE hash_token = $1")
            .bind(&hash)
            .fetch_one(&mut runtime)
            .await
            .expect("the runtime role reads clients");
        assert_eq!(found, 1);
        for statement in [
            format!(
                "INSERT INTO cliente_api (nome, hash_token, contas) VALUES ('x', '{}', '{{CC-1}}')",
                "b".repeat(64)
            ),
            "UPDATE cliente_api SET contas = '{CC-1,CC-2}'".to_owned(),
            "UPDATE cliente_api SET revogado_em = NULL".to_owned(),
            "DELETE FROM cliente_api".to_owned(),
            "TRUNCATE cliente_api".to_owned(),
        ] {
            match sqlx::raw_sql(&statement).execute(&mut runtime).await {
                Err(sqlx::Error::Database(e)) => {
                    assert_eq!(e.code().as_deref(), Some("42501"), "{statement}: {e}")
                }
                other => panic!("{default_url}: the runtime role was allowed {statement}: {other:?}"),
            }
        }
        runtime.close().await.expect("close");
    }
}
