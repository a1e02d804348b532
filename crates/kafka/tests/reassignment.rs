//! Pins the client behaviour antifraude's exactly-once loop relies on (#44): after a failure the
//! loop drops the records in hand and seeks each partition to the group's committed offset, and
//! a partition revoked from a member and later assigned to it again, with no offset given, must
//! likewise be fetched from the group's committed offset, not from where the member's fetch had
//! got to before the revocation. A partition the member keeps through the same rebalances goes
//! on from its position. Against the real broker of the local stack (`scripts/stack up`), under
//! both group protocols, through the project's consumer and its rebalance callback
//! (`kafka::context`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use kafka::config::{base_consumer_settings, consumer_config, producer_config, OffsetCommit};
use kafka::consumer::{self, KafkaConsumer};
use kafka::producer::{OutgoingRecord, Producer};
use kafka::{GroupProtocol, KafkaArgs};
use testkit::{eventually, unique, TestTopics, PATIENCE};

/// Records on each partition before the rebalances: A reads them all.
const RECORDS: i64 = 24;
/// Records on each partition after the moved partition came back to A.
const MORE: i64 = 4;
/// The group's committed offset of partitions 0 and 1: behind A's position, and a different one
/// per partition, so an offset received names where it came from.
const COMMITTED: [i64; 2] = [7, 13];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_assigned_again_is_fetched_from_its_committed_offset_kip848() {
    a_partition_assigned_again_is_fetched_from_its_committed_offset(GroupProtocol::Consumer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_assigned_again_is_fetched_from_its_committed_offset_classic() {
    a_partition_assigned_again_is_fetched_from_its_committed_offset(GroupProtocol::Classic).await;
}

/// Member A of group G reads both partitions to their end, G's committed offsets are set behind
/// that ([`COMMITTED`]), member B joins and the broker moves one partition to B, which reads it
/// and commits nothing, B leaves and the partition comes back to A: A's next records of it start
/// at the committed offset, and those of the partition it kept go on from its position.
async fn a_partition_assigned_again_is_fetched_from_its_committed_offset(protocol: GroupProtocol) {
    testkit::init_logs();
    let topics = TestTopics::create(&["reassigned"], 2).await;
    let topic = topics.topic("reassigned");
    let mut args = topics.args.clone();
    args.group_protocol = protocol;
    let producer = Producer::new(&producer_config(&args, "test", Duration::ZERO)).expect("producer");
    produce(&producer, &topic, 0..RECORDS).await;
    let group = unique("g");

    // A reads everything: its fetch position is the end of both partitions
    let a = Member::join(&args, "test-a", &group, &topic);
    eventually("A to read both partitions to their end", PATIENCE, || {
        ready(a.has_read(0, RECORDS - 1) && a.has_read(1, RECORDS - 1))
    })
    .await;
    assert_eq!(a.held(), [0, 1], "A alone holds both partitions");
    let read_before = a.receipts().len();
    assert_eq!(read_before, 2 * RECORDS as usize, "A read each record once: {:?}", a.receipts());

    // G's committed offsets, behind A's position (a plain commit; the loop commits in transactions)
    let mut offsets = TopicPartitionList::new();
    for (partition, offset) in [0, 1].into_iter().zip(COMMITTED) {
        offsets.add_partition_offset(&topic, partition, Offset::Offset(offset)).expect("offset");
    }
    a.consumer.commit(&offsets, CommitMode::Sync).expect("commit the middle offsets");
    assert_eq!(committed(&args, &group, &topic).await, COMMITTED);
    let tick_before = a.consumer.context().revocations.now();

    // B joins: the broker revokes one partition from A (A is polling) and assigns it to B
    let b = Member::join(&args, "test-b", &group, &topic);
    let (moved, kept) = eventually("one partition to move from A to B", PATIENCE, || {
        let (a_held, b_held) = (a.held(), b.held());
        std::future::ready(match (a_held.as_slice(), b_held.as_slice()) {
            (&[kept], &[moved]) if kept != moved => Some((moved, kept)),
            _ => None,
        })
    })
    .await;
    let revocations = &a.consumer.context().revocations;
    assert!(revocations.revoked_since(&topic, moved, tick_before), "A's callback saw {moved} revoked");
    // B, new to the partition, starts at the committed offset too, and reads to the end; it
    // commits nothing (no auto commit, no offset stored)
    eventually("B to read the moved partition to its end", PATIENCE, || {
        ready(b.has_read(moved, RECORDS - 1))
    })
    .await;
    assert_eq!(b.offsets(moved, 0), (COMMITTED[moved as usize]..RECORDS).collect::<Vec<_>>());
    b.close().await;
    assert_eq!(committed(&args, &group, &topic).await, COMMITTED, "nobody committed since");

    // B gone, the partition comes back to A, which kept polling
    eventually("the moved partition to come back to A", PATIENCE, || ready(a.held() == [0, 1])).await;
    // records past A's old position: a fetch from that position receives them too, and has to be
    // told apart from one from the committed offset
    produce(&producer, &topic, RECORDS..RECORDS + MORE).await;
    eventually("A to read both partitions to their new end", PATIENCE, || {
        ready(a.has_read(0, RECORDS + MORE - 1) && a.has_read(1, RECORDS + MORE - 1))
    })
    .await;

    let receipts = a.receipts();
    let after = &receipts[read_before..];
    // every record of the moved partition that A received since B joined came after the
    // revocation, i.e. from the assignment that gave the partition back
    for receipt in after.iter().filter(|receipt| receipt.partition == moved) {
        assert!(
            !revocations.revoked_since(&topic, moved, receipt.tick),
            "{receipt:?} was received before the last revocation of partition {moved}: {after:?}"
        );
    }
    let moved_offsets = a.offsets(moved, read_before);
    assert_eq!(
        moved_offsets.first(),
        Some(&COMMITTED[moved as usize]),
        "partition {moved}, revoked from A and assigned to it again, must restart at the group's \
         committed offset {}, not at A's old position {RECORDS}; A received since: {after:?}",
        COMMITTED[moved as usize]
    );
    assert_eq!(moved_offsets, (COMMITTED[moved as usize]..RECORDS + MORE).collect::<Vec<_>>(), "{after:?}");
    // the partition A kept was never revoked, and is not rewound to the committed offset
    assert!(!revocations.revoked_since(&topic, kept, tick_before), "partition {kept} stayed with A");
    let kept_offsets = a.offsets(kept, read_before);
    assert_eq!(
        kept_offsets.first(),
        Some(&RECORDS),
        "partition {kept}, kept by A, must go on from A's position {RECORDS}, not rewind to the \
         committed offset {}; A received since: {after:?}",
        COMMITTED[kept as usize]
    );
    assert_eq!(kept_offsets, (RECORDS..RECORDS + MORE).collect::<Vec<_>>(), "{after:?}");
    assert_eq!(committed(&args, &group, &topic).await, COMMITTED, "A committed nothing either");
    a.close().await;
}

/// A condition of [`eventually`], met or not.
fn ready(met: bool) -> std::future::Ready<Option<()>> {
    std::future::ready(met.then_some(()))
}

/// Writes the records numbered `range` to each of the two partitions; on a fresh topic their
/// numbers are their offsets.
async fn produce(producer: &Producer, topic: &str, range: std::ops::Range<i64>) {
    for n in range {
        for partition in [0, 1] {
            let mut record = OutgoingRecord::new(topic, format!("k{n}"), format!("r{n}"));
            record.partition = Some(partition);
            let delivered = producer.send(&record).await.expect("produce");
            assert_eq!(
                (delivered.partition, delivered.offset),
                (partition, n),
                "the topic is the test's own"
            );
        }
    }
}

/// The offsets committed for `group` on partitions 0 and 1 of `topic` (-1: none).
async fn committed(args: &KafkaArgs, group: &str, topic: &str) -> [i64; 2] {
    let mut config = base_consumer_settings(args, "test-offsets");
    config.set("group.id", group).set("enable.auto.commit", "false");
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        // never subscribes: it only asks the coordinator (OffsetFetch), it does not join
        let reader: rdkafka::consumer::BaseConsumer<kafka::context::Context> =
            kafka::context::create(&config).expect("offset reader");
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition(&topic, 0);
        partitions.add_partition(&topic, 1);
        let offsets =
            reader.committed_offsets(partitions, Duration::from_secs(30)).expect("committed offsets");
        [0, 1].map(|partition| match offsets.find_partition(&topic, partition).expect("partition").offset() {
            Offset::Offset(offset) => offset,
            _ => -1,
        })
    })
    .await
    .expect("offset reader task")
}

/// One record as a member received it.
#[derive(Debug, Clone, Copy)]
struct Receipt {
    partition: i32,
    offset: i64,
    /// The member's revocation clock when it received the record
    /// (`kafka::context::Revocations::now`).
    tick: u64,
}

/// A member of the group: the project's consumer (no offset committed by the client, the
/// rebalance callback of `kafka::context`), polled without pause by a task that notes every
/// record it receives; polling is what serves its rebalances.
struct Member {
    name: &'static str,
    consumer: Arc<KafkaConsumer>,
    receipts: Arc<Mutex<Vec<Receipt>>>,
    polling: tokio::task::JoinHandle<()>,
}

impl Member {
    fn join(args: &KafkaArgs, name: &'static str, group: &str, topic: &str) -> Self {
        let config = consumer_config(args, name, group, OffsetCommit::InTransaction);
        assert_eq!(config.get("enable.auto.commit"), Some("false"));
        let consumer = consumer::subscribe(&config, &[topic]).expect("consumer");
        let receipts = Arc::new(Mutex::new(Vec::new()));
        let polling = tokio::spawn({
            let (consumer, receipts) = (consumer.clone(), receipts.clone());
            async move {
                loop {
                    let message =
                        consumer.recv().await.unwrap_or_else(|error| panic!("{name} receives: {error}"));
                    let tick = consumer.context().revocations.now();
                    let receipt = Receipt { partition: message.partition(), offset: message.offset(), tick };
                    receipts.lock().expect("receipts").push(receipt);
                }
            }
        });
        Self { name, consumer, receipts, polling }
    }

    /// Every record received so far, in order.
    fn receipts(&self) -> Vec<Receipt> {
        assert!(!self.polling.is_finished(), "{} stopped polling (its panic is above)", self.name);
        self.receipts.lock().expect("receipts").clone()
    }

    /// The offsets of `partition` received, from the `from`-th receipt on.
    fn offsets(&self, partition: i32, from: usize) -> Vec<i64> {
        self.receipts()[from..]
            .iter()
            .filter(|receipt| receipt.partition == partition)
            .map(|receipt| receipt.offset)
            .collect()
    }

    fn has_read(&self, partition: i32, offset: i64) -> bool {
        self.receipts().iter().any(|receipt| receipt.partition == partition && receipt.offset == offset)
    }

    /// The partitions assigned to the member now.
    fn held(&self) -> Vec<i32> {
        let assignment = self.consumer.assignment().expect("assignment");
        let mut partitions: Vec<i32> =
            assignment.elements().iter().map(|element| element.partition()).collect();
        partitions.sort_unstable();
        partitions
    }

    /// Stops polling and closes the consumer: it leaves the group.
    async fn close(self) {
        self.polling.abort();
        assert!(self.polling.await.is_err_and(|error| error.is_cancelled()), "{} was polling", self.name);
        assert_eq!(Arc::strong_count(&self.consumer), 1, "the last handle of {}", self.name);
        // closing waits for the group to answer
        let consumer = self.consumer;
        tokio::task::spawn_blocking(move || drop(consumer)).await.expect("close");
    }
}
