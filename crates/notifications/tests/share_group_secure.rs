//! The share-group mode on the secure broker (`scripts/stack secure up`: SASL_SSL with
//! SCRAM-SHA-512, a CA of its own, least-privilege ACLs): notificacoes as its own Kafka user
//! configures its share group, delivers, and writes a dead letter, through krafka with the same
//! `KAFKA_SECURITY_PROTOCOL` / `KAFKA_SASL_*` / `KAFKA_SSL_*` settings as every rdkafka client.
//! `#[ignore]`d: `scripts/test` runs it once the secure broker is up.

use std::time::Duration;

use kafka::producer::{OutgoingRecord, Producer};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use contracts::topics;
use testkit::secure;
use testkit::webhook::{Receiver, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the secure broker: scripts/stack secure up"]
async fn as_its_own_user_over_sasl_ssl_the_share_group_delivers_and_dead_letters() {
    testkit::init_logs();
    let topics = secure::topics(1).await;
    let (receiver, url) = Receiver::start().await;
    let mut args = secure::args("notificacoes");
    args.topic_prefix = topics.args.topic_prefix.clone();
    let mut settings = notifications::settings_for_tests(args, url.parse().expect("url"), "s3cr3t", 1);
    settings.args.webhook_timeout_ms = 2_000;
    settings.args.concurrency = 2;
    settings.args.consumption = notifications::Consumption::ShareGroup;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    notifications::start(
        settings,
        &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
    )
    .await
    .expect("notificacoes starts as its own user, its share group configured");

    // the ledger writes the outcomes
    let mut ledger = secure::args("ledger");
    ledger.topic_prefix = topics.args.topic_prefix.clone();
    let producer =
        Producer::new(&kafka::config::producer_config(&ledger, "test", Duration::ZERO)).expect("producer");
    let (delivered, refused) = (Uuid::new_v4(), Uuid::new_v4());
    receiver.script(refused, &[Reply::Status(400)]);
    for event in [delivered, refused] {
        let payload = json!({"eventoId": event, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z"});
        let record = OutgoingRecord::new(topics.topic(topics::SETTLED), "CC-001", payload.to_string());
        producer.send(&record).await.expect("publish as ledger");
    }
    testkit::eventually("both notifications called", Duration::from_secs(60), || async {
        (!receiver.calls_for(delivered).is_empty() && !receiver.calls_for(refused).is_empty()).then_some(())
    })
    .await;
    // the refused one's dead letter, written by notificacoes over SASL_SSL
    testkit::eventually("the dead letter", Duration::from_secs(60), || async {
        let written =
            testkit::records_written(&topics.args, &topics.topic("transferencias.liquidada-dlt")).await;
        (written == 1).then_some(())
    })
    .await;
    shutdown.cancel();
    tracker.close();
    tokio::time::timeout(Duration::from_secs(30), tracker.wait()).await.expect("drained");
}
