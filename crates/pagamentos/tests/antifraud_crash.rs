//! Exactly-once through crashes: `pagamentos antifraude` is SIGKILLed twice mid-stream and
//! restarted; a `read_committed` reader sees exactly one output per input.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use kafka::config::{consumer_config, OffsetCommit};
use kafka::rdkafka::message::Message;
use serde_json::Value;
use tokio::process::Child;
use uuid::Uuid;

use contracts::topics;
use testkit::{unique, TestTopics};

const INPUTS: usize = 2_000;

fn antifraude(topics: &TestTopics, transactional_prefix: &str) -> Child {
    antifraude_instance(topics, transactional_prefix, "crash-test")
}

fn antifraude_instance(topics: &TestTopics, transactional_prefix: &str, instance: &str) -> Child {
    common::service(topics, "antifraude")
        .env("ANTIFRAUDE_LISTEN", "127.0.0.1:0")
        .env("TRANSACTIONAL_ID_PREFIX", transactional_prefix)
        .env("PAGAMENTOS_INSTANCE_ID", instance)
        .env("ANTIFRAUDE_BATCH_RECORDS", "50")
        .spawn()
        .expect("start pagamentos antifraude")
}

/// Committed outputs per transfer id, read until every input has one and 3 s more pass.
async fn committed_outputs(topics: &TestTopics) -> (HashMap<String, usize>, usize) {
    let reader = kafka::consumer::subscribe(
        &consumer_config(&topics.args, "test", &unique("reader"), OffsetCommit::StoredAfterHandling),
        &[&topics.topic(topics::ANALYSED), &topics.topic(topics::REJECTED)],
    )
    .expect("reader");
    let mut outputs: HashMap<String, usize> = HashMap::new();
    let mut total = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut quiet_until: Option<tokio::time::Instant> = None;
    while let Ok(record) = tokio::time::timeout_at(quiet_until.unwrap_or(deadline), reader.recv()).await {
        let record = record.expect("receive");
        let event: Value = serde_json::from_slice(record.payload().expect("payload")).expect("json");
        *outputs.entry(event["transferenciaId"].as_str().expect("id").to_owned()).or_default() += 1;
        total += 1;
        if outputs.len() == INPUTS && quiet_until.is_none() {
            quiet_until = Some(tokio::time::Instant::now() + Duration::from_secs(3));
        }
    }
    (outputs, total)
}

fn assert_exactly_once(ids: &[Uuid], outputs: &HashMap<String, usize>, total: usize) {
    assert_eq!(outputs.len(), INPUTS, "missing outputs: {} of {INPUTS} inputs seen", outputs.len());
    let doubled = outputs.values().filter(|count| **count > 1).count();
    assert_eq!(doubled, 0, "{doubled} inputs have more than one committed output");
    assert_eq!(total, INPUTS);
    for id in ids {
        assert_eq!(outputs.get(&id.to_string()), Some(&1));
    }
}

#[tokio::test]
async fn sigkill_mid_stream_twice_leaves_exactly_one_output_per_input() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let transactional_prefix = unique("tx-crash");
    let ids: Vec<Uuid> = (0..INPUTS).map(|_| Uuid::new_v4()).collect();
    let feeding = testkit::feed_requests(&topics, ids.clone(), Duration::from_millis(100));
    let mut service = antifraude(&topics, &transactional_prefix);
    for pause_ms in [1_200, 1_500] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        service.kill().await.expect("SIGKILL");
        service = antifraude(&topics, &transactional_prefix);
    }
    feeding.await.expect("feed");
    let (outputs, total) = committed_outputs(&topics).await;
    service.kill().await.expect("stop");
    assert_exactly_once(&ids, &outputs, total);
}

#[tokio::test]
async fn when_one_of_two_instances_dies_the_other_takes_over_without_duplicates() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let transactional_prefix = unique("tx-pair");
    let ids: Vec<Uuid> = (0..INPUTS).map(|_| Uuid::new_v4()).collect();
    let mut first = antifraude_instance(&topics, &transactional_prefix, "first");
    let mut second = antifraude_instance(&topics, &transactional_prefix, "second");
    let feeding = testkit::feed_requests(&topics, ids.clone(), Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    first.kill().await.expect("SIGKILL the first instance");
    feeding.await.expect("feed");
    let (outputs, total) = committed_outputs(&topics).await;
    second.kill().await.expect("stop");
    assert_exactly_once(&ids, &outputs, total);
}
