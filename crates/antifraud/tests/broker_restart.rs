//! antifraude recovers by itself from a broker restart mid-stream, with exactly one committed
//! output per input. Restarts the shared broker, so it is `#[ignore]`d and run alone by
//! `scripts/test` after the rest of the suite.

use std::collections::HashMap;
use std::time::Duration;

use kafka::config::{consumer_config, OffsetCommit};
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
        },
        // no admin token: /readyz answers its status line only (its detail is not under test here)
        auth: telemetry::health::HealthAuthArgs::default(),
        kafka: topics.args.clone(),
        topics: kafka::TopicArgs { partitions: 3, replicas: 1 },
        profile: kafka::Profile::Fast,
        metrics: telemetry::health::MetricsRoute::ServicePort,
    };
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    antifraud::start(
        settings,
        &telemetry::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
    )
    .await
    .expect("antifraude starts");

    let ids: Vec<Uuid> = (0..INPUTS).map(|_| Uuid::new_v4()).collect();
    let feed = testkit::feed_requests(&topics, ids.clone(), Duration::from_millis(150));
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    testkit::stack(&["restart", "kafka"]).await;
    feed.await.expect("feed");

    let reader = kafka::consumer::subscribe(
        &consumer_config(&topics.args, "test", &unique("reader"), OffsetCommit::StoredAfterHandling),
        &[&topics.topic(topics::ANALYSED), &topics.topic(topics::REJECTED)],
    )
    .expect("reader");
    let mut outputs: HashMap<String, usize> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut quiet_until = None;
    while let Ok(record) = tokio::time::timeout_at(quiet_until.unwrap_or(deadline), reader.recv()).await {
        let record = record.expect("receive");
        let event: Value = serde_json::from_slice(record.payload().expect("payload")).expect("json");
        *outputs.entry(event["transferenciaId"].as_str().expect("id").to_owned()).or_default() += 1;
        if outputs.len() == INPUTS && quiet_until.is_none() {
            quiet_until = Some(tokio::time::Instant::now() + Duration::from_secs(3));
        }
    }
    shutdown.cancel();
    tracker.close();
    tokio::time::timeout(Duration::from_secs(30), tracker.wait()).await.expect("drains");
    assert_eq!(outputs.len(), INPUTS, "missing outputs");
    assert!(outputs.values().all(|count| *count == 1), "an input has more than one committed output");
    for id in &ids {
        assert_eq!(outputs.get(&id.to_string()), Some(&1));
    }
}
