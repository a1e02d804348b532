//! Benchmark of antifraude alone, both profiles side by side, against the local stack:
//!
//! ```sh
//! cargo run --release -p antifraud --example antifraud_bench -- [backlog_fast] [backlog_reference] [steady_seconds]
//! ```
//!
//! 1. *Backlog*: requests over 1 000 keys are waiting on a 12-partition topic (default 20 000
//!    for `fast`, 2 000 for `reference`, which commits one transaction per record); one
//!    instance starts and drains them. Reports records per second from the first output to the
//!    moment a `read_committed` reader has seen every output.
//! 2. *Steady*: 200 requests/s for `steady_seconds` (default 10); reports the added latency per
//!    record, output record timestamp minus input record timestamp (both set by their
//!    producers, ms resolution): p50, p99, max. The input producer does not linger, so its
//!    own batching delay is not counted as antifraude's.
//!
//! Each profile gets fresh topics. Prints one JSON line per profile.

mod common;

use std::time::{Duration, Instant};

use kafka::config::{consumer_config, producer_config, OffsetCommit};
use kafka::producer::{OutgoingRecord, Producer};
use kafka::rdkafka::message::Message;
use kafka::Profile;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use contracts::topics;
use testkit::{unique, TestTopics};

use common::request;

const RATE_PER_SECOND: u64 = 200;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let backlog_fast: usize =
        args.next().map_or(20_000, |text| text.parse().expect("backlog_fast: a number"));
    let backlog_reference: usize =
        args.next().map_or(2_000, |text| text.parse().expect("backlog_reference: a number"));
    let steady_seconds: u64 = args.next().map_or(10, |text| text.parse().expect("steady_seconds: a number"));
    println!("{}", run(Profile::Fast, backlog_fast, steady_seconds).await);
    println!("{}", run(Profile::Reference, backlog_reference, steady_seconds).await);
}

fn percentile(sorted: &[i64], q: f64) -> i64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

// Over 100 lines on purpose: one measured run: the producer, the service and the reader bracket the
// same span.
async fn run(profile: Profile, backlog: usize, steady_seconds: u64) -> serde_json::Value {
    let topics = TestTopics::plan(12).await;
    let input = topics.topic(topics::REQUESTED);
    let producer = Producer::new(&producer_config(&topics.args, "bench", Duration::ZERO)).expect("producer");
    let records: Vec<OutgoingRecord> =
        (0..backlog).map(request).map(|(key, body)| OutgoingRecord::new(&input, key, body)).collect();
    futures::future::try_join_all(records.iter().map(|record| producer.send(record))).await.expect("backlog");

    let reader = kafka::consumer::subscribe(
        &consumer_config(&topics.args, "bench", &unique("reader"), OffsetCommit::StoredAfterHandling),
        &[&topics.topic(topics::ANALYSED)],
    )
    .expect("reader");
    let settings = antifraud::Settings {
        args: antifraud::AntifraudArgs {
            listen: "127.0.0.1:0".parse().expect("address"),
            block_threshold_cents: antifraud::scoring::DEFAULT_BLOCK_THRESHOLD_CENTS,
            transactional_id_prefix: unique("tx-bench"),
            instance_id: Some("bench".into()),
            batch_records: 500,
            batch_wait_ms: 0,
            kafka_client: antifraud::TransactionalClient::from_env(),
        },
        // no admin token: /readyz answers its status line only
        auth: telemetry::health::HealthAuthArgs::default(),
        kafka: topics.args.clone(),
        topics: kafka::TopicArgs { partitions: 12, replicas: 1 },
        profile,
        metrics: telemetry::health::MetricsRoute::ServicePort,
        producer: None,
    };
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    antifraud::start(
        settings,
        &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
    )
    .await
    .expect("start");
    // timed from the first output, so joining the group and registering the transactional id
    // (a second or so, once per process) do not count as throughput
    reader.recv().await.expect("first output");
    let started = Instant::now();
    let mut seen = 1;
    while seen < backlog {
        reader.recv().await.expect("receive");
        seen += 1;
    }
    let drain_seconds = started.elapsed().as_secs_f64();

    // steady: open loop, each request due at start + i/rate; latency from record timestamps
    let total = (RATE_PER_SECOND * steady_seconds) as usize;
    let sender = {
        let producer = producer.clone();
        let input = input.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for i in 0..total {
                tokio::time::sleep_until(
                    start + Duration::from_micros(i as u64 * 1_000_000 / RATE_PER_SECOND),
                )
                .await;
                let (key, body) = request(backlog + i);
                let producer = producer.clone();
                let record = OutgoingRecord::new(&input, key, body);
                tokio::spawn(async move { producer.send(&record).await.expect("steady send") });
            }
        })
    };
    let mut latencies = Vec::with_capacity(total);
    let input_reader = kafka::consumer::subscribe(
        &consumer_config(&topics.args, "bench", &unique("inputs"), OffsetCommit::StoredAfterHandling),
        &[&input],
    )
    .expect("input reader");
    let mut input_times = std::collections::HashMap::new();
    while input_times.len() < backlog + total {
        let record = input_reader.recv().await.expect("input");
        let body: serde_json::Value =
            serde_json::from_slice(record.payload().expect("payload")).expect("json");
        input_times.insert(
            body["transferenciaId"].as_str().expect("id").to_owned(),
            record.timestamp().to_millis().unwrap_or(0),
        );
    }
    while latencies.len() < total {
        let record = reader.recv().await.expect("receive");
        let body: serde_json::Value =
            serde_json::from_slice(record.payload().expect("payload")).expect("json");
        let id = body["transferenciaId"].as_str().expect("id");
        if let (Some(sent), Some(out)) = (input_times.get(id), record.timestamp().to_millis()) {
            latencies.push(out - sent);
        }
    }
    sender.await.expect("sender");
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    latencies.sort_unstable();
    // where the time goes: the service's own transaction histogram (cumulative over the run)
    let rendered = telemetry::metrics::install().render();
    let transaction_buckets: Vec<String> = rendered
        .lines()
        .filter(|line| line.starts_with("antifraud_transaction_seconds_bucket"))
        .map(|line| line.trim_start_matches("antifraud_transaction_seconds_bucket").to_owned())
        .collect();
    eprintln!("{profile:?} transaction_seconds buckets (cumulative): {}", transaction_buckets.join(" "));
    json!({
        "profile": format!("{profile:?}").to_lowercase(),
        "backlog": backlog,
        "drain_records_per_s": ((backlog - 1) as f64 / drain_seconds).round(),
        "steady_rate_per_s": RATE_PER_SECOND,
        "added_latency_ms": {"p50": percentile(&latencies, 0.5), "p99": percentile(&latencies, 0.99), "max": latencies[latencies.len() - 1]},
    })
}
