//! Our dead letters and retry records, read by Kafka's own Java classes: the running
//! `pagamentos notificacoes` (a webhook that always answers 503) writes the retry-1000, -2000,
//! -4000 and `-dlt` records of one notification, the running `pagamentos antifraude` dead-letters
//! a poison pill, and `tests/java/HeaderCheck.java`, run against kafka-clients (the jars
//! `scripts/stack` caches), reads every header the way Spring Kafka does (`Headers.lastHeader`,
//! `TimestampType.forName`, `ByteBuffer`, `new BigInteger(bytes)`) and exits non-zero on any
//! header that does not parse or has the wrong value, or on an original record that is not on
//! the partition Java's partitioner picks for its key.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kafka::producer::{OutgoingRecord, Producer};
use serde_json::json;
use tokio::process::Child;
use uuid::Uuid;

use contracts::topics;
use testkit::webhook::{Receiver, Reply};
use testkit::{unique, TestTopics};

/// This checkout (found at run time: a test binary may be shared by several clones).
fn checkout() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (run under cargo test)");
    PathBuf::from(package).join("../..")
}

/// Where `scripts/stack` keeps the Kafka jars: `${PAGAMENTOS_CACHE_DIR:-~/.cache/pagamentos}/
/// kafka-$KAFKA_VERSION/libs`, the version read from the script itself so the two never drift.
fn kafka_libs() -> PathBuf {
    let script = checkout().join("scripts/stack");
    let text =
        std::fs::read_to_string(&script).unwrap_or_else(|error| panic!("read {}: {error}", script.display()));
    let version = text
        .lines()
        .find_map(|line| line.strip_prefix("KAFKA_VERSION="))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("no KAFKA_VERSION= line in {}", script.display()));
    let cache = match std::env::var_os("PAGAMENTOS_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/pagamentos"),
    };
    let libs = cache.join(format!("kafka-{version}/libs"));
    let has_clients = std::fs::read_dir(&libs).is_ok_and(|entries| {
        entries.flatten().any(|entry| entry.file_name().to_string_lossy().starts_with("kafka-clients-"))
    });
    assert!(
        has_clients,
        "kafka-clients not found in {}: run `scripts/stack up` (it caches the Kafka {version} jars there)",
        libs.display()
    );
    libs
}

fn notifications(topics: &TestTopics, url: &str) -> Child {
    common::service(topics, "notificacoes")
        .env("NOTIFICACOES_LISTEN", "127.0.0.1:0")
        .env("NOTIFICACOES_WEBHOOK_URL", url)
        .env("NOTIFICACOES_WEBHOOK_TIMEOUT_MS", "2000")
        .spawn()
        .expect("start pagamentos notificacoes")
}

fn antifraud_service(topics: &TestTopics) -> Child {
    common::service(topics, "antifraude")
        .env("ANTIFRAUDE_LISTEN", "127.0.0.1:0")
        .env("TRANSACTIONAL_ID_PREFIX", unique("tx-headers"))
        .env("PAGAMENTOS_INSTANCE_ID", "header-check")
        .spawn()
        .expect("start pagamentos antifraude")
}

/// Waits for one committed record on `topic`.
async fn one_record(topics: &TestTopics, topic: &str) {
    let config = kafka::config::consumer_config(
        &topics.args,
        "test",
        &unique("reader"),
        kafka::config::OffsetCommit::StoredAfterHandling,
    );
    let consumer = kafka::consumer::subscribe(&config, &[topic]).expect("consumer");
    testkit::receive(&consumer, 1).await;
}

/// `java -cp '<libs>/*' HeaderCheck.java <args>`: (success, stdout + stderr).
async fn header_check(libs: &Path, args: &[String]) -> (bool, String) {
    let source = checkout().join("crates/pagamentos/tests/java/HeaderCheck.java");
    let run = tokio::process::Command::new("java")
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .arg(&source)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    // compiling the source and reading five topics: generous on a busy machine
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("HeaderCheck.java still running after 300 s")
        .unwrap_or_else(|error| panic!("run `java` (Java 17+ is needed, as for the broker): {error}"));
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_clients_read_our_retry_records_and_dead_letters_as_spring_does() {
    testkit::init_logs();
    let libs = kafka_libs();
    let topics = TestTopics::plan(3).await;
    let (receiver, url) = Receiver::start().await;
    receiver.answer_by_default(Reply::Status(503));
    let mut notifier = notifications(&topics, &url);
    let mut antifraud = antifraud_service(&topics);
    let producer = Producer::new(&kafka::config::producer_config(&topics.args, "test", Duration::ZERO))
        .expect("producer");

    // keys whose partition out of 3 differs between Java's murmur2 (CC-003 → 0, CC-004 → 1) and
    // librdkafka's default crc32 (1 and 2), so HeaderCheck's partitioner check can fail
    // a notification that fails all four attempts: retry-1000, -2000, -4000, then -dlt
    let event = Uuid::new_v4();
    let settled = topics.topic(topics::SETTLED);
    let payload =
        json!({"eventoId": event, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z"});
    producer.send(&OutgoingRecord::new(&settled, "CC-003", payload.to_string())).await.expect("publish");
    // a poison pill for antifraude's blocking handler: a kafka_dlt-* dead letter
    let requested = topics.topic(topics::REQUESTED);
    producer.send(&OutgoingRecord::new(&requested, "CC-004", "{not json")).await.expect("publish poison");

    testkit::eventually("four webhook calls", testkit::PATIENCE, || async {
        (receiver.calls_for(event).len() >= 4).then_some(())
    })
    .await;
    one_record(&topics, &format!("{settled}-dlt")).await;
    one_record(&topics, &format!("{requested}-dlt")).await;

    let args = [
        format!("bootstrap={}", topics.args.bootstrap_servers),
        format!("retried-topic={settled}"),
        format!("retry-group={}", topics.args.group(topics::groups::NOTIFICATIONS)),
        "retry-exception=notifications::webhook::ServerError".to_owned(),
        "retry-cause=http::status::StatusCode".to_owned(),
        format!("blocking-topic={requested}"),
        format!("blocking-group={}", topics.args.group(topics::groups::ANTIFRAUD)),
        format!("blocking-exception={}", antifraud::analysis::MALFORMED_EVENT),
        format!("blocking-cause={}", std::any::type_name::<serde_json::Error>()),
    ];
    let (passed, output) = header_check(&libs, &args).await;
    eprintln!("{output}");
    assert!(passed, "HeaderCheck.java found headers kafka-clients cannot read as Spring does:\n{output}");
    assert!(output.contains(" checks, 0 failed"), "{output}");

    notifier.start_kill().expect("SIGKILL notificacoes");
    antifraud.start_kill().expect("SIGKILL antifraude");
    notifier.wait().await.expect("reaped");
    antifraud.wait().await.expect("reaped");
}
