//! antifraude against the real stack: outputs, derived ids, poison, reprocessing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kafka::config::{consumer_config, producer_config, OffsetCommit};
use kafka::consumer::KafkaConsumer;
use kafka::producer::{OutgoingRecord, Producer};
use kafka::rdkafka::message::{Headers, Message, OwnedMessage};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use contracts::ids::{derived_event_id, ANALYSED_PREFIX, REJECTED_BY_ANTIFRAUD_PREFIX};
use contracts::topics;
use contracts::Cents;
use testkit::{receive, unique, TestTopics};

struct Running {
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(Duration::from_secs(30), self.tracker.wait()).await.expect("drains in 30 s");
    }
}

async fn start(topics: &TestTopics, instance: &str) -> Running {
    let settings = antifraud::Settings {
        args: antifraud::AntifraudArgs {
            listen: "127.0.0.1:0".parse().expect("address"),
            block_threshold_cents: antifraud::scoring::DEFAULT_BLOCK_THRESHOLD_CENTS,
            transactional_id_prefix: unique("tx-antifraude-test"),
            instance_id: Some(instance.into()),
            batch_records: 500,
            batch_wait_ms: 5,
            // scripts/test runs this file once per client
            kafka_client: antifraud::TransactionalClient::from_env(),
        },
        // no admin token: /readyz answers its status line only (its detail is not under test here)
        auth: telemetry::health::HealthAuthArgs::default(),
        kafka: topics.args.clone(),
        topics: kafka::TopicArgs { partitions: 2, replicas: 1 },
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
    Running { shutdown, tracker }
}

async fn publish(topics: &TestTopics, key: &str, payload: Vec<u8>) {
    publish_traced(topics, key, payload, None).await;
}

async fn publish_traced(topics: &TestTopics, key: &str, payload: Vec<u8>, traceparent: Option<&str>) {
    let producer = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    let mut record = OutgoingRecord::new(topics.topic(topics::REQUESTED), key, payload);
    if let Some(traceparent) = traceparent {
        record = record.header("traceparent", traceparent);
    }
    producer.send(&record).await.expect("publish");
}

fn reader(topics: &TestTopics, contract_topics: &[&str]) -> Arc<KafkaConsumer> {
    let names: Vec<String> = contract_topics.iter().map(|name| topics.topic(name)).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    kafka::consumer::subscribe(
        &consumer_config(&topics.args, "test", &unique("reader"), OffsetCommit::StoredAfterHandling),
        &names,
    )
    .expect("reader")
}

fn header(record: &OwnedMessage, name: &str) -> Option<String> {
    let headers = record.headers()?;
    let header = headers.iter().find(|header| header.key == name)?;
    header.value.map(|value| String::from_utf8_lossy(value).into_owned())
}

fn body(record: &OwnedMessage) -> Value {
    serde_json::from_slice(record.payload().expect("payload")).expect("json")
}

#[tokio::test]
async fn small_transfers_are_analysed_and_large_ones_blocked_with_derived_ids() {
    testkit::init_logs();
    let topics = TestTopics::plan(2).await;
    let running = start(&topics, "a").await;
    let (small, large) = (Uuid::new_v4(), Uuid::new_v4());
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    publish_traced(
        &topics,
        "CC-001",
        testkit::transfer_requested(small, "CC-001", Cents::new(1_234)).to_string().into_bytes(),
        Some(traceparent),
    )
    .await;
    publish(
        &topics,
        "CC-002",
        testkit::transfer_requested(large, "CC-002", Cents::new(10_000_000)).to_string().into_bytes(),
    )
    .await;

    let outputs = receive(&reader(&topics, &[topics::ANALYSED, topics::REJECTED]), 2).await;
    let by_topic: HashMap<String, &OwnedMessage> =
        outputs.iter().map(|record| (record.topic().to_owned(), record)).collect();
    let analysed = by_topic[&topics.topic(topics::ANALYSED)];
    let event = body(analysed);
    assert_eq!(event["transferenciaId"], small.to_string());
    assert_eq!(event["eventoId"], derived_event_id(ANALYSED_PREFIX, small).to_string());
    assert_eq!(event["score"], 5);
    assert_eq!(event["valorEmCentavos"], 1_234);
    assert_eq!(event["contaDestino"], "CC-999");
    assert_eq!(analysed.key(), Some(b"CC-001".as_slice()));
    assert_eq!(header(analysed, "evento-tipo").as_deref(), Some("TransferenciaAnalisada"));
    assert_eq!(header(analysed, "evento-id"), event["eventoId"].as_str().map(str::to_owned));
    let continued = header(analysed, "traceparent").expect("traceparent on the output");
    assert!(
        continued.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "the input's trace goes on: {continued}"
    );
    assert!(!continued.contains("00f067aa0ba902b7"), "a span of its own: {continued}");

    let rejected = by_topic[&topics.topic(topics::REJECTED)];
    let event = body(rejected);
    assert_eq!(event["transferenciaId"], large.to_string());
    assert_eq!(event["eventoId"], derived_event_id(REJECTED_BY_ANTIFRAUD_PREFIX, large).to_string());
    assert_eq!(event["motivo"], "BLOQUEADA_ANTIFRAUDE");
    assert_eq!(rejected.key(), Some(b"CC-002".as_slice()));
    assert_eq!(header(rejected, "evento-tipo").as_deref(), Some("TransferenciaRejeitada"));
    running.stop().await;
}

#[tokio::test]
async fn poison_goes_to_the_dead_letter_topic_and_the_rest_is_processed() {
    testkit::init_logs();
    let topics = TestTopics::plan(2).await;
    let (before, after) = (Uuid::new_v4(), Uuid::new_v4());
    // all on one key, so one partition, in this order, before the service starts: one batch
    publish(
        &topics,
        "CC-001",
        testkit::transfer_requested(before, "CC-001", Cents::new(100)).to_string().into_bytes(),
    )
    .await;
    publish(&topics, "CC-001", b"{\"eventoId\": 42".to_vec()).await;
    publish(
        &topics,
        "CC-001",
        testkit::transfer_requested(Uuid::new_v4(), "CC-001", Cents::new(-5)).to_string().into_bytes(),
    )
    .await;
    // an account or a currency that breaks the contract's rules is refused when read
    let mut bad_account = testkit::transfer_requested(Uuid::new_v4(), "CC-001", Cents::new(100));
    bad_account["contaDestino"] = json!("CC 999");
    publish(&topics, "CC-001", bad_account.to_string().into_bytes()).await;
    let mut bad_currency = testkit::transfer_requested(Uuid::new_v4(), "CC-001", Cents::new(100));
    bad_currency["moeda"] = json!("XYZ");
    publish(&topics, "CC-001", bad_currency.to_string().into_bytes()).await;
    publish(
        &topics,
        "CC-001",
        testkit::transfer_requested(after, "CC-001", Cents::new(200)).to_string().into_bytes(),
    )
    .await;
    let running = start(&topics, "a").await;

    let analysed = receive(&reader(&topics, &[topics::ANALYSED]), 2).await;
    let ids: Vec<Value> = analysed.iter().map(|record| body(record)["transferenciaId"].clone()).collect();
    assert_eq!(ids, [json!(before.to_string()), json!(after.to_string())]);
    let letters =
        receive(&reader(&topics, &[&contracts::topics::dead_letter_topic(topics::REQUESTED)]), 4).await;
    for letter in &letters {
        assert_eq!(
            header(letter, "kafka_dlt-exception-fqcn").as_deref(),
            Some("antifraud::analysis::MalformedEvent")
        );
        assert_eq!(header(letter, "kafka_dlt-original-topic"), Some(topics.topic(topics::REQUESTED)));
        assert_eq!(
            header(letter, "kafka_dlt-original-consumer-group"),
            Some(topics.args.group("antifraude"))
        );
    }
    assert_eq!(letters[0].payload(), Some(b"{\"eventoId\": 42".as_slice()));
    assert!(header(&letters[1], "kafka_dlt-exception-message").expect("message").contains("greater than 0"));
    let message = |letter| header(letter, "kafka_dlt-exception-message").expect("message");
    assert!(message(&letters[2]).contains("may contain only letters"), "{}", message(&letters[2]));
    assert!(message(&letters[3]).contains("not an active ISO 4217"), "{}", message(&letters[3]));
    running.stop().await;
}

#[tokio::test]
async fn a_redelivered_request_yields_the_same_event_id() {
    testkit::init_logs();
    let topics = TestTopics::plan(2).await;
    let running = start(&topics, "a").await;
    let transfer = Uuid::new_v4();
    // the outbox relay publishes at least once: the same event twice
    let payload = testkit::transfer_requested(transfer, "CC-001", Cents::new(4_321)).to_string().into_bytes();
    publish(&topics, "CC-001", payload.clone()).await;
    publish(&topics, "CC-001", payload).await;
    let outputs = receive(&reader(&topics, &[topics::ANALYSED]), 2).await;
    let (mut first, mut second) = (body(&outputs[0]), body(&outputs[1]));
    assert_eq!(first["eventoId"], derived_event_id(ANALYSED_PREFIX, transfer).to_string());
    // byte-identical but for the analysis timestamp
    first.as_object_mut().expect("object").remove("analisadaEm");
    second.as_object_mut().expect("object").remove("analisadaEm");
    assert_eq!(first, second);
    running.stop().await;
}

/// Antifraude's outputs are keyed by the source account and placed by the producer's
/// partitioner: it must be Java's (murmur2), so the ledger's Java twin and every Spring reader
/// see an account's events on one partition. librdkafka's `murmur2_random` is checked against
/// kafka-clients itself by `spring_headers`; each client's outputs must land where it puts them.
#[tokio::test]
async fn outputs_land_on_the_partition_javas_partitioner_gives_their_key() {
    testkit::init_logs();
    let topics = TestTopics::plan(12).await;
    let running = start(&topics, "a").await;
    let keys: Vec<String> = (0..24).map(|n| format!("CC-{n:03}")).collect();
    let producer = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    let input = topics.topic(topics::REQUESTED);
    for key in &keys {
        let request = testkit::transfer_requested(Uuid::new_v4(), key, Cents::new(1_000));
        producer
            .send(&OutgoingRecord::new(&input, key.as_str(), request.to_string()))
            .await
            .expect("publish");
    }
    let outputs = receive(&reader(&topics, &[topics::ANALYSED]), keys.len()).await;
    running.stop().await;

    // the same keys through the tests' producer (librdkafka, murmur2_random) to a topic with as
    // many partitions
    let probe_topic = topics.topic(topics::REJECTED);
    let mut java: HashMap<String, i32> = HashMap::new();
    for key in &keys {
        let delivered =
            producer.send(&OutgoingRecord::new(&probe_topic, key.as_str(), "probe")).await.expect("probe");
        java.insert(key.clone(), delivered.partition);
    }
    let spread: std::collections::HashSet<i32> = java.values().copied().collect();
    assert!(spread.len() > 4, "24 keys over 12 partitions should spread: {java:?}");
    for output in &outputs {
        let key = String::from_utf8(output.key().expect("keyed").to_vec()).expect("utf-8 key");
        assert_eq!(
            Some(&output.partition()),
            java.get(&key),
            "{key}: antifraude's output is on partition {}, Java's partitioner puts it on {:?}",
            output.partition(),
            java.get(&key)
        );
    }
}

/// How a record reaches the input in [`write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    /// An ordinary (idempotent) produce, as the outbox relay writes.
    Plain,
    /// Alone in a Kafka transaction that commits: a commit marker follows it.
    Committed,
    /// Alone in a Kafka transaction that aborts: unreadable under `read_committed`, and an abort
    /// marker follows it.
    Aborted,
}

/// Writes `records` (partition, kind, transfer) to `topic` in order, each on the partition
/// given, keyed `CC-<partition>`, as a Spring producer with a `transaction-id-prefix` writes
/// (every record in a transaction) or as the relay does.
async fn write(topics: &TestTopics, topic: &str, records: Vec<(i32, Write, Uuid)>) {
    use kafka::rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
    let plain: BaseProducer =
        producer_config(&topics.args, "upstream", Duration::ZERO).create().expect("plain producer");
    let transactional: BaseProducer = kafka::config::transactional_producer_config(
        &topics.args,
        "upstream",
        &unique("upstream"),
        Duration::ZERO,
    )
    .create()
    .expect("transactional producer");
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let timeout = Duration::from_secs(30);
        transactional.init_transactions(timeout).expect("init transactions");
        for (partition, kind, transfer) in records {
            let key = format!("CC-{partition:03}");
            let payload = testkit::transfer_requested(transfer, &key, Cents::new(1_000)).to_string();
            let record = BaseRecord::<str, str>::to(&topic).partition(partition).key(&key).payload(&payload);
            match kind {
                Write::Plain => {
                    plain.send(record).map_err(|(error, _)| error).expect("send");
                    plain.flush(timeout).expect("flush");
                }
                Write::Committed | Write::Aborted => {
                    transactional.begin_transaction().expect("begin");
                    transactional.send(record).map_err(|(error, _)| error).expect("send");
                    // on the broker before the transaction ends, so an aborted record takes its offset
                    transactional.flush(timeout).expect("flush");
                    if kind == Write::Committed {
                        transactional.commit_transaction(timeout).expect("commit");
                    } else {
                        transactional.abort_transaction(timeout).expect("abort");
                    }
                }
            }
        }
    })
    .await
    .expect("writer");
}

/// The transfers analysed, in the order read, until `last` of every listed partition's key is
/// among them (a record behind one that was passed over would come after it: its key's
/// outputs share one partition, in input order).
async fn analysed_until(reader: &KafkaConsumer, last: &[Uuid]) -> Vec<Uuid> {
    let mut seen = Vec::new();
    tokio::time::timeout(testkit::PATIENCE, async {
        while !last.iter().all(|id| seen.contains(id)) {
            let record = reader.recv().await.expect("receive").detach();
            let id = body(&record)["transferenciaId"].as_str().expect("id").parse().expect("uuid");
            seen.push(id);
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!("only {} analysed within {:?}, waiting for {last:?}: {seen:?}", seen.len(), testkit::PATIENCE)
    });
    seen
}

/// Offsets with no readable record are the log's, not gaps: a transactional writer upstream
/// (the article's Spring services with a `transaction-id-prefix` put a marker after every
/// transaction), an aborted transaction, and records deleted by `DeleteRecords` before
/// antifraude read them. antifraude analyses every readable record past them, at once, and
/// the aborted ones never. (The loop of #44 took the first marker for a gap and rewound for
/// ever: 0 of 12 records past one analysed in 90 s, issue #54.)
#[tokio::test]
async fn transaction_markers_aborted_and_deleted_records_upstream_stop_nothing() {
    use kafka::rdkafka::admin::{AdminClient, AdminOptions};
    use kafka::rdkafka::client::DefaultClientContext;
    testkit::init_logs();
    let topics = TestTopics::plan(2).await;
    let input = topics.topic(topics::REQUESTED);
    let reader = reader(&topics, &[topics::ANALYSED]);
    let round = |kinds: &[Write]| -> Vec<(i32, Write, Uuid)> {
        (0..2)
            .flat_map(|partition| kinds.iter().map(move |kind| (partition, *kind, Uuid::new_v4())))
            .collect()
    };
    let last = |records: &[(i32, Write, Uuid)]| -> Vec<Uuid> {
        (0..2)
            .filter_map(|partition| records.iter().rev().find(|(p, _, _)| *p == partition).map(|r| r.2))
            .collect()
    };

    // before antifraude starts, and again while it runs: committed and aborted transactions
    // between ordinary records; the group's first commit lands right before a marker
    let first = round(&[Write::Plain, Write::Committed, Write::Aborted, Write::Committed, Write::Plain]);
    write(&topics, &input, first.clone()).await;
    let running = start(&topics, "a").await;
    let mut seen = analysed_until(&reader, &last(&first)).await;
    let second = round(&[Write::Committed, Write::Committed, Write::Aborted, Write::Plain]);
    write(&topics, &input, second.clone()).await;
    seen.extend(analysed_until(&reader, &last(&second)).await);
    running.stop().await;

    // while it is stopped: records deleted before it read them, then more records
    let deleted = round(&[Write::Plain, Write::Committed]);
    write(&topics, &input, deleted.clone()).await;
    let admin: AdminClient<DefaultClientContext> =
        kafka::config::admin_config(&topics.args, "test").create().expect("admin");
    let ends = kafka::metadata::offsets_at(
        &*reader,
        &[(input.clone(), 0), (input.clone(), 1)],
        kafka::metadata::End::Last,
        Duration::from_secs(10),
    )
    .expect("ends");
    let mut before = kafka::rdkafka::TopicPartitionList::new();
    for partition in 0..2 {
        before
            .add_partition_offset(
                &input,
                partition,
                kafka::rdkafka::Offset::Offset(ends[&(input.clone(), partition)]),
            )
            .expect("offset");
    }
    admin.delete_records(&before, &AdminOptions::new()).await.expect("delete records");
    let third = round(&[Write::Plain, Write::Committed, Write::Plain]);
    write(&topics, &input, third.clone()).await;
    let running = start(&topics, "a").await;
    seen.extend(analysed_until(&reader, &last(&third)).await);
    running.stop().await;

    let readable = |records: &[(i32, Write, Uuid)]| -> Vec<Uuid> {
        records.iter().filter(|(_, kind, _)| *kind != Write::Aborted).map(|r| r.2).collect()
    };
    let expected: Vec<Uuid> = [readable(&first), readable(&second), readable(&third)].concat();
    let aborted: Vec<Uuid> = [&first, &second, &third]
        .iter()
        .flat_map(|records| records.iter().filter(|(_, kind, _)| *kind == Write::Aborted).map(|r| r.2))
        .collect();
    let missing: Vec<&Uuid> = expected.iter().filter(|id| !seen.contains(id)).collect();
    assert!(missing.is_empty(), "readable records never analysed: {missing:?}");
    let wrongly: Vec<&Uuid> = seen.iter().filter(|id| aborted.contains(id)).collect();
    assert!(wrongly.is_empty(), "aborted records analysed: {wrongly:?}");
    let gone: Vec<&Uuid> =
        seen.iter().filter(|id| deleted.iter().any(|(_, _, deleted)| deleted == *id)).collect();
    assert!(gone.is_empty(), "deleted records analysed: {gone:?}");
}
