//! The API's group commit (`transfers::writer`) against a real PostgreSQL: many transfers in
//! one transaction, each with its own answer; keys inside one batch; a transfer that breaks
//! the transaction fails alone.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use testkit::TestDatabase;
use transfers::domain::TransferRequest;
use transfers::error::{Refusal, StoreError};
use transfers::store::{Created, EventTarget, IdempotencyKey, NewTransfer};
use transfers::writer::{self, Writer};

fn transfer(amount_cents: i64, key: Option<&str>) -> NewTransfer {
    let request = TransferRequest::parse(&json!({
        "contaOrigem": "CC-001", "contaDestino": "CC-002", "valorEmCentavos": amount_cents, "moeda": "BRL"
    }))
    .expect("valid");
    let key = key.map(|key| IdempotencyKey {
        scope: "anonimo".into(),
        key: key.into(),
        fingerprint: request.fingerprint(),
        ttl: Duration::from_secs(60),
    });
    let target =
        EventTarget { topic: Arc::from("t.transferencias.solicitada"), traceparent: None, tracestate: None };
    NewTransfer { request, key, target }
}

async fn count(database: &TestDatabase, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&database.pool)
        .await
        .expect("count")
}

fn id(answer: &Result<Created, StoreError>) -> uuid::Uuid {
    match answer {
        Ok(Created::New(transfer) | Created::Replayed(transfer)) => transfer.id,
        Err(error) => panic!("refused: {error}"),
    }
}

#[tokio::test]
async fn one_transaction_answers_each_transfer_and_sees_keys_claimed_earlier_in_it() {
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    let batch = [
        transfer(100, None),
        transfer(200, Some("k-1")),
        transfer(200, Some("k-1")), // the same request again: a replay of the one just above
        transfer(300, Some("k-1")), // the key with another request: refused
        transfer(400, Some("k-2")),
    ];
    let answers = writer::write_batch(&database.pool, &batch.iter().collect::<Vec<_>>()).await;
    assert_eq!(answers.len(), 5);
    assert!(matches!(answers[0], Ok(Created::New(_))));
    assert!(matches!(answers[1], Ok(Created::New(_))));
    assert!(matches!(answers[2], Ok(Created::Replayed(_))));
    assert_eq!(id(&answers[1]), id(&answers[2]));
    assert!(matches!(answers[3], Err(StoreError::Refused(Refusal::KeyReused))), "{:?}", answers[3]);
    assert!(matches!(answers[4], Ok(Created::New(_))));
    assert_eq!(count(&database, "transferencia").await, 3);
    assert_eq!(count(&database, "outbox_evento").await, 3);
    assert_eq!(count(&database, "chave_idempotencia").await, 2);
}

#[tokio::test]
async fn a_transfer_that_breaks_the_transaction_fails_alone() {
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    // a database that refuses one amount, as any constraint the API does not check would
    sqlx::raw_sql(
        "CREATE FUNCTION recusa_666() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.valor_centavos = 666 THEN RAISE EXCEPTION 'no 666'; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER recusa_666 BEFORE INSERT ON transferencia FOR EACH ROW EXECUTE FUNCTION recusa_666();",
    )
    .execute(&database.pool)
    .await
    .expect("trigger");
    let batch = [transfer(1, Some("a")), transfer(666, Some("b")), transfer(3, None)];
    let answers = writer::write_batch(&database.pool, &batch.iter().collect::<Vec<_>>()).await;
    assert!(matches!(answers[0], Ok(Created::New(_))), "{:?}", answers[0]);
    assert!(matches!(answers[1], Err(StoreError::Database(_))), "{:?}", answers[1]);
    assert!(matches!(answers[2], Ok(Created::New(_))), "{:?}", answers[2]);
    assert_eq!(count(&database, "transferencia").await, 2);
    assert_eq!(count(&database, "outbox_evento").await, 2);
    // the refused request's key was not kept: it may be sent again
    assert_eq!(count(&database, "chave_idempotencia").await, 1);
}

#[tokio::test]
async fn concurrent_requests_through_the_batched_writer_each_get_their_transfer() {
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    let writer = Writer::batched(database.pool.clone(), outbox::Waker::default());
    let requests = (0..200).map(|n| {
        let writer = writer.clone();
        tokio::spawn(async move { writer.create(transfer(n + 1, Some(&format!("key-{n}")))).await })
    });
    let answers = futures::future::join_all(requests).await;
    let mut ids = std::collections::HashSet::new();
    for answer in answers {
        let answer = answer.expect("task");
        assert!(matches!(answer, Ok(Created::New(_))), "{answer:?}");
        ids.insert(id(&answer));
    }
    assert_eq!(ids.len(), 200, "every request its own transfer");
    assert_eq!(count(&database, "transferencia").await, 200);
    assert_eq!(count(&database, "outbox_evento").await, 200);
    // a request after the storm: its key replays, nothing new
    let again = writer.create(transfer(1, Some("key-0"))).await;
    assert!(matches!(again, Ok(Created::Replayed(_))), "{again:?}");
    assert_eq!(count(&database, "transferencia").await, 200);
}

/// Both writers wake this process's outbox relay once a new transfer is committed (before its
/// answer), and not for a replay, which wrote nothing.
#[tokio::test]
async fn the_writers_wake_the_relay_after_committing_a_new_transfer() {
    use futures::FutureExt;
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    let relay = outbox::Waker::default();
    let writers = [
        ("direct", Writer::direct(database.pool.clone(), relay.clone())),
        ("batched", Writer::batched(database.pool.clone(), relay.clone())),
    ];
    for (name, writer) in writers {
        let key = format!("wake-{name}");
        assert!(matches!(writer.create(transfer(100, Some(&key))).await, Ok(Created::New(_))));
        assert!(relay.woken().now_or_never().is_some(), "the {name} writer did not wake the relay");
        assert!(matches!(writer.create(transfer(100, Some(&key))).await, Ok(Created::Replayed(_))));
        assert!(relay.woken().now_or_never().is_none(), "the {name} writer woke the relay for a replay");
    }
}

#[tokio::test]
async fn with_the_database_away_every_request_in_the_batch_is_told_so() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(200))
        .connect_lazy("postgres://nobody:nothing@127.0.0.1:1/none")
        .expect("lazy pool");
    let batch = [transfer(1, None), transfer(2, None), transfer(3, None)];
    let answers = writer::write_batch(&pool, &batch.iter().collect::<Vec<_>>()).await;
    assert_eq!(answers.len(), 3);
    for answer in &answers {
        let error = answer.as_ref().expect_err("nothing written");
        assert!(error.is_unavailable(), "{error:?}");
    }
}

/// A "database" that accepts connections and never answers: every writer hangs on it.
async fn hung_database_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("postgres://nobody:nothing@{address}/none?sslmode=disable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_writers_stuck_a_full_queue_refuses_at_once_instead_of_waiting() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(writer::WRITERS as u32)
        .acquire_timeout(Duration::from_secs(3_600))
        .connect_lazy(&hung_database_url().await)
        .expect("lazy pool");
    let writer = Writer::batched(pool, outbox::Waker::default());
    // the writers hold at most WRITERS batches of MAX_BATCH, the queue as many again: one
    // more cannot fit anywhere
    let capacity = 2 * writer::WRITERS * writer::MAX_BATCH;
    let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..=capacity {
        let (writer, answers) = (writer.clone(), answers.clone());
        tokio::spawn(async move {
            let _ = answers.send(writer.create(transfer(1, None)).await);
        });
    }
    let refused = tokio::time::timeout(Duration::from_secs(60), answered.recv())
        .await
        .expect("a request answered although every writer is stuck")
        .expect("an answer");
    assert!(matches!(refused, Err(StoreError::WriterBusy)), "{refused:?}");
    let problem = web::ApiError::from(StoreError::WriterBusy);
    assert!(matches!(problem, web::ApiError::Overloaded { retry_after_s: 1, .. }), "{problem:?}");
}

#[tokio::test]
async fn a_group_commit_inserts_its_transfers_with_one_statement_and_their_events_with_another() {
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    // a statement-level trigger counts the INSERT statements on each table
    sqlx::raw_sql(
        "CREATE TABLE insercoes (tabela text PRIMARY KEY, comandos int NOT NULL); \
         CREATE FUNCTION conta_insercao() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           INSERT INTO insercoes VALUES (TG_TABLE_NAME, 1) \
             ON CONFLICT (tabela) DO UPDATE SET comandos = insercoes.comandos + 1; RETURN NULL; END $$; \
         CREATE TRIGGER conta_insercao AFTER INSERT ON transferencia \
           FOR EACH STATEMENT EXECUTE FUNCTION conta_insercao(); \
         CREATE TRIGGER conta_insercao AFTER INSERT ON chave_idempotencia \
           FOR EACH STATEMENT EXECUTE FUNCTION conta_insercao(); \
         CREATE TRIGGER conta_insercao AFTER INSERT ON outbox_evento \
           FOR EACH STATEMENT EXECUTE FUNCTION conta_insercao();",
    )
    .execute(&database.pool)
    .await
    .expect("counting triggers");
    let batch: Vec<NewTransfer> =
        (0..50).map(|n| transfer(n + 1, (n % 5 != 0).then(|| format!("batch-{n}")).as_deref())).collect();
    let answers = writer::write_batch(&database.pool, &batch.iter().collect::<Vec<_>>()).await;
    assert!(answers.iter().all(|answer| matches!(answer, Ok(Created::New(_)))), "{answers:?}");
    let statements: Vec<(String, i32)> =
        sqlx::query_as("SELECT tabela, comandos FROM insercoes ORDER BY tabela")
            .fetch_all(&database.pool)
            .await
            .expect("counts");
    let expected = [("chave_idempotencia", 1), ("outbox_evento", 1), ("transferencia", 1)]
        .map(|(t, n)| (t.to_owned(), n));
    assert_eq!(statements, expected, "INSERT statements per table for a batch of 50");
    assert_eq!(count(&database, "transferencia").await, 50);
    assert_eq!(count(&database, "chave_idempotencia").await, 40);
    // each event is its transfer's, in the batch's order
    let events: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT (payload::json->>'transferenciaId')::uuid, (payload::json->>'valorEmCentavos')::bigint \
         FROM outbox_evento ORDER BY sequencia",
    )
    .fetch_all(&database.pool)
    .await
    .expect("events");
    let created: Vec<(uuid::Uuid, i64)> = answers
        .iter()
        .map(|answer| match answer {
            Ok(Created::New(transfer)) => (transfer.id, transfer.amount_cents.get()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(events, created);
}

#[tokio::test]
async fn in_one_batch_keys_held_elsewhere_expired_or_repeated_are_each_answered_as_alone() {
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    // committed before the batch: a key to replay, one to misuse, one expired
    let before = [transfer(10, Some("replay")), transfer(20, Some("misuse")), transfer(30, Some("expired"))];
    let earlier = writer::write_batch(&database.pool, &before.iter().collect::<Vec<_>>()).await;
    sqlx::query(
        "UPDATE chave_idempotencia SET expira_em = now() - interval '1 second' WHERE chave = 'expired'",
    )
    .execute(&database.pool)
    .await
    .expect("expire");
    // a request in flight elsewhere holds this key's lock
    let mut other = database.pool.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('anonimo'), hashtext('in-flight'))")
        .execute(&mut *other)
        .await
        .expect("lock");
    let batch = [
        transfer(10, Some("replay")),
        transfer(21, Some("misuse")),
        transfer(31, Some("expired")),
        transfer(31, Some("expired")), // the request just above again: its replay
        transfer(40, Some("in-flight")),
        transfer(50, Some("fresh")),
        transfer(51, Some("fresh")), // the key just above with another request
        transfer(60, None),
    ];
    let answers = writer::write_batch(&database.pool, &batch.iter().collect::<Vec<_>>()).await;
    other.rollback().await.expect("rollback");
    assert!(matches!(&answers[0], Ok(Created::Replayed(t)) if t.id == id(&earlier[0])), "{:?}", answers[0]);
    assert!(matches!(answers[1], Err(StoreError::Refused(Refusal::KeyReused))), "{:?}", answers[1]);
    assert!(matches!(&answers[2], Ok(Created::New(t)) if t.id != id(&earlier[2])), "{:?}", answers[2]);
    assert!(matches!(&answers[3], Ok(Created::Replayed(t)) if t.id == id(&answers[2])), "{:?}", answers[3]);
    assert!(matches!(answers[4], Err(StoreError::Refused(Refusal::KeyInFlight))), "{:?}", answers[4]);
    assert!(matches!(answers[5], Ok(Created::New(_))), "{:?}", answers[5]);
    assert!(matches!(answers[6], Err(StoreError::Refused(Refusal::KeyReused))), "{:?}", answers[6]);
    assert!(matches!(answers[7], Ok(Created::New(_))), "{:?}", answers[7]);
    // three before, three now (the expired key's, the fresh key's, the keyless one), one event each
    assert_eq!(count(&database, "transferencia").await, 6);
    assert_eq!(count(&database, "outbox_evento").await, 6);
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_evento o JOIN transferencia t ON t.id = (o.payload::json->>'transferenciaId')::uuid",
    )
    .fetch_one(&database.pool)
    .await
    .expect("events");
    assert_eq!(events, 6, "every event names its transfer");
    // the key in flight was not taken: free once the other request has gone
    let later = writer::write_batch(&database.pool, &[&transfer(40, Some("in-flight"))]).await;
    assert!(matches!(later[0], Ok(Created::New(_))), "{:?}", later[0]);
}
