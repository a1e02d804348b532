//! Settlement through crashes: `pagamentos ledger` is SIGKILLed twice mid-stream and restarted.
//! Every transfer is decided once and moves money once, the books stay balanced, and every
//! outcome event that reaches Kafka is the same bytes however often the outbox sent it.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use kafka::config::producer_config;
use kafka::producer::{OutgoingRecord, Producer};
use kafka::rdkafka::message::Message;
use serde_json::{json, Value};
use tokio::process::Child;
use uuid::Uuid;

use contracts::topics;
use testkit::{TestDatabase, TestTopics};

const TRANSFERS: usize = 2_000;
const ACCOUNTS: usize = 40;
/// Every tenth transfer goes to an account that does not exist: rejected, `CONTA_INEXISTENTE`.
const MISSING_EVERY: usize = 10;

fn ledger(topics: &TestTopics, database: &TestDatabase) -> Child {
    common::service(topics, "ledger")
        .env("LEDGER_LISTEN", "127.0.0.1:0")
        .env("LEDGER_DATABASE_URL", &database.url)
        .env("LEDGER_DATABASE_CONNECTIONS", "4")
        .env("LEDGER_BATCH_RECORDS", "50")
        .spawn()
        .expect("start pagamentos ledger")
}

fn account(n: usize) -> String {
    format!("CC-{:03}", n % ACCOUNTS)
}

/// Publishes one `TransferenciaAnalisada` per id, keyed by the source account, pausing after
/// every 50 so the stream lasts long enough for the kills to land in it.
fn feed(topics: &TestTopics, ids: Vec<Uuid>) -> tokio::task::JoinHandle<()> {
    let input = topics.topic(topics::ANALYSED);
    let producer =
        Producer::new(&producer_config(&topics.args, "test-feed", Duration::ZERO)).expect("producer");
    tokio::spawn(async move {
        for (n, id) in ids.iter().enumerate() {
            let source = account(n);
            let destination =
                if n % MISSING_EVERY == 0 { "CC-INEXISTENTE".to_owned() } else { account(n + 7) };
            let event = json!({
                "eventoId": Uuid::new_v4(), "transferenciaId": id, "contaOrigem": source,
                "contaDestino": destination, "valorEmCentavos": 100 + n as i64, "moeda": "BRL",
                "score": 10, "analisadaEm": "2026-12-03T10:00:00Z"
            });
            producer.send(&OutgoingRecord::new(&input, source, event.to_string())).await.expect("feed");
            if n % 50 == 49 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    })
}

/// Outcome events per transfer id: both outcome topics read to their end (the caller has
/// stopped the ledger, whose outbox had published every row: they hold all it ever sent).
async fn outcome_events(topics: &TestTopics) -> HashMap<String, Vec<Vec<u8>>> {
    let mut events: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
    for topic in [topics.topic(topics::SETTLED), topics.topic(topics::REJECTED)] {
        for record in testkit::read_to_end(&topics.args, &topic).await {
            let bytes = record.payload().expect("payload").to_vec();
            let event: Value = serde_json::from_slice(&bytes).expect("json");
            events.entry(event["transferenciaId"].as_str().expect("id").to_owned()).or_default().push(bytes);
        }
    }
    events
}

/// How many transfers the ledger has decided.
async fn decided(database: &TestDatabase) -> usize {
    let decided: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia_processada")
        .fetch_one(&database.pool)
        .await
        .expect("decided");
    decided as usize
}

#[tokio::test]
async fn sigkill_mid_stream_twice_settles_every_transfer_exactly_once() {
    testkit::init_logs();
    let database = TestDatabase::create(&ledger::MIGRATOR).await;
    let topics = TestTopics::plan(3).await;
    for n in 0..ACCOUNTS {
        ledger::testing::open_account(&database.pool, &account(n), "BRL", 10_000_000).await;
    }
    let ids: Vec<Uuid> = (0..TRANSFERS).map(|_| Uuid::new_v4()).collect();
    let mut service = ledger(&topics, &database);
    let feeding = feed(&topics, ids.clone());
    // each instance killed once it has decided transfers of its own
    for _ in 0..2 {
        let target = (decided(&database).await + 200).min(TRANSFERS);
        testkit::eventually(&format!("{target} transfers decided"), testkit::PATIENCE, || async {
            (decided(&database).await >= target).then_some(())
        })
        .await;
        service.kill().await.expect("SIGKILL");
        service = ledger(&topics, &database);
    }
    feeding.await.expect("feed");

    let pool = &database.pool;
    testkit::eventually("every transfer decided and announced", testkit::PATIENCE, || async {
        let (decided, pending): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM transferencia_processada), \
                    (SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL)",
        )
        .fetch_one(pool)
        .await
        .expect("progress");
        (decided == TRANSFERS as i64 && pending == 0).then_some(())
    })
    .await;
    service.kill().await.expect("stop");
    let events = outcome_events(&topics).await;

    // the database: one decision per transfer, the right one, and money moved once
    let decisions: Vec<(Uuid, String, Option<String>, i64, i64)> = sqlx::query_as(
        "SELECT p.transferencia_id, p.resultado, p.motivo, \
                count(l.id) FILTER (WHERE l.tipo = 'D'), count(l.id) FILTER (WHERE l.tipo = 'C') \
         FROM transferencia_processada p LEFT JOIN lancamento l USING (transferencia_id) \
         GROUP BY p.transferencia_id, p.resultado, p.motivo",
    )
    .fetch_all(pool)
    .await
    .expect("decisions");
    assert_eq!(decisions.len(), TRANSFERS);
    let position: HashMap<Uuid, usize> = ids.iter().enumerate().map(|(n, id)| (*id, n)).collect();
    for (id, outcome, reason, debits, credits) in &decisions {
        let n = position[id];
        if n.is_multiple_of(MISSING_EVERY) {
            assert_eq!((outcome.as_str(), reason.as_deref()), ("REJEITADA", Some("CONTA_INEXISTENTE")));
            assert_eq!((*debits, *credits), (0, 0), "rejected transfer {id} has entries");
        } else {
            assert_eq!((outcome.as_str(), reason.as_deref()), ("LIQUIDADA", None), "transfer {id}");
            assert_eq!((*debits, *credits), (1, 1), "transfer {id} settled more than once");
        }
    }
    let broken: Vec<String> = ledger::verify::ledger_invariants(pool)
        .await
        .expect("verify")
        .into_iter()
        .filter(|result| !result.is_clean())
        .map(|result| format!("{}: {:?}", result.check, result.breaks))
        .collect();
    assert!(broken.is_empty(), "broken invariants: {broken:?}");

    // Kafka: every transfer announced; a resend after a crash is the same event, byte for byte
    assert_eq!(events.len(), TRANSFERS, "transfers announced");
    for (id, copies) in &events {
        assert!(copies.iter().all(|copy| copy == &copies[0]), "transfer {id}: differing outcome events");
    }
    let resent = events.values().filter(|copies| copies.len() > 1).count();
    eprintln!("outcome events sent more than once after the kills: {resent} of {TRANSFERS}");
}
