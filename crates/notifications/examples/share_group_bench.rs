//! Notifications per second to a slow receiver, retry topics against the share group, on the
//! real broker: `cargo run --release -p notifications --example share_group_bench [EVENTS]`.
//!
//! For each load and each `NOTIFICACOES_CONSUMPTION`, publishes EVENTS (default 4 000) settled
//! events on a topic set of its own (12 partitions), then starts the service with 64 calls in
//! flight (64 members in share-group mode) and times from the receiver's first call to the
//! one that completes the set. Loads: every call answered after 50 ms; every call after 5 ms
//! but one in 50 after 2 s (a receiver with a slow tail). Prints one JSON line per run.

use std::time::{Duration, Instant};

use serde_json::json;
use uuid::Uuid;

use notifications::Consumption;
use testkit::webhook::{Receiver, Reply};
use testkit::TestTopics;

mod common;

/// How the receiver answers.
#[derive(Debug, Clone, Copy)]
struct Load {
    name: &'static str,
    call: Duration,
    /// One call in `every` takes `slow` instead.
    slow: Option<(usize, Duration)>,
}

async fn run(events: usize, load: Load, consumption: Consumption) {
    let partitions = 12;
    let topic_set = TestTopics::plan(partitions).await;
    let (receiver, url) = Receiver::start().await;
    receiver.answer_by_default(Reply::After(load.call, 200));
    let payloads: Vec<_> = (0..events)
        .map(|n| {
            let event = Uuid::new_v4();
            match load.slow {
                Some((every, slow)) if n % every == 0 => receiver.script(event, &[Reply::After(slow, 200)]),
                _ => {}
            }
            json!({"eventoId": event, "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-04T10:00:00Z"})
        })
        .collect();
    common::publish_settled(&topic_set, payloads).await;

    let started = Instant::now();
    let running = common::start(&topic_set, &url, partitions, consumption).await;
    let done = loop {
        let calls = receiver.calls();
        let mut keys: Vec<&str> = calls.iter().filter_map(|call| call.idempotency_key.as_deref()).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() >= events {
            break calls;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "only {} of {events} in 300 s", keys.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let first = done.iter().map(|call| call.at).min().expect("calls");
    let last = done.iter().map(|call| call.at).max().expect("calls");
    let busy = last.duration_since(first).as_secs_f64() + load.call.as_secs_f64();
    println!(
        "{}",
        json!({
            "load": load.name,
            "consumption": format!("{consumption:?}"),
            "events": events,
            "webhook_calls": done.len(),
            "seconds_from_first_call_to_last": (busy * 1000.0).round() / 1000.0,
            "notifications_per_s": (events as f64 / busy).round(),
        })
    );
    running.stop().await;
}

#[tokio::main]
async fn main() {
    telemetry::logging::init("share-group-bench", telemetry::logging::LogFormat::Pretty);
    let events = std::env::args().nth(1).and_then(|arg| arg.parse().ok()).unwrap_or(4_000);
    let loads = [
        Load { name: "every call 50 ms", call: Duration::from_millis(50), slow: None },
        Load {
            name: "every call 5 ms, one in 50 2 s",
            call: Duration::from_millis(5),
            slow: Some((50, Duration::from_secs(2))),
        },
    ];
    for load in loads {
        for consumption in [Consumption::RetryTopics, Consumption::ShareGroup] {
            run(events, load, consumption).await;
        }
    }
}
