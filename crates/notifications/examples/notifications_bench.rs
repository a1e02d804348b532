//! Notification throughput to a local receiver, against the real broker:
//! `cargo run --release -p notifications --example notifications_bench [EVENTS]`.
//!
//! Publishes EVENTS (default 20 000) settled events on a topic set of its own (12 partitions),
//! then starts the service and times until the receiver has every one. Two runs: every call
//! answered 200, then one event in ten answered 503 once (so it goes through
//! `-retry-1000`). Prints one JSON line per run.

use std::time::{Duration, Instant};

use serde_json::json;
use uuid::Uuid;

use testkit::webhook::{Receiver, Reply};
use testkit::TestTopics;

mod common;

async fn run(events: usize, failing_every: Option<usize>) {
    let partitions = 12;
    let topic_set = TestTopics::plan(partitions).await;
    let (receiver, url) = Receiver::start().await;
    let payloads: Vec<_> = (0..events)
        .map(|n| {
            let event = Uuid::new_v4();
            if failing_every.is_some_and(|every| n % every == 0) {
                receiver.script(event, &[Reply::Status(503)]);
            }
            json!({"eventoId": event, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z",
                "contaOrigem": format!("CC-{:05}", n % 1000), "valorEmCentavos": 100, "moeda": "BRL"})
        })
        .collect();
    common::publish_settled(&topic_set, payloads).await;

    let started = Instant::now();
    let running = common::start(&topic_set, &url, partitions, notifications::Consumption::RetryTopics).await;
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
    running.stop().await;
}

#[tokio::main]
async fn main() {
    telemetry::logging::init("notifications-bench", telemetry::logging::LogFormat::Pretty);
    let events = std::env::args().nth(1).and_then(|arg| arg.parse().ok()).unwrap_or(20_000);
    run(events, None).await;
    run(events, Some(10)).await;
}
