//! `scripts/stack restart kafka|postgres` keeps the data the fault tests rely on.
//!
//! These restart the one shared stack, so they would break every test running beside them:
//! they are `#[ignore]`d and `scripts/test` runs them alone, after the rest of the suite
//! (group `alone` of `.config/nextest.toml`).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use kafka::config::{consumer_config, producer_config, OffsetCommit};
use kafka::producer::{OutgoingRecord, Producer};
use testkit::{eventually, unique, TestDatabase, TestTopics};

fn committed(bootstrap: &str, group: &str, topic: &str) -> Option<i64> {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("offset reader");
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(topic, 0);
    let offsets = reader.committed_offsets(partitions, Duration::from_secs(10)).ok()?;
    match offsets.find_partition(topic, 0)?.offset() {
        Offset::Offset(offset) => Some(offset),
        _ => None,
    }
}

#[tokio::test]
#[ignore = "restarts the shared broker: scripts/test runs it alone"]
async fn restarting_kafka_keeps_topics_records_and_committed_offsets() {
    testkit::init_logs();
    let topics = TestTopics::create(&["kept"], 1).await;
    let topic = topics.topic("kept");
    let args = &topics.args;
    let producer = Producer::new(&producer_config(args, "test", Duration::ZERO)).expect("producer");
    for n in 0..3 {
        producer.send(&OutgoingRecord::new(&topic, "k", format!("r{n}"))).await.expect("produce");
    }
    let group = unique("g");
    let consumer = kafka::consumer::subscribe(
        &consumer_config(args, "test", &group, OffsetCommit::InTransaction),
        &[&topic],
    )
    .expect("consumer");
    let mut offsets = Vec::new();
    while offsets.len() < 2 {
        let message = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .expect("a record within 60 s")
            .expect("receive");
        offsets.push(message.offset());
    }
    let mut commit = TopicPartitionList::new();
    commit.add_partition_offset(&topic, 0, Offset::Offset(2)).expect("offset");
    let handle = Arc::clone(&consumer);
    tokio::task::spawn_blocking(move || handle.commit(&commit, CommitMode::Sync))
        .await
        .expect("join")
        .expect("commit");
    drop(consumer);
    assert_eq!(committed(&args.bootstrap_servers, &group, &topic), Some(2));

    testkit::stack(&["restart", "kafka"]).await;

    let bootstrap = args.bootstrap_servers.clone();
    let (group_after, topic_after) = (group.clone(), topic.clone());
    let offset = eventually("the committed offset after the restart", Duration::from_secs(60), || {
        let (bootstrap, group, topic) = (bootstrap.clone(), group_after.clone(), topic_after.clone());
        async move {
            tokio::task::spawn_blocking(move || committed(&bootstrap, &group, &topic)).await.expect("join")
        }
    })
    .await;
    assert_eq!(offset, 2, "the group's committed offset survived the restart");

    // the group resumes at offset 2 and the records are all still there
    let consumer = kafka::consumer::subscribe(
        &consumer_config(args, "test", &group, OffsetCommit::InTransaction),
        &[&topic],
    )
    .expect("consumer");
    let message = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
        .await
        .expect("a record within 60 s")
        .expect("receive");
    assert_eq!(message.offset(), 2);
    assert_eq!(message.payload(), Some(b"r2".as_slice()));
}

#[tokio::test]
#[ignore = "restarts the shared database server: scripts/test runs it alone"]
async fn restarting_postgres_keeps_tables() {
    testkit::init_logs();
    let database = TestDatabase::empty().await;
    sqlx::query("CREATE TABLE kept (id int PRIMARY KEY)").execute(&database.pool).await.expect("create");
    sqlx::query("INSERT INTO kept VALUES (42)").execute(&database.pool).await.expect("insert");

    testkit::stack(&["restart", "postgres"]).await;

    // the pool's old connections died with the server; new ones come back
    let value: i32 = eventually("the row after the restart", Duration::from_secs(60), || async {
        sqlx::query_scalar("SELECT id FROM kept").fetch_one(&database.pool).await.ok()
    })
    .await;
    assert_eq!(value, 42);
}
