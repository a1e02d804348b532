//! The outbox relay against the real stack (the transfers schema hosts `outbox_evento`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kafka::config::{consumer_config, producer_config, OffsetCommit};
use kafka::consumer::KafkaConsumer;
use kafka::producer::Producer;
use kafka::rdkafka::message::{Headers, Message, OwnedMessage};
use sqlx::{Connection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use outbox::relay::{claim, publish, Relay, RelayOptions};
use testkit::{eventually, receive, unique, TestDatabase, TestTopics};

struct Fixture {
    database: TestDatabase,
    topics: TestTopics,
    topic: String,
    producer: Producer,
}

async fn fixture(partitions: i32) -> Fixture {
    testkit::init_logs();
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    let topics = TestTopics::create(&["events"], partitions).await;
    let topic = topics.topic("events");
    let producer = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    Fixture { database, topics, topic, producer }
}

impl Fixture {
    async fn insert(&self, key: &str, payload: &str) -> Uuid {
        let id = Uuid::new_v4();
        let mut tx = self.database.pool.begin().await.expect("begin");
        outbox::insert(
            &mut tx,
            &outbox::NewEvent {
                id,
                topic: &self.topic,
                key,
                event_type: "TransferenciaSolicitada",
                payload,
                traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                tracestate: None,
            },
        )
        .await
        .expect("insert");
        tx.commit().await.expect("commit");
        id
    }

    fn reader(&self) -> Arc<KafkaConsumer> {
        kafka::consumer::subscribe(
            &consumer_config(&self.topics.args, "test", &unique("reader"), OffsetCommit::StoredAfterHandling),
            &[&self.topic],
        )
        .expect("reader")
    }

    fn relay(&self, options: RelayOptions) -> Relay {
        Relay::new(self.database.pool.clone(), self.producer.clone(), options)
    }

    async fn pending(&self) -> i64 {
        pending(&self.database.pool).await
    }
}

async fn pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL")
        .fetch_one(pool)
        .await
        .expect("count")
}

fn event_id(record: &OwnedMessage) -> String {
    let headers = record.headers().expect("headers");
    let header = headers.iter().find(|header| header.key == "evento-id").expect("evento-id");
    String::from_utf8(header.value.expect("value").to_vec()).expect("utf-8")
}

#[tokio::test]
async fn a_crash_between_publish_and_mark_publishes_again_with_the_same_id() {
    let fixture = fixture(1).await;
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let reader = fixture.reader();

    // claim and publish, then "crash": the transaction is dropped before the mark
    let mut connection = fixture.database.pool.acquire().await.expect("connection");
    let mut tx = connection.begin().await.expect("begin");
    let claimed = claim(&mut tx, 10).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let acknowledged = publish(&fixture.producer, &claimed, "test").await;
    assert_eq!(acknowledged, vec![id]);
    drop(tx);
    assert_eq!(fixture.pending().await, 1, "the row is still pending after the crash");

    // the next relay publishes it again, with the same eventoId, and marks it
    let cycle = fixture.relay(RelayOptions::fast("test")).cycle(&mut connection).await.expect("cycle");
    assert_eq!((cycle.claimed, cycle.published), (1, 1));
    assert_eq!(fixture.pending().await, 0);
    let records = receive(&reader, 2).await;
    assert_eq!(event_id(&records[0]), id.to_string());
    assert_eq!(event_id(&records[1]), id.to_string());
    assert_eq!(records[0].payload(), records[1].payload());
}

#[tokio::test]
async fn events_of_one_key_leave_in_commit_order() {
    let fixture = fixture(3).await;
    let keys = ["CC-001", "CC-002", "CC-003", "CC-004", "CC-005"];
    for n in 0..250 {
        fixture.insert(keys[n % keys.len()], &format!(r#"{{"n":{n}}}"#)).await;
    }
    let reader = fixture.reader();
    let mut options = RelayOptions::fast("test");
    options.batch_rows_max = 40; // several cycles
    let shutdown = CancellationToken::new();
    let relay = tokio::spawn(fixture.relay(options).run(shutdown.clone()));
    let records = receive(&reader, 250).await;
    let mut last: HashMap<Vec<u8>, i64> = HashMap::new();
    for record in &records {
        let value: serde_json::Value =
            serde_json::from_slice(record.payload().expect("payload")).expect("json");
        let n = value["n"].as_i64().expect("n");
        let key = record.key().expect("key").to_vec();
        if let Some(previous) = last.insert(key, n) {
            assert!(previous < n, "per-key order broken: {previous} then {n}");
        }
    }
    shutdown.cancel();
    relay.await.expect("relay stops");
    assert_eq!(fixture.pending().await, 0);
}

#[tokio::test]
async fn only_one_relay_is_active_and_a_standby_takes_over() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    let (first_stop, second_stop) = (CancellationToken::new(), CancellationToken::new());
    let first = tokio::spawn(fixture.relay(RelayOptions::fast("test")).run(first_stop.clone()));
    let pool = fixture.database.pool.clone();
    let holders = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = \
             (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(&pool)
        .await
        .expect("locks")
    };
    eventually("the first relay to hold the lock", Duration::from_secs(30), || async {
        (holders().await == 1).then_some(())
    })
    .await;
    let second = tokio::spawn(fixture.relay(RelayOptions::fast("test")).run(second_stop.clone()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(holders().await, 1, "the second relay stands by");

    for n in 0..20 {
        fixture.insert("CC-001", &format!(r#"{{"n":{n}}}"#)).await;
    }
    let records = receive(&reader, 20).await;
    assert_eq!(records.len(), 20);

    // the active relay stops; the standby takes over and publishes what comes next
    first_stop.cancel();
    first.await.expect("first relay stops");
    let late = fixture.insert("CC-001", r#"{"n":20}"#).await;
    let record = receive(&reader, 1).await.remove(0);
    assert_eq!(event_id(&record), late.to_string());
    eventually("nothing pending", Duration::from_secs(30), || async {
        (fixture.pending().await == 0).then_some(())
    })
    .await;
    second_stop.cancel();
    second.await.expect("second relay stops");
    // every event exactly once: no crash happened, so no duplicate either
    let none_more = tokio::time::timeout(Duration::from_millis(1000), reader.recv()).await.is_err();
    assert!(none_more, "an event was published twice without a crash");
}

#[tokio::test]
async fn the_reference_profile_polls_without_notifications() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    let options = RelayOptions::reference("test");
    assert!(!options.listen);
    assert_eq!((options.batch_rows_max, options.poll_interval), (100, Duration::from_millis(200)));
    assert!(!options.drain_full_batches, "the article pauses 200 ms after every cycle");
    let shutdown = CancellationToken::new();
    let relay = tokio::spawn(fixture.relay(options).run(shutdown.clone()));
    for n in 0..150 {
        fixture.insert("CC-001", &format!(r#"{{"n":{n}}}"#)).await;
    }
    assert_eq!(receive(&reader, 150).await.len(), 150);
    shutdown.cancel();
    relay.await.expect("relay stops");
}

#[tokio::test]
async fn published_rows_past_retention_are_deleted_and_pending_ones_kept() {
    let fixture = fixture(1).await;
    for n in 0..5 {
        fixture.insert("CC-001", &format!(r#"{{"n":{n}}}"#)).await;
    }
    let mut options = RelayOptions::fast("test");
    options.retention = Duration::from_secs(3600);
    options.cleanup_rows_max = 2;
    let relay = fixture.relay(options);
    let mut connection = fixture.database.pool.acquire().await.expect("connection");
    relay.cycle(&mut connection).await.expect("cycle");
    let pending_id = fixture.insert("CC-001", r#"{"n":5}"#).await;
    // age three of the published rows past the retention
    sqlx::query(
        "UPDATE outbox_evento SET publicado_em = now() - interval '2 hours' \
         WHERE id IN (SELECT id FROM outbox_evento WHERE publicado_em IS NOT NULL LIMIT 3)",
    )
    .execute(&fixture.database.pool)
    .await
    .expect("age rows");
    assert_eq!(relay.cleanup(&mut connection).await.expect("cleanup"), 3);
    let left: Vec<(Uuid, bool)> = sqlx::query_as("SELECT id, publicado_em IS NULL FROM outbox_evento")
        .fetch_all(&fixture.database.pool)
        .await
        .expect("rows");
    assert_eq!(left.len(), 3);
    assert!(left.contains(&(pending_id, true)));
}
