//! Failure handling against the real stack: a transient failure retried then settled once, a
//! record whose retries run out dead-lettered while the rest goes on, a record that can never
//! be applied dead-lettered at once, and the database going away (never the record's fault).
//!
//! Transient failures are injected with a trigger on `transferencia_processada` that raises
//! SQLSTATE 40001 (serialization failure) for one transfer while a sequence, which a rollback
//! does not undo, is below a threshold.

use crate::common;

use std::time::Duration;

use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};
use uuid::Uuid;

use common::{entry_counts, header, receive, spawn_ledger, TestLedger};
use contracts::headers::dlt;
use contracts::topics;

/// Makes the claim of `transfer_id` fail with a serialization failure `failures` times.
async fn fail_transiently(ledger: &TestLedger, transfer_id: Uuid, failures: i64) {
    inject_failure(ledger, transfer_id, failures, "40001", "injected serialization failure").await;
}

/// Makes the claim of `transfer_id` fail with SQLSTATE `code` `failures` times.
async fn inject_failure(ledger: &TestLedger, transfer_id: Uuid, failures: i64, code: &str, message: &str) {
    let sql = format!(
        "CREATE SEQUENCE falhas_injetadas;
         CREATE FUNCTION falhar() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.transferencia_id = '{transfer_id}' THEN
                 IF nextval('falhas_injetadas') <= {failures} THEN
                     RAISE EXCEPTION '{message}' USING ERRCODE = '{code}';
                 END IF;
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER falhar BEFORE INSERT ON transferencia_processada
             FOR EACH ROW EXECUTE FUNCTION falhar();"
    );
    ledger.pool().execute(sql.as_str()).await.expect("install the failing trigger");
}

async fn failures_so_far(ledger: &TestLedger) -> i64 {
    sqlx::query_scalar("SELECT last_value FROM falhas_injetadas")
        .fetch_one(ledger.pool())
        .await
        .expect("sequence")
}

#[tokio::test]
async fn a_transfer_failing_transiently_three_times_is_settled_once() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let flaky = Uuid::new_v4();
    fail_transiently(&ledger, flaky, 3).await;

    let neighbour = Uuid::new_v4();
    ledger.publish_transfer(flaky, "CC-A", "CC-B", 300, "BRL").await;
    ledger.publish_transfer(neighbour, "CC-A", "CC-B", 200, "BRL").await;

    assert_eq!(ledger.decided(flaky).await, ("LIQUIDADA".into(), None));
    assert_eq!(ledger.decided(neighbour).await, ("LIQUIDADA".into(), None));
    assert_eq!(failures_so_far(&ledger).await, 4, "three failures, then the attempt that passed");
    assert_eq!(entry_counts(ledger.pool(), flaky).await, (1, 1));
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (500, 500));
    ledger.caught_up().await;
    assert_eq!(ledger.written(&topics::dead_letter_topic(topics::ANALYSED)).await, 0, "dead-lettered");
    let retries = format!("retries_total{{topic=\"{}\"}}", ledger.topics.topic(topics::ANALYSED));
    let metrics = ledger.metrics().await;
    assert!(metrics.lines().any(|line| line.starts_with(&retries) && !line.ends_with(" 0")), "{metrics}");
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn a_transfer_whose_retries_run_out_is_dead_lettered_and_the_rest_goes_on() {
    let ledger = spawn_ledger().await; // 3 retries in tests
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let dead_letters = ledger.reader(&topics::dead_letter_topic(topics::ANALYSED));
    let hopeless = Uuid::new_v4();
    fail_transiently(&ledger, hopeless, i64::MAX).await;

    let before = Uuid::new_v4();
    let after = Uuid::new_v4();
    ledger.publish_transfer(before, "CC-A", "CC-B", 100, "BRL").await;
    ledger.publish_transfer(hopeless, "CC-A", "CC-B", 300, "BRL").await;
    ledger.publish_transfer(after, "CC-A", "CC-B", 200, "BRL").await;

    let letter = receive(&dead_letters, 1).await.remove(0);
    let body: Value = common::payload(&letter);
    assert_eq!(body["transferenciaId"], hopeless.to_string());
    assert_eq!(header(&letter, dlt::EXCEPTION_FQCN).as_deref(), Some(ledger::settler::RETRIES_EXHAUSTED));
    assert!(header(&letter, dlt::EXCEPTION_MESSAGE)
        .expect("message")
        .contains("injected serialization failure"));
    assert_eq!(ledger.decided(before).await.0, "LIQUIDADA");
    assert_eq!(ledger.decided(after).await.0, "LIQUIDADA");
    assert_eq!(ledger::store::outcome(ledger.pool(), hopeless).await.expect("outcome"), None);
    assert_eq!(entry_counts(ledger.pool(), hopeless).await, (0, 0));
    // the batch attempt, then one attempt and three retries on its own
    assert_eq!(failures_so_far(&ledger).await, 5);
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (700, 300));
    ledger.caught_up().await;
    assert_eq!(
        ledger.written(&topics::dead_letter_topic(topics::ANALYSED)).await,
        1,
        "only the hopeless one"
    );
    ledger.stop().await;
}

/// A record that fails as if the database were away (SQLSTATE XX000, an internal error),
/// every time, while the database answers every other statement, is that record's fault: after
/// `INFRASTRUCTURE_FAILURES_MAX` attempts in a row it is dead-lettered with its cause, and the
/// records behind it on its partition are settled (before, it blocked them for ever).
#[tokio::test]
async fn a_record_failing_alone_as_if_the_database_were_away_is_dead_lettered_in_the_end() {
    let ledger = spawn_ledger().await; // 10 ms doubling up to 100 ms
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let dead_letters = ledger.reader(&topics::dead_letter_topic(topics::ANALYSED));
    let cursed = Uuid::new_v4();
    inject_failure(&ledger, cursed, i64::MAX, "XX000", "injected internal error").await;
    let after = Uuid::new_v4();
    ledger.publish_transfer(cursed, "CC-A", "CC-B", 300, "BRL").await;
    ledger.publish_transfer(after, "CC-A", "CC-B", 200, "BRL").await;

    let letter = receive(&dead_letters, 1).await.remove(0);
    assert_eq!(common::payload(&letter)["transferenciaId"], cursed.to_string());
    assert_eq!(header(&letter, dlt::EXCEPTION_FQCN).as_deref(), Some(ledger::settler::FAILS_ALONE));
    let message = header(&letter, dlt::EXCEPTION_MESSAGE).expect("message");
    assert!(
        message.contains("injected internal error") && message.contains("10 times in a row"),
        "{message}"
    );
    assert_eq!(ledger.decided(after).await.0, "LIQUIDADA");
    assert_eq!(entry_counts(ledger.pool(), cursed).await, (0, 0));
    // each attempt: the batch, then the record alone; until the bound
    assert_eq!(failures_so_far(&ledger).await, 2 * i64::from(ledger::settler::INFRASTRUCTURE_FAILURES_MAX));
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn a_transfer_that_can_never_be_applied_is_dead_lettered_at_once() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let dead_letters = ledger.reader(&topics::dead_letter_topic(topics::ANALYSED));
    // a constraint the record breaks (check_violation): not something a retry can change
    let doomed = Uuid::new_v4();
    inject_failure(&ledger, doomed, i64::MAX, "23514", "injected check violation").await;
    let fine = Uuid::new_v4();
    ledger.publish_transfer(doomed, "CC-A", "CC-B", 100, "BRL").await;
    ledger.publish_transfer(fine, "CC-A", "CC-B", 10, "BRL").await;

    let letter = receive(&dead_letters, 1).await.remove(0);
    assert_eq!(common::payload(&letter)["transferenciaId"], doomed.to_string());
    assert_eq!(header(&letter, dlt::EXCEPTION_FQCN).as_deref(), Some(ledger::settler::UNPROCESSABLE));
    assert_eq!(ledger.decided(fine).await.0, "LIQUIDADA");
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (990, 10));
    // the batch attempt and one attempt on its own: no retry
    assert_eq!(failures_so_far(&ledger).await, 2);
    // served at 0 from the start (alerting reads it); a retry would have counted 1
    let retries = format!("retries_total{{topic=\"{}\"}} 0", ledger.topics.topic(topics::ANALYSED));
    let metrics = ledger.metrics().await;
    assert!(
        metrics.lines().any(|line| line == retries),
        "a permanent failure was retried: {retries} not in\n{metrics}"
    );
    ledger.stop().await;
}

async fn readiness(ledger: &TestLedger) -> u16 {
    ledger.http.get(ledger.url("/readyz")).send().await.expect("GET /readyz").status().as_u16()
}

#[tokio::test]
async fn while_the_database_is_gone_the_ledger_waits_and_dead_letters_nothing() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 100_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let ids: Vec<Uuid> = (0..30).map(|_| Uuid::new_v4()).collect();

    ledger.close_database().await;
    for id in &ids {
        ledger.publish_transfer(*id, "CC-A", "CC-B", 100, "BRL").await;
    }
    testkit::eventually("readiness to fail", testkit::PATIENCE, || async {
        (readiness(&ledger).await == 503).then_some(())
    })
    .await;
    // the settler has failed 4 times, more than the test retry policy allows a record (one
    // attempt and 3 retries): the records must still be waiting, not dead-lettered. (The batch
    // backoff is the loop's default, 0.5 s doubling: about 8 s.)
    let retries = format!("retries_total{{topic=\"{}\"}} ", ledger.topics.topic(topics::ANALYSED));
    testkit::eventually("failures past a record's retry budget", testkit::PATIENCE, || async {
        let metrics = ledger.metrics().await;
        let count: u64 =
            metrics.lines().find_map(|line| line.strip_prefix(retries.as_str()))?.parse().ok()?;
        (count >= 4).then_some(())
    })
    .await;
    let response = ledger.http.get(ledger.url("/contas/CC-A")).send().await.expect("GET");
    assert_eq!(response.status(), 503, "the API says the database is unreachable");

    ledger.reopen_database().await;
    for id in &ids {
        assert_eq!(ledger.decided(*id).await.0, "LIQUIDADA");
    }
    testkit::eventually("readiness to return", testkit::PATIENCE, || async {
        (readiness(&ledger).await == 200).then_some(())
    })
    .await;
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (97_000, 3_000));
    ledger.caught_up().await;
    let dead_letter_topic = topics::dead_letter_topic(topics::ANALYSED);
    assert_eq!(ledger.written(&dead_letter_topic).await, 0, "a healthy record was dead-lettered");
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
#[ignore = "restarts the shared PostgreSQL: scripts/test runs it alone"]
async fn a_postgres_restart_mid_stream_loses_nothing_and_dead_letters_nothing() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 1_000_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let ids: Vec<Uuid> = (0..400).map(|_| Uuid::new_v4()).collect();
    let feeding = {
        let ids = ids.clone();
        let topic = ledger.topics.topic(topics::ANALYSED);
        let producer = kafka::producer::Producer::new(&kafka::config::producer_config(
            &ledger.topics.args,
            "test-feed",
            Duration::ZERO,
        ))
        .expect("producer");
        tokio::spawn(async move {
            for (n, id) in ids.iter().enumerate() {
                let event = common::analysed(*id, "CC-A", "CC-B", 100, "BRL");
                let record = kafka::producer::OutgoingRecord::new(&topic, "CC-A", event.to_string());
                producer.send(&record).await.expect("feed");
                if n % 20 == 19 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
    };
    // the restart lands mid-stream: once some transfers are settled
    testkit::eventually("the first transfers settled", testkit::PATIENCE, || async {
        let decided: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia_processada")
            .fetch_one(ledger.pool())
            .await
            .ok()?;
        (decided >= 20).then_some(())
    })
    .await;
    testkit::stack(&["restart", "postgres"]).await;
    feeding.await.expect("feed");
    for id in &ids {
        assert_eq!(ledger.decided(*id).await.0, "LIQUIDADA");
    }
    assert_eq!(ledger.balance("CC-B").await, 40_000);
    ledger.caught_up().await;
    let dead_letter_topic = topics::dead_letter_topic(topics::ANALYSED);
    assert_eq!(ledger.written(&dead_letter_topic).await, 0, "a healthy record was dead-lettered");
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn a_statement_cancelled_by_the_statement_timeout_is_retried_never_dead_lettered() {
    // no retries at all: were a statement timeout the record's fault, it would be a dead letter
    let ledger = common::spawn_ledger_with(1, |args| {
        args.ledger_retries = 0;
        args.database_statement_timeout_ms = 300;
        args.database_lock_timeout_ms = 0;
    })
    .await;
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    // a transaction of ours holds CC-A: the settler waits for its lock until the server
    // cancels the statement (SQLSTATE 57014), again and again, as with a hung database
    let mut blocker = PgConnection::connect(&ledger.database.url).await.expect("connect");
    blocker.execute("BEGIN").await.expect("begin");
    blocker.execute("SELECT 1 FROM conta WHERE id = 'CC-A' FOR UPDATE").await.expect("lock CC-A");
    let stuck = Uuid::new_v4();
    ledger.publish_transfer(stuck, "CC-A", "CC-B", 300, "BRL").await;
    testkit::eventually("the settler waiting for CC-A's lock", testkit::PATIENCE, || async {
        let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted")
            .fetch_one(ledger.pool())
            .await
            .ok()?;
        (waiting > 0).then_some(())
    })
    .await;
    // the lock is held for several statement timeouts: each attempt is cancelled
    let cancelled_before: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(xact_rollback), 0)::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(ledger.pool())
    .await
    .expect("rollbacks");
    testkit::eventually("several cancelled attempts", testkit::PATIENCE, || async {
        let now: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(xact_rollback), 0)::bigint FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(ledger.pool())
        .await
        .ok()?;
        (now >= cancelled_before + 2).then_some(())
    })
    .await;
    blocker.execute("COMMIT").await.expect("release CC-A");

    // settled once the lock is free; a dead-lettered record would never be decided
    assert_eq!(ledger.decided(stuck).await, ("LIQUIDADA".into(), None));
    assert_eq!(entry_counts(ledger.pool(), stuck).await, (1, 1));
    let dlt = format!("dlt_mensagens_total{{topic=\"{}-dlt\"}} 0", ledger.topics.topic(topics::ANALYSED));
    let metrics = ledger.metrics().await;
    assert!(metrics.lines().any(|line| line == dlt), "{dlt} in {metrics}");
    ledger.stop().await;
}
