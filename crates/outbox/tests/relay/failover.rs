//! A leader that stops leading with rows published and not yet marked: its marks stalled (the
//! rows locked by the test), it goes on publishing later rows; once it loses its connection the
//! next leader publishes every unmarked row again at once, in acceptance order, before the rows
//! of their keys that came after.

use std::collections::HashMap;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use outbox::relay::RelayOptions;
use testkit::{eventually, receive};

use crate::helpers::{event_id, fixture};

#[tokio::test]
async fn a_dead_leaders_unmarked_rows_are_published_again_by_the_next_leader_before_later_rows_of_their_key()
{
    let fixture = fixture(1).await;
    let pool = &fixture.database.pool;
    let reader = fixture.reader();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(fixture.insert("CC-001", &format!(r#"{{"n":{n}}}"#)).await);
    }
    // the test holds the first rows locked: every mark of them waits
    let mut locks = pool.begin().await.expect("begin");
    sqlx::query("SELECT id FROM outbox_evento WHERE id = ANY($1) FOR UPDATE")
        .bind(&ids)
        .fetch_all(&mut *locks)
        .await
        .expect("lock");

    let (first_stop, second_stop) = (CancellationToken::new(), CancellationToken::new());
    let first = tokio::spawn(fixture.relay(RelayOptions::fast("test")).run(first_stop.clone()));
    let published: Vec<String> = receive(&reader, 3).await.iter().map(event_id).collect();
    assert_eq!(published, strings(&ids));
    eventually("the leader's mark to wait for the locks", testkit::PATIENCE, || async {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                            AND wait_event_type = 'Lock' AND query LIKE 'UPDATE outbox_evento%')",
        )
        .fetch_one(pool)
        .await
        .expect("activity");
        waiting.then_some(())
    })
    .await;

    // the claims do not wait for the marks: later rows go out meanwhile, the unmarked ones not again
    ids.push(fixture.insert("CC-001", r#"{"n":3}"#).await);
    ids.push(fixture.insert("CC-002", r#"{"n":4}"#).await);
    let published: Vec<String> = receive(&reader, 2).await.iter().map(event_id).collect();
    assert_eq!(published, strings(&ids[3..]));
    assert_eq!(fixture.pending().await, 5, "nothing is marked yet");

    // a standby waits; the leader loses its connection (killed, as a dead process's would be)
    let second = tokio::spawn(fixture.relay(RelayOptions::fast("test")).run(second_stop.clone()));
    let terminated: bool = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(pool)
    .await
    .expect("terminate the leader's connection");
    assert!(terminated);
    ids.push(fixture.insert("CC-001", r#"{"n":5}"#).await);

    // the next leader (the standby, or the first relay leading again) publishes every unmarked
    // row again with its eventoId, in acceptance order, then the row that came after
    let again: Vec<String> = receive(&reader, 6).await.iter().map(event_id).collect();
    assert_eq!(again, strings(&ids), "the unmarked rows again, in order, before the later row");
    locks.rollback().await.expect("release");
    eventually("nothing pending", testkit::PATIENCE, || async {
        (fixture.pending().await == 0).then_some(())
    })
    .await;
    first_stop.cancel();
    second_stop.cancel();
    first.await.expect("first relay stops");
    second.await.expect("second relay stops");

    // the topic: the first five rows twice, the last once; per key, the first occurrences in
    // acceptance order (what a consumer that deduplicates by eventoId sees)
    let records = testkit::read_to_end(&fixture.topics.args, &fixture.topic).await;
    let topic: Vec<String> = records.iter().map(event_id).collect();
    let mut times: HashMap<&String, usize> = HashMap::new();
    for id in &topic {
        *times.entry(id).or_default() += 1;
    }
    let expected = strings(&ids);
    let counts: Vec<usize> = expected.iter().map(|id| times.get(id).copied().unwrap_or(0)).collect();
    assert_eq!(counts, [2, 2, 2, 2, 2, 1], "{topic:?}");
    let mut first_occurrences: Vec<&String> = Vec::new();
    for id in &topic {
        if !first_occurrences.contains(&id) {
            first_occurrences.push(id);
        }
    }
    assert_eq!(first_occurrences, expected.iter().collect::<Vec<_>>());
}

fn strings(ids: &[Uuid]) -> Vec<String> {
    ids.iter().map(Uuid::to_string).collect()
}
