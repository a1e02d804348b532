//! What the relay's tests share: a fixture (a database with the outbox's table alone, a topic, a
//! producer), and readers of the rows and records.

use std::sync::Arc;
use std::time::Duration;

use kafka::config::{consumer_config, producer_config, OffsetCommit};
use kafka::consumer::KafkaConsumer;
use kafka::producer::Producer;
use kafka::rdkafka::message::{Headers, Message, OwnedMessage};
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use outbox::relay::{Relay, RelayOptions};
use testkit::{unique, TestDatabase, TestTopics};

pub struct Fixture {
    pub database: TestDatabase,
    pub topics: TestTopics,
    pub topic: String,
    pub producer: Producer,
}

pub async fn fixture(partitions: i32) -> Fixture {
    testkit::init_logs();
    let database = TestDatabase::create(&outbox::migrations::STANDALONE).await;
    let topics = TestTopics::create(&["events"], partitions).await;
    let topic = topics.topic("events");
    let producer = Producer::new(&producer_config(&topics.args, "test", Duration::ZERO)).expect("producer");
    Fixture { database, topics, topic, producer }
}

impl Fixture {
    /// Writes one `TransferenciaSolicitada` row per key, all with `payload`, in the caller's
    /// open transaction (one statement).
    pub async fn insert_keys(&self, connection: &mut sqlx::PgConnection, keys: &[String], payload: &str) {
        let events: Vec<outbox::NewEvent<'_>> = keys
            .iter()
            .map(|key| outbox::NewEvent {
                id: Uuid::new_v4(),
                topic: &self.topic,
                key,
                event_type: "TransferenciaSolicitada",
                payload,
                traceparent: None,
                tracestate: None,
            })
            .collect();
        outbox::insert_many(connection, &events).await.expect("insert");
    }

    pub async fn insert(&self, key: &str, payload: &str) -> Uuid {
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

    pub fn reader(&self) -> Arc<KafkaConsumer> {
        kafka::consumer::subscribe(
            &consumer_config(&self.topics.args, "test", &unique("reader"), OffsetCommit::StoredAfterHandling),
            &[&self.topic],
        )
        .expect("reader")
    }

    pub fn relay(&self, options: RelayOptions) -> Relay {
        Relay::new(self.database.pool.clone(), self.producer.clone(), options)
    }

    pub async fn pending(&self) -> i64 {
        pending(&self.database.pool).await
    }

    pub async fn published_at(&self, id: Uuid) -> OffsetDateTime {
        sqlx::query_scalar("SELECT publicado_em FROM outbox_evento WHERE id = $1")
            .bind(id)
            .fetch_one(&self.database.pool)
            .await
            .expect("published")
    }
}

pub async fn pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL")
        .fetch_one(pool)
        .await
        .expect("count")
}

pub fn event_id(record: &OwnedMessage) -> String {
    let headers = record.headers().expect("headers");
    let header = headers.iter().find(|header| header.key == "evento-id").expect("evento-id");
    String::from_utf8(header.value.expect("value").to_vec()).expect("utf-8")
}

/// A producer that cannot deliver: its only bootstrap server is a port nobody listens on, so
/// every send waits for the delivery timeout (120 s). The shared broker is left alone.
pub async fn unreachable_producer() -> Producer {
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    let args = kafka::KafkaArgs::new(format!("127.0.0.1:{port}"));
    Producer::new(&producer_config(&args, "unreachable", Duration::ZERO)).expect("producer")
}
