//! The chaos suite's loss diagnosis (`common/chaos/dump.rs`) reads the broker's own logs with
//! Kafka's DumpLogSegments: given a request offset, it finds the transactional offset commit that
//! passed it and what that transaction wrote. Here against three real transactions of one
//! producer (one transactional.id, so librdkafka gives all three the same producer id and epoch):
//! it must tell them apart by their markers.

use crate::common::chaos::dump;

use std::time::Duration;

use kafka::config::{consumer_config, producer_config, transactional_producer_config, OffsetCommit};
use kafka::producer::{OutgoingRecord, Producer};
use kafka::rdkafka::consumer::Consumer;
use kafka::rdkafka::message::Message;
use kafka::rdkafka::{Offset, TopicPartitionList};
use kafka::transactional::TransactionalProducer;
use serde_json::json;
use uuid::Uuid;

use testkit::{eventually, receive, unique, TestTopics, PATIENCE};

/// The group's committed offset on `topic`/0, as the coordinator answers it.
async fn committed(consumer: std::sync::Arc<kafka::consumer::KafkaConsumer>, topic: String) -> Option<i64> {
    tokio::task::spawn_blocking(move || {
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition(&topic, 0);
        let committed = consumer.committed_offsets(partitions, Duration::from_secs(10)).ok()?;
        match committed.elements().first()?.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        }
    })
    .await
    .ok()?
}

// Over 100 lines on purpose: one scenario on one running system, read top to bottom; its steps
// build on each other's state, so splitting it would only pass that state around.
#[tokio::test]
async fn the_dump_finds_the_transactional_commit_that_passed_an_offset_and_what_it_wrote() {
    testkit::init_logs();
    let topics = TestTopics::create(&["entrada", "saida"], 1).await;
    let (input, output) = (topics.topic("entrada"), topics.topic("saida"));
    let plain = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    for n in 0..3 {
        let record = OutgoingRecord::new(&input, format!("CC-{n}"), json!({"n": n}).to_string());
        plain.send(&record).await.expect("publish input");
    }
    // a member of the group, for the group metadata the transactions send their offsets with
    let group = unique("loss-diagnosis");
    let consumer = kafka::consumer::subscribe(
        &consumer_config(&topics.args, "test", &group, OffsetCommit::InTransaction),
        &[&input],
    )
    .expect("member");
    receive(&consumer, 3).await;

    let transactional_id = unique("tx-loss-diagnosis");
    let config = transactional_producer_config(&topics.args, "test", &transactional_id, Duration::ZERO);
    let producer = TransactionalProducer::new(&config).expect("transactional producer");
    producer.init().await.expect("init");
    // three transactions: A commits offset 1, B (aborted) offset 2, C commits offset 3
    let [a, b, c] = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
    for (transfer, offset, commit) in [(a, 1, true), (b, 2, false), (c, 3, true)] {
        producer.begin().await.expect("begin");
        let payload = json!({"transferenciaId": transfer, "status": "APROVADA"}).to_string();
        producer.send(&OutgoingRecord::new(&output, "CC-0", payload)).await.expect("send output");
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(&input, 0, Offset::Offset(offset)).expect("offset");
        producer
            .send_offsets(offsets, consumer.group_metadata().expect("group metadata"))
            .await
            .expect("offsets");
        if commit {
            producer.commit().await.expect("commit");
        } else {
            producer.abort().await.expect("abort");
        }
    }
    // C's markers are written once the group reads offset 3 and a read_committed reader sees C
    eventually("the group's committed offset 3", PATIENCE, || {
        let (consumer, input) = (consumer.clone(), input.clone());
        async move { (committed(consumer, input).await == Some(3)).then_some(()) }
    })
    .await;
    let outputs: Vec<String> = testkit::read_to_end(&topics.args, &output)
        .await
        .iter()
        .map(|record| String::from_utf8_lossy(record.payload().unwrap_or_default()).into_owned())
        .collect();
    assert!(outputs.len() == 2 && outputs[1].contains(&c.to_string()), "committed outputs {outputs:?}");

    // the broker's files, read while it runs (the active segments, flushed or not)
    let evidence =
        dump::Evidence::gather(&topics.args.bootstrap_servers, std::slice::from_ref(&output)).await;
    assert!(!evidence.offsets.is_empty() && !evidence.outputs.is_empty(), "notes: {:?}", evidence.notes);

    // offset 1 (B's request, say): passed by C's commit, which claims [1, 3) and wrote only C
    let passing = evidence.passing(&group, &input, 0, 1).unwrap_or_else(|error| panic!("{error}"));
    let report = passing.report(Some(&b.to_string()));
    eprintln!("{}", report.join("\n"));
    assert_eq!(passing.commit.offset, Some(3), "{report:?}");
    assert_eq!(passing.previous, Some(1), "{report:?}");
    assert!(passing.commit.transactional, "{report:?}");
    let marker = passing.commit.end.as_ref().expect("its marker");
    assert_eq!(marker.kind, "COMMIT", "{report:?}");
    let transaction = passing.transaction.as_ref().expect("its transaction in the transaction log");
    assert_eq!(transaction.transactional_id, transactional_id);
    assert!(transaction.commit);
    assert_eq!(passing.outputs.len(), 1, "{report:?}");
    let (log, output_marker, written) = &passing.outputs[0];
    assert_eq!(log, &format!("{output}-0"));
    assert_eq!(output_marker.kind, "COMMIT");
    let transfers: Vec<Option<String>> = written.iter().map(dump::Written::transfer).collect();
    assert_eq!(transfers, [Some(c.to_string())], "{report:?}");
    assert!(
        report.iter().any(|line| line.contains(&format!("lost transfer {b} is NOT among"))),
        "{report:?}"
    );

    // offset 0: passed by A's commit (no commit before it), which wrote A
    let passing = evidence.passing(&group, &input, 0, 0).unwrap_or_else(|error| panic!("{error}"));
    let report = passing.report(Some(&a.to_string()));
    eprintln!("{}", report.join("\n"));
    assert_eq!((passing.commit.offset, passing.previous), (Some(1), None), "{report:?}");
    let transfers: Vec<Option<String>> = passing
        .outputs
        .iter()
        .flat_map(|(_, _, written)| written.iter().map(dump::Written::transfer))
        .collect();
    assert_eq!(transfers, [Some(a.to_string())], "{report:?}");
    // one producer instance: the same producer id for both commits (librdkafka: the same epoch)
    assert_eq!(
        passing.commit.producer_id,
        evidence.passing(&group, &input, 0, 1).expect("C").commit.producer_id
    );

    // nothing passed offset 3
    assert!(evidence.passing(&group, &input, 0, 3).is_err());
}

/// A broker that is not the local stack's: no log directory, said so, no panic.
#[tokio::test]
async fn an_unknown_broker_has_no_log_directory_and_says_so() {
    let evidence = dump::Evidence::gather("192.0.2.1:1", &["x".into()]).await;
    assert!(evidence.offsets.is_empty());
    assert!(
        evidence.notes.iter().any(|note| note.contains("Kafka's log directory not found")),
        "{:?}",
        evidence.notes
    );
    assert!(evidence.passing("g", "t", 0, 0).is_err());
}

/// DumpLogSegments' text as Kafka 4.3 prints it (taken from the local stack).
#[test]
fn the_parser_reads_batches_records_keys_payloads_and_markers() {
    let text = "Dumping /data/__consumer_offsets-1/00000000000000000000.log
Log starting offset: 0
baseOffset: 5 lastOffset: 5 count: 1 baseSequence: 0 lastSequence: 0 producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 546 CreateTime: 1796627094979 size: 159 magic: 2 compresscodec: none crc: 3180673819 isvalid: true
| offset: 5 CreateTime: 1796627094979 keySize: 65 valueSize: 24 sequence: 0 headerKeys: [] key: {\"type\":\"1\",\"data\":{\"group\":\"g\",\"topic\":\"t.in\",\"partition\":0}} payload: {\"version\":\"4\",\"data\":{\"offset\":2,\"leaderEpoch\":-1,\"metadata\":\"\",\"commitTimestamp\":1796627094975}}
baseOffset: 6 lastOffset: 6 count: 1 baseSequence: -1 lastSequence: -1 producerId: 1 producerEpoch: 1 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 705 CreateTime: 1796627095037 size: 78 magic: 2 compresscodec: none crc: 1057688733 isvalid: true
| offset: 6 CreateTime: 1796627095037 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0
Dumping /data/t.out-0/00000000000000000000.log
Log starting offset: 0
baseOffset: 0 lastOffset: 0 count: 1 baseSequence: 0 lastSequence: 0 producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1796627094753 size: 96 magic: 2 compresscodec: none crc: 578919534 isvalid: true
| offset: 0 CreateTime: 1796627094753 keySize: 1 valueSize: 27 sequence: 0 headerKeys: [] key: k payload: {\"transferenciaId\":\"out-0\"}
";
    let logs = dump::parse(text);
    assert_eq!(logs.len(), 2);
    assert_eq!((logs[0].topic.as_str(), logs[0].partition), ("__consumer_offsets", 1));
    assert_eq!((logs[1].topic.as_str(), logs[1].partition), ("t.out", 0));
    let commits = dump::offset_commits(&logs[..1], "g", "t.in");
    assert_eq!(commits.len(), 1);
    let commit = &commits[0];
    assert_eq!((commit.at, commit.producer_id, commit.offset, commit.partition), (5, 1, Some(2), 0));
    let end = commit.end.as_ref().expect("marker");
    assert_eq!((end.kind.as_str(), end.offset, end.epoch), ("COMMIT", 6, 1));
    assert_eq!(commit.effective(), Some(6));
    assert_eq!(logs[1].batches[0].records[0].key.as_deref(), Some("k"));
    assert_eq!(logs[1].batches[0].records[0].payload.as_deref(), Some("{\"transferenciaId\":\"out-0\"}"));
}
