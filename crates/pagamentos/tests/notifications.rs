//! `pagamentos notificacoes` and `pagamentos dlt` as operators run them: the service killed
//! while records wait in the retry topics loses none of them, and dead letters are replayed
//! once, never twice.

mod common;

use std::process::Stdio;
use std::time::Duration;

use kafka::producer::{OutgoingRecord, Producer};
use serde_json::{json, Value};
use tokio::process::Child;
use uuid::Uuid;

use contracts::topics;
use testkit::webhook::{Receiver, Reply};
use testkit::TestTopics;

fn notifications(topics: &TestTopics, url: &str) -> Child {
    common::service(topics, "notificacoes")
        .env("NOTIFICACOES_LISTEN", "127.0.0.1:0")
        .env("NOTIFICACOES_WEBHOOK_URL", url)
        .env("NOTIFICACOES_WEBHOOK_TIMEOUT_MS", "2000")
        .spawn()
        .expect("start pagamentos notificacoes")
}

async fn publish_settled(topics: &TestTopics, producer: &Producer, key: &str) -> Uuid {
    let event_id = Uuid::new_v4();
    let payload = json!({"eventoId": event_id, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z"});
    let record = OutgoingRecord::new(topics.topic(topics::SETTLED), key, payload.to_string());
    producer.send(&record).await.expect("publish");
    event_id
}

fn producer(topics: &TestTopics) -> Producer {
    Producer::new(&kafka::config::producer_config(&topics.args, "test", Duration::ZERO)).expect("producer")
}

/// `pagamentos dlt <args>`: (exit code, stdout, stderr).
async fn dlt(topics: &TestTopics, args: &[&str]) -> (i32, String, String) {
    let output = common::service(topics, "dlt")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run pagamentos dlt");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn kill(child: &mut Child) {
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_while_records_wait_in_retry_topics_loses_none() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let (receiver, url) = Receiver::start().await;
    let producer = producer(&topics);
    const EVENTS: usize = 300;
    let mut events = Vec::with_capacity(EVENTS);
    for n in 0..EVENTS {
        let event = publish_settled(&topics, &producer, &format!("CC-{:03}", n % 30)).await;
        // two failures each: every notification passes through retry-1000 and retry-2000
        receiver.script(event, &[Reply::Status(503), Reply::Status(503)]);
        events.push(event);
    }

    let mut service = notifications(&topics, &url);
    testkit::eventually("first attempts", Duration::from_secs(30), || async {
        (receiver.calls().len() >= EVENTS).then_some(())
    })
    .await;
    // now every record waits in retry-1000 (or is on its way to retry-2000)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    kill(&mut service).await;
    let calls_at_first_kill = receiver.calls().len();

    let mut service = notifications(&topics, &url);
    tokio::time::sleep(Duration::from_secs(3)).await;
    kill(&mut service).await;
    let calls_at_second_kill = receiver.calls().len();

    let mut service = notifications(&topics, &url);
    testkit::eventually("every notification delivered", Duration::from_secs(90), || async {
        // the third call of each event is answered 200
        events.iter().all(|event| receiver.calls_for(event).len() >= 3).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(8)).await; // let duplicates, if any, arrive
    kill(&mut service).await;
    let total = receiver.calls().len();
    let extra = total - 3 * EVENTS;
    eprintln!(
        "{EVENTS} notifications, killed at {calls_at_first_kill} and {calls_at_second_kill} calls: all delivered, \
         {total} calls in all ({extra} repeated after the kills, deduplicated by Idempotency-Key)"
    );
    // nothing went to the dead-letter topic: no event failed four times
    let (code, stdout, stderr) = dlt(&topics, &["list", "transferencias.liquidada-dlt", "--json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let letters: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(letters, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_replayed_once_and_never_twice() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let (receiver, url) = Receiver::start().await;
    let producer = producer(&topics);
    let mut service = notifications(&topics, &url);

    // three notifications the receiver refuses (400: dead-lettered after one call)
    let mut refused = Vec::new();
    for key in ["CC-001", "CC-002", "CC-003"] {
        let event = publish_settled(&topics, &producer, key).await;
        receiver.script(event, &[Reply::Status(400)]);
        refused.push(event);
    }
    let letters = testkit::eventually("three dead letters", Duration::from_secs(30), || async {
        let (code, stdout, _) = dlt(&topics, &["list", "transferencias.liquidada-dlt", "--json"]).await;
        let letters: Value = serde_json::from_str(&stdout).ok()?;
        (code == 0 && letters.as_array()?.len() == 3).then_some(letters)
    })
    .await;
    let settled = topics.topic(topics::SETTLED);
    for letter in letters.as_array().expect("array") {
        assert_eq!(letter["originalTopic"], settled.as_str());
        assert_eq!(letter["exceptionMessage"], "webhook answered 400 Bad Request");
        assert_eq!(letter["replayed"], false);
    }
    let dead_letter_topic = topics.topic("transferencias.liquidada-dlt");
    let retained = |topic: String, args: kafka::KafkaArgs| async move {
        tokio::task::spawn_blocking(move || kafka::dlt::DeadLetterTopic::open(&args, &topic)?.retained())
            .await
            .expect("task")
            .expect("retained")
    };
    assert_eq!(retained(dead_letter_topic.clone(), topics.args.clone()).await, 3);

    // the table names them too
    let (code, table, _) = dlt(&topics, &["list", "transferencias.liquidada-dlt"]).await;
    assert_eq!(code, 0);
    assert!(table.contains("webhook answered 400 Bad Request") && table.contains("CC-002"), "{table}");

    // a dry run sends nothing
    let (code, stdout, stderr) =
        dlt(&topics, &["replay", "transferencias.liquidada-dlt", "--all", "--dry-run"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("3 dead letters") && stdout.contains("would be replayed"), "{stdout}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.calls().len(), 3);

    // one replayed by partition and offset: delivered now that the receiver takes it
    let first = &letters[0];
    let (partition, offset) = (first["partition"].to_string(), first["offset"].to_string());
    let one = ["replay", "transferencias.liquidada-dlt", "--partition", &partition, "--offset", &offset];
    let (code, stdout, stderr) = dlt(&topics, &one).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    testkit::eventually("the replayed notification delivered", Duration::from_secs(20), || async {
        (receiver.calls().len() == 4).then_some(())
    })
    .await;
    assert_eq!(retained(dead_letter_topic.clone(), topics.args.clone()).await, 2);

    // the same one again: refused, nothing sent
    let (code, _, stderr) = dlt(&topics, &one).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("was replayed already"), "{stderr}");

    // the rest with --all: the one replayed before is skipped
    let (code, stdout, stderr) = dlt(&topics, &["replay", "transferencias.liquidada-dlt", "--all"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("2 replayed"), "{stdout}");
    testkit::eventually("every replayed notification delivered", Duration::from_secs(20), || async {
        refused.iter().all(|event| receiver.calls_for(event).len() == 2).then_some(())
    })
    .await;
    assert_eq!(retained(dead_letter_topic.clone(), topics.args.clone()).await, 0);

    // and --all again replays nothing
    let (code, stdout, stderr) = dlt(&topics, &["replay", "transferencias.liquidada-dlt", "--all"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("0 replayed"), "{stdout}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(receiver.calls().len(), 6, "each refused notification called twice, no more");
    let (_, stdout, _) = dlt(&topics, &["list", "transferencias.liquidada-dlt", "--json"]).await;
    assert_eq!(serde_json::from_str::<Value>(&stdout).expect("json"), json!([]));
    kill(&mut service).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlt_commands_refuse_bad_input_clearly() {
    let topics = TestTopics::plan(1).await;
    let (code, _, stderr) = dlt(&topics, &["list", "transferencias.liquidada"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("is not a dead-letter topic"), "{stderr}");
    let (code, _, stderr) = dlt(&topics, &["list", "nao-existe-dlt"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("does not exist"), "{stderr}");
    let (code, _, stderr) =
        dlt(&topics, &["replay", "transferencias.liquidada-dlt", "--partition", "0", "--offset", "5"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("has no record at offset 5"), "{stderr}");
    let (code, _, stderr) = dlt(&topics, &["replay", "transferencias.liquidada-dlt"]).await;
    assert_eq!(code, 2, "{stderr}");
}
