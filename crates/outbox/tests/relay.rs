//! The outbox relay against the real stack (a database of its own with the outbox's table alone).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kafka::config::{consumer_config, producer_config, OffsetCommit};
use kafka::consumer::KafkaConsumer;
use kafka::producer::Producer;
use kafka::rdkafka::message::{Headers, Message, OwnedMessage};
use sqlx::PgPool;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use outbox::relay::{claim, claim_and_mark, mark, publish, Cycle, Relay, RelayOptions};
use testkit::{eventually, receive, unique, TestDatabase, TestTopics};

struct Fixture {
    database: TestDatabase,
    topics: TestTopics,
    topic: String,
    producer: Producer,
}

async fn fixture(partitions: i32) -> Fixture {
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
    async fn insert_keys(&self, connection: &mut sqlx::PgConnection, keys: &[String], payload: &str) {
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

    async fn lease_end(&self, id: Uuid) -> OffsetDateTime {
        sqlx::query_scalar("SELECT reservado_ate FROM outbox_evento WHERE id = $1")
            .bind(id)
            .fetch_one(&self.database.pool)
            .await
            .expect("lease")
    }

    async fn published_at(&self, id: Uuid) -> OffsetDateTime {
        sqlx::query_scalar("SELECT publicado_em FROM outbox_evento WHERE id = $1")
            .bind(id)
            .fetch_one(&self.database.pool)
            .await
            .expect("published")
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
async fn a_crash_between_publish_and_mark_publishes_again_with_the_same_id_once_the_lease_ends() {
    let fixture = fixture(1).await;
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let reader = fixture.reader();

    // a relay claims and publishes, then "crashes" before the mark: its lease stays
    let crashed = Uuid::new_v4();
    let claimed = claim(&fixture.database.pool, crashed, 10, Duration::from_secs(2)).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let lease_end = fixture.lease_end(id).await;
    let acknowledged = publish(&fixture.producer, &claimed, "test").await;
    assert_eq!(acknowledged, vec![id]);
    assert_eq!(fixture.pending().await, 1, "the row is still pending after the crash");

    // the next relay takes it when the lease ends, publishes it again with the same eventoId,
    // and marks it
    let relay = fixture.relay(RelayOptions::fast("test"));
    let mut connection = fixture.database.pool.acquire().await.expect("connection");
    let never = CancellationToken::new();
    let deadline = tokio::time::Instant::now() + testkit::PATIENCE;
    loop {
        let cycle = relay.cycle(&mut connection, &never).await.expect("cycle");
        if cycle != Cycle::default() {
            assert_eq!(cycle, Cycle { claimed: 1, published: 1 });
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the row was never taken again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fixture.pending().await, 0);
    assert!(fixture.published_at(id).await >= lease_end, "taken before the lease ended");
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
    let first_relay = fixture.relay(RelayOptions::fast("test"));
    let first_instance = first_relay.instance();
    let first = tokio::spawn(first_relay.run(first_stop.clone()));
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
    eventually("the first relay to hold the lock", testkit::PATIENCE, || async {
        (holders().await == 1).then_some(())
    })
    .await;
    let second_relay = fixture.relay(RelayOptions::fast("test"));
    let second_instance = second_relay.instance();
    let second = tokio::spawn(second_relay.run(second_stop.clone()));

    // every row is claimed (and so marked) by the relay that publishes it: the standby, woken
    // by the same notifications, published none of them
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(fixture.insert("CC-001", &format!(r#"{{"n":{n}}}"#)).await);
    }
    let records = receive(&reader, 20).await;
    assert_eq!(records.len(), 20);
    let publishers = |ids: Vec<Uuid>| {
        let pool = fixture.database.pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<Uuid>>(
                "SELECT reservado_por FROM outbox_evento WHERE id = ANY($1)",
            )
            .bind(ids)
            .fetch_all(&pool)
            .await
            .expect("publishers")
        }
    };
    let by = publishers(ids.clone()).await;
    assert!(by.iter().all(|relay| *relay == Some(first_instance)), "the standby published: {by:?}");

    // the active relay stops; the standby takes over and publishes what comes next
    first_stop.cancel();
    first.await.expect("first relay stops");
    let late = fixture.insert("CC-001", r#"{"n":20}"#).await;
    let record = receive(&reader, 1).await.remove(0);
    assert_eq!(event_id(&record), late.to_string());
    assert_eq!(publishers(vec![late]).await, [Some(second_instance)], "published by the standby");
    eventually("nothing pending", testkit::PATIENCE, || async {
        (fixture.pending().await == 0).then_some(())
    })
    .await;
    second_stop.cancel();
    second.await.expect("second relay stops");
    // every event exactly once (no crash happened, so no duplicate either): both relays have
    // stopped, so the topic holds all it will ever hold of them
    ids.push(late);
    let published: Vec<String> =
        testkit::read_to_end(&fixture.topics.args, &fixture.topic).await.iter().map(event_id).collect();
    let expected: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    assert_eq!(published, expected, "an event was published twice without a crash, or out of order");
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
    relay.cycle(&mut connection, &CancellationToken::new()).await.expect("cycle");
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

/// A producer that cannot deliver: its only bootstrap server is a port nobody listens on, so
/// every send waits for the delivery timeout (120 s). The shared broker is left alone.
async fn unreachable_producer() -> Producer {
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    let args = kafka::KafkaArgs::new(format!("127.0.0.1:{port}"));
    Producer::new(&producer_config(&args, "unreachable", Duration::ZERO)).expect("producer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_broker_unreachable_no_transaction_holds_the_rows_and_shutdown_is_bounded() {
    let fixture = fixture(1).await;
    for n in 0..5 {
        fixture.insert("CC-001", &format!(r#"{{"n":{n}}}"#)).await;
    }
    let mut options = RelayOptions::fast("test");
    options.shutdown_grace = Duration::from_secs(1);
    let relay = Relay::new(fixture.database.pool.clone(), unreachable_producer().await, options.clone());
    let instance = relay.instance();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(relay.run(shutdown.clone()));

    // the relay is inside its cycle, waiting for a broker that does not answer
    let pool = fixture.database.pool.clone();
    // (or, were it to claim in a transaction kept open for the publish, to idle in it)
    eventually("the relay to claim the rows", testkit::PATIENCE, || async {
        let claimed: bool = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM outbox_evento WHERE reservado_por = $1 AND reservado_ate > now()) = 5 \
             OR EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                        AND state LIKE 'idle in transaction%')",
        )
        .bind(instance)
        .fetch_one(&pool)
        .await
        .expect("claimed");
        claimed.then_some(())
    })
    .await;
    // no transaction of the relay stays open: the rows are not row-locked, nobody idles in one
    let mut tx = fixture.database.pool.begin().await.expect("begin");
    let locked: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM outbox_evento FOR UPDATE NOWAIT")
        .fetch_all(&mut *tx)
        .await
        .expect("the claimed rows are not locked by an open transaction");
    assert_eq!(locked.len(), 5);
    tx.rollback().await.expect("rollback");
    let idle_in_transaction: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&fixture.database.pool)
    .await
    .expect("activity");
    assert_eq!(idle_in_transaction, 0, "a transaction idles while the relay waits for the broker");

    // shutdown in the middle of the cycle: the relay stops waiting after its grace
    shutdown.cancel();
    let bound = options.shutdown_grace + outbox::relay::SHUTDOWN_MARGIN;
    tokio::time::timeout(bound, running)
        .await
        .expect("the relay stops within its shutdown grace")
        .expect("relay task");
    // nothing unacknowledged was marked; the rows were given back for the next relay
    let (unpublished, still_leased): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE publicado_em IS NULL), count(*) FILTER (WHERE reservado_por IS NOT NULL) \
         FROM outbox_evento",
    )
    .fetch_one(&fixture.database.pool)
    .await
    .expect("rows");
    assert_eq!((unpublished, still_leased), (5, 0));
}

#[tokio::test]
async fn a_dead_relays_rows_are_published_when_its_lease_ends_and_before_later_rows_of_their_key() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    let first = fixture.insert("CC-001", r#"{"n":1}"#).await;
    // a relay leases the row and dies without publishing it
    let dead = Uuid::new_v4();
    let lease = Duration::from_secs(10);
    let leased = claim(&fixture.database.pool, dead, 10, lease).await.expect("claim");
    assert_eq!(leased.iter().map(|event| event.id).collect::<Vec<_>>(), vec![first]);
    let lease_end = fixture.lease_end(first).await;
    // more rows come: one behind it on its key, one of another key
    let second = fixture.insert("CC-001", r#"{"n":2}"#).await;
    let other = fixture.insert("CC-002", r#"{"n":3}"#).await;

    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fixture.relay(RelayOptions::fast("test")).run(shutdown.clone()));
    let records = receive(&reader, 3).await;
    let order: Vec<String> = records.iter().map(event_id).collect();
    let position = |id: Uuid| order.iter().position(|seen| *seen == id.to_string()).expect("published");
    assert!(position(first) < position(second), "CC-001 out of order: {order:?}");
    // the broker acknowledges before the relay marks: the marks come a moment after the records
    eventually("nothing pending", testkit::PATIENCE, || async {
        (fixture.pending().await == 0).then_some(())
    })
    .await;
    assert!(fixture.published_at(first).await >= lease_end, "taken before the dead relay's lease ended");
    assert!(fixture.published_at(second).await >= lease_end, "published ahead of its key's leased row");
    assert!(fixture.published_at(other).await < lease_end, "another key waited for the lease");
    shutdown.cancel();
    running.await.expect("relay stops");
}

#[tokio::test]
async fn a_relay_whose_lease_ended_and_was_taken_cannot_mark_the_rows() {
    let fixture = fixture(1).await;
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let pool = &fixture.database.pool;
    let (slow, next) = (Uuid::new_v4(), Uuid::new_v4());
    // a lease a busy machine cannot outlive between these two statements
    assert_eq!(claim(pool, slow, 10, Duration::from_secs(5)).await.expect("claim").len(), 1);
    assert!(
        claim(pool, next, 10, Duration::from_secs(60)).await.expect("claim").is_empty(),
        "the lease holds"
    );
    eventually("the lease to end and the next relay to take the row", testkit::PATIENCE, || async {
        (!claim(pool, next, 10, Duration::from_secs(60)).await.expect("claim").is_empty()).then_some(())
    })
    .await;
    // the slow relay's late acknowledgement marks nothing: the row belongs to the next relay
    assert_eq!(mark(pool, slow, &[id]).await.expect("mark"), 0);
    assert_eq!(fixture.pending().await, 1);
    assert_eq!(mark(pool, next, &[id]).await.expect("mark"), 1);
    assert_eq!(fixture.pending().await, 0);
}

#[tokio::test]
async fn a_relay_waiting_for_the_broker_keeps_renewing_its_lease() {
    let fixture = fixture(1).await;
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let mut options = RelayOptions::fast("test");
    options.lease = Duration::from_secs(1);
    options.shutdown_grace = Duration::ZERO;
    let relay = Relay::new(fixture.database.pool.clone(), unreachable_producer().await, options);
    let instance = relay.instance();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(relay.run(shutdown.clone()));
    let leased_until = || async {
        sqlx::query_scalar::<_, Option<OffsetDateTime>>(
            "SELECT reservado_ate FROM outbox_evento WHERE id = $1 AND reservado_por = $2",
        )
        .bind(id)
        .bind(instance)
        .fetch_optional(&fixture.database.pool)
        .await
        .expect("lease")
        .flatten()
    };
    let first = eventually("the relay to lease the row", testkit::PATIENCE, leased_until).await;
    // a lease of one second, renewed while the broker does not answer: it moves past its end
    eventually("the lease to be renewed past its first end", testkit::PATIENCE, || async {
        leased_until().await.filter(|until| *until > first + time::Duration::seconds(1))
    })
    .await;
    shutdown.cancel();
    running.await.expect("relay stops");
}

#[tokio::test]
async fn a_relay_takes_back_at_once_the_rows_it_still_leases_from_a_cycle_cut_short() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let later = fixture.insert("CC-001", r#"{"n":2}"#).await;
    let relay = fixture.relay(RelayOptions::fast("test"));
    // a cycle of this instance leased the first row and lost its connection before the mark
    let leased =
        claim(&fixture.database.pool, relay.instance(), 1, Duration::from_secs(3600)).await.expect("claim");
    assert_eq!(leased.len(), 1);
    let mut connection = fixture.database.pool.acquire().await.expect("connection");
    let cycle = relay.cycle(&mut connection, &CancellationToken::new()).await.expect("cycle");
    assert_eq!(cycle, Cycle { claimed: 2, published: 2 }, "its own lease does not hold the relay back");
    let order: Vec<String> = receive(&reader, 2).await.iter().map(event_id).collect();
    assert_eq!(order, vec![id.to_string(), later.to_string()]);
}

/// A relay that could not connect follows its pool to another server: after a failover the pool
/// is pointed at the promoted server (`database::connect`'s watcher), and the relay's next
/// attempt must go there, not to the server its first attempt tried. The "old server" here is a
/// listener of the test's own that takes the connection and closes it.
#[tokio::test]
async fn a_relay_that_cannot_connect_follows_its_pool_to_the_new_server() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead_port = dead.local_addr().expect("address").port();
    let pool = fixture.database.pool.clone();
    let promoted = (*pool.connect_options()).clone();
    pool.set_connect_options(promoted.clone().host("127.0.0.1").port(dead_port));

    let stop = CancellationToken::new();
    let relay = tokio::spawn(fixture.relay(RelayOptions::fast("test")).run(stop.clone()));
    // the relay knocked on the dead server: it is in its connect loop
    let (knock, _) = tokio::time::timeout(testkit::PATIENCE, dead.accept())
        .await
        .expect("the relay to try the server its pool points at")
        .expect("accept");
    drop(knock);
    pool.set_connect_options(promoted);

    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let record = receive(&reader, 1).await.remove(0);
    assert_eq!(event_id(&record), id.to_string());
    eventually("nothing pending", testkit::PATIENCE, || async {
        (fixture.pending().await == 0).then_some(())
    })
    .await;
    stop.cancel();
    relay.await.expect("relay stops");
}

/// The statement of a cycle that starts at once: it marks the previous cycle's acknowledged
/// rows and leases the next ones, never taking back a row it marks (its claim does not see its
/// own marks), and marks nothing of a row another relay has taken meanwhile.
#[tokio::test]
async fn a_claim_that_marks_the_previous_batch_never_takes_it_back() {
    let fixture = fixture(1).await;
    let pool = &fixture.database.pool;
    let first = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let taken = fixture.insert("CC-002", r#"{"n":2}"#).await;
    let (owner, other) = (Uuid::new_v4(), Uuid::new_v4());
    let leased: Vec<Uuid> = claim(pool, owner, 2, Duration::from_secs(60))
        .await
        .expect("claim")
        .iter()
        .map(|event| event.id)
        .collect();
    assert_eq!(leased, vec![first, taken]);
    // the second row's lease was taken over by another relay before this one's mark
    sqlx::query("UPDATE outbox_evento SET reservado_por = $2 WHERE id = $1")
        .bind(taken)
        .bind(other)
        .execute(pool)
        .await
        .expect("take over");
    let later = fixture.insert("CC-001", r#"{"n":3}"#).await;
    let (marked, next) = claim_and_mark(pool, owner, 10, Duration::from_secs(60), &[first, taken])
        .await
        .expect("claim and mark");
    assert_eq!(marked, 1, "only the row this relay still held");
    assert_eq!(next.iter().map(|event| event.id).collect::<Vec<_>>(), vec![later], "not the row it marked");
    fixture.published_at(first).await;
    let published: Option<OffsetDateTime> =
        sqlx::query_scalar("SELECT publicado_em FROM outbox_evento WHERE id = $1")
            .bind(taken)
            .fetch_one(pool)
            .await
            .expect("row");
    assert_eq!(published, None, "the other relay's row stays to that relay");
    // nothing acknowledged: a plain claim, nothing marked
    let (marked, next) = claim_and_mark(pool, owner, 10, Duration::from_secs(60), &[]).await.expect("claim");
    assert_eq!((marked, next.len()), (0, 1), "its own lease on the later row");
}

/// The lease is a heap-only (HOT) update: the table keeps room on its pages
/// (`20261206000001_outbox_fillfactor`), so a claim rewrites (nearly) every leased row in place
/// and adds no index entry. With full pages every lease of a new batch becomes a new tuple
/// elsewhere with an entry in each of the table's four indexes, and the claim costs about twice
/// as much (#28).
#[tokio::test]
async fn a_claim_leases_its_rows_in_place_without_touching_the_indexes() {
    let fixture = fixture(1).await;
    let mut tx = fixture.database.pool.begin().await.expect("begin");
    let keys: Vec<String> = (0..500).map(|n| format!("CC-{:03}", n % 100)).collect();
    let payload = format!(r#"{{"descricao":"{}"}}"#, "x".repeat(300));
    fixture.insert_keys(&mut tx, &keys, &payload).await;
    let leased = claim(&mut *tx, Uuid::new_v4(), 500, Duration::from_secs(60)).await.expect("claim");
    assert_eq!(leased.len(), 500);
    // this transaction's own counts: no wait for the statistics collector
    let (updated, in_place): (i64, i64) = sqlx::query_as(
        "SELECT pg_stat_get_xact_tuples_updated('outbox_evento'::regclass), \
                pg_stat_get_xact_tuples_hot_updated('outbox_evento'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("statistics");
    // deterministic for one transaction on a new table: 445 of 500 at fillfactor 50 (a page's
    // last rows may not find room), none at 100
    assert_eq!(updated, 500);
    assert!(in_place * 5 >= updated * 4, "{in_place} of {updated} leases were heap-only updates");
}

/// Heap blocks this transaction has read from `outbox_evento` so far (cache hits included).
async fn heap_blocks_read(tx: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar("SELECT pg_stat_get_xact_blocks_fetched('outbox_evento'::regclass)")
        .fetch_one(tx)
        .await
        .expect("statistics")
}

/// A backlog met with the statistics of a drained queue (taken while nothing was pending, as
/// they are in steady operation): a claim and a mark read each pending row a few times, not
/// once per row they take. Planned from those statistics, the per-key check once read every
/// pending row for every candidate, and the marks scanned every pending row to find their ids:
/// a claim of 1 000 rows behind 20 000 took 7.2 s, so a relay met a backlog after an outage
/// at a crawl (#28). Here the old statement's claim read 183 846 heap blocks, the new one 3 545.
#[tokio::test]
async fn a_claim_behind_a_backlog_reads_each_pending_row_a_few_times_whatever_the_statistics() {
    const PUBLISHED: usize = 6_000;
    const BACKLOG: usize = 3_000;
    const BATCH: i64 = 500;
    let fixture = fixture(1).await;
    let pool = &fixture.database.pool;
    // statistics are this test's to take: no autovacuum ANALYZE in between
    sqlx::query("ALTER TABLE outbox_evento SET (autovacuum_enabled = false)")
        .execute(pool)
        .await
        .expect("alter");
    let payload = format!(r#"{{"descricao":"{}"}}"#, "x".repeat(300));
    let insert = |count: usize| {
        let keys: Vec<String> = (0..count).map(|n| format!("CC-{:03}", n % 300)).collect();
        let (fixture, payload) = (&fixture, &payload);
        async move {
            let mut tx = pool.begin().await.expect("begin");
            fixture.insert_keys(&mut tx, &keys, payload).await;
            tx.commit().await.expect("commit");
        }
    };
    insert(PUBLISHED).await;
    sqlx::query("UPDATE outbox_evento SET publicado_em = now()").execute(pool).await.expect("publish");
    sqlx::query("ANALYZE outbox_evento").execute(pool).await.expect("analyze");
    insert(BACKLOG).await;

    let owner = Uuid::new_v4();
    let mut tx = pool.begin().await.expect("begin");
    let before = heap_blocks_read(&mut tx).await;
    let first = claim(&mut *tx, owner, BATCH, Duration::from_secs(60)).await.expect("claim");
    let claimed = heap_blocks_read(&mut tx).await;
    let ids: Vec<Uuid> = first.iter().map(|event| event.id).collect();
    let (marked, second) =
        claim_and_mark(&mut *tx, owner, BATCH, Duration::from_secs(60), &ids).await.expect("claim and mark");
    let marked_and_claimed = heap_blocks_read(&mut tx).await;
    tx.rollback().await.expect("rollback");

    assert_eq!((first.len(), marked, second.len()), (BATCH as usize, BATCH as u64, BATCH as usize));
    // a few reads per pending row and per row taken; the nested loop read BACKLOG per row taken
    let bound = 3 * (BACKLOG as i64 + BATCH);
    let (claim_reads, mark_and_claim_reads) = (claimed - before, marked_and_claimed - claimed);
    assert!(claim_reads < bound, "the claim read {claim_reads} heap blocks (bound {bound})");
    assert!(
        mark_and_claim_reads < bound,
        "the mark and claim read {mark_and_claim_reads} heap blocks (bound {bound})"
    );
}

/// A cycle's mark rides on the next cycle's claim; a relay stopped while it drains has no next
/// claim, so it writes the mark on its own before it returns. Without that, the rows of its last
/// batch would be in the topic yet pending, and published again by the next relay.
#[tokio::test]
async fn a_relay_stopped_mid_drain_marks_every_row_the_broker_acknowledged_before_it_returns() {
    const ROWS: i64 = 10_000;
    let fixture = fixture(1).await;
    let keys: Vec<String> = (0..ROWS).map(|n| format!("CC-{:03}", n % 100)).collect();
    let mut connection = fixture.database.pool.acquire().await.expect("connection");
    fixture.insert_keys(&mut connection, &keys, r#"{"n":1}"#).await;
    drop(connection);
    let mut options = RelayOptions::fast("test");
    options.batch_rows_max = 10; // a thousand cycles to drain, each marking the previous one
    let shutdown = CancellationToken::new();
    let relay = tokio::spawn(fixture.relay(options).run(shutdown.clone()));
    eventually("the relay marks its first batches", testkit::PATIENCE, || async {
        (fixture.pending().await < ROWS).then_some(())
    })
    .await;
    shutdown.cancel();
    relay.await.expect("relay stops");
    let pending = fixture.pending().await;
    assert!(pending > 0, "the relay drained every row before it was stopped: nothing was tested");

    let records = testkit::read_to_end(&fixture.topics.args, &fixture.topic).await;
    let in_topic: HashSet<String> = records.iter().map(event_id).collect();
    assert_eq!(records.len(), in_topic.len(), "a row published twice");
    let marked: HashSet<String> =
        sqlx::query_scalar::<_, Uuid>("SELECT id FROM outbox_evento WHERE publicado_em IS NOT NULL")
            .fetch_all(&fixture.database.pool)
            .await
            .expect("marked")
            .iter()
            .map(Uuid::to_string)
            .collect();
    let unmarked: Vec<&String> = in_topic.difference(&marked).collect();
    assert!(
        unmarked.is_empty(),
        "{} rows in the topic still pending after the relay stopped",
        unmarked.len()
    );
    assert_eq!(in_topic.len() as i64, ROWS - pending, "every marked row is in the topic");
}
