//! What both notification benchmarks do around their measurement: publish the settled events,
//! start the service with 64 calls in flight, stop it.

use std::time::Duration;

use kafka::producer::{OutgoingRecord, Producer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use contracts::topics;
use testkit::TestTopics;

/// Publishes `payloads` to the topic set's settlements topic, keyed over 1 000 accounts, and
/// waits for every acknowledgement.
pub async fn publish_settled(topic_set: &TestTopics, payloads: impl IntoIterator<Item = Value>) {
    let producer =
        Producer::new(&kafka::config::producer_config(&topic_set.args, "bench", Duration::from_millis(5)))
            .expect("producer");
    let topic = topic_set.topic(topics::SETTLED);
    let mut sends = Vec::new();
    for (n, payload) in payloads.into_iter().enumerate() {
        let record = OutgoingRecord::new(&topic, format!("CC-{:05}", n % 1000), payload.to_string());
        let producer = producer.clone();
        sends.push(tokio::spawn(async move { producer.send(&record).await.expect("publish") }));
    }
    for send in sends {
        send.await.expect("send task");
    }
}

/// A running notifications service.
pub struct Running {
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

/// Starts notifications on `topic_set` (`partitions` each) against webhook `url`, 64 calls in
/// flight, consuming as `consumption` says.
pub async fn start(
    topic_set: &TestTopics,
    url: &str,
    partitions: i32,
    consumption: notifications::Consumption,
) -> Running {
    let url = url.parse().expect("url");
    let mut settings =
        notifications::settings_for_tests(topic_set.args.clone(), url, "bench-secret", partitions);
    settings.args.concurrency = 64;
    settings.args.consumption = consumption;
    let (shutdown, tracker) = (CancellationToken::new(), TaskTracker::new());
    let supervisor = service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone());
    notifications::start(settings, &supervisor).await.expect("start");
    Running { shutdown, tracker }
}

impl Running {
    /// Stops the service and waits for its tasks to drain.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}
