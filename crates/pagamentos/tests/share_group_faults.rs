//! `pagamentos notificacoes` with `NOTIFICACOES_CONSUMPTION=share-group` as operators run it:
//! SIGKILLed while records are in every stage of their attempts, its broker restarted and
//! killed under it, and its dead letters read and re-driven by `pagamentos dlt`. Nothing may be
//! lost: every notification reaches the receiver with a 2xx or its dead letter is written.
//! Duplicates are allowed (delivery is at least once; receivers dedupe by `Idempotency-Key`),
//! and counted. The in-process tests of the mode are `crates/notifications/tests/share_group.rs`.

use crate::common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use kafka::producer::{OutgoingRecord, Producer};
use serde_json::{json, Value};
use tokio::process::Child;
use uuid::Uuid;

use contracts::topics;
use kafka::rdkafka::message::Message;
use testkit::webhook::{Receiver, Reply};
use testkit::TestTopics;

/// `pagamentos notificacoes` in share-group mode with `members` members; its log (every
/// record acquired, every retry and dead letter) goes to a file named after the test's topic
/// prefix in the target's tmp directory, printed here.
fn notifications(topics: &TestTopics, url: &str, members: u32) -> Child {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}log", topics.args.topic_prefix));
    eprintln!("notificacoes logs to {}", path.display());
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("log file");
    common::service(topics, "notificacoes")
        .env("RUST_LOG", "info,notifications::share_group=debug")
        .stderr(log.try_clone().expect("log"))
        .stdout(log)
        .env("NOTIFICACOES_LISTEN", "127.0.0.1:0")
        .env("NOTIFICACOES_WEBHOOK_URL", url)
        .env("NOTIFICACOES_WEBHOOK_TIMEOUT_MS", "5000")
        .env("NOTIFICACOES_CONSUMPTION", "share-group")
        .env("NOTIFICACOES_WEBHOOK_CONCURRENCY", members.to_string())
        .spawn()
        .expect("start pagamentos notificacoes")
}

fn producer(topics: &TestTopics) -> Producer {
    Producer::new(&kafka::config::producer_config(&topics.args, "test", Duration::ZERO)).expect("producer")
}

/// Publishes a settled event for a fresh transfer, which `receiver` answers with `replies`
/// (scripted before it is published: the service may call at once), then 200.
async fn publish_settled(
    topics: &TestTopics,
    producer: &Producer,
    receiver: &Receiver,
    key: &str,
    replies: &[Reply],
) -> Uuid {
    let event_id = Uuid::new_v4();
    receiver.script(event_id, replies);
    let payload = json!({"eventoId": event_id, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z"});
    let record = OutgoingRecord::new(topics.topic(topics::SETTLED), key, payload.to_string());
    producer.send(&record).await.expect("publish");
    event_id
}

async fn kill(child: &mut Child) {
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
}

/// `pagamentos dlt <args>`: (exit code, stdout, stderr).
async fn dlt(topics: &TestTopics, args: &[&str]) -> (i32, String, String) {
    common::system::captured(common::service(topics, "dlt").args(args), "pagamentos dlt").await
}

/// The event ids of every dead letter in the settled topic's `-dlt`, with repeats.
async fn dead_lettered(topics: &TestTopics) -> Vec<String> {
    testkit::read_to_end(&topics.args, &topics.topic("transferencias.liquidada-dlt"))
        .await
        .iter()
        .map(|letter| {
            let payload: Value = serde_json::from_slice(letter.payload().unwrap_or_default()).expect("json");
            payload["eventoId"].as_str().expect("eventoId").to_owned()
        })
        .collect()
}

/// What the receiver answers: calls 1–3 a quick 503 each (1 s, 2 s, 4 s apart), the fourth,
/// the last attempt, a 503 after `fourth`, then 503 for ever.
fn always_failing(fourth: Duration) -> Vec<Reply> {
    let mut replies =
        vec![Reply::Status(503), Reply::Status(503), Reply::Status(503), Reply::After(fourth, 503)];
    replies.extend([Reply::Status(503); 12]);
    replies
}

/// Receivers that fail twice and then take the notification (its third call, or any later).
const FLAKY: [Reply; 2] = [Reply::Status(503), Reply::Status(503)];

/// Every flaky event got a call answered 2xx (its third or a later one) and every failing one
/// has a dead letter; returns the calls in all and the dead letters in all.
async fn nothing_lost(
    topics: &TestTopics,
    receiver: &Receiver,
    flaky: &[Uuid],
    failing: &[Uuid],
    within: Duration,
) -> (usize, usize) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let missing: Vec<(&Uuid, usize)> = flaky
            .iter()
            .map(|event| (event, receiver.calls_for(event).len()))
            .filter(|(_, calls)| *calls < 3)
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} flaky notifications never answered 2xx after {within:?} (event, calls made): {missing:?}",
            missing.len(),
            flaky.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let deadline = tokio::time::Instant::now() + within;
    let letters = loop {
        let letters = dead_lettered(topics).await;
        let distinct: HashSet<&String> = letters.iter().collect();
        let missing = failing.iter().filter(|event| !distinct.contains(&event.to_string())).count();
        if missing == 0 {
            break letters;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{missing} of {} failing notifications lost: no dead letter after {within:?}",
            failing.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let flaky_ids: HashSet<String> = flaky.iter().map(Uuid::to_string).collect();
    assert!(
        letters.iter().all(|letter| !flaky_ids.contains(letter)),
        "a notification that was delivered was dead-lettered too"
    );
    (receiver.calls().len(), letters.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_the_last_attempts_loses_nothing() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let (receiver, url) = Receiver::start().await;
    let producer = producer(&topics);
    const EACH: usize = 30;
    let (mut flaky, mut failing) = (Vec::new(), Vec::new());
    for n in 0..EACH {
        let key = format!("CC-{:03}", n % 10);
        flaky.push(publish_settled(&topics, &producer, &receiver, &key, &FLAKY).await);
        let replies = always_failing(Duration::from_secs(4));
        failing.push(publish_settled(&topics, &producer, &receiver, &key, &replies).await);
    }
    let members = 2 * EACH as u32; // every record in hand at once
    let mut service = notifications(&topics, &url, members);
    // SIGKILL while a record is in its last attempt (the fourth call, held 4 s by the
    // receiver), others in earlier ones or waiting for their retry
    testkit::eventually("a fourth call in flight", Duration::from_secs(90), || async {
        failing.iter().any(|event| receiver.calls_for(event).len() >= 4).then_some(())
    })
    .await;
    kill(&mut service).await;
    let in_last = failing.iter().filter(|event| receiver.calls_for(event).len() == 4).count();
    let calls_at_kill = receiver.calls().len();

    let mut service = notifications(&topics, &url, members);
    let (calls, letters) = nothing_lost(&topics, &receiver, &flaky, &failing, Duration::from_secs(120)).await;
    kill(&mut service).await;
    let mut by_calls = std::collections::BTreeMap::new();
    for event in &failing {
        *by_calls.entry(receiver.calls_for(event).len()).or_insert(0) += 1;
    }
    eprintln!(
        "{} notifications ({EACH} to fail for good), SIGKILLed at {calls_at_kill} calls with {in_last} in their \
         fourth attempt: nothing lost; {calls} calls in all (at least {}), {letters} dead letters for {EACH}; \
         failing ones by calls made: {by_calls:?}",
        2 * EACH,
        EACH * 3 + EACH * 4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_group_dead_letters_are_listed_and_replayed_by_pagamentos_dlt() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let (receiver, url) = Receiver::start().await;
    let producer = producer(&topics);
    let mut service = notifications(&topics, &url, 4);
    let mut refused = Vec::new();
    for key in ["CC-001", "CC-002"] {
        refused.push(publish_settled(&topics, &producer, &receiver, key, &[Reply::Status(400)]).await);
    }
    let letters = testkit::eventually("two dead letters", Duration::from_secs(60), || async {
        let (code, stdout, _) = dlt(&topics, &["list", "transferencias.liquidada-dlt", "--json"]).await;
        let letters: Value = serde_json::from_str(&stdout).ok()?;
        (code == 0 && letters.as_array()?.len() == 2).then_some(letters)
    })
    .await;
    let settled = topics.topic(topics::SETTLED);
    for letter in letters.as_array().expect("array") {
        assert_eq!(letter["originalTopic"], settled.as_str());
        assert_eq!(letter["exceptionMessage"], "webhook answered 400 Bad Request");
    }
    let (code, stdout, stderr) = dlt(&topics, &["replay", "transferencias.liquidada-dlt", "--all"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("2 replayed"), "{stdout}");
    // re-driven to the original topic, the share group delivers them again
    testkit::eventually("the replayed notifications delivered", Duration::from_secs(60), || async {
        refused.iter().all(|event| receiver.calls_for(event).len() >= 2).then_some(())
    })
    .await;
    kill(&mut service).await;
}

/// A single-node Kafka of the test's own (`scripts/stack up kafka` with its own state directory
/// and ports, the stack's share-group settings included), beside the shared one, which is never
/// touched; stopped and wiped when dropped.
struct PrivateBroker {
    state: PathBuf,
    port: u16,
}

impl PrivateBroker {
    const PORT: u16 = 19_392;

    async fn up() -> Self {
        let broker = Self {
            state: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("share-group-broker"),
            port: Self::PORT,
        };
        broker.stop_and_wipe();
        broker.stack(&["up", "kafka"]).await;
        broker
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command =
            std::process::Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/stack"));
        command
            .args(args)
            .env("PAGAMENTOS_STACK_DIR", &self.state)
            .env("KAFKA_BROKER_PORT", self.port.to_string());
        command
    }

    /// `scripts/stack <args>` on this broker.
    async fn stack(&self, args: &[&str]) {
        let mut command = self.command(args);
        let status = tokio::task::spawn_blocking(move || command.status())
            .await
            .expect("join")
            .expect("run scripts/stack");
        assert!(status.success(), "scripts/stack {args:?} on the private broker failed");
    }

    /// SIGKILL: a crash, no controlled shutdown.
    async fn kill(&self) {
        let pid = std::fs::read_to_string(self.state.join("kafka/broker.pid")).expect("broker.pid");
        let status =
            tokio::process::Command::new("kill").args(["-KILL", pid.trim()]).status().await.expect("kill");
        assert!(status.success(), "kill -KILL the private broker");
    }

    fn stop_and_wipe(&self) {
        if self.state.exists() {
            let _ = self.command(&["down", "kafka"]).status();
            let _ = std::fs::remove_dir_all(&self.state);
        }
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        self.stop_and_wipe();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts and kills a broker of its own: scripts/test runs it alone"]
async fn a_broker_restarted_and_killed_under_it_loses_nothing() {
    testkit::init_logs();
    let broker = PrivateBroker::up().await;
    let mut args = testkit::kafka_args();
    args.bootstrap_servers = broker.bootstrap();
    // declared after the broker, so dropped before it: its topics are deleted while it runs
    let topics = TestTopics::plan_on(args, 3, 1).await;
    let (receiver, url) = Receiver::start().await;
    let producer = producer(&topics);
    let members = 32;
    let mut service = notifications(&topics, &url, members);

    let (mut healthy, mut flaky, mut failing) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..2 {
        // a stream of notifications, some failing for a while, some for good
        for n in 0..150 {
            let key = format!("CC-{:03}", n % 30);
            match n % 10 {
                0 => flaky.push(publish_settled(&topics, &producer, &receiver, &key, &FLAKY).await),
                1 if n % 30 == 1 => {
                    let replies = always_failing(Duration::from_millis(500));
                    failing.push(publish_settled(&topics, &producer, &receiver, &key, &replies).await);
                }
                _ => healthy.push(publish_settled(&topics, &producer, &receiver, &key, &[]).await),
            }
        }
        testkit::eventually("the stream under way", Duration::from_secs(90), || async {
            (receiver.calls().len() >= 100 * (round + 1)).then_some(())
        })
        .await;
        if round == 0 {
            broker.stack(&["restart", "kafka"]).await; // a clean restart
        } else {
            broker.kill().await; // a crash
            tokio::time::sleep(Duration::from_secs(2)).await; // down a while, as a machine reboots
            broker.stack(&["up", "kafka"]).await;
        }
    }
    let within = Duration::from_secs(180);
    testkit::eventually("every healthy notification delivered", within, || async {
        healthy.iter().all(|event| !receiver.calls_for(event).is_empty()).then_some(())
    })
    .await;
    let (calls, letters) = nothing_lost(&topics, &receiver, &flaky, &failing, within).await;
    let delivered: HashSet<String> =
        receiver.calls().iter().filter_map(|call| call.idempotency_key.clone()).collect();
    kill(&mut service).await;
    eprintln!(
        "{} notifications through a broker restart and a broker crash: nothing lost; {} distinct called, \
         {calls} calls in all, {letters} dead letters for {}",
        healthy.len() + flaky.len() + failing.len(),
        delivered.len(),
        failing.len()
    );
    drop(topics);
}
