//! The status projection against the real stack: outcome events set final statuses once.

use crate::common;

use std::time::Duration;

use kafka::producer::{OutgoingRecord, Producer};
use serde_json::{json, Value};
use uuid::Uuid;

use common::{receive, spawn_app, transfer, TestApp};
use contracts::topics;

async fn pending_transfer(app: &TestApp) -> String {
    let body: Value =
        app.post_transfer(&transfer("CC-001", "CC-002", 100), None).await.json().await.expect("body");
    body["id"].as_str().expect("id").to_owned()
}

fn settled(id: &str) -> Value {
    json!({"eventoId": Uuid::new_v4(), "transferenciaId": id, "liquidadaEm": "2026-12-03T10:00:00Z"})
}

fn rejected(id: &str, reason: &str) -> Value {
    json!({"eventoId": Uuid::new_v4(), "transferenciaId": id, "motivo": reason, "rejeitadaEm": "2026-12-03T10:00:00Z"})
}

async fn publish(app: &TestApp, topic: &str, payload: Vec<u8>) {
    let producer = Producer::new(&kafka::config::producer_config(&app.topics.args, "test", Duration::ZERO))
        .expect("producer");
    producer.send(&OutgoingRecord::new(app.topics.topic(topic), "CC-001", payload)).await.expect("publish");
}

async fn status_of(app: &TestApp, id: &str) -> (String, Value) {
    let body: Value = app.get_transfer(id).await.json().await.expect("body");
    (body["status"].as_str().expect("status").to_owned(), body["motivoRejeicao"].clone())
}

async fn eventually_status(app: &TestApp, id: &str, expected: &str) -> Value {
    testkit::eventually(&format!("{id} to become {expected}"), testkit::PATIENCE, || async {
        let (status, reason) = status_of(app, id).await;
        (status == expected).then_some(reason)
    })
    .await
}

#[tokio::test]
async fn outcomes_set_the_final_status_once_whatever_the_order_or_repetition() {
    let app = spawn_app().await;
    let settled_id = pending_transfer(&app).await;
    let rejected_id = pending_transfer(&app).await;

    publish(&app, topics::SETTLED, settled(&settled_id).to_string().into_bytes()).await;
    publish(&app, topics::REJECTED, rejected(&rejected_id, "SALDO_INSUFICIENTE").to_string().into_bytes())
        .await;
    assert_eq!(eventually_status(&app, &settled_id, "LIQUIDADA").await, Value::Null);
    assert_eq!(eventually_status(&app, &rejected_id, "REJEITADA").await, "SALDO_INSUFICIENTE");

    // duplicates and contradicting late events change nothing
    publish(&app, topics::SETTLED, settled(&settled_id).to_string().into_bytes()).await;
    publish(&app, topics::REJECTED, rejected(&settled_id, "BLOQUEADA_ANTIFRAUDE").to_string().into_bytes())
        .await;
    publish(&app, topics::SETTLED, settled(&rejected_id).to_string().into_bytes()).await;
    // a marker after them on each topic (one partition each): once the markers are projected,
    // every record before them was handled
    let (settled_marker, rejected_marker) = (pending_transfer(&app).await, pending_transfer(&app).await);
    publish(&app, topics::SETTLED, settled(&settled_marker).to_string().into_bytes()).await;
    publish(&app, topics::REJECTED, rejected(&rejected_marker, "CONTA_INEXISTENTE").to_string().into_bytes())
        .await;
    eventually_status(&app, &settled_marker, "LIQUIDADA").await;
    eventually_status(&app, &rejected_marker, "REJEITADA").await;
    assert_eq!(status_of(&app, &settled_id).await, ("LIQUIDADA".into(), Value::Null));
    assert_eq!(status_of(&app, &rejected_id).await, ("REJEITADA".into(), json!("SALDO_INSUFICIENTE")));
    app.stop().await;
}

#[tokio::test]
async fn unknown_transfers_are_skipped_and_poison_goes_to_the_dead_letter_topic() {
    let app = spawn_app().await;
    let dead_letters = app.reader(&contracts::topics::dead_letter_topic(topics::SETTLED));
    publish(&app, topics::SETTLED, settled(&Uuid::new_v4().to_string()).to_string().into_bytes()).await;
    publish(&app, topics::SETTLED, b"{not json".to_vec()).await;
    publish(&app, topics::SETTLED, json!({"eventoId": Uuid::new_v4()}).to_string().into_bytes()).await;
    let after = pending_transfer(&app).await;
    publish(&app, topics::SETTLED, settled(&after).to_string().into_bytes()).await;

    // the partition was not stuck: the record after the poison was projected
    eventually_status(&app, &after, "LIQUIDADA").await;
    let letters = receive(&dead_letters, 2).await;
    for letter in &letters {
        assert_eq!(
            common::header(letter, "kafka_dlt-exception-fqcn").as_deref(),
            Some(transfers::projection::MALFORMED_EVENT)
        );
        assert_eq!(
            common::header(letter, "kafka_dlt-original-consumer-group"),
            Some(app.topics.args.group(contracts::topics::groups::TRANSFERS_PROJECTION))
        );
    }
    assert_eq!(kafka::rdkafka::message::Message::payload(&letters[0]), Some(b"{not json".as_slice()));
    app.stop().await;
}

#[tokio::test]
async fn an_outcome_with_malformed_optional_details_still_sets_the_status() {
    let app = spawn_app().await;
    let settled_id = pending_transfer(&app).await;
    let rejected_id = pending_transfer(&app).await;
    // another producer's bug in the extras the contract lets readers ignore (§3)
    let settled = json!({"eventoId": Uuid::new_v4(), "transferenciaId": settled_id, "liquidadaEm": "2026-12-03T10:00:00Z",
        "contaOrigem": "CC 001", "contaDestino": "CC-002", "valorEmCentavos": 100, "moeda": "XYZ"});
    let rejected = json!({"eventoId": Uuid::new_v4(), "transferenciaId": rejected_id, "motivo": "SALDO_INSUFICIENTE",
        "rejeitadaEm": "2026-12-03T10:00:00Z", "contaOrigem": "CC 001", "contaDestino": "CC-002", "moeda": "XYZ"});
    publish(&app, topics::SETTLED, settled.to_string().into_bytes()).await;
    publish(&app, topics::REJECTED, rejected.to_string().into_bytes()).await;
    assert_eq!(eventually_status(&app, &settled_id, "LIQUIDADA").await, Value::Null);
    assert_eq!(eventually_status(&app, &rejected_id, "REJEITADA").await, "SALDO_INSUFICIENTE");
    app.stop().await;
}
