//! `pagamentos notificacoes` and `pagamentos dlt` as operators run them: the service killed
//! while records wait in the retry topics loses none of them, and dead letters are replayed
//! once, never twice.

use crate::common;

use std::time::Duration;

use kafka::producer::{OutgoingRecord, Producer};
use serde_json::{json, Value};
use tokio::process::Child;
use uuid::Uuid;

use contracts::headers::{encode_big_integer, encode_int, encode_long};
use contracts::topics;
use kafka::rdkafka::message::{Headers, Message};
use kafka::retry_topic::now_ms;
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
    publish_settled_as(topics, producer, key, Uuid::new_v4()).await
}

async fn publish_settled_as(topics: &TestTopics, producer: &Producer, key: &str, event_id: Uuid) -> Uuid {
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
    common::system::captured(common::service(topics, "dlt").args(args), "pagamentos dlt").await
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
    testkit::eventually("first attempts", testkit::PATIENCE, || async {
        (receiver.calls().len() >= EVENTS).then_some(())
    })
    .await;
    // killed once every record waits in retry-1000 (or is on its way to retry-2000)
    let first_retries = topics.topic(&topics::retry_topic(topics::SETTLED, 1_000));
    testkit::eventually("every record forwarded to retry-1000", testkit::PATIENCE, || async {
        (testkit::records_written(&topics.args, &first_retries).await >= EVENTS as i64).then_some(())
    })
    .await;
    kill(&mut service).await;
    let calls_at_first_kill = receiver.calls().len();

    // and its successor killed once it is at work (it has called the webhook itself)
    let mut service = notifications(&topics, &url);
    testkit::eventually("the restarted service's first calls", testkit::PATIENCE, || async {
        (receiver.calls().len() > calls_at_first_kill).then_some(())
    })
    .await;
    kill(&mut service).await;
    let calls_at_second_kill = receiver.calls().len();

    let mut service = notifications(&topics, &url);
    testkit::eventually("every notification delivered", testkit::PATIENCE, || async {
        // the third call of each event is answered 200
        events.iter().all(|event| receiver.calls_for(event).len() >= 3).then_some(())
    })
    .await;
    // every stage has committed all it was given: its calls, forwards and dead letters are done
    testkit::notifications_consumed(&topics.args).await;
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
        // scripted before it is published: the running service may call at once
        let event = Uuid::new_v4();
        receiver.script(event, &[Reply::Status(400)]);
        publish_settled_as(&topics, &producer, key, event).await;
        refused.push(event);
    }
    let letters = testkit::eventually("three dead letters", testkit::PATIENCE, || async {
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
        tokio::task::spawn_blocking(move || {
            kafka_admin::dlt::DeadLetterTopic::open(&args, &topic)?.retained()
        })
        .await
        .expect("task")
        .expect("retained")
    };
    assert_eq!(retained(dead_letter_topic.clone(), topics.args.clone()).await, 3);

    // the table names them too
    let (code, table, _) = dlt(&topics, &["list", "transferencias.liquidada-dlt"]).await;
    assert_eq!(code, 0);
    assert!(table.contains("webhook answered 400 Bad Request") && table.contains("CC-002"), "{table}");

    // a dry run sends nothing: the original topic has no more records after it than before
    let written = testkit::records_written(&topics.args, &settled).await;
    let (code, stdout, stderr) =
        dlt(&topics, &["replay", "transferencias.liquidada-dlt", "--all", "--dry-run"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("3 dead letters") && stdout.contains("would be replayed"), "{stdout}");
    assert_eq!(testkit::records_written(&topics.args, &settled).await, written, "the dry run wrote");
    assert_eq!(receiver.calls().len(), 3);

    // one replayed by partition and offset: delivered now that the receiver takes it
    let first = &letters[0];
    let (partition, offset) = (first["partition"].to_string(), first["offset"].to_string());
    let one = ["replay", "transferencias.liquidada-dlt", "--partition", &partition, "--offset", &offset];
    let (code, stdout, stderr) = dlt(&topics, &one).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    testkit::eventually("the replayed notification delivered", testkit::PATIENCE, || async {
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
    testkit::eventually("every replayed notification delivered", testkit::PATIENCE, || async {
        refused.iter().all(|event| receiver.calls_for(event).len() == 2).then_some(())
    })
    .await;
    assert_eq!(retained(dead_letter_topic.clone(), topics.args.clone()).await, 0);

    // and --all again replays nothing: it writes nothing to the original topic
    let written = testkit::records_written(&topics.args, &settled).await;
    let (code, stdout, stderr) = dlt(&topics, &["replay", "transferencias.liquidada-dlt", "--all"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("0 replayed"), "{stdout}");
    assert_eq!(testkit::records_written(&topics.args, &settled).await, written, "--all again wrote");
    // the service has done all it will for what was written: no call beyond these
    testkit::notifications_consumed(&topics.args).await;
    assert_eq!(receiver.calls().len(), 6, "each refused notification called twice, no more");
    let (_, stdout, _) = dlt(&topics, &["list", "transferencias.liquidada-dlt", "--json"]).await;
    assert_eq!(serde_json::from_str::<Value>(&stdout).expect("json"), json!([]));
    kill(&mut service).await;
}

/// A dead letter of `topics::SETTLED` as Spring Kafka 4.x writes it after four failed attempts:
/// the originals once, every `retry_topic-*` and exception header once a hop (the hop to -dlt
/// included: attempts 5, backoff = the time it was dead-lettered), oldest first.
fn spring_dead_letter(topics: &TestTopics, key: &str, event: Uuid, dead_lettered_ms: i64) -> OutgoingRecord {
    let settled = topics.topic(topics::SETTLED);
    let payload =
        json!({"eventoId": event, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z"});
    let original_ms = dead_lettered_ms - 7_300;
    let mut record =
        OutgoingRecord::new(topics.topic("transferencias.liquidada-dlt"), key, payload.to_string())
            .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .header("kafka_original-topic", settled.as_str())
            .header("kafka_original-partition", encode_int(1).to_vec())
            .header("kafka_original-offset", encode_long(41).to_vec())
            .header("kafka_original-timestamp", encode_long(original_ms).to_vec())
            .header("kafka_original-timestamp-type", "CreateTime")
            .header("kafka_dlt-original-consumer-group", topics.args.group("notificacoes"));
    // failures at +0, +1.1 s, +3.2 s, +7.3 s; delays 1 s, 2 s, 4 s, then 0 to -dlt
    for (hop, (failed_after_ms, delay_ms)) in
        [(0, 1_000), (1_100, 2_000), (3_200, 4_000), (7_300, 0)].into_iter().enumerate()
    {
        record = record
            .header(
                "kafka_exception-fqcn",
                "org.springframework.kafka.listener.ListenerExecutionFailedException",
            )
            .header("kafka_exception-cause-fqcn", "org.springframework.web.client.HttpServerErrorException")
            .header("kafka_exception-message", format!("503 on attempt {}", hop + 1))
            .header(
                "kafka_exception-stacktrace",
                "org.springframework.kafka.listener.ListenerExecutionFailedException: …",
            )
            .header("retry_topic-original-timestamp", encode_big_integer(original_ms))
            .header("retry_topic-attempts", encode_int(hop as i32 + 2).to_vec())
            .header(
                "retry_topic-backoff-timestamp",
                encode_big_integer(original_ms + failed_after_ms + delay_ms),
            );
    }
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spring_dead_letter_with_a_value_per_hop_is_listed_by_its_last_and_replayed_whole() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let (receiver, url) = Receiver::start().await;
    let producer = producer(&topics);
    let mut service = notifications(&topics, &url);

    let event = Uuid::new_v4();
    let letter = spring_dead_letter(&topics, "CC-007", event, now_ms() - 1_000);
    let delivered = producer.send(&letter).await.expect("publish the Spring dead letter");
    // and one from before #23, whose timestamp type is spelled CREATE_TIME
    let old = OutgoingRecord::new(topics.topic("transferencias.liquidada-dlt"), "CC-008", "{}")
        .header("kafka_dlt-original-topic", topics.topic(topics::SETTLED))
        .header("kafka_dlt-original-timestamp", encode_long(1_733_212_800_123).to_vec())
        .header("kafka_dlt-original-timestamp-type", "CREATE_TIME")
        .header("kafka_dlt-exception-message", "malformed");
    producer.send(&old).await.expect("publish the old dead letter");

    // listed by the last value of each header, both timestamp spellings read
    let (code, stdout, stderr) = dlt(&topics, &["list", "transferencias.liquidada-dlt", "--json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let letters: Value = serde_json::from_str(&stdout).expect("json");
    let listed = |key: &str| {
        letters
            .as_array()
            .expect("array")
            .iter()
            .find(|letter| letter["key"] == key)
            .cloned()
            .expect("listed")
    };
    let spring = listed("CC-007");
    assert_eq!(spring["exceptionMessage"], "503 on attempt 4", "{spring}");
    assert_eq!(spring["originalTopic"], topics.topic(topics::SETTLED));
    assert_eq!(spring["originalTimestampType"], "CreateTime");
    let before = listed("CC-008");
    assert_eq!(before["originalTimestampType"], "CreateTime", "{before}");
    assert_eq!(before["originalTimestampMs"], 1_733_212_800_123_i64);

    // re-driven to retry-1000 only: every value of every header travels, in order
    let replayed_at = now_ms();
    let (partition, offset) = (delivered.partition.to_string(), delivered.offset.to_string());
    let to = ["replay", "transferencias.liquidada-dlt", "--partition", &partition, "--offset", &offset];
    let (code, stdout, stderr) =
        dlt(&topics, &[&to[..], &["--to", "transferencias.liquidada-retry-1000"]].concat()).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    let retry = topics.topic("transferencias.liquidada-retry-1000");
    let reader = kafka::consumer::subscribe(
        &kafka::config::consumer_config(
            &topics.args,
            "test",
            &testkit::unique("reader"),
            kafka::config::OffsetCommit::StoredAfterHandling,
        ),
        &[&retry],
    )
    .expect("reader");
    let replayed = testkit::receive(&reader, 1).await.remove(0);
    let headers: Vec<(String, Vec<u8>)> = replayed
        .headers()
        .expect("headers")
        .iter()
        .map(|header| (header.key.to_owned(), header.value.unwrap_or_default().to_vec()))
        .collect();
    let mut expected = letter.headers.clone();
    expected.push((
        kafka_admin::dlt::REPLAYED_FROM.to_owned(),
        format!("{}/{partition}/{offset}", topics.topic("transferencias.liquidada-dlt")).into_bytes(),
    ));
    assert_eq!(headers, expected, "the replayed record's headers");
    // due at once: its last backoff value is the time it was dead-lettered
    let due = kafka::retry_topic::due_at_ms(&replayed).expect("a backoff timestamp");
    assert!(due < replayed_at, "due {} ms after the replay", due - replayed_at);
    testkit::eventually("the replayed notification delivered", testkit::PATIENCE, || async {
        (!receiver.calls_for(event).is_empty()).then_some(())
    })
    .await;
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
