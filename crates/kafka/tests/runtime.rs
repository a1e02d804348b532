//! The Kafka runtime against the real broker of the local stack (`scripts/stack up`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use contracts::headers::{decode_int, decode_long, decode_timestamp_type, TimestampType};
use kafka::config::{consumer_config, producer_config, transactional_producer_config, OffsetCommit};
use kafka::consumer::{self, Backoff, Handler, KafkaConsumer, LoopOptions, Verdict};
use kafka::dead_letter::{DeadLetterPublisher, Failure};
use kafka::producer::{OutgoingRecord, Producer};
use kafka::transactional::TransactionalProducer;
use kafka::KafkaArgs;
use testkit::{eventually, unique, TestTopics};

const WAIT: Duration = testkit::PATIENCE;

fn producer(args: &KafkaArgs) -> Producer {
    Producer::new(&producer_config(args, "test", Duration::ZERO)).expect("producer")
}

fn consumer(args: &KafkaArgs, group: &str, topic: &str, commit: OffsetCommit) -> Arc<KafkaConsumer> {
    consumer::subscribe(&consumer_config(args, "test", group, commit), &[topic]).expect("consumer")
}

/// Receives records until `until` says the list is complete.
async fn receive_until(
    consumer: &KafkaConsumer,
    mut until: impl FnMut(&[OwnedMessage]) -> bool,
) -> Vec<OwnedMessage> {
    let mut received = Vec::new();
    tokio::time::timeout(WAIT, async {
        while !until(&received) {
            let message = consumer.recv().await.expect("receive");
            received.push(message.detach());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out; received {} records", received.len()));
    received
}

fn payload(message: &OwnedMessage) -> String {
    String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned()
}

/// The offset committed for `group` on partition 0 of `topic` (`None`: nothing committed).
fn committed(args: &KafkaArgs, group: &str, topic: &str) -> Option<i64> {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("group.id", group)
        .create()
        .expect("offset reader");
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(topic, 0);
    let offsets = reader.committed_offsets(partitions, Duration::from_secs(10)).expect("committed offsets");
    match offsets.find_partition(topic, 0).expect("partition").offset() {
        Offset::Offset(offset) => Some(offset),
        _ => None,
    }
}

#[tokio::test]
async fn read_committed_sees_committed_records_and_never_aborted_ones() {
    testkit::init_logs();
    let topics = TestTopics::create(&["tx"], 1).await;
    let topic = topics.topic("tx");
    let args = &topics.args;
    let config = transactional_producer_config(args, "test", &unique("tx-test"), Duration::ZERO);
    let producer = TransactionalProducer::new(&config).expect("transactional producer");
    producer.init().await.expect("init transactions");

    producer.begin().await.expect("begin");
    producer.send(&OutgoingRecord::new(&topic, "k", "aborted")).await.expect("send");
    producer.abort().await.expect("abort");
    producer.begin().await.expect("begin");
    producer.send(&OutgoingRecord::new(&topic, "k", "committed")).await.expect("send");
    producer.commit().await.expect("commit");

    let committed_reader = consumer(args, &unique("g"), &topic, OffsetCommit::StoredAfterHandling);
    let seen = receive_until(&committed_reader, |seen| seen.iter().any(|m| payload(m) == "committed")).await;
    let payloads: Vec<String> = seen.iter().map(payload).collect();
    assert_eq!(payloads, ["committed"], "read_committed must skip the aborted record");

    // the aborted record really is in the log: a read_uncommitted reader sees it
    let mut uncommitted = consumer_config(args, "test", &unique("g"), OffsetCommit::StoredAfterHandling);
    uncommitted.set("isolation.level", "read_uncommitted");
    let uncommitted_reader = consumer::subscribe(&uncommitted, &[&topic]).expect("consumer");
    let seen = receive_until(&uncommitted_reader, |seen| seen.len() == 2).await;
    assert_eq!(seen.iter().map(payload).collect::<Vec<_>>(), ["aborted", "committed"]);
}

#[tokio::test]
async fn offsets_sent_in_a_transaction_move_only_when_it_commits() {
    testkit::init_logs();
    let topics = TestTopics::create(&["in", "out"], 1).await;
    let (input, output) = (topics.topic("in"), topics.topic("out"));
    let args = &topics.args;
    let plain = producer(args);
    for n in 0..3 {
        plain.send(&OutgoingRecord::new(&input, "k", format!("r{n}"))).await.expect("produce");
    }
    let group = unique("g");
    let source = consumer(args, &group, &input, OffsetCommit::InTransaction);
    let records = receive_until(&source, |seen| seen.len() == 3).await;
    let tx = TransactionalProducer::new(&transactional_producer_config(
        args,
        "test",
        &unique("tx"),
        Duration::ZERO,
    ))
    .expect("transactional producer");
    tx.init().await.expect("init");

    let offsets_after = |record: &OwnedMessage| {
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(record.topic(), record.partition(), Offset::Offset(record.offset() + 1))
            .expect("offset");
        offsets
    };
    // first record: produced and its offset sent, then aborted
    tx.begin().await.expect("begin");
    tx.send(&OutgoingRecord::new(&output, "k", "out-aborted")).await.expect("send");
    tx.send_offsets(offsets_after(&records[0]), source.group_metadata().expect("group metadata"))
        .await
        .expect("send offsets");
    tx.abort().await.expect("abort");
    assert_eq!(committed(args, &group, &input), None, "an aborted transaction moved the offset");

    // all three: committed together with the output
    tx.begin().await.expect("begin");
    tx.send(&OutgoingRecord::new(&output, "k", "out-committed")).await.expect("send");
    tx.send_offsets(offsets_after(&records[2]), source.group_metadata().expect("group metadata"))
        .await
        .expect("send offsets");
    tx.commit().await.expect("commit");
    assert_eq!(committed(args, &group, &input), Some(3));

    let reader = consumer(args, &unique("g"), &output, OffsetCommit::StoredAfterHandling);
    let seen = receive_until(&reader, |seen| !seen.is_empty()).await;
    assert_eq!(payload(&seen[0]), "out-committed");
}

#[tokio::test]
async fn dead_letters_keep_the_record_and_carry_springs_headers() {
    testkit::init_logs();
    let topics = TestTopics::create(&["events", "events-dlt"], 2).await;
    let (topic, dead_letters) = (topics.topic("events"), topics.topic("events-dlt"));
    let args = &topics.args;
    let plain = producer(args);
    let mut poison = OutgoingRecord::new(&topic, "CC-001", vec![0xff, 0xfe, b'{']);
    poison.partition = Some(1);
    poison = poison.header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    let original = plain.send(&poison).await.expect("produce");

    let group = unique("ledger");
    let source = consumer(args, &group, &topic, OffsetCommit::StoredAfterHandling);
    let record = receive_until(&source, |seen| !seen.is_empty()).await.remove(0);
    #[derive(Debug, thiserror::Error)]
    #[error("expected value at line 1 column 1")]
    struct NotJson;
    let failure = Failure::new("ledger::error::MalformedEvent", "serde_json::Error", &NotJson);
    DeadLetterPublisher::new(plain.clone(), &group)
        .publish(&record, &failure)
        .await
        .expect("publish dead letter");

    let reader = consumer(args, &unique("ops"), &dead_letters, OffsetCommit::StoredAfterHandling);
    let letter = receive_until(&reader, |seen| !seen.is_empty()).await.remove(0);
    assert_eq!(letter.partition(), 1, "a dead letter keeps its partition number");
    assert_eq!(letter.key(), Some(b"CC-001".as_slice()));
    assert_eq!(letter.payload(), Some([0xff, 0xfe, b'{'].as_slice()));
    let header = |name: &str| -> Vec<u8> {
        let headers = letter.headers().expect("headers");
        let found = headers.iter().find(|h| h.key == name).unwrap_or_else(|| panic!("no header {name}"));
        found.value.expect("value").to_vec()
    };
    assert_eq!(header("traceparent"), b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    assert_eq!(header("kafka_dlt-original-topic"), topic.as_bytes());
    assert_eq!(header("kafka_dlt-original-partition"), [0, 0, 0, 1]);
    assert_eq!(header("kafka_dlt-original-offset"), original.offset.to_be_bytes());
    assert_eq!(decode_int(&header("kafka_dlt-original-partition")), Ok(1));
    let timestamp = decode_long(&header("kafka_dlt-original-timestamp")).expect("8 bytes");
    assert_eq!(Some(timestamp), record.timestamp().to_millis());
    assert_eq!(header("kafka_dlt-original-timestamp-type"), b"CreateTime");
    assert_eq!(
        decode_timestamp_type(&header("kafka_dlt-original-timestamp-type")),
        Ok(TimestampType::CreateTime)
    );
    assert_eq!(header("kafka_dlt-original-consumer-group"), group.as_bytes());
    assert_eq!(header("kafka_dlt-exception-fqcn"), b"ledger::error::MalformedEvent");
    assert_eq!(header("kafka_dlt-exception-cause-fqcn"), b"serde_json::Error");
    assert_eq!(header("kafka_dlt-exception-message"), b"expected value at line 1 column 1");
}

/// Fails every batch that holds the record at `poison_offset`; records what it saw.
struct FailAt {
    poison_offset: Option<i64>,
    handled: Arc<Mutex<Vec<i64>>>,
    attempts_at_poison: Arc<Mutex<u32>>,
}

#[derive(Debug, thiserror::Error)]
#[error("database unavailable")]
struct Unavailable;

impl Handler for FailAt {
    type Error = Unavailable;

    async fn handle(&mut self, batch: &[OwnedMessage], _retrying: bool) -> Result<Vec<Verdict>, Unavailable> {
        if batch.iter().any(|record| Some(record.offset()) == self.poison_offset) {
            *self.attempts_at_poison.lock().expect("lock") += 1;
            return Err(Unavailable);
        }
        self.handled.lock().expect("lock").extend(batch.iter().map(Message::offset));
        Ok(Verdict::all_done(batch))
    }
}

#[tokio::test]
async fn the_loop_never_commits_a_record_whose_handler_failed() {
    testkit::init_logs();
    let topics = TestTopics::create(&["work"], 1).await;
    let topic = topics.topic("work");
    let args = &topics.args;
    let plain = producer(args);
    for n in 0..5 {
        plain.send(&OutgoingRecord::new(&topic, "k", format!("r{n}"))).await.expect("produce");
    }
    let group = unique("g");
    let options = LoopOptions {
        batch_records_max: 1,
        backoff: Backoff {
            initial: Duration::from_millis(20),
            multiplier: 2.0,
            max: Duration::from_millis(100),
        },
        ..LoopOptions::default()
    };

    // offsets 0 and 1 succeed, 2 fails on every attempt
    let handled = Arc::new(Mutex::new(Vec::new()));
    let attempts = Arc::new(Mutex::new(0));
    let shutdown = CancellationToken::new();
    let failing =
        FailAt { poison_offset: Some(2), handled: handled.clone(), attempts_at_poison: attempts.clone() };
    let run = tokio::spawn(consumer::run(
        consumer(args, &group, &topic, OffsetCommit::StoredAfterHandling),
        failing,
        options.clone(),
        shutdown.clone(),
    ));
    eventually("three failed attempts at offset 2", WAIT, || async {
        (*attempts.lock().expect("lock") >= 3).then_some(())
    })
    .await;
    shutdown.cancel();
    run.await.expect("join").expect("loop ends cleanly");
    assert_eq!(*handled.lock().expect("lock"), [0, 1]);
    assert_eq!(committed(args, &group, &topic), Some(2), "offset 2 failed: the commit must stop before it");

    // a new instance of the group starts at the failed record and goes on
    let handled = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let healthy =
        FailAt { poison_offset: None, handled: handled.clone(), attempts_at_poison: attempts.clone() };
    let run = tokio::spawn(consumer::run(
        consumer(args, &group, &topic, OffsetCommit::StoredAfterHandling),
        healthy,
        options,
        shutdown.clone(),
    ));
    eventually("offsets 2..5 handled", WAIT, || async {
        (handled.lock().expect("lock").len() == 3).then_some(())
    })
    .await;
    shutdown.cancel();
    run.await.expect("join").expect("loop ends cleanly");
    assert_eq!(*handled.lock().expect("lock"), [2, 3, 4]);
    assert_eq!(committed(args, &group, &topic), Some(5));
}

#[tokio::test]
async fn trace_context_travels_in_headers() {
    testkit::init_logs();
    let topics = TestTopics::create(&["traced"], 1).await;
    let topic = topics.topic("traced");
    let args = &topics.args;
    let sending = tracing::info_span!("http_request");
    let sent_traceparent = telemetry::context::traceparent(&sending).expect("a trace");
    let mut record = OutgoingRecord::new(&topic, "k", "v");
    kafka::trace::inject(&sending, &mut record);
    producer(args).send(&record).await.expect("produce");

    let reader = consumer(args, &unique("g"), &topic, OffsetCommit::StoredAfterHandling);
    let received = receive_until(&reader, |seen| !seen.is_empty()).await.remove(0);
    let handling = tracing::info_span!("handle");
    kafka::trace::continue_from(&handling, &received);
    let continued = telemetry::context::traceparent(&handling).expect("a trace");
    let trace_id = |traceparent: &str| traceparent.split('-').nth(1).map(str::to_owned);
    assert_eq!(trace_id(&continued), trace_id(&sent_traceparent), "one trace across the hop");
    assert_ne!(continued, sent_traceparent, "the consumer's span is a child, not the same span");
}

#[tokio::test]
async fn lag_reaches_zero_after_draining_a_transactional_topic() {
    testkit::init_logs();
    let topics = TestTopics::create(&["tx-lag"], 1).await;
    let topic = topics.topic("tx-lag");
    let args = &topics.args;
    let tx = TransactionalProducer::new(&transactional_producer_config(
        args,
        "test",
        &unique("tx"),
        Duration::ZERO,
    ))
    .expect("transactional producer");
    tx.init().await.expect("init");
    for batch in 0..3 {
        tx.begin().await.expect("begin");
        for n in 0..2 {
            tx.send(&OutgoingRecord::new(&topic, "k", format!("b{batch}-r{n}"))).await.expect("send");
        }
        tx.commit().await.expect("commit");
    }
    // 6 records and 3 commit markers: the high watermark is 9
    let group = unique("g");
    let consumer = consumer(args, &group, &topic, OffsetCommit::StoredAfterHandling);
    let handled = Arc::new(Mutex::new(Vec::new()));
    let accept_all =
        FailAt { poison_offset: None, handled: handled.clone(), attempts_at_poison: Arc::new(Mutex::new(0)) };
    let shutdown = CancellationToken::new();
    let run =
        tokio::spawn(consumer::run(consumer.clone(), accept_all, LoopOptions::default(), shutdown.clone()));
    eventually("six records handled", WAIT, || async {
        (handled.lock().expect("lock").len() == 6).then_some(())
    })
    .await;
    let lag = eventually("lag 0", WAIT, || {
        let consumer = consumer.clone();
        async move {
            let lags = tokio::task::spawn_blocking(move || kafka::lag::measure(&consumer))
                .await
                .expect("join")
                .ok()?;
            (lags.len() == 1 && lags[0].2 == 0).then_some(lags)
        }
    })
    .await;
    assert_eq!(lag[0].1, 0);
    shutdown.cancel();
    run.await.expect("join").expect("loop ends cleanly");
    assert_eq!(committed(args, &group, &topic), Some(9), "committed past the last commit marker");
}

#[tokio::test]
async fn lag_counts_each_partition_from_its_commit_or_else_from_its_log_start() {
    testkit::init_logs();
    let topics = TestTopics::create(&["lag-per-partition"], 3).await;
    let topic = topics.topic("lag-per-partition");
    let args = &topics.args;
    let producer = producer(args);
    // partition 0: five records; partition 1: four, the first three then deleted; 2: none
    for (partition, count) in [(0, 5), (1, 4)] {
        for n in 0..count {
            let mut record = OutgoingRecord::new(&topic, "k", format!("p{partition}-{n}"));
            record.partition = Some(partition);
            producer.send(&record).await.expect("send");
        }
    }
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &args.bootstrap_servers).create().expect("admin");
    let mut deleted = TopicPartitionList::new();
    deleted.add_partition_offset(&topic, 1, Offset::Offset(3)).expect("offset");
    let after =
        admin.delete_records(&deleted, &rdkafka::admin::AdminOptions::new()).await.expect("delete records");
    assert_eq!(after.find_partition(&topic, 1).map(|element| element.offset()), Some(Offset::Offset(3)));

    // assigned by hand, nothing read: every partition lags from its committed offset, or its
    // log start where the group has committed nothing
    let group = unique("g");
    let consumer: KafkaConsumer =
        kafka::context::create(&consumer_config(args, "test", &group, OffsetCommit::StoredAfterHandling))
            .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for partition in 0..3 {
        assignment.add_partition(&topic, partition);
    }
    consumer.assign(&assignment).expect("assign");
    let lags = |consumer: &KafkaConsumer| {
        let mut lags = kafka::lag::measure(consumer).expect("measure");
        lags.sort();
        lags.into_iter().map(|(_, partition, lag)| (partition, lag)).collect::<Vec<_>>()
    };
    assert_eq!(lags(&consumer), vec![(0, 5), (1, 1), (2, 0)], "nothing committed: from each log start");

    let mut commit = TopicPartitionList::new();
    commit.add_partition_offset(&topic, 0, Offset::Offset(2)).expect("offset");
    commit.add_partition_offset(&topic, 1, Offset::Offset(4)).expect("offset");
    consumer.commit(&commit, rdkafka::consumer::CommitMode::Sync).expect("commit");
    assert_eq!(lags(&consumer), vec![(0, 3), (1, 0), (2, 0)], "from the committed offsets");

    consumer.unassign().expect("unassign");
    assert_eq!(lags(&consumer), vec![], "nothing assigned, nothing measured");
}
