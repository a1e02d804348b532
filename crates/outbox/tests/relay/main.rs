//! The outbox relay against the real stack (a database of its own with the outbox's table alone).
//!
//! Here the relay running: republishing after a crash, per-key order, one active relay, the
//! wake-ups, the reference profile, cleanup, a failed send, an unreachable broker, a failover of
//! the database, a stop mid-drain. A leader that dies with rows unmarked is in `failover.rs`,
//! the claim and mark statements in `claims.rs`, the fixture in `helpers.rs`.

mod claims;
mod failover;
mod helpers;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use kafka::rdkafka::message::Message;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use outbox::relay::{claim, publish, Cycle, Relay, RelayOptions};
use testkit::{eventually, receive};

use helpers::{event_id, fixture, unreachable_producer};

/// A relay that dies after the broker's acknowledgement and before the mark leaves the row
/// pending: the next relay takes it at once, its first claim, and publishes it with the same
/// `eventoId`.
#[tokio::test]
async fn a_crash_between_publish_and_mark_publishes_again_at_once_with_the_same_id() {
    let fixture = fixture(1).await;
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let reader = fixture.reader();

    // a relay claims and publishes, then "crashes" before the mark
    let claimed = claim(&fixture.database.pool, 10, &[]).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let acknowledged = publish(&fixture.producer, &claimed, "test").await;
    assert_eq!(acknowledged, vec![id]);
    assert_eq!(fixture.pending().await, 1, "the row is still pending after the crash");

    // the next relay's first cycle publishes it again with the same eventoId, and marks it
    let relay = fixture.relay(RelayOptions::fast("test"));
    let mut connection = fixture.database.pool.acquire().await.expect("connection");
    let cycle = relay.cycle(&mut connection, &CancellationToken::new()).await.expect("cycle");
    assert_eq!(cycle, Cycle { claimed: 1, published: 1 }, "the row is taken again at once");
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
    let first_relay = fixture.relay(RelayOptions::fast("test"));
    let first_progress = first_relay.progress();
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
    let second_progress = second_relay.progress();
    let second = tokio::spawn(second_relay.run(second_stop.clone()));

    // every row is published and marked by the active relay: the standby, woken by the same
    // notifications, published none of them
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(fixture.insert("CC-001", &format!(r#"{{"n":{n}}}"#)).await);
    }
    let records = receive(&reader, 20).await;
    assert_eq!(records.len(), 20);
    eventually("the active relay to mark its rows", testkit::PATIENCE, || async {
        (first_progress.published() == 20).then_some(())
    })
    .await;
    assert_eq!((second_progress.published(), second_progress.in_flight()), (0, 0), "the standby published");

    // the active relay stops; the standby takes over and publishes what comes next
    first_stop.cancel();
    first.await.expect("first relay stops");
    let late = fixture.insert("CC-001", r#"{"n":20}"#).await;
    let record = receive(&reader, 1).await.remove(0);
    assert_eq!(event_id(&record), late.to_string());
    eventually("nothing pending", testkit::PATIENCE, || async {
        (fixture.pending().await == 0).then_some(())
    })
    .await;
    assert_eq!(
        (first_progress.published(), second_progress.published()),
        (20, 1),
        "published by the standby"
    );
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

/// A local writer's wake-up starts a cycle at once, without the insert trigger's `NOTIFY` (here
/// disabled) and long before the poll interval.
#[tokio::test]
async fn a_local_writers_wake_up_starts_a_cycle_at_once() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    sqlx::query("ALTER TABLE outbox_evento DISABLE TRIGGER outbox_evento_notificar")
        .execute(&fixture.database.pool)
        .await
        .expect("no NOTIFY");
    let mut options = RelayOptions::fast("test");
    options.poll_interval = Duration::from_secs(3600);
    let relay = fixture.relay(options);
    let (waker, progress) = (relay.waker(), relay.progress());
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(relay.run(shutdown.clone()));
    // the relay leads (its marker waits for work) and sleeps: its first claim found nothing
    eventually("the relay to lead and wait", testkit::PATIENCE, || async {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
                            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) \
                AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                            AND state = 'idle' AND query LIKE '%ORDER BY sequencia%')",
        )
        .fetch_one(&fixture.database.pool)
        .await
        .expect("activity");
        waiting.then_some(())
    })
    .await;
    for round in 0..3 {
        let id = fixture.insert("CC-001", &format!(r#"{{"n":{round}}}"#)).await;
        waker.wake();
        let record = receive(&reader, 1).await.remove(0);
        assert_eq!(event_id(&record), id.to_string());
    }
    eventually("the rows marked", testkit::PATIENCE, || async { (progress.published() == 3).then_some(()) })
        .await;
    shutdown.cancel();
    running.await.expect("relay stops");
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

/// A send that fails leaves its row out of nothing: the next claim, after the failure backoff,
/// takes it again. Here the broker refuses the record (larger than `message.max.bytes`) until
/// the row is made smaller, while the rows around it go out.
#[tokio::test]
async fn a_row_whose_send_failed_is_taken_again_by_a_later_claim() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    let before = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let refused = fixture.insert("CC-002", &format!(r#"{{"n":2,"x":"{}"}}"#, "x".repeat(2_000_000))).await;
    let after = fixture.insert("CC-003", r#"{"n":3}"#).await;
    let mut options = RelayOptions::fast("test");
    options.failure_backoff = Duration::from_millis(200);
    let relay = fixture.relay(options);
    let progress = relay.progress();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(relay.run(shutdown.clone()));
    let order: Vec<String> = receive(&reader, 2).await.iter().map(event_id).collect();
    assert_eq!(order, [before.to_string(), after.to_string()]);
    eventually("the two rows marked", testkit::PATIENCE, || async {
        (progress.published() == 2).then_some(())
    })
    .await;
    assert_eq!(fixture.pending().await, 1, "the refused row stays pending");
    sqlx::query("UPDATE outbox_evento SET payload = '{\"n\":2}' WHERE id = $1")
        .bind(refused)
        .execute(&fixture.database.pool)
        .await
        .expect("smaller");
    let record = receive(&reader, 1).await.remove(0);
    assert_eq!(event_id(&record), refused.to_string(), "the failed row was never taken again");
    eventually("nothing pending", testkit::PATIENCE, || async {
        (fixture.pending().await == 0).then_some(())
    })
    .await;
    shutdown.cancel();
    running.await.expect("relay stops");
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
    let progress = relay.progress();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(relay.run(shutdown.clone()));

    // the relay is inside its cycle, waiting for a broker that does not answer
    let pool = fixture.database.pool.clone();
    // (or, were it to claim in a transaction kept open for the publish, to idle in it)
    eventually("the relay to claim the rows", testkit::PATIENCE, || async {
        let idle_in_transaction: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                            AND state LIKE 'idle in transaction%')",
        )
        .fetch_one(&pool)
        .await
        .expect("activity");
        (progress.in_flight() == 5 || idle_in_transaction).then_some(())
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
    // nothing unacknowledged was marked: the rows stay for the next relay
    assert_eq!(fixture.pending().await, 5);
    assert_eq!((progress.published(), progress.in_flight()), (0, 0));
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

/// Marks are written by the leader's marker, off the path, behind the claims; a relay stopped
/// while it drains waits for its marker before it returns. Without that, the rows of its last
/// batches would be in the topic yet pending, and published again by the next relay.
#[tokio::test]
async fn a_relay_stopped_mid_drain_marks_every_row_the_broker_acknowledged_before_it_returns() {
    const ROWS: i64 = 10_000;
    let fixture = fixture(1).await;
    let keys: Vec<String> = (0..ROWS).map(|n| format!("CC-{:03}", n % 100)).collect();
    let mut connection = fixture.database.pool.acquire().await.expect("connection");
    fixture.insert_keys(&mut connection, &keys, r#"{"n":1}"#).await;
    drop(connection);
    let mut options = RelayOptions::fast("test");
    options.batch_rows_max = 10; // a thousand cycles to drain, the marks behind them
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
