//! antifraude recovers by itself from a broker restart mid-stream, with exactly one committed
//! output per input. Restarts the shared broker, so it is `#[ignore]`d and run alone by
//! `scripts/test` after the rest of the suite.

use std::collections::HashMap;
use std::time::Duration;

use kafka::rdkafka::message::Message;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use contracts::topics;
use testkit::{unique, TestTopics};

const INPUTS: usize = 1_000;

#[tokio::test]
#[ignore = "restarts the shared broker: scripts/test runs it alone"]
async fn a_broker_restart_mid_stream_loses_and_doubles_nothing() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let settings = antifraud::Settings {
        args: antifraud::AntifraudArgs {
            listen: "127.0.0.1:0".parse().expect("address"),
            block_threshold_cents: antifraud::scoring::DEFAULT_BLOCK_THRESHOLD_CENTS,
            transactional_id_prefix: unique("tx-restart"),
            instance_id: Some("restart".into()),
            batch_records: 50,
            batch_wait_ms: 5,
            kafka_client: antifraud::TransactionalClient::from_env(),
        },
        // no admin token: /readyz answers its status line only (its detail is not under test here)
        auth: telemetry::health::HealthAuthArgs::default(),
        kafka: topics.args.clone(),
        topics: kafka::TopicArgs { partitions: 3, replicas: 1 },
        profile: kafka::Profile::Fast,
        metrics: telemetry::health::MetricsRoute::ServicePort,
        producer: None,
    };
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    antifraud::start(
        settings,
        &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
    )
    .await
    .expect("antifraude starts");

    let ids: Vec<Uuid> = (0..INPUTS).map(|_| Uuid::new_v4()).collect();
    let feed = testkit::feed_requests(&topics, ids.clone(), Duration::from_millis(150));
    let output_topics = [topics.topic(topics::ANALYSED), topics.topic(topics::REJECTED)];
    // the restart lands mid-stream: once outputs are being committed
    testkit::eventually("the first outputs", testkit::PATIENCE, || async {
        let mut written = 0;
        for topic in &output_topics {
            written += testkit::records_written(&topics.args, topic).await;
        }
        (written >= 50).then_some(())
    })
    .await;
    testkit::stack(&["restart", "kafka"]).await;
    feed.await.expect("feed");

    // every input handled (its offset travels in the transaction of its output), then the
    // service stopped: the output topics hold all it will ever write
    let group = topics.args.group(topics::groups::ANTIFRAUD);
    testkit::consumed(&topics.args, &group, &[topics.topic(topics::REQUESTED)]).await;
    shutdown.cancel();
    tracker.close();
    tokio::time::timeout(Duration::from_secs(30), tracker.wait()).await.expect("drains");
    let mut outputs: HashMap<String, usize> = HashMap::new();
    for topic in &output_topics {
        for record in testkit::read_to_end(&topics.args, topic).await {
            let event: Value = serde_json::from_slice(record.payload().expect("payload")).expect("json");
            *outputs.entry(event["transferenciaId"].as_str().expect("id").to_owned()).or_default() += 1;
        }
    }
    assert_eq!(outputs.len(), INPUTS, "missing outputs");
    assert!(outputs.values().all(|count| *count == 1), "an input has more than one committed output");
    for id in &ids {
        assert_eq!(outputs.get(&id.to_string()), Some(&1));
    }
}
