//! The analysis handler driven directly against the real stack, in the two states a running
//! service reaches only by chance: a retry after a commit whose answer was lost, and a batch
//! holding records of a partition that was revoked while it was being handled.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kafka::config::{consumer_config, producer_config, transactional_producer_config, OffsetCommit};
use kafka::consumer::{Handler, KafkaConsumer};
use kafka::producer::{OutgoingRecord, Producer};
use kafka::rdkafka::consumer::Consumer;
use kafka::rdkafka::message::Message;
use kafka::rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use uuid::Uuid;

use antifraud::analysis::{Analyser, Topics};
use antifraud::scoring::{Scorer, DEFAULT_BLOCK_THRESHOLD_CENTS};
use contracts::topics;
use contracts::Cents;
use testkit::{eventually, receive, unique, TestTopics};

const RECORDS: usize = 20;

/// Publishes `RECORDS` requests over twenty keys (both partitions get some); returns their ids.
async fn publish_requests(topics: &TestTopics) -> HashSet<String> {
    let producer = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    let mut ids = HashSet::new();
    for n in 0..RECORDS {
        let id = Uuid::new_v4();
        let key = format!("CC-{n:03}");
        let event = testkit::transfer_requested(id, &key, Cents::new(100 + n as i64));
        let record = OutgoingRecord::new(topics.topic(topics::REQUESTED), key, event.to_string());
        producer.send(&record).await.expect("publish");
        ids.insert(id.to_string());
    }
    ids
}

fn member(topics: &TestTopics, group: &str) -> Arc<KafkaConsumer> {
    kafka::consumer::subscribe(
        &consumer_config(&topics.args, "test", group, OffsetCommit::InTransaction),
        &[&topics.topic(topics::REQUESTED)],
    )
    .expect("member")
}

fn analyser(topics: &TestTopics, consumer: Arc<KafkaConsumer>, group: &str) -> Analyser {
    Analyser::new(
        consumer,
        transactional_producer_config(&topics.args, "test", &unique("tx-handler"), Duration::from_millis(1)),
        Topics { analysed: topics.topic(topics::ANALYSED), rejected: topics.topic(topics::REJECTED) },
        Scorer { block_threshold_cents: DEFAULT_BLOCK_THRESHOLD_CENTS },
        group.to_owned(),
    )
}

/// Every committed output's transfer id: both output topics read to their end. The handler
/// committed its transaction before it returned, so they hold all it wrote.
async fn committed_outputs(topics: &TestTopics) -> Vec<String> {
    let mut outputs = Vec::new();
    for topic in [topics.topic(topics::ANALYSED), topics.topic(topics::REJECTED)] {
        for record in testkit::read_to_end(&topics.args, &topic).await {
            let body: Value = serde_json::from_slice(record.payload().expect("payload")).expect("json");
            outputs.push(body["transferenciaId"].as_str().expect("transferenciaId").to_owned());
        }
    }
    outputs
}

/// The group's committed offset of each input partition (`None`: nothing committed).
async fn committed_offsets(consumer: Arc<KafkaConsumer>, topic: String) -> Vec<Option<i64>> {
    tokio::task::spawn_blocking(move || {
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition(&topic, 0);
        partitions.add_partition(&topic, 1);
        let committed = consumer.committed_offsets(partitions, Duration::from_secs(10)).expect("committed");
        committed
            .elements()
            .iter()
            .map(|element| match element.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            })
            .collect()
    })
    .await
    .expect("join")
}

/// `RECORDS` requests published and received by the one member of a new group.
struct Received {
    topics: TestTopics,
    ids: HashSet<String>,
    group: String,
    consumer: Arc<KafkaConsumer>,
    batch: Vec<kafka::rdkafka::message::OwnedMessage>,
}

impl Received {
    async fn new() -> Self {
        testkit::init_logs();
        let topics = TestTopics::plan(2).await;
        let ids = publish_requests(&topics).await;
        let group = unique("antifraude-handler");
        let consumer = member(&topics, &group);
        let batch = receive(&consumer, RECORDS).await;
        Self { topics, ids, group, consumer, batch }
    }
}

#[tokio::test]
async fn a_retry_after_a_commit_whose_answer_was_lost_commits_nothing_twice() {
    let Received { topics, ids, group, consumer, batch } = Received::new().await;
    let mut analyser = analyser(&topics, consumer.clone(), &group);

    analyser.handle(&batch, false).await.expect("first attempt commits");
    // the service did not hear the commit's answer: the whole batch comes round again
    analyser.assume_last_attempt_failed();
    analyser.handle(&batch, false).await.expect("the retry succeeds");

    let outputs = committed_outputs(&topics).await;
    assert_eq!(outputs.len(), RECORDS, "one committed output per input, none doubled: {outputs:?}");
    assert_eq!(outputs.into_iter().collect::<HashSet<_>>(), ids);
    let mut ends = [0_i64; 2];
    for record in &batch {
        ends[record.partition() as usize] = ends[record.partition() as usize].max(record.offset() + 1);
    }
    let committed = committed_offsets(consumer, topics.topic(topics::REQUESTED)).await;
    assert_eq!(committed, ends.iter().map(|end| (*end > 0).then_some(*end)).collect::<Vec<_>>());
}

/// A retry takes records as done only on the committed offset its own failed attempt sent:
/// here the offsets were committed by another instance's transaction (as by a bug, or a
/// stale commit this member cannot account for), so the records are analysed again rather
/// than dropped unanalysed; a record dropped on an offset nobody vouches for is lost for good.
#[tokio::test]
async fn a_retry_does_not_take_records_as_done_on_offsets_it_did_not_send() {
    let Received { topics, ids, group, consumer, batch } = Received::new().await;

    analyser(&topics, consumer.clone(), &group).handle(&batch, false).await.expect("first instance commits");
    // another instance (its own transactional id) retries the same batch: the group's
    // committed offsets are past every record, but not what it sent (it sent nothing)
    let mut second = analyser(&topics, consumer.clone(), &group);
    second.assume_last_attempt_failed();
    second.handle(&batch, false).await.expect("the retry succeeds");

    let outputs = committed_outputs(&topics).await;
    let mut counts = std::collections::HashMap::<String, usize>::new();
    for id in outputs {
        *counts.entry(id).or_default() += 1;
    }
    assert_eq!(counts.keys().cloned().collect::<HashSet<_>>(), ids);
    assert!(
        counts.values().all(|count| *count == 2),
        "every record analysed again by the retry, none taken as done on offsets it did not send: {counts:?}"
    );
}

#[tokio::test]
async fn records_of_a_partition_revoked_mid_batch_are_left_to_its_new_owner() {
    testkit::init_logs();
    let topics = TestTopics::plan(2).await;
    let ids = publish_requests(&topics).await;
    let group = unique("antifraude-handler");
    let (first, second) = (member(&topics, &group), member(&topics, &group));
    // both members keep polling so the group settles on one partition each; what they receive
    // is dropped (nothing is committed by them). An error (the broker away for a moment) does
    // not stop a member: one that stopped polling would leave the group to the other for good
    let pollers: Vec<_> = [first.clone(), second.clone()]
        .into_iter()
        .map(|consumer| {
            tokio::spawn(async move {
                loop {
                    if consumer.recv().await.is_err() {
                        tokio::time::sleep(Duration::from_millis(100)).await; // spacing the retries
                    }
                }
            })
        })
        .collect();
    let owned = eventually("each member owns one partition", testkit::PATIENCE, || {
        let (first, second) = (first.clone(), second.clone());
        async move {
            let mine = first.assignment().ok()?;
            let theirs = second.assignment().ok()?;
            (mine.count() == 1 && theirs.count() == 1).then(|| mine.elements()[0].partition())
        }
    })
    .await;

    // a batch read before the rebalance: every record, of both partitions
    let everything = kafka::consumer::subscribe(
        &consumer_config(&topics.args, "test", &unique("batch"), OffsetCommit::StoredAfterHandling),
        &[&topics.topic(topics::REQUESTED)],
    )
    .expect("batch reader");
    let batch = receive(&everything, RECORDS).await;
    let ours: HashSet<String> = batch
        .iter()
        .filter(|record| record.partition() == owned)
        .map(|record| {
            let body: Value = serde_json::from_slice(record.payload().expect("payload")).expect("json");
            body["transferenciaId"].as_str().expect("id").to_owned()
        })
        .collect();
    assert!(!ours.is_empty() && ours.len() < ids.len(), "both partitions hold records: {}", ours.len());

    let mut analyser = analyser(&topics, first.clone(), &group);
    analyser.handle(&batch, false).await.expect("the batch is handled");

    let outputs = committed_outputs(&topics).await;
    assert_eq!(outputs.len(), ours.len(), "only the owned partition's records: {outputs:?}");
    assert_eq!(outputs.into_iter().collect::<HashSet<_>>(), ours);
    let committed = committed_offsets(first, topics.topic(topics::REQUESTED)).await;
    let revoked = 1 - owned as usize;
    assert_eq!(committed[revoked], None, "no offset committed for the partition this member does not own");
    assert!(committed[owned as usize].is_some(), "the owned partition's offsets went with the transaction");
    for poller in pollers {
        poller.abort();
    }
}
