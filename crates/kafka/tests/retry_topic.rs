//! A retry stage against the real broker: records wait for their backoff timestamp with only
//! their partition paused, and none is lost or processed early while others stream in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use contracts::headers::{encode_big_integer, retry};
use kafka::config::{consumer_config, producer_config, OffsetCommit};
use kafka::producer::{OutgoingRecord, Producer};
use kafka::retry_topic::{now_ms, Attempt, Chain, Stage, StageOptions, Verdict};
use testkit::{eventually, unique, TestTopics};

/// Records every attempt: payload → (when it was due, when it ran).
#[derive(Default)]
struct Recorder {
    attempts: Mutex<HashMap<String, Vec<(i64, i64)>>>,
}

impl Attempt for Recorder {
    async fn attempt(&self, record: &OwnedMessage) -> Verdict {
        let due = kafka::retry_topic::due_at_ms(record).unwrap_or(0);
        let payload = String::from_utf8_lossy(record.payload().unwrap_or_default()).into_owned();
        self.attempts.lock().expect("lock").entry(payload).or_default().push((due, now_ms()));
        Verdict::Done
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_records_are_neither_lost_nor_early_while_others_stream_in() {
    testkit::init_logs();
    let topics = TestTopics::create(&["stage-retry-1000"], 3).await;
    let topic = topics.topic("stage-retry-1000");
    let group = unique("stage");
    let stage = Stage {
        attempt: 2,
        group: group.clone(),
        sources: vec![(topic.clone(), topics.topic("stage"))],
        waits_for_backoff: true,
    };
    let consumer = kafka::consumer::subscribe(
        &consumer_config(&topics.args, "test", &group, OffsetCommit::StoredAfterHandling),
        &[&topic],
    )
    .expect("consumer");
    let producer = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    let recorder = Arc::new(Recorder::default());
    let shutdown = CancellationToken::new();
    // long batches: a timer of a held record fires while a batch is being filled
    let options = StageOptions { batch_wait_max: Duration::from_millis(150), ..StageOptions::default() };
    let run = tokio::spawn(kafka::retry_topic::run(
        consumer,
        recorder.clone(),
        producer.clone(),
        Chain { delays_ms: vec![1000] },
        stage,
        options,
        shutdown.clone(),
    ));

    // 1 500 records over 3 s, each due 100–600 ms after it is sent, on three partitions
    let count = 1_500;
    for n in 0..count {
        let due = now_ms() + 100 + (n as i64 * 37) % 500;
        let record = OutgoingRecord::new(&topic, format!("k{}", n % 30), format!("r{n}"))
            .header(retry::BACKOFF_TIMESTAMP, encode_big_integer(due));
        let producer = producer.clone();
        tokio::spawn(async move { producer.send(&record).await.expect("publish") });
        if n % 25 == 24 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    eventually("every record attempted", testkit::PATIENCE, || async {
        (recorder.attempts.lock().expect("lock").len() == count).then_some(())
    })
    .await;
    // stopped: every attempt it will ever make is recorded
    shutdown.cancel();
    run.await.expect("stage task").expect("stage");
    let attempts = recorder.attempts.lock().expect("lock").clone();
    let early: Vec<_> = attempts.iter().filter(|(_, runs)| runs.iter().any(|(due, ran)| ran < due)).collect();
    assert!(early.is_empty(), "{} records ran before they were due: {:?}", early.len(), early.first());
    let repeated = attempts.values().filter(|runs| runs.len() > 1).count();
    assert_eq!(repeated, 0, "records attempted more than once without a failure or restart");
}

/// The offset committed for `group` on partition 0 of `topic` (`None`: nothing committed).
fn committed(args: &kafka::KafkaArgs, group: &str, topic: &str) -> Option<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_stopped_while_holding_a_record_commits_nothing_of_it() {
    testkit::init_logs();
    let topics = TestTopics::create(&["hold-retry-1000"], 1).await;
    let topic = topics.topic("hold-retry-1000");
    let group = unique("stage");
    let producer = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    let recorder = Arc::new(Recorder::default());
    let start = |recorder: Arc<Recorder>| {
        let stage = Stage {
            attempt: 2,
            group: group.clone(),
            sources: vec![(topic.clone(), topics.topic("hold"))],
            waits_for_backoff: true,
        };
        let consumer = kafka::consumer::subscribe(
            &consumer_config(&topics.args, "test", &group, OffsetCommit::StoredAfterHandling),
            &[&topic],
        )
        .expect("consumer");
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(kafka::retry_topic::run(
            consumer,
            recorder,
            producer.clone(),
            Chain { delays_ms: vec![1000] },
            stage,
            StageOptions::default(),
            shutdown.clone(),
        ));
        (shutdown, run)
    };
    let send = |payload: &str, due: i64| {
        let record = OutgoingRecord::new(&topic, "k", payload)
            .header(retry::BACKOFF_TIMESTAMP, encode_big_integer(due));
        let producer = producer.clone();
        async move { producer.send(&record).await.expect("publish") }
    };
    let (shutdown, run) = start(recorder.clone());
    send("due", now_ms() - 1_000).await;
    eventually("the record due at once attempted", Duration::from_secs(60), || async {
        recorder.attempts.lock().expect("lock").contains_key("due").then_some(())
    })
    .await;
    // the member has joined and is fetching: the held record's margin starts now, not before
    // a group join that takes seconds on a broker started moments ago
    let held_due = now_ms() + 6_000;
    send("held", held_due).await;
    // not a synchronisation: the assertions below hold whenever the stop comes; waiting longer
    // than the runtime's idle store interval (500 ms) gives a store of the held record's offset
    // the chance to happen, which the first assertion would catch
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(now_ms() < held_due, "the machine is too slow for this test's 6 s margin");
    shutdown.cancel();
    run.await.expect("stage task").expect("stage");
    assert_eq!(committed(&topics.args, &group, &topic), Some(1), "the held record's offset was committed");
    assert!(!recorder.attempts.lock().expect("lock").contains_key("held"), "attempted before it was due");

    // the next member of the group gets it again from the committed offset, and waits for it
    let (shutdown, run) = start(recorder.clone());
    let runs = eventually("the held record attempted", Duration::from_secs(60), || async {
        recorder.attempts.lock().expect("lock").get("held").cloned()
    })
    .await;
    assert_eq!(runs.len(), 1);
    assert!(runs[0].1 >= held_due, "attempted {} ms before it was due", held_due - runs[0].1);
    // "held" came after "due" in the partition: "due" was not attempted again
    assert_eq!(recorder.attempts.lock().expect("lock")["due"].len(), 1);
    shutdown.cancel();
    run.await.expect("stage task").expect("stage");
    assert_eq!(committed(&topics.args, &group, &topic), Some(2));
}
