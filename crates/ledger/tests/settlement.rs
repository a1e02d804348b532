//! Settlement against the real stack: the article's duplicate delivery, every rejection,
//! pinned outcomes, batches with mixed outcomes, poison records, crossing transfers.

use crate::common;

use std::collections::HashMap;

use kafka::rdkafka::message::Message;
use serde_json::Value;
use uuid::Uuid;

use common::{analysed, entry_counts, header, payload, receive, spawn_ledger, spawn_ledger_with};
use contracts::headers::{dlt, EVENT_ID, EVENT_TYPE};
use contracts::ids::{derived_event_id, REJECTED_BY_LEDGER_PREFIX, SETTLED_PREFIX};
use contracts::topics;

#[tokio::test]
async fn a_transfer_delivered_twice_moves_money_once_and_announces_it_once() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 10_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let settled = ledger.reader(topics::SETTLED);
    let transfer = Uuid::new_v4();

    // the article's test: the same transfer twice, here also under a different eventoId
    // once back to back (likely one batch), then again after it was decided (later batches)
    let event = analysed(transfer, "CC-A", "CC-B", 2_500, "BRL");
    ledger.publish("CC-A", event.to_string()).await;
    ledger.publish("CC-A", event.to_string()).await;
    assert_eq!(ledger.decided(transfer).await, ("LIQUIDADA".into(), None));
    ledger.publish("CC-A", event.to_string()).await;
    ledger.publish_transfer(transfer, "CC-A", "CC-B", 2_500, "BRL").await;
    let marker = Uuid::new_v4();
    ledger.publish_transfer(marker, "CC-A", "CC-B", 1, "BRL").await;

    assert_eq!(ledger.decided(marker).await, ("LIQUIDADA".into(), None));
    assert_eq!(ledger.decided(transfer).await, ("LIQUIDADA".into(), None));
    assert_eq!(ledger.balance("CC-A").await, 10_000 - 2_500 - 1);
    assert_eq!(ledger.balance("CC-B").await, 2_500 + 1);
    assert_eq!(entry_counts(ledger.pool(), transfer).await, (1, 1));

    let records = receive(&settled, 2).await;
    let ours: Vec<_> =
        records.iter().filter(|record| payload(record)["transferenciaId"] == transfer.to_string()).collect();
    assert_eq!(ours.len(), 1, "one TransferenciaLiquidada for the transfer");
    let record = ours[0];
    let event_id = derived_event_id(SETTLED_PREFIX, transfer).to_string();
    assert_eq!(record.key(), Some("CC-A".as_bytes()));
    assert_eq!(header(record, EVENT_ID).as_deref(), Some(event_id.as_str()));
    assert_eq!(header(record, EVENT_TYPE).as_deref(), Some("TransferenciaLiquidada"));
    let body = payload(record);
    assert_eq!(body["eventoId"], event_id);
    assert_eq!((body["contaOrigem"].as_str(), body["valorEmCentavos"].as_i64()), (Some("CC-A"), Some(2_500)));
    // the ledger has handled every record and published every outcome: the transfer's and the
    // marker's, nothing more
    ledger.caught_up().await;
    assert_eq!(ledger.written(topics::SETTLED).await, 2, "a duplicate outcome was published");
    // a duplicate is normal traffic, not a failure
    let dead_letter_topic = topics::dead_letter_topic(topics::ANALYSED);
    assert_eq!(ledger.written(&dead_letter_topic).await, 0, "a duplicate was dead-lettered");
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn each_rejection_is_an_event_that_moves_nothing_and_outcomes_stay_pinned() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    ledger.create_account("CC-USD", "USD", 500).await;
    let rejected = ledger.reader(topics::REJECTED);

    let no_account = Uuid::new_v4();
    let wrong_currency = Uuid::new_v4();
    let wrong_transfer_currency = Uuid::new_v4();
    let no_funds = Uuid::new_v4();
    let settled = Uuid::new_v4();
    ledger.publish_transfer(no_account, "CC-A", "CC-NOPE", 100, "BRL").await;
    ledger.publish_transfer(wrong_currency, "CC-A", "CC-USD", 100, "BRL").await;
    ledger.publish_transfer(wrong_transfer_currency, "CC-A", "CC-B", 100, "EUR").await;
    ledger.publish_transfer(no_funds, "CC-A", "CC-B", 1_001, "BRL").await;
    ledger.publish_transfer(settled, "CC-A", "CC-B", 1_000, "BRL").await;

    let expected = [
        (no_account, "CONTA_INEXISTENTE"),
        (wrong_currency, "MOEDA_INCOMPATIVEL"),
        (wrong_transfer_currency, "MOEDA_INCOMPATIVEL"),
        (no_funds, "SALDO_INSUFICIENTE"),
    ];
    for (id, reason) in expected {
        assert_eq!(ledger.decided(id).await, ("REJEITADA".into(), Some(reason.into())), "{reason}");
        assert_eq!(entry_counts(ledger.pool(), id).await, (0, 0), "{reason} moved money");
    }
    assert_eq!(ledger.decided(settled).await, ("LIQUIDADA".into(), None));
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (0, 1_000));

    let events: HashMap<String, Value> = receive(&rejected, expected.len())
        .await
        .iter()
        .map(|record| (payload(record)["transferenciaId"].as_str().expect("id").to_owned(), payload(record)))
        .collect();
    for (id, reason) in expected {
        let event = &events[&id.to_string()];
        assert_eq!(event["motivo"], reason);
        assert_eq!(event["eventoId"], derived_event_id(REJECTED_BY_LEDGER_PREFIX, id).to_string());
    }

    // pinned: the money is there now, and CC-NOPE exists, but the decisions stand
    ledger.deposit("CC-A", 5_000).await;
    ledger.create_account("CC-NOPE", "BRL", 0).await;
    ledger.publish_transfer(no_funds, "CC-A", "CC-B", 1_001, "BRL").await;
    ledger.publish_transfer(no_account, "CC-A", "CC-NOPE", 100, "BRL").await;
    // and a settled transfer redelivered after its source was emptied moves nothing either
    ledger.publish_transfer(settled, "CC-A", "CC-B", 1_000, "BRL").await;
    let marker = Uuid::new_v4();
    ledger.publish_transfer(marker, "CC-A", "CC-B", 1, "BRL").await;
    assert_eq!(ledger.decided(marker).await, ("LIQUIDADA".into(), None));
    assert_eq!(ledger.decided(no_funds).await, ("REJEITADA".into(), Some("SALDO_INSUFICIENTE".into())));
    assert_eq!(ledger.decided(no_account).await, ("REJEITADA".into(), Some("CONTA_INEXISTENTE".into())));
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (4_999, 1_001));
    assert_eq!(entry_counts(ledger.pool(), settled).await, (1, 1));
    ledger.caught_up().await;
    assert_eq!(ledger.written(topics::REJECTED).await, 4, "a pinned rejection was announced again");
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn one_batch_settles_in_order_and_a_rejection_does_not_undo_the_others() {
    let mut ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    // no consumer while the records are published: they wait and come as one backlog
    ledger.instances.pop().expect("instance").stop().await;
    let ids: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    let steps = [
        ("CC-A", "CC-B", 400, "LIQUIDADA"),
        ("CC-A", "CC-B", 400, "LIQUIDADA"),
        ("CC-A", "CC-B", 400, "SALDO_INSUFICIENTE"),
        ("CC-B", "CC-A", 300, "LIQUIDADA"),
        ("CC-A", "CC-B", 500, "LIQUIDADA"),
        ("CC-A", "CC-B", 1, "SALDO_INSUFICIENTE"),
    ];
    for (id, (source, destination, cents, _)) in ids.iter().zip(steps) {
        // one key: one partition, so the ledger sees them in this order
        ledger.publish("same-key", analysed(*id, source, destination, cents, "BRL").to_string()).await;
    }
    ledger.start_instance().await;
    for (id, (_, _, _, expected)) in ids.iter().zip(steps) {
        let (result, reason) = ledger.decided(*id).await;
        assert_eq!(reason.as_deref().unwrap_or(&result), expected, "transfer {id}");
    }
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (0, 1_000));
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn malformed_records_go_to_the_dead_letter_topic_at_once_and_the_rest_settle() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let dead_letters = ledger.reader(&topics::dead_letter_topic(topics::ANALYSED));
    let input = ledger.topics.topic(topics::ANALYSED);

    let same_account = analysed(Uuid::new_v4(), "CC-A", "CC-A", 10, "BRL");
    let zero = analysed(Uuid::new_v4(), "CC-A", "CC-B", 0, "BRL");
    // an account or a currency that breaks the contract's rules is refused when read (not
    // decided as CONTA_INEXISTENTE or MOEDA_INCOMPATIVEL)
    let bad_account = analysed(Uuid::new_v4(), "CC-A", "CC B", 10, "BRL");
    let bad_currency = analysed(Uuid::new_v4(), "CC-A", "CC-B", 10, "XYZ");
    let poisons: [Vec<u8>; 6] = [
        b"{not json".to_vec(),
        vec![0xff, 0xfe, 0x00],
        same_account.to_string().into_bytes(),
        zero.to_string().into_bytes(),
        bad_account.to_string().into_bytes(),
        bad_currency.to_string().into_bytes(),
    ];
    let before = Uuid::new_v4();
    let after = Uuid::new_v4();
    ledger.publish_transfer(before, "CC-A", "CC-B", 100, "BRL").await;
    for poison in &poisons {
        ledger.publish("CC-A", poison.clone()).await;
    }
    ledger.publish_transfer(after, "CC-A", "CC-B", 100, "BRL").await;

    assert_eq!(ledger.decided(before).await.0, "LIQUIDADA");
    assert_eq!(ledger.decided(after).await.0, "LIQUIDADA");
    let letters = receive(&dead_letters, poisons.len()).await;
    for (letter, poison) in letters.iter().zip(&poisons) {
        assert_eq!(letter.payload(), Some(poison.as_slice()), "payload kept byte for byte");
        assert_eq!(letter.key(), Some("CC-A".as_bytes()));
        assert_eq!(header(letter, dlt::ORIGINAL_TOPIC).as_deref(), Some(input.as_str()));
        assert_eq!(
            header(letter, dlt::EXCEPTION_FQCN).as_deref(),
            Some(ledger::settler::MALFORMED_EVENT),
            "{:?}",
            header(letter, dlt::EXCEPTION_MESSAGE)
        );
        assert!(header(letter, dlt::ORIGINAL_OFFSET).is_some());
        assert_eq!(
            header(letter, dlt::ORIGINAL_CONSUMER_GROUP).as_deref(),
            Some(ledger.topics.args.group(topics::groups::LEDGER).as_str())
        );
    }
    assert!(header(&letters[2], dlt::EXCEPTION_MESSAGE).expect("message").contains("both \"CC-A\""));
    let message = |letter| header(letter, dlt::EXCEPTION_MESSAGE).expect("message");
    assert!(message(&letters[4]).contains("may contain only letters"), "{}", message(&letters[4]));
    assert!(message(&letters[5]).contains("not an active ISO 4217"), "{}", message(&letters[5]));
    ledger.caught_up().await;
    assert_eq!(ledger.written(&topics::dead_letter_topic(topics::ANALYSED)).await, 6, "one dead letter each");
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (800, 200));
    let metrics = ledger.metrics().await;
    let dead_topic = topics::dead_letter_topic(&input);
    assert!(
        metrics.lines().any(|line| line.starts_with("dlt_mensagens_total")
            && line.contains(&dead_topic)
            && line.ends_with(" 6")),
        "{metrics}"
    );
    ledger.stop().await;
}

#[tokio::test]
async fn two_hundred_crossing_transfers_on_two_instances_conserve_money() {
    const ACCOUNTS: usize = 6;
    const TRANSFERS: usize = 200;
    let mut ledger = spawn_ledger_with(4, |_| {}).await;
    ledger.start_instance().await;
    for n in 0..ACCOUNTS {
        ledger.create_account(&format!("CC-{n}"), "BRL", 10_000).await;
    }
    // A→B and B→A, over every pair, each instance holding some of the partitions
    let mut ids = Vec::new();
    let publishing: Vec<_> = (0..TRANSFERS)
        .map(|n| {
            let (a, b) = (n % ACCOUNTS, (n / ACCOUNTS + 1 + n) % ACCOUNTS);
            let (a, b) = if a == b { (a, (b + 1) % ACCOUNTS) } else { (a, b) };
            let (source, destination) = if n % 2 == 0 { (a, b) } else { (b, a) };
            let id = Uuid::new_v4();
            ids.push(id);
            (id, format!("CC-{source}"), format!("CC-{destination}"), 1 + (n as i64 * 37) % 3_000)
        })
        .collect();
    let sends = publishing.iter().map(|(id, source, destination, cents)| {
        ledger.publish_transfer(*id, source, destination, *cents, "BRL")
    });
    futures::future::join_all(sends).await;

    for id in &ids {
        ledger.decided(*id).await;
    }
    let balances = ledger.balances().await;
    let customers: i64 = (0..ACCOUNTS).map(|n| balances[&format!("CC-{n}")]).sum();
    assert_eq!(customers, ACCOUNTS as i64 * 10_000, "money was created or lost: {balances:?}");
    assert_eq!(balances["EMISSOR-BRL"], -(ACCOUNTS as i64) * 10_000);
    assert!(balances
        .values()
        .zip(balances.keys())
        .all(|(balance, id)| *balance >= 0 || id.starts_with("EMISSOR-")));
    let settled: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transferencia_processada WHERE resultado = 'LIQUIDADA'")
            .fetch_one(ledger.pool())
            .await
            .expect("count");
    assert!(settled > 0);
    ledger.assert_books_balance().await;
    ledger.stop().await;
}

#[tokio::test]
async fn metrics_show_settlement_latency_outcomes_outbox_and_lag() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-1", "BRL", 1_000).await;
    ledger.create_account("CC-2", "BRL", 0).await;
    let (settled, short) = (Uuid::new_v4(), Uuid::new_v4());
    ledger.publish_transfer(settled, "CC-1", "CC-2", 100, "BRL").await;
    ledger.publish_transfer(short, "CC-1", "CC-2", 5_000, "BRL").await;
    ledger.decided(settled).await;
    ledger.decided(short).await;
    ledger.outbox_drained().await;
    let group_lag = format!("kafka_consumer_lag{{group=\"{}\"", ledger.topics.args.group("ledger"));
    // the lag is refreshed every 5 s
    let metrics = testkit::eventually("lag reported", testkit::PATIENCE, || async {
        let metrics = ledger.metrics().await;
        metrics.lines().any(|line| line.starts_with(&group_lag)).then_some(metrics)
    })
    .await;
    for expected in [
        "ledger_settlement_seconds_bucket",
        "ledger_outcomes_total{outcome=\"LIQUIDADA\",reason=\"\"}",
        "ledger_outcomes_total{outcome=\"REJEITADA\",reason=\"SALDO_INSUFICIENTE\"}",
        "outbox_pendentes{database=\"ledger\"}",
        "outbox_oldest_pending_seconds{database=\"ledger\"}",
    ] {
        assert!(metrics.contains(expected), "{expected} missing from /metrics:\n{metrics}");
    }
    ledger.stop().await;
}

/// Writes `events` (transfer, commit?) to the ledger's input, each alone in a Kafka
/// transaction that commits or aborts, as the article's Java antifraude writes (a marker after
/// every transaction; an aborted record unreadable under `read_committed`).
async fn write_in_transactions(ledger: &common::TestLedger, events: Vec<(Uuid, bool)>) {
    use kafka::rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
    let producer: BaseProducer = kafka::config::transactional_producer_config(
        &ledger.topics.args,
        "upstream",
        &testkit::unique("upstream"),
        std::time::Duration::ZERO,
    )
    .create()
    .expect("transactional producer");
    let topic = ledger.topics.topic(topics::ANALYSED);
    tokio::task::spawn_blocking(move || {
        let timeout = std::time::Duration::from_secs(30);
        producer.init_transactions(timeout).expect("init transactions");
        for (transfer, commit) in events {
            let event = analysed(transfer, "CC-A", "CC-B", 100, "BRL").to_string();
            producer.begin_transaction().expect("begin");
            producer
                .send(BaseRecord::<str, str>::to(&topic).key("CC-A").payload(&event))
                .map_err(|(error, _)| error)
                .expect("send");
            // on the broker before the transaction ends, so an aborted record takes its offset
            producer.flush(timeout).expect("flush");
            if commit {
                producer.commit_transaction(timeout).expect("commit");
            } else {
                producer.abort_transaction(timeout).expect("abort");
            }
        }
    })
    .await
    .expect("writer");
}

/// Transaction markers and aborted records in the ledger's input (what a transactional
/// antifraude, Java or ours, leaves there) are not records: every committed transfer is
/// settled once, every aborted one never (proved by a plain transfer written after them, on
/// the same partition, being settled), and the group's lag reaches 0 past the last marker.
#[tokio::test]
async fn transactions_committed_and_aborted_upstream_settle_the_committed_ones_only() {
    let ledger = spawn_ledger().await;
    ledger.create_account("CC-A", "BRL", 1_000).await;
    ledger.create_account("CC-B", "BRL", 0).await;
    let events: Vec<(Uuid, bool)> = [true, true, false, true, false, false, true]
        .into_iter()
        .map(|commit| (Uuid::new_v4(), commit))
        .collect();
    write_in_transactions(&ledger, events.clone()).await;
    let marker = Uuid::new_v4();
    ledger.publish_transfer(marker, "CC-A", "CC-B", 100, "BRL").await;

    assert_eq!(ledger.decided(marker).await.0, "LIQUIDADA");
    for (transfer, commit) in &events {
        if *commit {
            assert_eq!(ledger.decided(*transfer).await.0, "LIQUIDADA");
            assert_eq!(entry_counts(ledger.pool(), *transfer).await, (1, 1));
        } else {
            assert_eq!(
                ledger::store::outcome(ledger.pool(), *transfer).await.expect("outcome"),
                None,
                "aborted"
            );
        }
    }
    assert_eq!((ledger.balance("CC-A").await, ledger.balance("CC-B").await), (500, 500));
    ledger.caught_up().await;
    ledger.assert_books_balance().await;
    ledger.stop().await;
}
