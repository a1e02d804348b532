//! Notification throughput to a local receiver, against the real broker:
//! `cargo run --release -p notifications --example notifications_bench [EVENTS]`.
//!
//! Publishes EVENTS (default 20 000) settled events on a topic set of its own (12 partitions),
//! then starts the service and times until the receiver has every one. Two runs: every call
//! answered 200, then one event in ten answered 503 once (so it goes through
//! `-retry-1000`). Prints one JSON line per run.

use std::time::{Duration, Instant};

use kafka::producer::{OutgoingRecord, Producer};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use contracts::topics;
use testkit::webhook::{Receiver, Reply};
use testkit::TestTopics;

async fn run(events: usize, failing_every: Option<usize>) {
    let partitions = 12;
    let topic_set = TestTopics::plan(partitions).await;
    let (receiver, url) = Receiver::start().await;
    let producer =
        Producer::new(&kafka::config::producer_config(&topic_set.args, "bench", Duration::from_millis(5)))
            .expect("producer");
    let topic = topic_set.topic(topics::SETTLED);
    let mut sends = Vec::with_capacity(events);
    for n in 0..events {
        let event = Uuid::new_v4();
        if failing_every.is_some_and(|every| n % every == 0) {
            receiver.script(event, &[Reply::Status(503)]);
        }
        let payload = json!({"eventoId": event, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z",
            "contaOrigem": format!("CC-{:05}", n % 1000), "valorEmCentavos": 100, "moeda": "BRL"});
        let record = OutgoingRecord::new(&topic, format!("CC-{:05}", n % 1000), payload.to_string());
        let producer = producer.clone();
        sends.push(tokio::spawn(async move { producer.send(&record).await.expect("publish") }));
    }
    for send in sends {
        send.await.expect("send task");
    }

    let mut settings = notifications::Settings::for_tests(
        topic_set.args.clone(),
        url.parse().expect("url"),
        "bench-secret",
        partitions,
    );
    settings.args.concurrency = 64;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let started = Instant::now();
    notifications::start(
        settings,
        &telemetry::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
    )
    .await
    .expect("start");
    let expected = events + failing_every.map_or(0, |every| events.div_ceil(every));
    let mut first_call = None;
    loop {
        let calls = receiver.calls();
        if first_call.is_none() {
            first_call = calls.first().map(|call| call.at);
        }
        if calls.len() >= expected {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let mut per_event: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
            for call in &calls {
                *per_event.entry(call.idempotency_key.clone().unwrap_or_default()).or_default() += 1;
            }
            let mut histogram = std::collections::BTreeMap::new();
            for count in per_event.values() {
                *histogram.entry(*count).or_insert(0) += 1;
            }
            panic!(
                "only {} of {expected} calls; events by calls: {histogram:?}, events called: {}",
                calls.len(),
                per_event.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = receiver.calls();
    let last = calls.iter().map(|call| call.at).max().expect("calls");
    let first = first_call.expect("first call");
    let busy = last.duration_since(first).as_secs_f64();
    println!(
        "{}",
        json!({
            "events": events,
            "failing_once_every": failing_every,
            "webhook_calls": calls.len(),
            "seconds_from_first_to_last_call": (busy * 1000.0).round() / 1000.0,
            "notifications_per_s": (events as f64 / busy).round(),
            "seconds_including_start": (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        })
    );
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
}

#[tokio::main]
async fn main() {
    telemetry::logging::init("notifications-bench", telemetry::logging::LogFormat::Pretty);
    let events = std::env::args().nth(1).and_then(|arg| arg.parse().ok()).unwrap_or(20_000);
    run(events, None).await;
    run(events, Some(10)).await;
}
