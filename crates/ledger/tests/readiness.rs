//! `/readyz` of the ledger with its database gone (issue #25): every caller reads `503`, so
//! probes need no credentials, but only the admin token reads why (the failing check and its
//! error); without it, or with the API token, the body is `not ready` alone.

use crate::common;

use std::time::Duration;

use common::spawn_ledger_with_auth;

const API: &str = "api-secret";
const ADMIN: &str = "admin-secret";

/// `GET /readyz` as `bearer`, if any: (status, body).
async fn readyz(ledger: &common::TestLedger, bearer: Option<&str>) -> (u16, String) {
    let mut request = ledger.http.get(ledger.url("/readyz"));
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("GET /readyz");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

#[tokio::test]
async fn with_the_database_gone_only_the_admin_token_reads_why_the_ledger_is_not_ready() {
    let ledger = spawn_ledger_with_auth(1, web::AuthArgs::tokens(API, ADMIN), |_| {}).await;
    let callers = [None, Some(API), Some("not-a-token"), Some(ADMIN)];
    // the test's database is reached as its owner: the admin reads that too (issue #46)
    let role = ledger.pool().connect_options().get_username().to_owned();
    let owner = database::schema::Prepared::Migrated { role }.owner_warning("ledger").expect("owner");
    let ready = |caller: Option<&str>| match caller {
        Some(ADMIN) => format!("ready\nwarning: {owner}\n"),
        _ => "ready\n".to_owned(),
    };
    for caller in callers {
        assert_eq!(readyz(&ledger, caller).await, (200, ready(caller)), "{caller:?}");
    }

    ledger.close_database().await;
    let detail =
        testkit::eventually("the admin to read 503 naming postgres", Duration::from_secs(30), || async {
            let (status, body) = readyz(&ledger, Some(ADMIN)).await;
            (status == 503 && body.starts_with("not ready\npostgres: ")).then_some(body)
        })
        .await;
    eprintln!("/readyz with the admin token: {detail:?}");
    // the database stays closed: every other caller reads the status line alone
    for caller in [None, Some(API), Some("not-a-token")] {
        assert_eq!(readyz(&ledger, caller).await, (503, "not ready\n".to_owned()), "{caller:?}");
    }

    ledger.reopen_database().await;
    testkit::eventually("the ledger ready again", Duration::from_secs(60), || async {
        (readyz(&ledger, Some(ADMIN)).await.0 == 200).then_some(())
    })
    .await;
    for caller in callers {
        assert_eq!(readyz(&ledger, caller).await, (200, ready(caller)), "{caller:?}");
    }
    ledger.stop().await;
}
