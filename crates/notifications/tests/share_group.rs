//! `NOTIFICACOES_CONSUMPTION=share-group` against the real broker (Kafka 4.3, share groups on)
//! and a real local HTTP receiver: deliveries, retries by redelivery with the contract's
//! delays, dead letters as the retry topics write them, a slow call that holds nobody else,
//! and two instances working on one partition at once.
//!
//! Absence is proved by a marker, never by waiting: a marker record goes to the partition
//! after everything else, and once the broker reports the group's share-partition start offset
//! at the marker, every record before it is accepted or archived and can never come again.
//! The crash and broker-restart tests run the binary: `crates/pagamentos/tests/share_group_faults.rs`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kafka::producer::{Delivered, OutgoingRecord, Producer};
use kafka::rdkafka::consumer::Consumer;
use kafka::rdkafka::message::{Message, OwnedMessage};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use contracts::headers::{decode_big_integer, decode_int, decode_text};
use contracts::topics;
use notifications::share_group::GROUP;
use testkit::webhook::{Call, Receiver, Reply};
use testkit::TestTopics;

const SECRET: &str = "s3cr3t";

/// One `notifications::start` in share-group mode.
struct Service {
    health: SocketAddr,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Service {
    async fn start(
        args: &kafka::KafkaArgs,
        partitions: i32,
        url: &str,
        members: u32,
        timeout_ms: u64,
    ) -> Self {
        Self::start_as(args, partitions, url, members, timeout_ms, notifications::Consumption::ShareGroup)
            .await
    }

    async fn start_as(
        args: &kafka::KafkaArgs,
        partitions: i32,
        url: &str,
        members: u32,
        timeout_ms: u64,
        consumption: notifications::Consumption,
    ) -> Self {
        let mut settings =
            notifications::settings_for_tests(args.clone(), url.parse().expect("url"), SECRET, partitions);
        settings.args.webhook_timeout_ms = timeout_ms;
        settings.args.concurrency = members;
        settings.args.consumption = consumption;
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let health = notifications::start(
            settings,
            &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
        )
        .await
        .expect("start");
        Self { health, shutdown, tracker }
    }

    async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.health);
        reqwest::get(url).await.expect("metrics").text().await.expect("metrics body")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(Duration::from_secs(30), self.tracker.wait()).await.expect("drained");
    }
}

/// The test's topics, a producer and the broker's view of the share group.
struct Fixture {
    topics: TestTopics,
    producer: Producer,
    partitions: i32,
}

impl Fixture {
    async fn new(partitions: i32) -> Self {
        testkit::init_logs();
        let topics = TestTopics::plan(partitions).await;
        let producer = Producer::new(&kafka::config::producer_config(&topics.args, "test", Duration::ZERO))
            .expect("producer");
        Self { topics, producer, partitions }
    }

    fn group(&self) -> String {
        self.topics.args.group(GROUP)
    }

    /// A settled event for a fresh transfer, to `partition` (the partitioner's choice if
    /// `None`); returns its event id and where it landed.
    async fn settle(&self, partition: Option<i32>) -> (Uuid, Delivered) {
        self.settle_as(Uuid::new_v4(), partition).await
    }

    /// A settled event whose calls `receiver` answers with `replies`, scripted before the
    /// event is published: a member may call the moment it is written.
    async fn settle_scripted(
        &self,
        partition: Option<i32>,
        receiver: &Receiver,
        replies: &[Reply],
    ) -> (Uuid, Delivered) {
        let event_id = Uuid::new_v4();
        receiver.script(event_id, replies);
        self.settle_as(event_id, partition).await
    }

    async fn settle_as(&self, event_id: Uuid, partition: Option<i32>) -> (Uuid, Delivered) {
        let payload = json!({"eventoId": event_id, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z"});
        let delivered = self.publish(topics::SETTLED, partition, payload.to_string().into_bytes()).await;
        (event_id, delivered)
    }

    async fn publish(&self, topic: &str, partition: Option<i32>, payload: Vec<u8>) -> Delivered {
        let mut record = OutgoingRecord::new(self.topics.topic(topic), "CC-001", payload);
        record.partition = partition;
        self.producer.send(&record).await.expect("publish")
    }

    /// The end check: a marker to `partition` of the settled topic, delivered by `receiver`,
    /// then the broker's share-partition start offset (SPSO) at the marker, so that nothing
    /// before it can be delivered again. The broker moves the SPSO past settled records only
    /// when it next acquires one of the partition: a record settled after the marker was
    /// handed out (a slow call, a retry's wait) holds it back until another marker follows.
    async fn settled_up_to_a_marker(&self, receiver: &Receiver, partition: i32) {
        let topic = self.topics.topic(topics::SETTLED);
        let admin = notifications_admin(&self.topics.args).await;
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (marker, delivered) =
                self.settle_scripted(Some(partition), receiver, &[Reply::Status(200)]).await;
            wait_calls(receiver, marker, 1, Duration::from_secs(60)).await;
            let reached = Instant::now() + Duration::from_secs(3);
            while Instant::now() < reached {
                let offsets =
                    admin.admin().describe_share_group_offsets(self.group(), Default::default()).await;
                let start = offsets.ok().and_then(|offsets| {
                    offsets
                        .into_iter()
                        .find(|(of, _)| of.topic == topic && of.partition == partition)
                        .and_then(|(_, offset)| offset.ok())
                        .map(|offset| offset.start_offset)
                });
                if start.is_some_and(|start| start >= delivered.offset) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(
                Instant::now() < deadline,
                "{topic}/{partition}: the share-partition start offset never reached a marker"
            );
        }
    }

    /// The end check on every partition of the settled topic.
    async fn settled_everywhere(&self, receiver: &Receiver) {
        for partition in 0..self.partitions {
            self.settled_up_to_a_marker(receiver, partition).await;
        }
    }

    /// Reads `count` records of the settled topic's `-dlt`.
    async fn dead_letters(&self, count: usize) -> Vec<OwnedMessage> {
        let config = kafka::config::consumer_config(
            &self.topics.args,
            "test",
            &testkit::unique("dlt-reader"),
            kafka::config::OffsetCommit::StoredAfterHandling,
        );
        let consumer =
            kafka::consumer::subscribe(&config, &[&self.topics.topic("transferencias.liquidada-dlt")])
                .expect("dlt consumer");
        let records = testkit::receive(&consumer, count).await;
        consumer.unsubscribe();
        records
    }

    /// Dead letters ever written to the settled topic's `-dlt`.
    async fn dead_letters_written(&self) -> i64 {
        testkit::records_written(&self.topics.args, &self.topics.topic("transferencias.liquidada-dlt")).await
    }
}

async fn notifications_admin(args: &kafka::KafkaArgs) -> krafka::Kafka {
    krafka::Kafka::builder(args.bootstrap_servers.clone()).client_id("test").connect().await.expect("admin")
}

async fn wait_calls(receiver: &Receiver, event_id: Uuid, count: usize, within: Duration) -> Vec<Call> {
    testkit::eventually(&format!("{count} calls for {event_id}"), within, || async {
        let calls = receiver.calls_for(event_id);
        (calls.len() >= count).then_some(calls)
    })
    .await
}

fn gap(calls: &[Call], index: usize) -> Duration {
    calls[index + 1].at.duration_since(calls[index].at)
}

/// The last value of header `name` (as Spring's `lastHeader`).
fn header<'a>(record: &'a OwnedMessage, name: &str) -> &'a [u8] {
    kafka::consumer::header(record, name).unwrap_or_else(|| panic!("header {name} missing"))
}

fn values<'a>(record: &'a OwnedMessage, name: &str) -> Vec<&'a [u8]> {
    kafka::consumer::header_values(record, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_outcome_is_delivered_once_with_the_contracts_request() {
    let fixture = Fixture::new(1).await;
    let (receiver, url) = Receiver::start().await;
    let service = Service::start(&fixture.topics.args, 1, &url, 4, 2_000).await;
    let (settled, _) = fixture.settle(None).await;
    let rejected = Uuid::new_v4();
    let payload =
        json!({"eventoId": rejected, "transferenciaId": Uuid::new_v4(), "motivo": "SALDO_INSUFICIENTE",
        "rejeitadaEm": "2026-12-04T10:00:00Z"})
        .to_string();
    fixture.publish(topics::REJECTED, None, payload.clone().into_bytes()).await;

    let call = wait_calls(&receiver, rejected, 1, Duration::from_secs(60)).await.remove(0);
    assert_eq!(call.idempotency_key.as_deref(), Some(rejected.to_string().as_str()));
    assert_eq!(call.event_type.as_deref(), Some("TransferenciaRejeitada"));
    assert_eq!(call.body, payload.as_bytes());
    assert_eq!(
        call.signature.as_deref(),
        Some(notifications::webhook::signature(SECRET, payload.as_bytes()).as_str())
    );
    let call = wait_calls(&receiver, settled, 1, Duration::from_secs(60)).await.remove(0);
    assert_eq!(call.event_type.as_deref(), Some("TransferenciaLiquidada"));

    fixture.settled_everywhere(&receiver).await;
    assert_eq!(receiver.calls_for(settled).len(), 1, "delivered once");
    assert_eq!(receiver.calls_for(rejected).len(), 1, "delivered once");
    assert_eq!(fixture.dead_letters_written().await, 0);
    let metrics = service.metrics().await;
    assert!(metrics.contains("notifications_webhook_total{outcome=\"delivered\"}"), "{metrics}");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_receiver_is_called_again_a_second_then_two_seconds_later() {
    let fixture = Fixture::new(1).await;
    let (receiver, url) = Receiver::start().await;
    let service = Service::start(&fixture.topics.args, 1, &url, 4, 2_000).await;
    members_assigned(&service, &fixture.group(), 4).await; // the gaps measured in a settled group, not one forming
    let (event, _) = fixture
        .settle_scripted(None, &receiver, &[Reply::Status(503), Reply::Status(503), Reply::Status(200)])
        .await;

    let calls = wait_calls(&receiver, event, 3, Duration::from_secs(60)).await;
    eprintln!("measured retry gaps: {:?}, {:?}", gap(&calls, 0), gap(&calls, 1));
    assert!(gap(&calls, 0) >= Duration::from_millis(1000), "first retry after {:?}", gap(&calls, 0));
    assert!(gap(&calls, 1) >= Duration::from_millis(2000), "second retry after {:?}", gap(&calls, 1));
    // delivered on the third call: no fourth, no dead letter
    fixture.settled_everywhere(&receiver).await;
    assert_eq!(receiver.calls_for(event).len(), 3);
    assert_eq!(fixture.dead_letters_written().await, 0);
    let settled = fixture.topics.topic(topics::SETTLED);
    let metrics = service.metrics().await;
    assert!(metrics.contains(&format!("retries_total{{topic=\"{settled}\"}} 2")), "{metrics}");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_failing_receiver_gets_four_calls_then_the_dead_letter_is_written() {
    let fixture = Fixture::new(1).await;
    let (receiver, url) = Receiver::start().await;
    let service = Service::start(&fixture.topics.args, 1, &url, 4, 2_000).await;
    members_assigned(&service, &fixture.group(), 4).await; // the gaps measured in a settled group, not one forming
    let (event, original) = fixture.settle_scripted(None, &receiver, &[Reply::Status(503); 10]).await;

    let calls = wait_calls(&receiver, event, 4, Duration::from_secs(60)).await;
    eprintln!("measured retry gaps: {:?}, {:?}, {:?}", gap(&calls, 0), gap(&calls, 1), gap(&calls, 2));
    for (index, at_least) in [(0, 1000), (1, 2000), (2, 4000)] {
        assert!(
            gap(&calls, index) >= Duration::from_millis(at_least),
            "gap {index}: {:?}",
            gap(&calls, index)
        );
    }

    let letters = fixture.dead_letters(1).await;
    let letter = &letters[0];
    let payload: Value = serde_json::from_slice(letter.payload().expect("payload")).expect("json");
    assert_eq!(payload["eventoId"], event.to_string());
    assert_eq!(letter.key(), Some(&b"CC-001"[..]));
    assert_eq!(letter.partition(), original.partition, "the original's partition number");
    let settled = fixture.topics.topic(topics::SETTLED);
    // the retry-topic family, one value each (the record took one hop: to -dlt), attempts one
    // past the fourth, due at once when re-driven
    assert_eq!(decode_text(header(letter, "kafka_original-topic")), Ok(settled.as_str()));
    assert_eq!(decode_int(header(letter, "kafka_original-partition")), Ok(original.partition));
    assert_eq!(contracts::headers::decode_long(header(letter, "kafka_original-offset")), Ok(original.offset));
    assert_eq!(header(letter, "kafka_original-timestamp-type"), b"CreateTime");
    assert_eq!(
        decode_text(header(letter, "kafka_dlt-original-consumer-group")),
        Ok(fixture.group().as_str())
    );
    assert_eq!(decode_int(header(letter, "retry_topic-attempts")), Ok(5));
    let due = decode_big_integer(header(letter, "retry_topic-backoff-timestamp")).expect("backoff");
    assert!(due <= letter.timestamp().to_millis().expect("timestamp"));
    assert!(decode_big_integer(header(letter, "retry_topic-original-timestamp")).is_ok());
    assert_eq!(header(letter, "kafka_exception-fqcn"), b"notifications::webhook::ServerError");
    assert_eq!(header(letter, "kafka_exception-cause-fqcn"), b"http::status::StatusCode");
    assert_eq!(header(letter, "kafka_exception-message"), b"webhook answered 503 Service Unavailable");
    for name in [
        "kafka_original-topic",
        "kafka_original-offset",
        "kafka_dlt-original-consumer-group",
        "retry_topic-attempts",
        "kafka_exception-fqcn",
        "kafka_exception-stacktrace",
    ] {
        assert_eq!(values(letter, name).len(), 1, "{name}");
    }

    // no fifth call, one dead letter
    fixture.settled_everywhere(&receiver).await;
    assert_eq!(receiver.calls_for(event).len(), 4);
    assert_eq!(fixture.dead_letters_written().await, 1);
    let metrics = testkit::eventually("the dead-letter gauge", Duration::from_secs(20), || async {
        let metrics = service.metrics().await;
        metrics.contains(&format!("dlt_mensagens_retidas{{topic=\"{settled}-dlt\"}} 1")).then_some(metrics)
    })
    .await;
    for expected in [
        format!("retries_total{{topic=\"{settled}\"}} 3"),
        format!("dlt_mensagens_total{{topic=\"{settled}-dlt\"}} 1"),
    ] {
        assert!(metrics.contains(&expected), "{expected} missing from /metrics");
    }
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_is_dead_lettered_after_one_call_and_garbage_after_none() {
    let fixture = Fixture::new(1).await;
    let (receiver, url) = Receiver::start().await;
    let service = Service::start(&fixture.topics.args, 1, &url, 4, 2_000).await;
    let (event, _) = fixture.settle_scripted(None, &receiver, &[Reply::Status(400)]).await;
    fixture.publish(topics::SETTLED, None, b"{not json".to_vec()).await;

    let letters = fixture.dead_letters(2).await;
    let refused =
        letters.iter().find(|letter| letter.payload() != Some(&b"{not json"[..])).expect("refused letter");
    let garbage =
        letters.iter().find(|letter| letter.payload() == Some(&b"{not json"[..])).expect("garbage letter");
    assert_eq!(header(refused, "kafka_exception-fqcn"), b"notifications::webhook::ClientError");
    assert_eq!(header(refused, "kafka_exception-cause-fqcn"), b"http::status::StatusCode");
    assert_eq!(header(garbage, "kafka_exception-fqcn"), notifications::notifier::MALFORMED_EVENT.as_bytes());
    assert_eq!(header(garbage, "kafka_exception-cause-fqcn"), b"serde_json::error::Error");
    // rejected by the first attempt: on their way to attempt 2
    assert_eq!(decode_int(header(refused, "retry_topic-attempts")), Ok(2));
    assert_eq!(decode_int(header(garbage, "retry_topic-attempts")), Ok(2));

    fixture.settled_everywhere(&receiver).await;
    assert_eq!(receiver.calls_for(event).len(), 1, "one call for the 400");
    assert_eq!(fixture.dead_letters_written().await, 2);
    assert!(receiver.calls().iter().all(|call| &call.body[..] != b"{not json"), "garbage is never sent");
    service.stop().await;
}

/// Waits until `members` members of `group` (over every service of this process) have
/// partitions assigned, so that what the test publishes next is shared as the broker will go
/// on sharing it. The gauge is read through `service`; other tests' services in this process
/// count their own groups' members.
async fn members_assigned(service: &Service, group: &str, members: u32) {
    let line = format!("notifications_members_with_partitions{{group=\"{group}\"}} {members}\n");
    testkit::eventually(&format!("{members} members with partitions"), Duration::from_secs(90), || async {
        service.metrics().await.contains(&line).then_some(())
    })
    .await;
}

/// Healthy notifications published one after the other while one call hangs for `slow`, on
/// every partition (the hanging one's included); returns each one's latency, from its
/// publication to its call, and whether they all came while the slow call was still open.
async fn healthy_latencies_beside_a_slow_call(
    consumption: notifications::Consumption,
    slow: Duration,
) -> (Vec<Duration>, bool) {
    let fixture = Fixture::new(3).await;
    let (receiver, url) = Receiver::start().await;
    let members = 8; // more than the 6 partitions of the two topics: each is shared
    let service = Service::start_as(&fixture.topics.args, 3, &url, members, 10_000, consumption).await;
    if consumption == notifications::Consumption::ShareGroup {
        members_assigned(&service, &fixture.group(), members).await;
    }
    for partition in 0..3 {
        let (warm, _) = fixture.settle(Some(partition)).await;
        wait_calls(&receiver, warm, 1, Duration::from_secs(60)).await;
    }
    let (hanging, _) = fixture.settle_scripted(Some(0), &receiver, &[Reply::After(slow, 200)]).await;
    let hung_at = wait_calls(&receiver, hanging, 1, Duration::from_secs(20)).await[0].at;
    let mut latencies = Vec::new();
    for n in 0..12 {
        let sent = Instant::now();
        let (event, _) = fixture.settle(Some(n % 3)).await;
        let call = wait_calls(&receiver, event, 1, Duration::from_secs(30)).await.remove(0);
        latencies.push(call.at.duration_since(sent));
    }
    let while_open = Instant::now() < hung_at + slow;
    if consumption == notifications::Consumption::ShareGroup {
        fixture.settled_everywhere(&receiver).await;
        assert_eq!(receiver.calls_for(hanging).len(), 1, "the slow call was made once");
    }
    service.stop().await;
    (latencies, while_open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_on_one_partition_holds_no_other_notification() {
    let slow = Duration::from_secs(6);
    let (latencies, while_open) =
        healthy_latencies_beside_a_slow_call(notifications::Consumption::ShareGroup, slow).await;
    eprintln!("healthy notifications beside a {slow:?} call: latencies {latencies:?}");
    let worst = latencies.iter().max().copied().unwrap_or_default();
    assert!(worst < Duration::from_secs(2), "a healthy notification took {worst:?}: {latencies:?}");
    assert!(while_open, "the healthy notifications came only after the slow call ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_work_on_one_partition_at_once() {
    let fixture = Fixture::new(1).await;
    let (first, first_url) = Receiver::start().await;
    let (second, second_url) = Receiver::start().await;
    // every call takes a while, so that work on one partition overlaps when it is shared
    let call = Duration::from_millis(300);
    first.answer_by_default(Reply::After(call, 200));
    second.answer_by_default(Reply::After(call, 200));
    let members = 4;
    let one = Service::start(&fixture.topics.args, 1, &first_url, members, 5_000).await;
    members_assigned(&one, &fixture.group(), members).await;
    let other = Service::start(&fixture.topics.args, 1, &second_url, members, 5_000).await;
    members_assigned(&other, &fixture.group(), 2 * members).await; // both instances' members

    // one partition (the settled topic has one): with 8 members over 2 partitions, each
    // partition has 4, two of each instance
    let count = 40;
    let mut events = Vec::new();
    for _ in 0..count {
        events.push(fixture.settle(Some(0)).await.0);
    }
    testkit::eventually("every notification", Duration::from_secs(60), || async {
        events
            .iter()
            .all(|event| !first.calls_for(event).is_empty() || !second.calls_for(event).is_empty())
            .then_some(())
    })
    .await;
    let (by_first, by_second): (Vec<Call>, Vec<Call>) = (first.calls(), second.calls());
    eprintln!(
        "partition 0 of the settled topic: {} calls by the first instance, {} by the second",
        by_first.len(),
        by_second.len()
    );
    assert!(!by_first.is_empty() && !by_second.is_empty(), "one instance had the partition to itself");
    let overlapping = by_first
        .iter()
        .filter(|a| by_second.iter().any(|b| a.at.max(b.at).duration_since(a.at.min(b.at)) < call))
        .count();
    assert!(overlapping > 0, "no call of one instance overlapped a call of the other");
    one.stop().await;
    other.stop().await;
}
