//! Exactly-once through crashes: `pagamentos antifraude` is SIGKILLed twice mid-stream and
//! restarted, one of two instances dies, a frozen instance is replaced and then resumed as a
//! zombie; a `read_committed` reader sees exactly one output per input, reading the topics to
//! their end once the services are stopped.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use kafka::rdkafka::message::Message;
use serde_json::Value;
use tokio::process::Child;
use uuid::Uuid;

use contracts::topics;
use testkit::{unique, TestTopics};

const INPUTS: usize = 2_000;

fn antifraud(topics: &TestTopics, transactional_prefix: &str) -> Child {
    antifraud_instance(topics, transactional_prefix, "crash-test")
}

fn antifraud_instance(topics: &TestTopics, transactional_prefix: &str, instance: &str) -> Child {
    common::service(topics, "antifraude")
        .env("ANTIFRAUDE_LISTEN", "127.0.0.1:0")
        .env("TRANSACTIONAL_ID_PREFIX", transactional_prefix)
        .env("PAGAMENTOS_INSTANCE_ID", instance)
        .env("ANTIFRAUDE_BATCH_RECORDS", "50")
        .spawn()
        .expect("start pagamentos antifraude")
}

/// Committed outputs per transfer id, and their total: the output topics read to their end
/// once every input has an output (the caller has stopped the services by then, so the end
/// comes once the broker has resolved their last transactions).
async fn committed_outputs(topics: &TestTopics) -> (HashMap<String, usize>, usize) {
    let mut outputs: HashMap<String, usize> = HashMap::new();
    let mut total = 0;
    for topic in [topics.topic(topics::ANALYSED), topics.topic(topics::REJECTED)] {
        for record in testkit::read_to_end(&topics.args, &topic).await {
            let event: Value = serde_json::from_slice(record.payload().expect("payload")).expect("json");
            *outputs.entry(event["transferenciaId"].as_str().expect("id").to_owned()).or_default() += 1;
            total += 1;
        }
    }
    (outputs, total)
}

/// Waits until every input has a committed output: the output topics read to their current
/// end (no consumer group of the test's, whose own rebalances could stall it), again and again.
async fn every_input_answered(topics: &TestTopics) {
    let mut answered = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while answered < INPUTS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {answered} of {INPUTS} inputs answered in 180 s"
        );
        answered = committed_outputs(topics).await.0.len();
    }
}

/// Waits until antifraude's group has committed at least `count` inputs (or all of them): the
/// instances running now are at work. Each input counts once, whatever was written for it.
async fn inputs_committed(topics: &TestTopics, count: usize) {
    let (group, input) = (topics.args.group(topics::groups::ANTIFRAUD), topics.topic(topics::REQUESTED));
    let count = count.min(INPUTS) as i64;
    testkit::eventually(&format!("{count} inputs committed"), testkit::PATIENCE, || async {
        (testkit::committed(&topics.args, &group, &input).await >= count).then_some(())
    })
    .await;
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
    let mut service = antifraud(&topics, &transactional_prefix);
    // each instance killed once it has committed inputs of its own
    let mut committed = 0;
    for _ in 0..2 {
        committed += 200;
        inputs_committed(&topics, committed).await;
        service.kill().await.expect("SIGKILL");
        service = antifraud(&topics, &transactional_prefix);
    }
    feeding.await.expect("feed");
    every_input_answered(&topics).await;
    service.kill().await.expect("stop");
    let (outputs, total) = committed_outputs(&topics).await;
    assert_exactly_once(&ids, &outputs, total);
}

#[tokio::test]
async fn when_one_of_two_instances_dies_the_other_takes_over_without_duplicates() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let transactional_prefix = unique("tx-pair");
    let ids: Vec<Uuid> = (0..INPUTS).map(|_| Uuid::new_v4()).collect();
    let mut first = antifraud_instance(&topics, &transactional_prefix, "first");
    let mut second = antifraud_instance(&topics, &transactional_prefix, "second");
    let feeding = testkit::feed_requests(&topics, ids.clone(), Duration::from_millis(100));
    // the first dies once the pair is at work
    inputs_committed(&topics, 300).await;
    first.kill().await.expect("SIGKILL the first instance");
    feeding.await.expect("feed");
    every_input_answered(&topics).await;
    second.kill().await.expect("stop");
    let (outputs, total) = committed_outputs(&topics).await;
    assert_exactly_once(&ids, &outputs, total);
}

/// Kafka's zombie: an instance frozen mid-stream (SIGSTOP) is replaced by one with the same
/// transactional id, which fences it when it registers and carries on; the frozen one, resumed
/// after its replacement committed, must not get a single late write through.
#[tokio::test]
async fn a_resumed_zombie_with_the_same_transactional_id_is_fenced() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let transactional_prefix = unique("tx-zombie");
    let ids: Vec<Uuid> = (0..INPUTS).map(|_| Uuid::new_v4()).collect();
    let feeding = testkit::feed_requests(&topics, ids.clone(), Duration::from_millis(100));
    let mut zombie = antifraud_instance(&topics, &transactional_prefix, "same");
    // freeze it once it is committing outputs: it then holds a batch, maybe a transaction
    let outputs = [topics.topic(topics::ANALYSED), topics.topic(topics::REJECTED)];
    let written = || async {
        let mut sum = 0;
        for topic in &outputs {
            sum += testkit::records_written(&topics.args, topic).await;
        }
        sum
    };
    testkit::eventually("the first instance's outputs", testkit::PATIENCE, || async {
        (written().await >= 100).then_some(())
    })
    .await;
    let signal = |signal: &'static str, pid: u32| async move {
        let status = tokio::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .await
            .expect("kill");
        assert!(status.success(), "kill {signal}");
    };
    let zombie_pid = zombie.id().expect("pid");
    signal("-STOP", zombie_pid).await;
    let frozen_at = written().await;
    // the replacement, same transactional id: it fences the frozen one and carries on
    let mut replacement = antifraud_instance(&topics, &transactional_prefix, "same");
    testkit::eventually("the replacement's outputs", testkit::PATIENCE, || async {
        (written().await >= frozen_at + 200).then_some(())
    })
    .await;
    signal("-CONT", zombie_pid).await;
    feeding.await.expect("feed");
    every_input_answered(&topics).await;
    zombie.kill().await.expect("stop the zombie");
    replacement.kill().await.expect("stop the replacement");
    let (outputs, total) = committed_outputs(&topics).await;
    assert_exactly_once(&ids, &outputs, total);
}
