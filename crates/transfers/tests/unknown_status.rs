//! A status in `transferencia` that this binary does not know (a newer writer, a hand edit) is
//! an error wherever a transfer is read, never a transfer shown as `PENDENTE`.

use std::sync::Arc;

use serde_json::json;
use testkit::TestDatabase;
use transfers::domain::{Status, TransferRequest};
use transfers::store::{self, Created, EventTarget, ListFilter, NewTransfer};

#[tokio::test]
async fn an_unknown_status_is_an_error_not_pending() {
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    let request = TransferRequest::parse(&json!({
        "contaOrigem": "CC-001", "contaDestino": "CC-002", "valorEmCentavos": 100, "moeda": "BRL"
    }))
    .expect("valid");
    let target =
        EventTarget { topic: Arc::from("t.transferencias.solicitada"), traceparent: None, tracestate: None };
    let Created::New(transfer) =
        store::create(&database.pool, &NewTransfer { request, key: None, target }).await.expect("created")
    else {
        panic!("a transfer without a key is always new")
    };
    assert_eq!(transfer.status, Status::Pending);
    let read = store::find(&database.pool, transfer.id).await.expect("read").expect("found");
    assert_eq!(read.status, Status::Pending);

    sqlx::query("UPDATE transferencia SET status = 'CANCELADA' WHERE id = $1")
        .bind(transfer.id)
        .execute(&database.pool)
        .await
        .expect("a status this binary does not know");
    let error = store::find(&database.pool, transfer.id).await.expect_err("an unknown status is refused");
    let chain = telemetry::error_chain(&error);
    assert!(chain.contains("unknown transfer status \"CANCELADA\""), "{chain}");
    let filter = ListFilter { account: Some("CC-001".into()), status: None, limit: 10 };
    store::list(&database.pool, &filter).await.expect_err("listing it is refused too");
}
