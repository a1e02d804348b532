//! The API keeps accepting transfers while Kafka is down; every event arrives once the broker
//! is back, in per-key order. Restarts the shared broker, so it is `#[ignore]`d and run alone
//! by `scripts/test` after the rest of the suite.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kafka::rdkafka::message::Message;
use serde_json::Value;

use tokio_util::sync::CancellationToken;

use common::{payload, receive, spawn_app, transfer};
use contracts::topics;

#[tokio::test]
#[ignore = "restarts the shared broker: scripts/test runs it alone"]
async fn transfers_accepted_during_a_broker_restart_are_all_published_in_key_order() {
    let app = spawn_app().await;
    let keys = ["CC-001", "CC-002", "CC-003"];
    let restart = tokio::spawn(testkit::stack(&["restart", "kafka"]));

    // one request at a time, as a client that waits for each answer: acceptance order per key
    let mut accepted: Vec<(String, i64)> = Vec::new();
    let started = Instant::now();
    let mut n = 0;
    // readiness is watched beside the requests: a check against a dead broker takes its full
    // timeout, which must not slow the stream of POSTs
    let readiness = {
        let (http, url) = (app.http.clone(), app.url("/readyz"));
        let stop = CancellationToken::new();
        let watching = stop.clone();
        let task = tokio::spawn(async move {
            let mut saw_not_ready = false;
            while !watching.is_cancelled() {
                if let Ok(response) = http.get(&url).send().await {
                    saw_not_ready |= response.status() == 503;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            saw_not_ready
        });
        (stop, task)
    };
    while !restart.is_finished() || started.elapsed() < Duration::from_secs(3) {
        let key = keys[n % keys.len()];
        let amount = n as i64 + 1;
        let response = app.post_transfer(&transfer(key, "CC-999", amount), None).await;
        assert_eq!(response.status(), 202, "the API accepts while Kafka is down");
        let body: Value = response.json().await.expect("body");
        accepted.push((body["id"].as_str().expect("id").to_owned(), amount));
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    restart.await.expect("scripts/stack restart kafka");
    assert!(accepted.len() > 50, "only {} transfers sent during the restart", accepted.len());
    readiness.0.cancel();
    assert!(readiness.1.await.expect("readiness watcher"), "/readyz never answered 503 while Kafka was down");
    let mut last = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let response = app.http.get(app.url("/readyz")).send().await.expect("GET /readyz");
        if response.status() == 200 {
            break;
        }
        last = response.text().await.unwrap_or_default();
        assert!(tokio::time::Instant::now() < deadline, "/readyz not 200 60 s after the restart: {last}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(last);

    let reader = app.reader(topics::REQUESTED);
    let expected: HashSet<String> = accepted.iter().map(|(id, _)| id.clone()).collect();
    let mut seen = HashSet::new();
    let mut last_amount: HashMap<Vec<u8>, i64> = HashMap::new();
    while seen.len() < expected.len() {
        let record = receive(&reader, 1).await.remove(0);
        let event = payload(&record);
        let id = event["transferenciaId"].as_str().expect("id").to_owned();
        if !seen.insert(id.clone()) {
            continue; // at least once: a duplicate carries the same ids and changes nothing
        }
        let amount = event["valorEmCentavos"].as_i64().expect("amount");
        let key = record.key().expect("key").to_vec();
        if let Some(previous) = last_amount.insert(key, amount) {
            assert!(previous < amount, "per-key order broken: {previous} then {amount}");
        }
    }
    assert_eq!(seen, expected, "every accepted transfer was published");
    app.stop().await;
}
